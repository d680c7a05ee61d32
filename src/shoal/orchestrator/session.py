"""How a leader resumes a session (teams/session.py) and announces what ended.

Resume (`resume`): the team file names the last session; its state.json is read (a corrupt
one is set aside and a new session begun), every task is registered again, and each kind
adopts its live tasks: a process still running (same pid *and* start time) is watched again,
one that ended meanwhile gets the exit code its wrapper recorded on disk, one that never
started is queued. What the event stream says was announced or notified is not announced
again, even where state.json (written at most every 0.2 s) lags behind it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from shoal.core.errors import CorruptFileError
from shoal.core.events import (
    TaskNotified,
    TaskTerminated,
    task_notified,
    task_terminated,
)
from shoal.core.notify import summary_for
from shoal.core.paths import Layout
from shoal.core.secretenv import lost_env_error
from shoal.core.tasks import (
    AnyTaskState,
    LocalShellTaskState,
    TaskStatus,
    TaskType,
    missing_env,
)
from shoal.teams.session import Session
from shoal.teams.session import notification_id as notification_id
from shoal.teams.session_files import _read_jsonl
from shoal.workers.kinds import TaskKind, TaskStore


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


class StartQueue(Protocol):
    """The scheduler's queue of tasks waiting to start (scheduling.py)."""

    def enqueue(self, task_id: str, *, first: bool = False) -> None: ...


class SessionHost(TaskStore, Protocol):
    """What resuming and notifying need of the leader."""

    layout: Layout
    session: Session
    created_at: float
    snapshot: Snapshot
    kinds: dict[TaskType, TaskKind]

    @property
    def scheduler(self) -> StartQueue: ...

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
            host.scheduler.enqueue(task.id)
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
