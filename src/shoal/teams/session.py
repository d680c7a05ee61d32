"""A leader session on disk: its directory, its validated state (`state.json`), and the
writers of its append-only logs (`events.jsonl`, `history.jsonl`).

`state.json` (the registry snapshot) holds plain data only (pids and start times, never
handles) and is replaced atomically; `events.jsonl` is the event stream; finished tasks leave
the registry once notified and their final record is appended to `history.jsonl`, so
`ps --all` and `wait` still find them. Resuming a session is the leader's
(orchestrator/session.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.core.errors import CorruptFileError, NoSpaceError, NotFoundError, is_no_space
from shoal.core.events import Event, parse_event
from shoal.core.ids import new_ulid, ulid_from_bytes
from shoal.core.jsonio import append_line, atomic_write, read_bytes_nofollow
from shoal.core.paths import FILE_MODE, Layout
from shoal.core.tasks import AnyTaskState, TaskState
from shoal.teams.session_files import HistoryReader as HistoryReader
from shoal.teams.session_files import SessionFiles, current_session_files


class LeaderInfo(BaseModel):
    """Which process leads the session."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    pid: int
    started_at: float
    jobs: int = 0


class GroupState(BaseModel):
    """A task group of the session (`groups` of state.json)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    parallel: int = 0
    paused: bool = False


class SessionState(BaseModel):
    """The content of `sessions/{id}/state.json`."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    v: int = 1
    session_id: str
    team: str
    created_at: float
    updated_at: float
    leader: LeaderInfo | None = None
    tasks: dict[str, TaskState] = Field(default_factory=dict)
    groups: dict[str, GroupState] = Field(default_factory=dict)
    """Task groups by name (`shoal group`): their parallelism and whether they are paused."""


class Session(SessionFiles):
    """Paths and files of one session directory: its reads (SessionFiles), the validated
    state, and the writers."""

    def __init__(self, layout: Layout, session_id: str) -> None:
        super().__init__(layout, session_id)
        self._fds: dict[Path, int] = {}
        # Events a full disk held back (in order), and the error that held them.
        self._unwritten: deque[dict[str, Any]] = deque()
        self.write_error: NoSpaceError | None = None

    def team_name(self) -> str:
        """The team this session belongs to (from its state)."""
        return self.read_state().team

    def ensure(self) -> Session:
        """Create the session directories (0700, no symlinks)."""
        for sub in ("tasks", "transcripts", "remote", "agents"):
            self.layout.ensure(self.dir / sub)
        return self

    # -- state -------------------------------------------------------------------------------

    def read_state(self) -> SessionState:
        """The validated state; NotFoundError when absent, CorruptFileError when invalid."""
        try:
            raw = read_bytes_nofollow(self.state_file)
        except FileNotFoundError:
            raise NotFoundError(f"no session state at {self.state_file}") from None
        try:
            return SessionState.model_validate(orjson.loads(raw))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            reason = str(exc).splitlines()[0]
            raise CorruptFileError(self.state_file, f"invalid session state: {reason}") from None

    def write_state(self, state: SessionState) -> None:
        """Replace state.json atomically."""
        self.write_state_bytes(orjson.dumps(state.model_dump(mode="json")))

    def write_state_bytes(self, raw: bytes) -> None:
        """Replace state.json atomically with already-encoded state."""
        atomic_write(self.state_file, raw)

    def set_aside(self) -> Path:
        """Move a corrupt state.json out of the way (kept for inspection); returns where."""
        target = self.dir / f"state.json.corrupt-{int(time.time())}"
        os.replace(self.state_file, target)
        return target

    # -- append-only logs ----------------------------------------------------------------------

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        """One O_APPEND write of one JSON line (the fd stays open for the next record); on a
        full disk NoSpaceError, with no torn line left behind."""
        fd = self._fds.get(path)
        if fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = self._fds[path] = os.open(path, flags, FILE_MODE)
            except OSError as exc:
                if is_no_space(exc):
                    raise NoSpaceError.from_os_error(exc, path) from None
                raise
        append_line(fd, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE), path)

    def close(self) -> None:
        """Write the events still held in memory if the disk lets it, then close the logs."""
        self.flush_events()
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def emit(self, event: Event) -> Event:
        """Append an event (stamped with `session_id` and `ts`) to events.jsonl; returns it.

        On a full disk the event is kept in memory, in order behind any kept before it, and
        written by a later `emit` or `flush_events`; `write_error` says why, `unwritten` how
        many wait. The caller still gets the event (it happened; only its line is late).
        """
        stamped = event.stamped(self.id, time.time())
        self._unwritten.append(stamped.to_record())
        self.flush_events()
        return stamped

    def flush_events(self) -> bool:
        """Write the events held in memory, oldest first; True once none is left."""
        while self._unwritten:
            try:
                self._append(self.events_file, self._unwritten[0])
            except NoSpaceError as exc:
                self.write_error = exc
                return False
            self._unwritten.popleft()
        self.write_error = None
        return True

    @property
    def unwritten(self) -> int:
        """How many events wait in memory for room on the disk."""
        return len(self._unwritten)

    def record_history(self, task: AnyTaskState) -> None:
        """Append the final record of a task that leaves the registry (NoSpaceError on a full
        disk: the caller keeps the task until it is written)."""
        self._append(self.history_file, task.model_dump(mode="json"))

    def clear_history(self, keep: Iterable[dict[str, Any]] = ()) -> None:
        """Empty the history (`shoal clean`) but for the records `keep`: replaced by a new
        file, the open append fd closed first so no later record goes to the old file."""
        fd = self._fds.pop(self.history_file, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        atomic_write(
            self.history_file,
            b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in keep),
        )

    def typed_events(self) -> Iterator[Event]:
        """Every event so far that this build knows, as its model."""
        for record in self.events():
            event = parse_event(record)
            if event is not None:
                yield event


def current_session(layout: Layout, team: str) -> Session | None:
    """The team's latest session (the team file's lead_session_id), if it has one on disk."""

    files = current_session_files(layout, team)
    return None if files is None else Session(layout, files.id)


def new_session_id() -> str:
    """A new session id (a lower-case ULID: time-ordered)."""
    return new_ulid().lower()


def notification_id(task_id: str) -> str:
    """A message id fixed by the task alone (a task ends once), so a notification re-sent after
    a crash — even with another end time — is the same message and handled once."""
    digest = hashlib.sha256(task_id.encode()).digest()
    return ulid_from_bytes(digest[:16])
