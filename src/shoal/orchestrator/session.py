"""A leader session on disk, and how a leader resumes it and announces what ended.

`state.json` (the registry snapshot) holds plain data only (pids and start times, never
handles) and is replaced atomically; `events.jsonl` is the event stream; finished tasks leave
the registry once notified and their final record is appended to `history.jsonl`, so
`ps --all` and `wait` still find them.

Resume (`resume`): the team file names the last session; its state.json is read (a corrupt
one is set aside and a new session begun), every task is registered again, and each kind
adopts its live tasks: a process still running (same pid *and* start time) is watched again,
one that ended meanwhile gets the exit code its wrapper recorded on disk, one that never
started is queued. What the event stream says was announced or notified is not announced
again, even where state.json (written at most every 0.2 s) lags behind it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.core.errors import CorruptFileError, NoSpaceError, NotFoundError, is_no_space
from shoal.core.events import (
    Event,
    TaskNotified,
    TaskTerminated,
    parse_event,
    task_notified,
    task_terminated,
)
from shoal.core.ids import new_ulid, ulid_from_bytes
from shoal.core.jsonio import append_line, atomic_write, read_bytes_nofollow
from shoal.core.notify import summary_for
from shoal.core.paths import FILE_MODE, Layout
from shoal.core.secretenv import lost_env_error
from shoal.core.tasks import (
    AnyTaskState,
    LocalShellTaskState,
    TaskState,
    TaskStatus,
    TaskType,
    missing_env,
)
from shoal.orchestrator.session_files import HistoryReader as HistoryReader
from shoal.orchestrator.session_files import SessionFiles, _read_jsonl, current_session_files
from shoal.workers.kinds import TaskKind, TaskStore


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

    def clear_history(self) -> None:
        """Empty the history (`shoal clean`): replaced by an empty file, the open append fd
        closed first so no later record goes to the old file."""
        fd = self._fds.pop(self.history_file, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        atomic_write(self.history_file, b"")

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


class Snapshot:
    """Writes the registry to state.json: only when something changed, at most every so often.

    The throttle is safe because what a crash must not lose is on disk per task anyway (output
    file, the wrapper's pid and exit files). Each task's JSON is kept between writes and
    re-encoded only when the (immutable) task object changed. `announced` holds the tasks
    whose end is in the event stream (so a resumed leader does not announce them again).
    """

    def __init__(self) -> None:
        self.dirty = True
        self.last_write = 0.0
        self.announced: set[str] = set()
        self._cache: dict[str, tuple[AnyTaskState, orjson.Fragment]] = {}

    def due(self, interval: float) -> bool:
        return self.dirty and time.monotonic() - self.last_write >= interval

    def write(
        self,
        session: Session,
        team: str,
        created_at: float,
        leader: Mapping[str, Any] | None,
        tasks: _Tasks,
        groups: Mapping[str, Any] | None = None,
    ) -> None:
        self.last_write = time.monotonic()
        fragments: dict[str, orjson.Fragment] = {}
        cache = self._cache
        for task in tasks.get_all_tasks():
            hit = cache.get(task.id)
            if hit is None or hit[0] is not task:
                hit = (task, orjson.Fragment(orjson.dumps(task.model_dump(mode="json"))))
                cache[task.id] = hit
            fragments[task.id] = hit[1]
        for gone in [k for k in cache if k not in fragments]:
            del cache[gone]
        session.write_state_bytes(
            orjson.dumps(
                {
                    "v": 1,
                    "session_id": session.id,
                    "team": team,
                    "created_at": created_at,
                    "updated_at": time.time(),
                    "leader": leader,
                    "tasks": fragments,
                    **({"groups": groups} if groups else {}),
                }
            )
        )
        self.dirty = False


class _Tasks(Protocol):
    def get_all_tasks(self) -> list[AnyTaskState]: ...


class SessionHost(TaskStore, Protocol):
    """What resuming and notifying need of the leader."""

    layout: Layout
    session: Session
    created_at: float
    snapshot: Snapshot
    kinds: dict[TaskType, TaskKind]
    queue: deque[str]

    def new_session(self, session_id: str | None = None) -> Session: ...

    def register(self, task: AnyTaskState) -> AnyTaskState: ...


def resume(host: SessionHost, session_id: str | None) -> bool:
    """Lead session `session_id` again if its state is on disk (True), else a new one."""
    # (a link planted at the session's directory is refused here, not taken for no session)
    if (
        not session_id
        or not host.layout.checked(Session(host.layout, session_id).state_file).exists()
    ):
        host.new_session()
        return False
    session = host.new_session(session_id)
    try:
        state = session.read_state()
    except CorruptFileError as exc:
        aside = session.set_aside()
        session.close()
        host.new_session()
        host.note(f"{exc}; moved it to {aside} and started a new session")
        return False
    announced, notified = _ended_in_stream(session)
    host.snapshot.announced = announced
    host.created_at = state.created_at
    for task in state.tasks.values():
        host.register(task)
        if task.is_terminal:
            continue
        kind = host.kinds.get(task.type)
        if kind is None:
            host.move_task(
                task.id, TaskStatus.FAILED, error=f"this build cannot run {task.type.value} tasks"
            )
            continue
        kind.adopt(task, host)
        current = host.get(task.id)
        if current is not None and current.status == TaskStatus.PENDING:
            lost = missing_env(current)
            if lost:  # (its --env values died with the leader that held them)
                error = lost_env_error(task.id, lost)
                host.move_task(task.id, TaskStatus.FAILED, error=error)
                continue
            host.queue.append(task.id)
    for task_id in notified:  # (a no-op for tasks state.json already has as notified)
        host.mark_notified(task_id)
    return True


def _ended_in_stream(session: Session) -> tuple[set[str], set[str]]:
    """(tasks whose end was announced, tasks whose notification was sent) per the stream.

    Read as plain records, not as event models: a resume reads every end of a long session
    (validating them was 40 % of reading a stream of 90,000 tasks' events)."""
    announced: set[str] = set()
    notified: set[str] = set()
    ids_of = {
        TaskTerminated.model_fields["subtype"].default: announced,
        TaskNotified.model_fields["subtype"].default: notified,
    }
    marks = [f'"{subtype}"'.encode() for subtype in ids_of]
    for record in _read_jsonl(session.events_file, marks):
        ids = ids_of.get(record.get("subtype"))
        task_id = record.get("task_id")
        if ids is not None and record.get("type") == "system" and isinstance(task_id, str):
            ids.add(task_id)
    return announced, notified


def _run_id(task: AnyTaskState) -> str:
    """The id of this run of a task: its id, with the run's number once restarted in place."""
    restarts = task.restarts if isinstance(task, LocalShellTaskState) else 0
    return f"{task.id}.{restarts}" if restarts else task.id


def notify_once(host: SessionHost, task: AnyTaskState, extras: Mapping[str, Any]) -> bool:
    """Announce a terminal task's end and send its one notification (atomic check-and-set of
    `notified`: False when it was sent already)."""
    if not host.mark_notified(task.id):
        return False
    final = host.get(task.id) or task
    summary = summary_for(final)
    if final.id not in host.snapshot.announced:
        host.emit(task_terminated(final, summary))
        host.snapshot.announced.add(final.id)
    event = task_notified(final, summary, extras)
    host.notify_owner(
        final,
        event.notification,
        summary,
        status=final.status.value,
        # (a task run again in place ends again: its notification is a new message)
        msg_id=notification_id(_run_id(final)),
    )
    host.emit(event)
    return True
