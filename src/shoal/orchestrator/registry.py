"""The leader's in-memory task table: every task of a session by id, safe across threads.

The task model (states, transitions, eviction rules) is in `shoal.core.tasks`; this is the
table the poll loop and the swarm update through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

from shoal.core.tasks import (
    AnyTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    MonitorMcpTaskState,
    RemoteAgentTaskState,
    TaskType,
    check_transition,
    should_evict,
)
from shoal.core.taskupdates import evolve

# UI state that survives re-registration on resume, where the task model has the field.
RESUME_KEPT_FIELDS: Final = ("retain", "start_time", "messages", "disk_loaded", "pending_messages")


def owner_of(task: AnyTaskState) -> tuple[str, str] | None:
    """The edge of the ownership tree above `task`: (the agent or member whose end ends it,
    the words that say so), or None for a task of the lead's own (teammates, dreams,
    workflows, a top-level agent). The one place the ownership fields are read: a subagent's
    or fork's `parent_agent`, a shell's `agent_id`, a monitor's or remote task's `owner`.
    (A coordinator's worker, `worker_of`, is dispatched, not owned: it runs to its end.)"""
    if isinstance(task, LocalAgentTaskState):
        return (task.parent_agent, "its parent agent {} ended") if task.parent_agent else None
    if isinstance(task, LocalShellTaskState):
        return (task.agent_id, "its agent {} exited") if task.agent_id else None
    if isinstance(task, MonitorMcpTaskState | RemoteAgentTaskState) and task.owner:
        return task.owner, "its owner {} has gone"
    return None


class TaskRegistry:
    """The in-memory task table (id -> state), safe to share between threads.

    Every method holds one lock for its whole read-modify-write, so updates always apply to the
    fresh state, never to a stale copy. Updaters run under that lock: they must not call back
    into the registry.
    """

    def __init__(self, tasks: Iterable[AnyTaskState] = ()) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, AnyTaskState] = {}
        # Ids of terminal tasks still here: notification and eviction look only at these, so a
        # registry with many live tasks costs nothing per pass.
        self._terminal: dict[str, None] = {}
        for task in tasks:
            self._store(task)

    def _store(self, task: AnyTaskState) -> None:
        self._tasks[task.id] = task
        if task.is_terminal:
            self._terminal[task.id] = None

    def register_task(self, task: AnyTaskState) -> AnyTaskState:
        """Add `task` (on resume, keeping the known UI state of its id); returns what was stored."""
        with self._lock:
            existing = self._tasks.get(task.id)
            if existing is not None:
                fields = type(task).model_fields
                kept = {
                    name: getattr(existing, name)
                    for name in RESUME_KEPT_FIELDS
                    if name in fields and name in type(existing).model_fields
                }
                if kept:
                    task = type(task).model_validate({**dict(task), **kept})
            self._store(task)
            return task

    def update_task_state(self, task_id: str, updater: Callable[[Any], AnyTaskState]) -> bool:
        """Replace task `task_id` with `updater(current)`; True if it changed.

        An unknown id (e.g. already evicted) is a no-op returning False. Returning the same object
        is a no-op. The new state must keep the id and type, and its status change must be legal
        (IllegalTransition), even if the updater bypassed `transition`.
        """
        with self._lock:
            current = self._tasks.get(task_id)
            if current is None:
                return False
            new = updater(current)
            if new is current:
                return False
            if new.id != current.id or new.type != current.type:
                raise TypeError(
                    f"task {task_id}: an update cannot change id or type "
                    f"(got {new.id} of type {new.type.value})"
                )
            check_transition(task_id, current.status, new.status)
            self._store(new)
            return True

    def mark_notified(self, task_id: str) -> bool:
        """Atomically set `notified`; True only for the first caller once the task is terminal."""
        with self._lock:
            current = self._tasks.get(task_id)
            if current is None or not current.is_terminal or current.notified:
                return False
            self._store(evolve(current, notified=True))
            return True

    def evict(self, now: float) -> list[AnyTaskState]:
        """Remove every task `should_evict` allows at `now`; returns the removed states."""
        with self._lock:
            gone = [t for i in self._terminal if should_evict(t := self._tasks[i], now)]
            for task in gone:
                del self._tasks[task.id]
                del self._terminal[task.id]
            return gone

    @property
    def live(self) -> int:
        """How many tasks here have not ended."""
        return len(self._tasks) - len(self._terminal)

    def terminal_tasks(self) -> list[AnyTaskState]:
        """A snapshot of the terminal tasks still in the registry."""
        with self._lock:
            return [self._tasks[i] for i in self._terminal]

    def get(self, task_id: str) -> AnyTaskState | None:
        """The current state of `task_id`, or None."""
        with self._lock:
            return self._tasks.get(task_id)

    def remove(self, task_id: str) -> AnyTaskState | None:
        """Drop `task_id` from the registry; returns what was removed, or None."""
        with self._lock:
            self._terminal.pop(task_id, None)
            return self._tasks.pop(task_id, None)

    def get_all_tasks(self) -> list[AnyTaskState]:
        """A snapshot of every task, in registration order."""
        with self._lock:
            return list(self._tasks.values())

    def get_task_by_type(self, task_type: TaskType | str) -> list[AnyTaskState]:
        """A snapshot of the tasks of one type, in registration order."""
        kind = TaskType(task_type)
        with self._lock:
            return [t for t in self._tasks.values() if t.type == kind]

    def orphans(self, departed: Callable[[str], bool]) -> list[tuple[AnyTaskState, str]]:
        """The unfinished tasks whose owner (`owner_of`) has departed, each with the reason
        it ends: stopping a node of the tree ends its subtree, a level a pass (each child
        ends, and its own children follow once it has)."""
        found = []
        for task in self.get_all_tasks():
            edge = None if task.is_terminal else owner_of(task)
            if edge is not None and departed(edge[0]):
                found.append((task, edge[1].format(edge[0])))
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        with self._lock:
            return task_id in self._tasks
