"""A task-list item and its rules: the status table, the one move check, the read view of the
whole list, the claim rules (blockers, busy owners, failures) and the dependency edges (both
sides of each, no cycle), without the files."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from shoal.core.errors import (
    ConflictError,
    CorruptFileError,
    NotFoundError,
    UsageError,
)
from shoal.core.machine import IllegalMove, Machine
from shoal.core.names import NAME_PATTERN


class TaskItemStatus(StrEnum):
    """The status of a task-list item, as written in its file."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


# The legal status moves (moving to the status an item already has is always a no-op).
# pending -> completed is allowed: a lead or a script may close a task nobody claimed.
# completed -> pending is the explicit reopen; completed -> in_progress is refused, so a
# reopened task is claimed again through pending, under the claim rules (blockers, busy).
TRANSITIONS: Final[Mapping[TaskItemStatus, frozenset[TaskItemStatus]]] = {
    TaskItemStatus.PENDING: frozenset({TaskItemStatus.IN_PROGRESS, TaskItemStatus.COMPLETED}),
    TaskItemStatus.IN_PROGRESS: frozenset({TaskItemStatus.PENDING, TaskItemStatus.COMPLETED}),
    TaskItemStatus.COMPLETED: frozenset({TaskItemStatus.PENDING}),
}
STATUSES: Final[tuple[str, ...]] = tuple(s.value for s in TaskItemStatus)
# Not a status: `update(status="deleted")` removes the item, whatever its status.
DELETED: Final = "deleted"
UPDATE_STATUSES: Final[tuple[str, ...]] = (*STATUSES, DELETED)
ClaimReason = Literal["already_claimed", "already_resolved", "blocked", "agent_busy"]


TaskId = Annotated[int, Field(strict=True, ge=1)]


class _Unset(enum.Enum):
    """Marks an argument that was not given (None means "clear" where a field may be null)."""

    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
Unset = _Unset  # the type of UNSET, for callers' annotations


class TaskItem(BaseModel):
    """One item of the shared task list, exactly as in `tasklist/{id}.json` (format version 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    v: Literal[1] = 1
    id: TaskId
    subject: str
    description: str = ""
    active_form: str | None = None
    owner: str | None = None
    status: TaskItemStatus = TaskItemStatus.PENDING
    blocks: tuple[TaskId, ...] = ()
    blocked_by: tuple[TaskId, ...] = ()
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: str | None = None
    updated_at: str | None = None

    @field_validator("owner")
    @classmethod
    def _valid_owner(cls, value: str | None) -> str | None:
        if value is not None and not NAME_PATTERN.fullmatch(value):
            raise ValueError(f"invalid owner name {value!r}")
        return value

    @property
    def resolved(self) -> bool:
        """True once the task is completed (it no longer blocks anything)."""
        return self.status == TaskItemStatus.COMPLETED


class IllegalStatusMove(IllegalMove, ConflictError):
    """A status change that TRANSITIONS does not allow; nothing was written."""

    def __init__(self, task_id: int, current: TaskItemStatus, requested: TaskItemStatus) -> None:
        self.task_id = task_id
        self.requested = requested
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "nothing"
        hint = ""
        if current == TaskItemStatus.COMPLETED:
            hint = f"; reopen it first with `shoal task update {task_id} --status pending`"
        message = (
            f"task {task_id} is {current.value} and cannot move to {requested.value} "
            f"(from {current.value} only to: {allowed}){hint}"
        )
        super().__init__(message, str(task_id), current, requested, TRANSITIONS[current])


ITEM_MACHINE: Final = Machine(
    TRANSITIONS, refuse=lambda item, a, b, _: IllegalStatusMove(int(item), a, b)
)
"""A task-list item's status."""


def move_item(item: TaskItem, status: TaskItemStatus | str, **changes: Any) -> TaskItem:
    """`item` with `status` and `changes` (not written); IllegalStatusMove unless TRANSITIONS
    allows the move. The one place a status move is checked: update, claim and release all
    build their new item here. The same status is no move (only `changes` apply)."""
    current, target = TaskItemStatus(item.status), TaskItemStatus(status)
    ITEM_MACHINE.check(str(item.id), current, target)
    return item.model_copy(update={**changes, "status": target})


class ClaimRefused(ConflictError):
    """A claim that the rules refuse; `reason` is the machine-readable code."""

    def __init__(
        self, task_id: int, reason: ClaimReason, detail: str | list[int], why: str
    ) -> None:
        self.task_id = task_id
        self.reason: ClaimReason = reason
        self.detail = detail
        super().__init__(f"cannot claim task {task_id}: {reason} ({why})")

    def to_json(self) -> dict[str, Any]:
        """The refusal as printed by `shoal task claim --json`."""
        return {"ok": False, "reason": self.reason, "task_id": self.task_id, "detail": self.detail}


Notify = Callable[[TaskItem, str | None], None]


@dataclass
class TaskSnapshot:
    """Item files of the list read at one moment: valid items and corrupt ones, by id."""

    items: dict[int, TaskItem] = field(default_factory=dict)
    errors: dict[int, CorruptFileError] = field(default_factory=dict)

    def open_blockers(self, item: TaskItem) -> list[int]:
        """Ids in `item.blocked_by` that still block it (a corrupt blocker counts as open,
        a missing one as gone)."""
        out: list[int] = []
        for bid in item.blocked_by:
            blocker = self.items.get(bid)
            if bid in self.errors or (blocker is not None and not blocker.resolved):
                out.append(bid)
        return out

    def in_progress_of(self, name: str, *, besides: int | None = None) -> list[int]:
        """Ids of in-progress tasks owned by `name` (other than `besides`)."""
        return [
            t.id
            for t in self.sorted()
            if t.owner == name and t.status == TaskItemStatus.IN_PROGRESS and t.id != besides
        ]

    def sorted(self) -> list[TaskItem]:
        """Valid items by ascending id."""
        return [self.items[i] for i in sorted(self.items)]

    def depends_on(self, start: int, target: int) -> list[int] | None:
        """The chain of `blocked_by` edges from `start` to `target`, or None if there is none."""
        stack: list[tuple[int, list[int]]] = [(start, [start])]
        seen: set[int] = set()
        while stack:
            current, path = stack.pop()
            if current == target:
                return path
            if current in seen:
                continue
            seen.add(current)
            item = self.items.get(current)
            if item is not None:
                stack.extend((b, [*path, b]) for b in item.blocked_by)
        return None


