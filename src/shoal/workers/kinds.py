"""The interface between the leader's loop and the kinds of task it runs.

Each task kind (shell, teammate, agent, remote, dream, monitor, and the workflow kind of
orchestrator/batch/) implements `TaskKind`; it changes task state only through the
`TaskStore` the leader hands it, never by importing the leader. The loop calls `poll` from
its named steps and never branches on a task's type.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from shoal.core.config import Limits
from shoal.core.events import Event, task_terminated
from shoal.core.tasks import AnyTaskState, LocalAgentTaskState, TaskStatus, TaskType


class Poll(Enum):
    """What a step of the tick asks a kind to look at (compared by identity: it is asked for
    every live task on every pass)."""

    REAP = "reap"  # ended processes, kills past their deadline
    OUTPUT = "output"  # output deltas and the output cap
    STALLS = "stalls"  # silent tasks waiting at a prompt


class TaskStore(Protocol):
    """What a task kind may do to the registry and the session (all from the loop's thread)."""

    @property
    def limits(self) -> Limits: ...

    @property
    def environ(self) -> dict[bytes, bytes]:
        """The leader's environment at its start (what tasks inherit)."""
        ...

    def get(self, task_id: str) -> AnyTaskState | None: ...

    def set_task(self, task_id: str, **changes: Any) -> bool:
        """Change fields of a task (same values: no change)."""
        ...

    def move_task(self, task_id: str, status: TaskStatus, **changes: Any) -> bool:
        """Move a task through the transition table."""
        ...

    def mark_notified(self, task_id: str) -> bool: ...

    def write_ahead(self, task_id: str) -> bool:
        """Move a task to running and write that down now, before anything is spawned for
        it (False: it could not be written, and the task has failed saying so)."""
        ...

    def emit(self, event: Event) -> None: ...

    def note(self, text: str) -> None: ...

    def notify_owner(
        self, task: AnyTaskState, xml: str, summary: str, *, status: str, msg_id: str | None
    ) -> None:
        """Deliver a `task_notification` to the task's owner (not the lead: it reads events)."""
        ...

    def watch_pid(self, key: str, pid: int | None) -> None:
        """Wake the loop when process `pid` exits."""
        ...

    def unwatch_pid(self, key: str) -> None: ...

    def wake(self) -> None: ...

    def workers_of(self, agent_id: str) -> list[LocalAgentTaskState]:
        """Every worker of coordinator `agent_id` in the session (live and evicted)."""
        ...

    def output_file(self, task_id: str) -> Path: ...


class TaskKind(Protocol):
    """One kind of task, as the loop sees it."""

    types: frozenset[TaskType]

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        """Start a pending task (it ends running, or failed with the reason)."""
        ...

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        """Look at this kind's live tasks (`only` those ids, if given): what `what` names,
        and nothing that blocks."""
        ...

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        """Begin ending a live task; a later `poll` (REAP) finishes what is left. Never waits."""
        ...

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """On resume: take back a live task of an earlier leader, or settle it from disk."""
        ...

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        """Extra fields of the task's notification XML (`result`, `usage`), if any."""
        ...

    def live(self) -> Iterable[str]:
        """Ids of the tasks this kind runs now."""
        ...

    def signalled(self) -> Iterable[str]:
        """Ids of live tasks with news since the last REAP (a pidfd fired, a kill is due)."""
        ...

    def on_exit(self, key: str) -> bool:
        """A pidfd the kind asked to watch fired; True if `key` was its own."""
        ...

    def next_due(self) -> float | None:
        """The next monotonic time the kind must be polled at (a kill's deadline), if any."""
        ...

    def running(self) -> int:
        """How many tasks of this kind hold a job slot."""
        ...


def end_unannounced(store: TaskStore, task_id: str) -> None:
    """A stop the user asked for is not news: the ended task counts as notified (no
    notification goes out), and its end is an event still."""
    store.mark_notified(task_id)
    final = store.get(task_id)
    if final is not None:
        store.emit(task_terminated(final))
