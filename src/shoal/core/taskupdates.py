"""Changing a task state: every change checked (known, mutable fields; a status move the
transition table allows; a dream's phase move), `end_time` and the panel grace filled in on
a terminal move, and a result cut to its cap. States are frozen: each change is a copy."""

from __future__ import annotations

import time
from typing import Any, Final, TypeVar

from shoal.core.tasks import DreamPhase, DreamTaskState, TaskStateBase, check_dream_phase
from shoal.core.taskstatus import (
    AGENT_TASK_TYPES,
    PANEL_GRACE_S,
    TERMINAL_STATUSES,
    TaskStatus,
    check_transition,
)

T = TypeVar("T", bound=TaskStateBase)

_IMMUTABLE_FIELDS: Final = frozenset({"id", "type"})


# A task's `result` as its record, state.json, events, notifications and `ps --json` carry it;
# the whole text stays in the task's output file (`shoal logs ID`).
RESULT_CAP_CHARS: Final = 100_000


def capped_result(text: str, task_id: str) -> str:
    """`text` cut to RESULT_CAP_CHARS characters, with a mark saying how much was left out
    and where the whole of it is."""
    if len(text) <= RESULT_CAP_CHARS:
        return text
    rest = len(text) - RESULT_CAP_CHARS
    mark = f"[result cut: {rest:,} more characters in `shoal logs {task_id}`]"
    return f"{text[:RESULT_CAP_CHARS]}\n{mark}"


def _checked_changes(task: TaskStateBase, changes: dict[str, Any]) -> dict[str, Any] | None:
    """The changes to apply (end_time filled in on a terminal move), or None for no change."""
    fields = type(task).model_fields
    for name in changes:
        if name not in fields:
            raise TypeError(f"{type(task).__name__} has no field {name!r}")
        if name in _IMMUTABLE_FIELDS:
            raise TypeError(f"task {task.id}: field {name!r} cannot change")
    result = changes.get("result")
    if isinstance(result, str) and len(result) > RESULT_CAP_CHARS:
        changes = {**changes, "result": capped_result(result, task.id)}
    if all(getattr(task, name) == value for name, value in changes.items()):
        return None
    if "phase" in changes and isinstance(task, DreamTaskState):
        check_dream_phase(task.id, task.phase, DreamPhase(changes["phase"]))
    if "status" in changes:
        new_status = TaskStatus(changes["status"])
        check_transition(task.id, task.status, new_status)
        changes = {**changes, "status": new_status}
        if new_status in TERMINAL_STATUSES and "end_time" not in changes and task.end_time is None:
            changes["end_time"] = time.time()
        if (
            new_status in TERMINAL_STATUSES
            and task.type in AGENT_TASK_TYPES
            and "evict_after" not in changes
            and getattr(task, "evict_after", None) is None
        ):  # (the panel grace, written down: a resumed leader keeps the same deadline)
            ended = changes.get("end_time", task.end_time) or time.time()
            changes["evict_after"] = ended + PANEL_GRACE_S
    return changes


def update_task(task: T, **changes: Any) -> T:
    """A copy of `task` with `changes`; the same object when nothing changes.

    A status change must be allowed by TRANSITIONS (else IllegalTransition); moving to a terminal
    status sets `end_time` to now unless given or already set.
    """
    checked = _checked_changes(task, changes)
    if checked is None:
        return task
    # model_copy(update=...) skips validation; re-validate so no change can build an invalid
    # record (nested model instances are reused as they are, so this stays cheap).
    return type(task).model_validate({**dict(task), **checked})


def evolve(task: T, **changes: Any) -> T:
    """`update_task` for values the caller built itself (already typed and valid): the same
    field and transition checks, without re-validating the whole record. The leader's hot path
    (a task started, read, finished) uses it; anything from outside goes through
    `update_task`."""
    checked = _checked_changes(task, changes)
    if checked is None:
        return task
    return task.model_copy(update=checked)


def transition(task: T, new_status: TaskStatus | str, **changes: Any) -> T:
    """Move `task` to `new_status` (with `changes`), or raise IllegalTransition.

    Moving to the status the task already has is not an error: for a terminal task it returns
    the same object (the first outcome reported wins, later duplicates are dropped); otherwise
    it just applies `changes`.
    """
    status = TaskStatus(new_status)
    if status == task.status:
        return task if task.is_terminal else update_task(task, **changes)
    check_transition(task.id, task.status, status)
    return update_task(task, status=status, **changes)
