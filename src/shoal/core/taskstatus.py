"""Task types, ids and statuses: the plain (model-free) part of the task model, which the
CLI's hot paths need without importing the models (core/tasks.py re-exports all of it)."""

from __future__ import annotations

import re
import secrets
from enum import StrEnum
from typing import Any, Final

from shoal.core.errors import ShoalError, UsageError
from shoal.core.machine import IllegalMove, Machine

# --------------------------------------------------------------------------- constants

PANEL_GRACE_S: Final = 30.0
"""How long a finished agent task stays visible (and in the registry) after it ends."""
KILLED_DISPLAY_S: Final = 3.0
"""How long a killed non-agent task stays visible after it ends."""
MAX_TASK_OUTPUT_BYTES: Final = 5 * 1024**3
# The kill reason of a task stopped because someone asked (`shoal stop`, a leader shutting
# down): such an end is not news, so it sends no notification.
STOPPED_ON_REQUEST: Final = "stopped on request"
"""Default output cap of one task; past it the task is killed and the reason recorded."""
OUTPUT_READ_CHUNK: Final = 8 * 1024**2
"""The most output the poll loop reads from one task in one tick."""
TEAMMATE_MESSAGES_UI_CAP: Final = 50
"""Messages kept per in-process teammate for display (292 agents once reached 36.8 GB)."""
AGENT_MESSAGES_UI_CAP: Final = TEAMMATE_MESSAGES_UI_CAP
"""Messages kept per local agent for display (its `messages`), as for a teammate."""
MESSAGE_TEXT_CAP: Final = 200
"""Characters of a message's text kept in a record's `messages` (the record is in
state.json: 50 messages of a thousand agents must stay a few MB at most)."""
RECENT_ACTIVITIES_CAP: Final = 5
DREAM_TURNS_CAP: Final = 30
MAIN_SESSION_AGENT_TYPE: Final = "main-session"

JsonDict = dict[str, Any]

# --------------------------------------------------------------------------- types and ids


class TaskType(StrEnum):
    """The kinds of background task; the value is what goes on disk (and what str() gives)."""

    LOCAL_BASH = "local_bash"
    LOCAL_AGENT = "local_agent"
    REMOTE_AGENT = "remote_agent"
    IN_PROCESS_TEAMMATE = "in_process_teammate"
    LOCAL_WORKFLOW = "local_workflow"
    MONITOR_MCP = "monitor_mcp"
    DREAM = "dream"


TASK_ID_PREFIXES: Final[dict[TaskType, str]] = {
    TaskType.LOCAL_BASH: "b",
    TaskType.LOCAL_AGENT: "a",
    TaskType.REMOTE_AGENT: "r",
    TaskType.IN_PROCESS_TEAMMATE: "t",
    TaskType.LOCAL_WORKFLOW: "w",
    TaskType.MONITOR_MCP: "m",
    TaskType.DREAM: "d",
}
_TYPE_BY_PREFIX: Final = {prefix: kind for kind, prefix in TASK_ID_PREFIXES.items()}
TASK_ID_ALPHABET: Final = "0123456789abcdefghijklmnopqrstuvwxyz"
TASK_ID_RANDOM_LENGTH: Final = 8
_TASK_ID_SPACE: Final = len(TASK_ID_ALPHABET) ** TASK_ID_RANDOM_LENGTH
TASK_ID_PATTERN: Final = re.compile(r"^[" + "".join(_TYPE_BY_PREFIX) + r"][0-9a-z]{8}$")

AGENT_TASK_TYPES: Final = frozenset({TaskType.LOCAL_AGENT, TaskType.IN_PROCESS_TEAMMATE})


def new_task_id(task_type: TaskType | str) -> str:
    """A fresh task id: the type's prefix plus 8 random characters of [0-9a-z], e.g. a7k2m9x3f."""
    prefix = TASK_ID_PREFIXES[TaskType(task_type)]
    n = secrets.randbelow(_TASK_ID_SPACE)  # (one draw, written in base 36: uniform per digit)
    tail = []
    for _ in range(TASK_ID_RANDOM_LENGTH):
        n, digit = divmod(n, 36)
        tail.append(TASK_ID_ALPHABET[digit])
    return prefix + "".join(tail)


def task_type_of_id(task_id: str) -> TaskType:
    """The task type encoded in `task_id`'s prefix; a malformed id raises UsageError naming it."""
    if not TASK_ID_PATTERN.fullmatch(task_id):
        prefixes = ", ".join(f"{p}={t.value}" for t, p in TASK_ID_PREFIXES.items())
        raise UsageError(
            f"malformed task id {task_id!r}: expected a type prefix ({prefixes}) followed by "
            f"{TASK_ID_RANDOM_LENGTH} characters of [0-9a-z], e.g. 'a7k2m9x3f'"
        )
    return _TYPE_BY_PREFIX[task_id[0]]


# --------------------------------------------------------------------------- status


class TaskStatus(StrEnum):
    """Where a task is in its life; completed, failed and killed are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"


TRANSITIONS: Final[dict[TaskStatus, frozenset[TaskStatus]]] = {
    # A task can fail to start, or be killed before it starts.
    TaskStatus.PENDING: frozenset({TaskStatus.RUNNING, TaskStatus.FAILED, TaskStatus.KILLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.KILLED}),
    TaskStatus.COMPLETED: frozenset(),
    TaskStatus.FAILED: frozenset(),
    TaskStatus.KILLED: frozenset(),
}


class IllegalTransition(IllegalMove, ShoalError):
    """A status change TRANSITIONS does not allow (e.g. anything out of a terminal state)."""

    def __init__(self, task_id: str, from_status: TaskStatus, to_status: TaskStatus) -> None:
        self.task_id = task_id
        self.from_status = from_status
        self.to_status = to_status
        allowed = TRANSITIONS[from_status]
        names = ", ".join(sorted(s.value for s in allowed))
        why = f"allowed: {names}" if names else f"{from_status.value} is terminal"
        message = (
            f"task {task_id}: illegal status change {from_status.value} -> {to_status.value} "
            f"({why})"
        )
        super().__init__(message, task_id, from_status, to_status, allowed)


TASK_MACHINE: Final = Machine(
    TRANSITIONS, refuse=lambda task_id, a, b, _: IllegalTransition(task_id, a, b)
)
"""A background task's life (every kind shares it)."""
TERMINAL_STATUSES: Final = TASK_MACHINE.terminal


def is_terminal_task_status(status: TaskStatus | str) -> bool:
    """True for completed, failed and killed: states a task never leaves."""
    return TaskStatus(status) in TERMINAL_STATUSES


def check_transition(task_id: str, from_status: TaskStatus, to_status: TaskStatus) -> None:
    """Raise IllegalTransition unless `from_status -> to_status` is allowed (or a no-op)."""
    TASK_MACHINE.check(task_id, from_status, to_status)


TIMED_OUT_REASON: Final = "timed out after "
"""How the kill reason of a task stopped by its own timeout begins."""


def retry_due(
    status: str, retries: int, pid: int | None, notified: bool, kill_reason: str | None
) -> bool:
    """True when a shell task that ended so will get another attempt (it ran, it failed or
    timed out, retries are left and its end was not yet told): the scheduler's rule, and what
    `shoal wait` waits through."""
    if notified or retries <= 0 or pid is None:
        return False
    timed_out = status == "killed" and (kill_reason or "").startswith(TIMED_OUT_REASON)
    return status == "failed" or timed_out
