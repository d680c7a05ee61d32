"""Teammates as background processes: a new session each, output into a log file.

A teammate's command line is `python -m shoal worker ...`; rather than a new interpreter that
imports shoal again (about half a second of CPU each), the process's fork server (one per
leader process, `core/forkserver.py`) forks it from a process that has those imports done.
`SHOAL_FORKSERVER=0` starts every teammate as a new interpreter instead; a fork server that
cannot start or dies is said once on stderr, and teammates then start as new interpreters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import ClassVar, Final

from shoal.core import forkserver
from shoal.core.errors import ShoalError
from shoal.core.paths import FILE_MODE
from shoal.core.procs import is_alive, process_start_time, terminate
from shoal.teams.backends.base import Handle, SpawnSpec

STOP_GRACE_S = 5.0

# What a worker imports, done once in the fork server (names, not imports: the server loads
# them; nothing here depends on those layers).
WORKER_PRELOAD: Final = (
    "shoal.cli.entry",
    "shoal.cli.main",
    "shoal.cli.worker",
    "shoal.workers.teammate.worker",
    "shoal.mailbox.watcher",
)

_client: forkserver.ForkClient | None = None
_client_lock = threading.Lock()
_said_broken = False


def fork_client() -> forkserver.ForkClient | None:
    """This process's fork server client (its server started with the first teammate), or
    None when it is turned off or broke."""
    global _client
    if not forkserver.enabled():
        return None
    with _client_lock:
        if _client is None:
            _client = forkserver.ForkClient(WORKER_PRELOAD)
        return _client if _client.broken is None else None


def say_broken(why: str) -> None:
    """Say once, on stderr (the leader's log), that teammates no longer start as forks."""
    global _said_broken
    if not _said_broken:
        _said_broken = True
        print(f"shoal: note: {why}; teammates start as new interpreters", file=sys.stderr)


class ProcessBackend:
    """Popen in a new session; liveness from pid + start time."""

    name: ClassVar[str] = "process"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._forked: dict[int, forkserver.ForkClient] = {}
        self._started: dict[int, float | None] = {}

    def available(self) -> tuple[bool, str]:
        return True, "always available"

    def spawn(self, spec: SpawnSpec) -> Handle:
        client = fork_client() if forkserver.forkable(spec.argv) else None
        if client is not None:
            try:
                pid = client.spawn(
                    spec.argv,
                    cwd=spec.cwd,
                    env={**os.environ, **spec.env, **spec.secret_env},
                    log=str(spec.log_file) if spec.log_file is not None else None,
                )
            except forkserver.ForkServerError as exc:
                say_broken(str(exc))  # (this teammate starts the usual way)
            except OSError as exc:
                raise ShoalError(f"cannot start teammate {spec.name!r}: {exc}") from None
            else:
                self._forked[pid] = client
                self._started[pid] = process_start_time(pid)
                return Handle(backend=self.name, pid=pid)
        log = spec.log_file
        out: int | None = None
        if log is not None:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            proc = subprocess.Popen(
                spec.argv,
                cwd=spec.cwd,
                env={**os.environ, **spec.env, **spec.secret_env},
                stdin=subprocess.DEVNULL,
                stdout=out if out is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ShoalError(f"cannot start teammate {spec.name!r}: {exc}") from None
        finally:
            if out is not None:
                os.close(out)
        self._children[proc.pid] = proc
        self._started[proc.pid] = process_start_time(proc.pid)
        return Handle(backend=self.name, pid=proc.pid)

    def is_alive(self, handle: Handle) -> bool:
        if handle.pid is None:
            return False
        child = self._children.get(handle.pid)
        if child is not None:
            return child.poll() is None
        forked = self._forked.get(handle.pid)
        if forked is not None:
            running = forked.running(handle.pid)
            if running is not None:  # (the server's word: no /proc reads for each teammate)
                return running
        return is_alive(handle.pid, self._started.get(handle.pid))

    def exit_code(self, handle: Handle) -> int | None:
        """The exit code of a teammate this backend started, once it ended."""
        pid = handle.pid or -1
        forked = self._forked.get(pid)
        if forked is not None:
            return forked.exit_code(pid)
        child = self._children.get(pid)
        return None if child is None else child.poll()

    def kill(self, handle: Handle) -> None:
        if handle.pid is None:
            return
        terminate(handle.pid, self._started.get(handle.pid), grace=STOP_GRACE_S, group=True)
        child = self._children.get(handle.pid)
        if child is not None:
            child.poll()

    def close(self, team: str) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]
        for pid, forked in list(self._forked.items()):
            if forked.exit_code(pid) is not None:
                del self._forked[pid]
