"""The leader's task table as the task kinds, the swarm and resume see it (the store
interface of workers/kinds.py), with the session it is written to and the wake-up of the loop.

Everything here runs on the loop's thread but `wake`, which any thread may call.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from shoal.core.config import Limits
from shoal.core.errors import NoSpaceError, ShoalError, TaskError
from shoal.core.events import Event, Note
from shoal.core.paths import Layout
from shoal.core.procs import current_identity
from shoal.core.tasks import (
    AnyTaskState,
    LocalAgentTaskState,
    TaskStatus,
    parse_task_state,
    should_evict,
)
from shoal.core.taskupdates import evolve
from shoal.mailbox.router import notify_owner
from shoal.orchestrator.registry import TaskRegistry
from shoal.orchestrator.session import Snapshot
from shoal.teams.models import LEAD_NAME
from shoal.teams.session import HistoryReader, Session, new_session_id
from shoal.teams.store import Teams

EventSink = Callable[[Event], None]


class Policy(Protocol):
    """Something the `policy` step consults every pass (the batch engine of `shoal run`)."""

    def on_event(self, event: Event) -> None:
        """An event the leader emitted (called on the loop's thread, at once)."""
        ...

    def step(self, leader: Any, now: float) -> None:
        """Decide: submit tasks, stop tasks, or ask the leader to stop."""
        ...

    def next_due(self) -> float | None:
        """The next monotonic time the policy must run at, if any."""
        ...


class HeldBack:
    """What a full disk keeps in the leader's memory (events, state.json, history records,
    notifications), by kind: the leader notes the first failure of a spell once, retries each
    tick, and says so again when the last of it is written."""

    def __init__(self) -> None:
        self.kinds: dict[str, NoSpaceError] = {}
        # Steps that retry on their own and have said once that the disk is full.
        self.noted: set[str] = set()

    def failed(self, kind: str, exc: NoSpaceError) -> bool:
        """Record that `kind` could not be written; True if this begins a spell."""
        first = not self.kinds
        self.kinds[kind] = exc
        return first

    def written(self, kind: str) -> bool:
        """Record that `kind` is written; True if that ends the spell."""
        if self.kinds.pop(kind, None) is None or self.kinds:
            return False
        self.noted.clear()
        return True


class LeaderStore:
    """The registry, its snapshot on disk, the event stream, and the loop's wake-ups."""

    def __init__(
        self, layout: Layout, team: str, limits: Limits | None, on_event: EventSink | None
    ) -> None:
        self.layout = layout
        self.team = team
        self.teams = Teams(layout)
        self._limits = limits or Limits()
        self.on_event = on_event
        self.registry = TaskRegistry()
        self.session: Session
        self.created_at = time.time()
        self.notes: list[str] = []
        self.policies: list[Policy] = []
        self.snapshot = Snapshot()
        self.history_reader: HistoryReader | None = None  # (the session's, read as it grows)
        self._identity = current_identity()
        # What tasks inherit, as a plain dict: handing posix_spawn `os.environb` itself costs a
        # Python-level lookup per variable on every start.
        self._environ: dict[bytes, bytes] = dict(os.environb)
        self._waiters: dict[str, list[Callable[[AnyTaskState], None]]] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pidfds: dict[str, int] = {}
        self.held_back = HeldBack()
        # Owner notifications a full disk kept from their inbox, by task id (retried each tick).
        self._undelivered: dict[str, tuple[str, dict[str, Any]]] = {}
        # Tasks found evictable at the last full round: they leave at the next one (a view
        # that just saw a task end still finds it in state.json for a round).
        self._evictable: set[str] = set()

    def new_session(self, session_id: str | None = None) -> Session:
        """Lead session `session_id` (a new one by default)."""
        self.session = Session(self.layout, session_id or new_session_id()).ensure()
        return self.session

    @property
    def limits(self) -> Limits:
        return self._limits

    @property
    def environ(self) -> dict[bytes, bytes]:
        return self._environ

    @property
    def identity(self) -> tuple[int, float]:
        """(pid, start time) of the leader's process."""
        return self._identity

    @property
    def session_id(self) -> str:
        return self.session.id

    def get(self, task_id: str) -> AnyTaskState | None:
        return self.registry.get(task_id)

    def register(self, task: AnyTaskState) -> AnyTaskState:
        """Add a task to the registry (state.json is written on the next persist)."""
        stored = self.registry.register_task(task)
        self.snapshot.dirty = True
        return stored

    def update_task(self, task_id: str, updater: Callable[[Any], AnyTaskState]) -> bool:
        changed = self.registry.update_task_state(task_id, updater)
        if changed:
            self.snapshot.dirty = True
        return changed

    def set_task(self, task_id: str, **changes: Any) -> bool:
        """Change fields of a task (same values: no change, no write)."""
        return self.update_task(task_id, lambda t: evolve(t, **changes))

    def move_task(self, task_id: str, status: TaskStatus, **changes: Any) -> bool:
        """Move a task through the transition table (the registry checks the move)."""

        def move(task: AnyTaskState) -> AnyTaskState:
            if status == task.status:
                return task if task.is_terminal else evolve(task, **changes)
            return evolve(task, status=status, **changes)

        return self.update_task(task_id, move)

    def mark_notified(self, task_id: str) -> bool:
        marked = self.registry.mark_notified(task_id)
        self.snapshot.dirty = self.snapshot.dirty or marked
        return marked

    def history(self) -> dict[str, dict[str, Any]]:
        """Final records of evicted tasks by id, read as the history grows: the leader is its
        only writer, and a long session's history parsed whole on each lookup made every
        `sh --foreground` wait 40 ms after three thousand tasks. (On the loop's thread, as
        every read of the registry: the records are shared, not copied.)"""
        if self.history_reader is None or self.history_reader.session is not self.session:
            self.history_reader = HistoryReader(self.session)
        return self.history_reader.read()

    def workers_of(self, agent_id: str) -> list[LocalAgentTaskState]:
        """Every worker of coordinator `agent_id` in this session (live and evicted)."""
        found: dict[str, LocalAgentTaskState] = {}
        for raw in self.history().values():
            if raw.get("worker_of") == agent_id:
                task = parse_task_state(raw)
                if isinstance(task, LocalAgentTaskState):
                    found[task.id] = task
        for task in self.registry.get_all_tasks():
            if isinstance(task, LocalAgentTaskState) and task.worker_of == agent_id:
                found[task.id] = task
        return list(found.values())

    def find_agent(self, task_id: str) -> LocalAgentTaskState:
        """The agent task `task_id` (live, or from the session's history)."""
        task = self.registry.get(task_id)
        if task is None:
            raw = self.history().get(task_id)
            if raw is not None:
                task = parse_task_state(raw)
        if not isinstance(task, LocalAgentTaskState):
            what = "no task" if task is None else f"task {task_id} is not an agent task;"
            raise TaskError(f"{what} {task_id} in team {self.team!r} (see `shoal ps --all`)")
        return task

    def forget_history(self) -> None:
        """The history file was emptied (`shoal clean`): read it afresh next time."""
        self.history_reader = None

    def mark_dirty(self) -> None:
        """Something in the registry changed outside `update_task` (state.json must be written)."""
        self.snapshot.dirty = True

    def emit(self, event: Event) -> None:
        """Append an event to the session's stream and hand it to the sink and the policies
        (on a full disk the session keeps the line in memory until `write_held_back`)."""
        record = self.session.emit(event)
        for policy in self.policies:
            policy.on_event(record)
        if self.on_event is not None:
            self.on_event(record)
        if self.session.write_error is not None:
            self._no_space("events", self.session.write_error)

    def note(self, text: str) -> None:
        """A line for the person running the leader (also an event)."""
        self.notes.append(text)
        self.emit(Note(text=text))

    def notify_owner(
        self, task: AnyTaskState, xml: str, summary: str, *, status: str, msg_id: str | None
    ) -> None:
        owner = task.owner
        if not owner or owner == LEAD_NAME:
            return  # the lead reads notifications from the event stream
        fields = {
            "xml": xml,
            "summary": summary,
            "task_id": task.id,
            "status": status,
            "task_type": task.type.value,
            "output_file": task.output_file,
            "message_id": msg_id,
        }
        self._undelivered[task.id] = (owner, fields)
        self._deliver(task.id)

    def holds_notification(self, task_id: str) -> bool:
        """True while a full disk keeps the task's owner notification in memory."""
        return task_id in self._undelivered

    def _deliver(self, task_id: str) -> bool:
        """Deliver a held notification; False while the disk is full (it stays held: its
        message id is fixed, so a copy that did land is handled once)."""
        owner, fields = self._undelivered[task_id]
        try:
            notify_owner(self.teams.directory(self.team), owner, **fields)
        except NoSpaceError as exc:
            self._no_space("notifications", exc)
            return False
        except ShoalError as exc:
            self.note(f"could not notify {owner} about {task_id}: {exc}")
        del self._undelivered[task_id]
        return True

    # -- a full disk: what could not be written stays in memory, retried every tick ------------

    def _no_space(self, kind: str, exc: NoSpaceError) -> None:
        if self.held_back.failed(kind, exc):
            self.note(
                f"{exc}; the leader keeps what it cannot write in memory and retries every tick"
            )

    def note_failure(self, kind: str, text: str, exc: ShoalError) -> None:
        """Note `text` about a step that retries on its own; a full disk only once a spell."""
        if isinstance(exc, NoSpaceError):
            if kind in self.held_back.noted:
                return
            self.held_back.noted.add(kind)
        self.note(text)

    def _written(self, kind: str) -> None:
        if self.held_back.written(kind):
            self.note("there is space again: what the leader kept in memory is written")

    def write_held_back(self) -> None:
        """Retry what a full disk held back: events (in order), then owner notifications."""
        if not self.held_back.kinds:
            return
        if self.session.flush_events():
            self._written("events")
        if all(self._deliver(task_id) for task_id in list(self._undelivered)):
            self._written("notifications")

    def write_snapshot(
        self, leader: dict[str, Any] | None, groups: dict[str, Any] | None = None
    ) -> bool:
        """Write state.json (True); on a full disk the old one stays and the next persist
        retries (False)."""
        try:
            self.snapshot.write(
                self.session, self.team, self.created_at, leader, self.registry, groups
            )
        except NoSpaceError as exc:
            self._no_space("state", exc)
            return False
        self._written("state")
        return True

    def evict_to_history(self, now: float, *, new_round: bool = True) -> None:
        """Drop terminal, notified tasks (after their grace) on the round after the one that
        found them evictable, once their final record is in the history, every event before
        it is written, and their owner was told: on a full disk a task stays in the registry
        (and state.json) until then. `new_round`: a full round (a quick pass only drops what
        an earlier round marked)."""
        if self.session.unwritten:
            return
        marked, found = self._evictable, set()
        for task in self.registry.terminal_tasks():
            if not should_evict(task, now) or task.id in self._undelivered:
                continue
            if task.id not in marked:
                found.add(task.id)
                continue
            try:
                self.session.record_history(task)
            except NoSpaceError as exc:
                self._no_space("history", exc)
                return
            self.registry.remove(task.id)
            marked.discard(task.id)
            self.snapshot.dirty = True
        if new_round:
            self._evictable = found
        self._written("history")

    def output_file(self, task_id: str) -> Path:
        return self.session.output_file(task_id)

    def watch_pid(self, key: str, pid: int | None) -> None:
        """Wake the loop when process `pid` exits (a pidfd in the selector)."""
        if pid is None or key in self._pidfds:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self.wake()  # already gone: the next pass finds out
            return
        self._pidfds[key] = fd
        self._selector.register(fd, selectors.EVENT_READ, key)

    def unwatch_pid(self, key: str) -> None:
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            self._selector.unregister(fd)
            os.close(fd)

    def wake(self) -> None:
        """Make the loop run its steps now (from any thread)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")