def check_id(task_id: int) -> int:
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 1:
        raise UsageError(f"invalid task id {task_id!r}: task ids are whole numbers from 1")
    return task_id


def check_subject(subject: str) -> str:
    if not subject.strip():
        raise UsageError("a task needs a subject (it is empty)")
    return subject


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = dict(metadata or {})
    try:
        orjson.dumps(meta)
    except TypeError as exc:
        raise UsageError(f"task metadata must be plain JSON: {exc}") from None
    return meta


MAX_TASK_FAILURES: Final = 3
"""A task whose turns failed this many times is parked: no teammate claims it on its own any
more (an assigned owner still may), so one broken task does not loop forever."""


def parked(item: TaskItem) -> bool:
    """Whether `item` is pending, unowned and parked after MAX_TASK_FAILURES failed turns."""
    return (
        item.status == TaskItemStatus.PENDING
        and item.owner is None
        and failures_of(item) >= MAX_TASK_FAILURES
    )


def failures_of(item: TaskItem) -> int:
    try:
        return int((item.metadata or {}).get("failures", 0) or 0)
    except (TypeError, ValueError):
        return 0


def first_claimable(snap: TaskSnapshot, name: str, max_failures: int | None) -> TaskItem | None:
    # A task whose metadata says `"auto_claim": false` is only ever given by assignment (e.g.
    # the attempts of a batch run, whose engine decides retries itself).
    for item in snap.sorted():
        if (
            item.status == TaskItemStatus.PENDING
            and item.owner in (None, name)
            and (item.metadata or {}).get("auto_claim", True) is not False
            and (max_failures is None or item.owner == name or failures_of(item) < max_failures)
            and not snap.open_blockers(item)
        ):
            return item
    return None


def check_claim(snap: TaskSnapshot, item: TaskItem, name: str, check_busy: bool) -> None:
    if item.resolved:
        raise ClaimRefused(item.id, "already_resolved", item.status.value, "it is completed")
    if item.owner is not None and item.owner != name:
        raise ClaimRefused(item.id, "already_claimed", item.owner, f"owned by {item.owner}")
    blockers = snap.open_blockers(item)
    if blockers:
        ids = ", ".join(str(i) for i in blockers)
        raise ClaimRefused(item.id, "blocked", blockers, f"open blockers: {ids}")
    if check_busy:
        busy = snap.in_progress_of(name, besides=item.id)
        if busy:
            ids = ", ".join(str(i) for i in busy)
            raise ClaimRefused(
                item.id, "agent_busy", busy, f"{name} is working on task {ids}; finish it first"
            )


def checked_blockers(
    snap: TaskSnapshot, task_ids: Iterable[int], what: str, team: str
) -> list[int]:
    """Validated, de-duplicated blocker ids that exist as readable items."""
    out: list[int] = []
    for bid in task_ids:
        check_id(bid)
        if bid in snap.errors:
            raise snap.errors[bid]
        if bid not in snap.items:
            raise NotFoundError(f"{what}: no task {bid} in team {team!r} (see `shoal task list`)")
        if bid not in out:
            out.append(bid)
    return out


def edge_edits(
    snap: TaskSnapshot, task_id: int, blocked_by: list[int], blocks: list[int], team: str
) -> dict[int, TaskItem]:
    """Items changed by adding `task_id blocked_by b` and `task_id blocks x` edges: both
    sides of each edge, and none that would make a cycle (a ConflictError naming it)."""
    blocked_by = checked_blockers(snap, blocked_by, f"task {task_id} --blocked-by", team)
    blocks = checked_blockers(snap, blocks, f"task {task_id} --blocks", team)
    edits: dict[int, TaskItem] = {}

    def current(i: int) -> TaskItem:
        return edits.get(i, snap.items[i])

    def link(blocked: int, blocker: int) -> None:
        if blocked == blocker:
            raise ConflictError(f"task {blocked} cannot be blocked by itself")
        chain = snap.depends_on(blocker, blocked)
        if chain is not None:
            cycle = " -> ".join(str(i) for i in (blocked, *chain))
            raise ConflictError(
                f"task {blocked} cannot be blocked by task {blocker}: that would make a "
                f"cycle ({cycle}, each blocked by the next)"
            )
        a, b = current(blocked), current(blocker)
        if blocker not in a.blocked_by:
            a = a.model_copy(update={"blocked_by": (*a.blocked_by, blocker)})
        if blocked not in b.blocks:
            b = b.model_copy(update={"blocks": (*b.blocks, blocked)})
        edits[blocked], edits[blocker] = a, b
        # Later cycle checks must see this edge too.
        snap.items[blocked] = a
        snap.items[blocker] = b

    original = dict(snap.items)
    try:
        for b in blocked_by:
            link(task_id, b)
        for x in blocks:
            link(x, task_id)
    finally:
        snap.items.clear()
        snap.items.update(original)
    return {i: t for i, t in edits.items() if t != snap.items[i]}
