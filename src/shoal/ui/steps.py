"""Workflow steps under their workflow: the order every task listing shows (ps, board, ui)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

T = TypeVar("T")
STEP_MARK: Final = "└ "
"""What a step's line shows before its description."""


def nest_steps(rows: Iterable[T], fields: Callable[[T], Mapping[str, Any]]) -> list[tuple[T, bool]]:
    """`rows` in their order, each workflow's steps moved right after it: (row, is_step);
    `fields(row)` is the row's task record. A step whose workflow is not among `rows` stays
    where it is, as a step."""
    listed = list(rows)
    ids = {fields(r).get("id") for r in listed}
    steps: dict[str, list[T]] = {}
    for row in listed:
        parent = fields(row).get("workflow_id")
        if parent is not None and parent in ids:
            steps.setdefault(str(parent), []).append(row)
    out: list[tuple[T, bool]] = []
    for row in listed:
        info = fields(row)
        parent = info.get("workflow_id")
        if parent is not None and parent in ids:
            continue  # (placed under its workflow)
        out.append((row, parent is not None))
        out += [(step, True) for step in steps.get(str(info.get("id")), [])]
    return out


def step_prefix(record: Mapping[str, Any]) -> str:
    """STEP_MARK for a workflow's step, else ""."""
    return STEP_MARK if record.get("workflow_id") else ""


def workflow_progress(record: Mapping[str, Any]) -> str:
    """` · 2/3 steps (running: test)` for a workflow's record, else ""."""
    if record.get("type") != "local_workflow":
        return ""
    done, total = record.get("completed_steps") or 0, record.get("total_steps") or 0
    current = record.get("current_step")
    return f" · {done}/{total} steps" + (f" (running: {current})" if current else "")
