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
from shoal.core.errors import ShoalError
from shoal.core.events import Event, Note
from shoal.core.paths import Layout
from shoal.core.procs import current_identity
from shoal.core.tasks import AnyTaskState, TaskStatus, evolve, parse_task_state
from shoal.mailbox.router import notify_owner
from shoal.orchestrator.registry import TaskRegistry
from shoal.orchestrator.session import Session, Snapshot, new_session_id
from shoal.teams.models import LEAD_NAME
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
        self._identity = current_identity()
        # What tasks inherit, as a plain dict: handing posix_spawn `os.environb` itself costs a
        # Python-level lookup per variable on every start.
        self._environ: dict[bytes, bytes] = dict(os.environb)
        self._waiters: dict[str, list[Callable[[AnyTaskState], None]]] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pidfds: dict[str, int] = {}

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

    def _answer_waiters(self) -> None:
        """Hand each ended task's final record to whoever waits for it (a `stop` reply)."""
        for task_id in [
            i for i in self._waiters if (t := self.registry.get(i)) is None or t.is_terminal
        ]:
            final = self.registry.get(task_id)
            waiters = self._waiters.pop(task_id)
            if final is None:  # (evicted: its final record is in the history)
                raw = self.session.history().get(task_id)
                final = parse_task_state(raw) if raw is not None else None
            if final is not None:
                for waiter in waiters:
                    waiter(final)

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

    def mark_dirty(self) -> None:
        """Something in the registry changed outside `update_task` (state.json must be written)."""
        self.snapshot.dirty = True

    def emit(self, event: Event) -> None:
        """Append an event to the session's stream and hand it to the sink and the policies."""
        record = self.session.emit(event)
        for policy in self.policies:
            policy.on_event(record)
        if self.on_event is not None:
            self.on_event(record)

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
        try:
            notify_owner(
                self.teams.directory(self.team),
                owner,
                xml=xml,
                summary=summary,
                task_id=task.id,
                status=status,
                task_type=task.type.value,
                output_file=task.output_file,
                message_id=msg_id,
            )
        except ShoalError as exc:
            self.note(f"could not notify {owner} about {task.id}: {exc}")

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
