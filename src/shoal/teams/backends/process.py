"""Teammates as background processes: a new session each, output into a log file."""

from __future__ import annotations

import os
import subprocess
from typing import ClassVar

from shoal.core.errors import ShoalError
from shoal.core.paths import FILE_MODE
from shoal.core.procs import is_alive, process_start_time, terminate
from shoal.teams.backends.base import Handle, SpawnSpec

STOP_GRACE_S = 5.0


class ProcessBackend:
    """Popen in a new session; liveness from pid + start time."""

    name: ClassVar[str] = "process"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._started: dict[int, float | None] = {}

    def available(self) -> tuple[bool, str]:
        return True, "always available"

    def spawn(self, spec: SpawnSpec) -> Handle:
        log = spec.log_file
        out: int | None = None
        if log is not None:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            proc = subprocess.Popen(
                spec.argv,
                cwd=spec.cwd,
                env={**os.environ, **spec.env},
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
        return is_alive(handle.pid, self._started.get(handle.pid))

    def exit_code(self, handle: Handle) -> int | None:
        """The exit code of a teammate this backend started, once it ended."""
        child = self._children.get(handle.pid or -1)
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
