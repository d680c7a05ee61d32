"""A leader session on disk: `state.json` (registry snapshot), `events.jsonl`, `history.jsonl`.

`state.json` holds plain data only (pids and start times, never handles) and is replaced
atomically. Finished tasks leave the registry once notified; their final record is appended to
`history.jsonl`, so `ps --all` and `wait` still find them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.core.errors import CorruptFileError, NotFoundError
from shoal.core.jsonio import atomic_write, read_bytes_nofollow
from shoal.core.paths import FILE_MODE, Layout
from shoal.core.tasks import AnyTaskState, TaskState


class LeaderInfo(BaseModel):
    """Which process leads the session."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    pid: int
    started_at: float
    jobs: int = 0


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


class Session:
    """Paths and files of one session directory."""

    def __init__(self, layout: Layout, session_id: str) -> None:
        self.layout = layout
        self.id = session_id
        self.dir = layout.session_dir(session_id)
        self._fds: dict[Path, int] = {}

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def events_file(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def history_file(self) -> Path:
        return self.dir / "history.jsonl"

    @property
    def tasks_dir(self) -> Path:
        return self.dir / "tasks"

    def output_file(self, task_id: str) -> Path:
        return self.tasks_dir / f"{task_id}.output"

    def team_name(self) -> str:
        """The team this session belongs to (from its state)."""
        return self.read_state().team

    def ensure(self) -> Session:
        """Create the session directories (0700, no symlinks)."""
        for sub in ("tasks", "transcripts", "remote"):
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

    def read_tasks_raw(self) -> dict[str, dict[str, Any]]:
        """The tasks of state.json as the plain dicts the leader wrote, unvalidated: for
        readers that poll (`ps`, `wait`, `logs -f`) and only show them. {} when absent."""
        try:
            raw = read_bytes_nofollow(self.state_file)
        except FileNotFoundError:
            return {}
        try:
            tasks = orjson.loads(raw).get("tasks")
        except (orjson.JSONDecodeError, AttributeError):
            tasks = None
        if not isinstance(tasks, dict) or not all(
            isinstance(t, dict) and "status" in t for t in tasks.values()
        ):
            raise CorruptFileError(self.state_file, "invalid session state: no task table")
        return tasks

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
        """One O_APPEND write of one JSON line (the fd stays open for the next record)."""
        fd = self._fds.get(path)
        if fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = self._fds[path] = os.open(path, flags, FILE_MODE)
        os.write(fd, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        """Close the append-only logs this object holds open."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def emit(self, event: dict[str, Any]) -> dict[str, Any]:
        """Append an event record (with `session_id` and `ts`) to events.jsonl."""
        record = {**event, "session_id": self.id, "ts": time.time()}
        self._append(self.events_file, record)
        return record

    def record_history(self, task: AnyTaskState) -> None:
        """Append the final record of a task that leaves the registry."""
        self._append(self.history_file, task.model_dump(mode="json"))

    def events(self) -> Iterator[dict[str, Any]]:
        """Every event so far (a torn last line, from a crash mid-write, is skipped)."""
        yield from _read_jsonl(self.events_file)

    def history(self) -> dict[str, dict[str, Any]]:
        """Final records of evicted tasks by id (a poller keeps a HistoryReader instead)."""
        return HistoryReader(self).read()


class HistoryReader:
    """A session's history read incrementally: each `read()` parses only what was appended
    since the last one (a poller of a long session would otherwise re-read it all)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.records: dict[str, dict[str, Any]] = {}
        self._offset = 0

    def read(self) -> dict[str, dict[str, Any]]:
        """Final records of evicted tasks by id, up to the last complete line."""
        try:
            fd = os.open(self.session.history_file, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return self.records
        with os.fdopen(fd, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        for line in data[:end].splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict) and "id" in record:
                    self.records[record["id"]] = record
        self._offset += end
        return self.records


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as fh:
        for line in fh:
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict):
                    yield record


def current_session(layout: Layout, team: str) -> Session | None:
    """The team's latest session (the team file's lead_session_id), if it has one on disk."""
    from shoal.teams.store import Teams

    tf = Teams(layout).read(team)
    if not tf.lead_session_id:
        return None
    session = Session(layout, tf.lead_session_id)
    return session if session.dir.is_dir() else None
