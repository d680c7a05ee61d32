"""The footer pill: one short label for the background tasks (stdlib only, on plain dicts).

Task records are the JSON objects of `state.json` (or `model_dump(mode="json")` of a state), so
the same function serves `shoal pill`'s fast path, which never imports pydantic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

TaskRecord = Mapping[str, Any]

MAIN_SESSION_AGENT_TYPE: Final = "main-session"
DIAMOND_OPEN: Final = "◇"
DIAMOND_FILLED: Final = "◆"
_ACTIVE: Final = frozenset({"pending", "running"})


def is_background_record(task: TaskRecord) -> bool:
    """True for a pending or running task not in the foreground (`is_background_task`)."""
    return task.get("status") in _ACTIVE and task.get("is_backgrounded", True) is not False


def is_panel_agent_record(task: TaskRecord) -> bool:
    """True for a local agent of the coordinator panel (any but a backgrounded main session)."""
    return task.get("type") == "local_agent" and task.get("agent_type") != MAIN_SESSION_AGENT_TYPE


def pill_tasks(tasks: Iterable[TaskRecord]) -> list[TaskRecord]:
    """The tasks the pill counts: background ones, panel agent tasks left out."""
    return [t for t in tasks if is_background_record(t) and not is_panel_agent_record(t)]


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


def _team_of(task: TaskRecord) -> str:
    identity = task.get("identity")
    if isinstance(identity, Mapping):
        return str(identity.get("team_name", ""))
    return ""


KIND_ORDER: Final = (
    "local_bash",
    "in_process_teammate",
    "local_agent",
    "remote_agent",
    "local_workflow",
    "monitor_mcp",
    "dream",
)
"""The order of the kinds in a detailed pill (`1 shell, 1 team`)."""


def pill_label(tasks: Iterable[TaskRecord], *, detail: bool = False) -> str:
    """The pill text for `tasks` (already filtered with `pill_tasks`); "" when there are none.

    One kind: `1 shell`/`3 shells` (shell monitors as `1 monitor`, both as `2 shells, 1 monitor`),
    `2 local agents`, `◇ 1 cloud session` (a lone ultraplan shows its phase), `1 team`/`2 teams`
    counted by team, `dreaming`, `1 background workflow`, `2 monitors`. Mixed kinds:
    `N background tasks`, or with `detail` each kind's label (`1 shell, 1 team`).
    """
    items = list(tasks)
    n = len(items)
    if n == 0:
        return ""
    kinds = {t.get("type") for t in items}
    if len(kinds) > 1:
        if not detail:
            return _plural(n, "background task")
        rank = {k: i for i, k in enumerate(KIND_ORDER)}
        ordered = sorted(kinds, key=lambda k: (rank.get(str(k), len(rank)), str(k)))
        return ", ".join(_one_kind([t for t in items if t.get("type") == k]) for k in ordered)
    return _one_kind(items)


def _one_kind(items: list[TaskRecord]) -> str:
    """The label of tasks all of one kind."""
    n = len(items)
    kind = items[0].get("type")
    if kind == "local_bash":
        monitors = sum(1 for t in items if t.get("kind") == "monitor")
        parts = []
        if n - monitors:
            parts.append(_plural(n - monitors, "shell"))
        if monitors:
            parts.append(_plural(monitors, "monitor"))
        return ", ".join(parts)
    if kind == "in_process_teammate":
        return _plural(len({_team_of(t) for t in items}), "team")
    if kind == "local_agent":
        return _plural(n, "local agent")
    if kind == "remote_agent":
        first = items[0]
        if n == 1 and first.get("is_ultraplan"):
            phase = first.get("ultraplan_phase")
            if phase == "plan_ready":
                return f"{DIAMOND_FILLED} ultraplan ready"
            if phase == "needs_input":
                return f"{DIAMOND_OPEN} ultraplan needs your input"
            return f"{DIAMOND_OPEN} ultraplan"
        return f"{DIAMOND_OPEN} " + _plural(n, "cloud session")
    if kind == "dream":
        return "dreaming"
    if kind == "local_workflow":
        return _plural(n, "background workflow")
    if kind == "monitor_mcp":
        return _plural(n, "monitor")
    return _plural(n, "background task")


def pill_for(tasks: Iterable[TaskRecord], *, detail: bool = False) -> str:
    """`pill_label(pill_tasks(tasks))`: the label for every task of a session."""
    return pill_label(pill_tasks(tasks), detail=detail)
