"""The fork server's own process (`python -m shoal.core.forkhost FD TTY_ADDRESS PRELOAD...`):
it imports the preloaded modules once, then forks a child for each spawn request of its one
client (forkserver.py, where the protocol is described) and for each tmux pane stub that asks
on its abstract socket, and reports each child's end. Single-threaded: forking a process with
threads is unsafe.
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
import sys
import threading
import time
import traceback
from array import array
from collections.abc import Sequence
from typing import Any, Final

import orjson
import setproctitle

from shoal.core.forkserver import forkable

FILE_MODE: Final = 0o600
HANGUP_GRACE_S: Final = 5.0
"""How long a worker whose pane stub died has between HUP and KILL."""
TTY_REQUEST_TIMEOUT_S: Final = 2.0
MAX_TTY_REQUEST: Final = 4 * 1024 * 1024


def _child(
    request: dict[str, Any], keep_closed: list[int], stdio: Sequence[int] | None = None
) -> None:
    """In the forked child: become the command `argv`, then exit as the interpreter would.
    With `stdio` (a pane's terminal, passed by its stub), those are its fds 0, 1 and 2."""
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
        if stdio is not None:
            for number, fd in enumerate(stdio):
                os.dup2(fd, number)
            for fd in set(stdio) - {0, 1, 2}:
                os.close(fd)
        else:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            log = request.get("log")
            if log:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                out = os.open(log, flags, FILE_MODE)
            else:
                out = os.open(os.devnull, os.O_WRONLY)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
        _fresh_stdio()
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


def _fresh_stdio() -> None:
    """New `sys.stdin`, `stdout` and `stderr` for the child's fds 0-2, as an interpreter
    starting on them would make: the server's were made for /dev/null and believe their
    files seekable, which a terminal is not (a flush then fails with ESPIPE)."""
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    errors = sys.stdout.errors if sys.stdout is not None else "strict"
    tty = os.isatty(1)
    sys.stdin = open(  # noqa: SIM115 (they live as long as the process)
        0, encoding=encoding, errors=errors, closefd=False
    )
    sys.stdout = open(  # noqa: SIM115
        1, "w", buffering=1 if tty else -1, encoding=encoding, errors=errors, closefd=False
    )
    sys.stderr = open(  # noqa: SIM115
        2, "w", buffering=1, encoding=encoding, errors="backslashreplace", closefd=False
    )


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


def _receive_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A pane stub's request line and the fds that came with it (ValueError when it is not
    one, the fds then closed)."""
    conn.settimeout(TTY_REQUEST_TIMEOUT_S)
    fds: list[int] = []
    buf = b""
    try:
        while not buf.endswith(b"\n"):
            data, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                    fds += got.tolist()
            if not data:
                raise ValueError("the connection closed before a whole request")
            buf += data
            if len(buf) > MAX_TTY_REQUEST:
                raise ValueError("the request is too long")
        request = orjson.loads(buf)
        if not isinstance(request, dict) or request.get("op") != "spawn_tty" or len(fds) != 3:
            raise ValueError("not a spawn_tty request with three fds")
    except (OSError, ValueError) as exc:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise ValueError(str(exc)) from None
    return request, fds


def _serve(fd: int, tty_address: str, preload: Sequence[str]) -> None:
    setproctitle.setproctitle(f"shoal fork server (for pid {os.getppid()})")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the leader's to handle)
    for module in preload:
        importlib.import_module(module)
    _settle()
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(b"\0" + bytes.fromhex(tty_address))
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    stubs: dict[int, socket.socket] = {}  # a pane's worker -> its stub's connection
    doomed: dict[int, float] = {}  # a worker whose stub died -> when it gets KILL
    selector = selectors.DefaultSelector()

    def send(msg: dict[str, Any]) -> None:
        sock.sendall(orjson.dumps(msg) + b"\n")

    def held() -> list[int]:
        """The fds a child must not keep."""
        return [fd, listener.fileno(), wake_r, wake_w, selector.fileno()] + [
            c.fileno() for c in stubs.values()
        ]

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            doomed.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            stub = stubs.pop(pid, None)
            if stub is None:
                send({"exit": pid, "code": code})
                continue
            with contextlib.suppress(OSError):
                selector.unregister(stub)
            with contextlib.suppress(OSError):
                stub.sendall(orjson.dumps({"exit": code}) + b"\n")
            stub.close()

    def checked(request: dict[str, Any]) -> str | None:
        """Why `request` cannot be forked, or None."""
        argv = request.get("argv") or []
        if forkable(argv) is None:
            return f"not a `{sys.executable} -m MODULE` command: {argv}"
        try:
            fresh = [m for m in request.get("preload") or () if m not in sys.modules]
            for module in fresh:
                importlib.import_module(module)
        except Exception as exc:
            return f"cannot import {module}: {exc}"
        if fresh:
            _settle()
        if threading.active_count() != 1:
            return "the fork server has threads; it cannot fork safely"
        if not os.path.isdir(request.get("cwd") or ""):
            return f"working directory {request.get('cwd')!r} does not exist"
        return None

    def spawn(request: dict[str, Any]) -> None:
        rid = request.get("id")
        problem = checked(request)
        if problem is not None:
            send({"id": rid, "error": problem})
            return
        log = request.get("log")
        if log:  # (checked here so that the caller hears why, not only the child's log)
            try:
                os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                                 FILE_MODE))  # fmt: skip
            except OSError as exc:
                send({"id": rid, "error": f"cannot open log {log}: {exc}"})
                return
        pid = os.fork()
        if pid == 0:
            _child(request, held())
        children.add(pid)
        send({"id": rid, "pid": pid})

    def spawn_tty() -> None:
        conn, _ = listener.accept()
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            uid = int.from_bytes(creds[4:8], sys.byteorder)
            if uid != os.getuid():
                raise ValueError(f"a peer of uid {uid} is not answered")
            request, fds = _receive_request(conn)
        except (OSError, ValueError):
            conn.close()
            return
        try:
            problem = checked(request)
            if problem is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(orjson.dumps({"error": problem}) + b"\n")
                conn.close()
                return
            try:
                pid = os.fork()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    conn.sendall(orjson.dumps({"error": f"cannot fork: {exc}"}) + b"\n")
                conn.close()
                return
            if pid == 0:
                _child(request, [*held(), conn.fileno()], stdio=fds)
        finally:
            for passed in fds:
                os.close(passed)
        children.add(pid)
        try:
            conn.settimeout(TTY_REQUEST_TIMEOUT_S)
            conn.sendall(orjson.dumps({"pid": pid}) + b"\n")
        except OSError:
            pass  # (its stub is gone: the selector sees the close, and the worker is hung up)
        conn.setblocking(False)
        stubs[pid] = conn
        selector.register(conn, selectors.EVENT_READ, pid)

    def stub_gone(pid: int) -> None:
        """The stub of worker `pid` closed its connection (it was killed): hang up."""
        conn = stubs.pop(pid, None)
        if conn is not None:
            selector.unregister(conn)
            conn.close()
        if pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGHUP)
            doomed[pid] = time.monotonic() + HANGUP_GRACE_S

    selector.register(sock, selectors.EVENT_READ, "client")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    selector.register(listener, selectors.EVENT_READ, "listener")
    send({"ready": True, "pid": os.getpid()})
    buf = b""
    while True:
        now = time.monotonic()
        timeout = min([5.0, *(max(0.0, t - now) for t in doomed.values())])
        for key, _ in selector.select(timeout=timeout):
            if key.data == "signal":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                continue
            if key.data == "listener":
                spawn_tty()
                continue
            if isinstance(key.data, int):  # a stub: it says nothing after its request
                try:
                    alive = key.fileobj.recv(1) != b""  # type: ignore[union-attr]
                except BlockingIOError:
                    alive = True
                except OSError:
                    alive = False
                if not alive:
                    stub_gone(key.data)
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
        now = time.monotonic()
        for pid in [p for p, t in doomed.items() if t <= now]:
            del doomed[pid]
            if pid in children:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # (the client went away)
        _serve(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
