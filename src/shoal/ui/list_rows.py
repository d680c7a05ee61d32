"""The team's shared task list as the views show it: one row per item, with what holds it
back (its open blockers, its failed turns)."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.teams.taskitems import TaskSnapshot, failures_of


@dataclass(frozen=True)
class ListRow:
    """One item of the team's shared task list, as the views show it."""

    id: int
    subject: str
    status: str
    owner: str | None = None
    open_blockers: tuple[int, ...] = ()
    failures: int = 0


def list_rows(snap: TaskSnapshot) -> tuple[list[ListRow], list[str]]:
    """Rows of a task-list snapshot, and one error line per corrupt item."""
    rows = [
        ListRow(
            id=item.id,
            subject=item.subject,
            status=item.status.value,
            owner=item.owner,
            open_blockers=tuple(snap.open_blockers(item)),
            failures=failures_of(item),
        )
        for item in snap.sorted()
    ]
    return rows, [f"task list item {i}: {err}" for i, err in sorted(snap.errors.items())]
