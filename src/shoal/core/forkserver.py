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

A tmux teammate's pane runs a small stub (teams/backends/pane_stub.py) that hands its terminal
to a forked worker: for those the server also listens on an abstract unix socket whose name its
client chose at random (`tty_address`). Only a peer of the same user is answered (checked with
SO_PEERCRED), one request per connection: `{"op": "spawn_tty", "argv", "cwd", "env"}` with
the pane's fds 0, 1 and 2 passed along (SCM_RIGHTS). The worker is forked onto them; the
stub gets `{"pid": PID}`, later `{"exit": CODE}`. A stub whose connection closes while its
worker runs (it was killed) gets its worker hung up (HUP, then KILL after a grace); when the
server itself goes, these workers go on like the others.

Protocol: one JSON object a line. Client -> server: `{"op": "spawn", "id": N, "argv": [...],
"cwd": DIR, "env": {...}, "log": PATH|null, "preload": [MODULE, ...]}`. Server -> client:
`{"id": N, "pid": PID}` or `{"id": N, "error": TEXT}`, and `{"exit": PID, "code": CODE}` when
a child ends (code as `subprocess` gives it: negative for a signal).

This module is the client's side (`ForkClient`, in the leader's process); the server's own
process is forkhost.py.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import orjson

ENV_DISABLE: Final = "SHOAL_FORKSERVER"
"""Set to 0 to start every child as a new interpreter (no fork server)."""
READY_TIMEOUT_S: Final = 60.0
DRAIN_INTERVAL_S: Final = 0.02


@functools.cache
def _running_binary() -> str | None:
    """The interpreter binary this process runs (None where /proc cannot say)."""
    try:
        return os.path.realpath(os.readlink("/proc/self/exe"))
    except OSError:
        return None


def _this_interpreter(program: str) -> bool:
    """Whether `program` is this interpreter: `sys.executable` and the binary it runs (a
    command naming something else, such as a wrapper script, is that program's to run)."""
    if program != sys.executable:
        return False
    binary = _running_binary()
    return binary is None or os.path.realpath(program) == binary


def forkable(argv: Sequence[str]) -> str | None:
    """The module of a `python -m MODULE ...` command line of this interpreter, else None."""
    if len(argv) >= 3 and argv[1] == "-m" and _this_interpreter(argv[0]):
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
        name = f"shoal-fork-{os.getuid()}-{secrets.token_hex(12)}"
        self.tty_address = name.encode().hex()
        """The abstract socket name (hex) where panes ask for a worker on their terminal."""

    # -- the server's life ----------------------------------------------------------------------

    def _start(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        if self.broken is not None:
            raise ForkServerError(self.broken)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shoal.core.forkhost",
                    str(theirs.fileno()),
                    self.tty_address,
                    *self._preload,
                ],
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

    def ensure_started(self) -> str:
        """Start the server if it is not running; the address panes connect to (hex).
        ForkServerError when it cannot be used."""
        with self._lock:
            self._start()
            return self.tty_address

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
