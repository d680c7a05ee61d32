"""A fork server: a process that has shoal imported already and forks children on request.

Starting a teammate as `python -m shoal worker ...` costs a new interpreter and about half a
second of CPU importing shoal (most of it building pydantic models), every time. A fork of a
process that has done the imports once costs a few milliseconds. So the process backend asks
this server, started once per leader process, to fork its workers; it runs `python -m MODULE
ARGS...` command lines in a child of its own, exactly as the interpreter would, and answers
with the child's pid, later with its exit code.

The server is single-threaded (forking a process with threads is unsafe), started with its own
session, and talks to its one client over a socket pair the client created: no path, no
listening socket, nobody else can ask it for anything. It exits when that socket closes (the
leader exited or was killed); the children it forked go on, in sessions of their own.

Protocol: one JSON object a line. Client -> server: `{"op": "spawn", "id": N, "argv": [...],
"cwd": DIR, "env": {...}, "log": PATH|null, "preload": [MODULE, ...]}`. Server -> client:
`{"id": N, "pid": PID}` or `{"id": N, "error": TEXT}`, and `{"exit": PID, "code": CODE}` when
a child ends (code as `subprocess` gives it: negative for a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Final

import orjson
import setproctitle

ENV_DISABLE: Final = "SHOAL_FORKSERVER"
"""Set to 0 to start every child as a new interpreter (no fork server)."""
READY_TIMEOUT_S: Final = 60.0
DRAIN_INTERVAL_S: Final = 0.02
FILE_MODE: Final = 0o600


def forkable(argv: Sequence[str]) -> str | None:
    """The module of a `python -m MODULE ...` command line of this interpreter, else None."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return argv[2]
    return None


def enabled() -> bool:
    return os.environ.get(ENV_DISABLE, "1").strip().lower() not in ("0", "false", "no", "off")


class ForkServerError(Exception):
    """The fork server could not be started or did not answer."""


class ForkClient:
    """The client side: starts the server on first use; thread-safe.

    `spawn` returns a pid; `exit_code(pid)` is the child's code once the server saw it end
    (None while it runs, or for a pid the server did not fork)."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self._preload = list(preload)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._drained = 0.0
        self.broken: str | None = None

    # -- the server's life ----------------------------------------------------------------------

    def _start(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        if self.broken is not None:
            raise ForkServerError(self.broken)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), *self._preload],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            mine.close()
            self.broken = f"cannot start the fork server: {exc}"
            raise ForkServerError(self.broken) from None
        finally:
            theirs.close()
        mine.setblocking(True)
        self._sock = mine
        try:
            self._wait_for(lambda: self._replies.pop(-1, None), READY_TIMEOUT_S)
        except ForkServerError as exc:
            self._break(f"the fork server did not start: {exc}")
            raise ForkServerError(str(self.broken)) from None
        return mine

    def _break(self, why: str) -> None:
        self.broken = why
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Let the server go (the children it forked go on)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
                if self._proc.poll() is None:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None

    # -- messages -------------------------------------------------------------------------------

    def _take(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf:
            line, _, self._buf = self._buf.partition(b"\n")
            msg = orjson.loads(line)
            if "exit" in msg:
                self._exits[int(msg["exit"])] = int(msg["code"])
            elif msg.get("ready"):
                self._replies[-1] = msg
            else:
                self._replies[int(msg["id"])] = msg

    def _wait_for(self, found: Any, timeout: float) -> Any:
        sock = self._sock
        assert sock is not None
        deadline = time.monotonic() + timeout
        while (got := found()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"no answer in {timeout:.0f} s")
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                raise ForkServerError(f"its socket failed: {exc}") from None
            if not data:
                raise ForkServerError("it exited")
            self._take(data)
        return got

    def _drain(self) -> None:
        """Read what the server sent meanwhile (exits), without waiting; at most every
        DRAIN_INTERVAL_S (a leader asks about each of its teammates once a tick)."""
        sock = self._sock
        now = time.monotonic()
        if sock is None or now - self._drained < DRAIN_INTERVAL_S:
            return
        self._drained = now
        sock.setblocking(False)
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._break(f"the fork server's socket failed: {exc}")
                return
            if not data:
                self._break("the fork server exited")
                return
            self._take(data)

    # -- the client's calls ---------------------------------------------------------------------

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str],
        log: str | None,
        preload: Sequence[str] = (),
    ) -> int:
        """Fork `argv` (a `python -m MODULE ...` line of this interpreter) in the server; its
        pid. ForkServerError when the server cannot be used; OSError for the child's own
        trouble (a log that cannot be opened, a missing cwd)."""
        with self._lock:
            sock = self._start()
            self._next += 1
            rid = self._next
            request = {
                "op": "spawn",
                "id": rid,
                "argv": list(argv),
                "cwd": cwd,
                "env": env,
                "log": log,
                "preload": list(preload),
            }
            try:
                sock.sendall(orjson.dumps(request) + b"\n")
                reply = self._wait_for(lambda: self._replies.pop(rid, None), READY_TIMEOUT_S)
            except (ForkServerError, OSError) as exc:
                self._break(f"the fork server failed: {exc}")
                raise ForkServerError(str(self.broken)) from None
            if "error" in reply:
                raise OSError(str(reply["error"]))
            return int(reply["pid"])

    def exit_code(self, pid: int) -> int | None:
        """The exit code of child `pid` once the server reported its end, else None."""
        with self._lock:
            self._drain()
            return self._exits.get(pid)

    def running(self, pid: int) -> bool | None:
        """Whether child `pid` runs, by the server's word (it reaps and reports every child
        it forked); None when the server is gone and cannot say."""
        with self._lock:
            self._drain()
            if pid in self._exits:
                return False
            return None if self._sock is None else True


# -- the server ---------------------------------------------------------------------------------


def _child(request: dict[str, Any], keep_closed: list[int]) -> None:
    """In the forked child: become the command `argv`, then exit as the interpreter would."""
    code = 1
    try:
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        atexit._clear()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = request.get("log")
        if log:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        else:
            out = os.open(os.devnull, os.O_WRONLY)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        # (`ps` and /proc/PID/cmdline show the command this child runs, not the server's)
        setproctitle.setproctitle(" ".join(argv))
        sys.argv = [argv[0], *argv[3:]]
        # `-m` runs a module's code afresh as __main__; one the server preloaded is not reused
        # (runpy would warn), while a package's __main__ runs as usual.
        target = sys.modules.get(argv[2])
        if target is not None and not hasattr(target, "__path__"):
            del sys.modules[argv[2]]
        try:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:
            traceback.print_exc()
            code = 1
        # What the interpreter does at exit: wait for non-daemon threads, run atexit.
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
    finally:
        os._exit(code & 0xFF if code >= 0 else 1)


def _settle() -> None:
    """Make what is imported cheap to share with the children: finish the pydantic models
    that build lazily (each child would rebuild them on first use), then move every object
    out of the collector's reach, so that a child's collections do not write to (and so
    copy) the pages it shares with the server."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None:
        base = pydantic.BaseModel
        pending = list(base.__subclasses__())
        while pending:
            model = pending.pop()
            pending.extend(model.__subclasses__())
            if not getattr(model, "__pydantic_complete__", True):
                with contextlib.suppress(Exception):  # (one it cannot finish stays lazy)
                    model.model_rebuild()
    gc.collect()
    gc.freeze()


