"""The runner's side of an agent's status file (`agents/{task_id}.status.json`, see job.py):
its progress, throttled to one write each STATUS_INTERVAL_S, with what it waits on, its
running foreground commands and a worker's lease violations written at once; then the
outcome, the one write that must not be dropped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import NoSpaceError, ShoalError
from shoal.workers.agent.job import AgentStatus, JobOutcome
from shoal.workers.agent.progress import Progress

# Progress is written at most this often (the outcome at once).
STATUS_INTERVAL_S: Final = 0.25


class StatusWriter:
    """The runner's side of the status file: progress (throttled), then the outcome."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        self.note: str | None = None
        self.waiting: dict[str, Any] | None = None  # the permission request it waits on
        self.commands: dict[int, float | None] = {}  # running foreground commands: pgid -> start
        self.violations: list[dict[str, Any]] = []  # a worker's changes outside its lease
        self._written = 0.0
        self._progress: dict[str, Any] = {}
        self._tracker: Progress | None = None  # (its messages and drained count go along)

    def progress(self, progress: Progress, *, force: bool = False) -> None:
        self._progress = progress.to_record()
        self._tracker = progress
        now = time.monotonic()
        if force or now - self._written >= STATUS_INTERVAL_S:
            self._written = now
            self._save(AgentStatus(pid=self.pid, progress=self._progress))

    def track(self, pgid: int, running: bool) -> None:
        """A foreground command's process group started (listed at once) or ended."""
        from shoal.core.procs import process_start_time

        if running:
            self.commands[pgid] = process_start_time(pgid)
        else:
            self.commands.pop(pgid, None)
        self.flush()

    def violation(self, command: str, paths: list[str]) -> None:
        """A worker's Bash command changed `paths` outside its lease: recorded at once."""
        self.violations.append({"command": command[:500], "paths": paths[:100], "at": time.time()})
        self.flush()

    def flush(self) -> None:
        """Write the latest progress (and what it waits on) now."""
        self._written = time.monotonic()
        self._save(AgentStatus(pid=self.pid, progress=self._progress))

    def done(self, outcome: JobOutcome, undrained: list[str]) -> None:
        """Write the outcome; on a full disk NoSpaceError (the one write that must not be
        dropped: the caller names the cause)."""
        self._save(
            AgentStatus(
                state="done",
                pid=self.pid,
                progress=self._progress,
                outcome=outcome,
                undrained=tuple(undrained),
            ),
            final=True,
        )

    def _save(self, status: AgentStatus, *, final: bool = False) -> None:
        update: dict[str, Any] = {
            "note": self.note,
            "waiting": self.waiting,
            "commands": tuple((pgid, started) for pgid, started in self.commands.items()),
            "violations": tuple(self.violations),
            "updated_at": time.time(),
        }
        if self._tracker is not None:
            update["drained"] = self._tracker.drained
            update["messages"] = tuple(self._tracker.messages)
            update["from_disk"] = self._tracker.from_disk
        status = status.model_copy(update=update)
        try:
            status.save(self.path)
        except (ShoalError, OSError) as exc:  # (progress on a full disk: the next write retries)
            if final and isinstance(exc, NoSpaceError):
                raise