def _serve(fd: int, preload: Sequence[str]) -> None:
    setproctitle.setproctitle(f"shoal fork server (for pid {os.getppid()})")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the leader's to handle)
    for module in preload:
        importlib.import_module(module)
    _settle()
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    selector = selectors.DefaultSelector()

    def send(msg: dict[str, Any]) -> None:
        sock.sendall(orjson.dumps(msg) + b"\n")

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def spawn(request: dict[str, Any]) -> None:
        rid = request.get("id")
        argv = request.get("argv") or []
        if forkable(argv) is None:
            send({"id": rid, "error": f"not a `{sys.executable} -m MODULE` command: {argv}"})
            return
        try:
            fresh = [m for m in request.get("preload") or () if m not in sys.modules]
            for module in fresh:
                importlib.import_module(module)
        except Exception as exc:
            send({"id": rid, "error": f"cannot import {module}: {exc}"})
            return
        if fresh:
            _settle()
        if threading.active_count() != 1:
            send({"id": rid, "error": "the fork server has threads; it cannot fork safely"})
            return
        log = request.get("log")
        if log:  # (checked here so that the caller hears why, not only the child's log)
            try:
                os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                                 FILE_MODE))  # fmt: skip
            except OSError as exc:
                send({"id": rid, "error": f"cannot open log {log}: {exc}"})
                return
        if not os.path.isdir(request.get("cwd") or ""):
            send({"id": rid, "error": f"working directory {request.get('cwd')!r} does not exist"})
            return
        pid = os.fork()
        if pid == 0:
            _child(request, [fd, wake_r, wake_w, selector.fileno()])
        children.add(pid)
        send({"id": rid, "pid": pid})

    selector.register(sock, selectors.EVENT_READ, "client")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    send({"ready": True, "pid": os.getpid()})
    buf = b""
    while True:
        for key, _ in selector.select(timeout=5.0):
            if key.data == "signal":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                continue
            data = sock.recv(65536)
            if not data:
                return  # the client is gone; the children go on without us
            buf += data
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                request = orjson.loads(line)
                if request.get("op") == "spawn":
                    spawn(request)
        reap()


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # (the client went away)
        _serve(int(sys.argv[1]), sys.argv[2:])
