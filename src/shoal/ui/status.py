"""Status icons and colours, teammate activity lines and small formatters (stdlib only).

Mirrors the seed's taskStatusUtils: `status_icon`, `status_color` and
`describe_teammate_activity`, on plain records so every view (board, app, pill) shares them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

StatusColor = Literal["success", "error", "warning", "background"]

ICON_RUNNING: Final = "▶"
ICON_COMPLETED: Final = "✔"
ICON_FAILED: Final = "✘"
ICON_IDLE: Final = "…"
ICON_AWAITING: Final = "?"
ICON_STOPPING: Final = "⚠"
ICON_PENDING: Final = "•"

COLOR_STYLES: Final[dict[StatusColor, str]] = {
    "success": "green",
    "error": "red",
    "warning": "yellow",
    "background": "bright_blue",
}
"""The rich style of each semantic colour ('background' is the seed's blue of background work)."""


@dataclass(frozen=True)
class StatusFlags:
    """What refines a status: an idle, approval-waiting, stopping or erroring teammate."""

    idle: bool = False
    awaiting_approval: bool = False
    shutdown_requested: bool = False
    has_error: bool = False


_NO_FLAGS: Final = StatusFlags()


def status_icon(status: str, flags: StatusFlags | None = None) -> str:
    """One glyph: ▶ running, ✔ completed, ✘ failed/killed, … idle, ? approval, ⚠ stopping."""
    f = flags or _NO_FLAGS
    if f.has_error:
        return ICON_FAILED
    if f.awaiting_approval:
        return ICON_AWAITING
    if f.shutdown_requested:
        return ICON_STOPPING
    if status == "running":
        return ICON_IDLE if f.idle else ICON_RUNNING
    if status == "completed":
        return ICON_COMPLETED
    if status in ("failed", "killed"):
        return ICON_FAILED
    return ICON_PENDING


def status_color(status: str, flags: StatusFlags | None = None) -> StatusColor:
    """success (completed), error (failed), warning (killed, approval, stopping), or background."""
    f = flags or _NO_FLAGS
    if f.has_error:
        return "error"
    if f.awaiting_approval or f.shutdown_requested:
        return "warning"
    if f.idle:
        return "background"
    if status == "completed":
        return "success"
    if status == "failed":
        return "error"
    if status == "killed":
        return "warning"
    return "background"


def status_style(status: str, flags: StatusFlags | None = None) -> str:
    """The rich style of `status_color`."""
    return COLOR_STYLES[status_color(status, flags)]


# --------------------------------------------------------------------------- teammate activity


@dataclass(frozen=True)
class TeammateFacts:
    """What the activity line of a teammate (task or team member) is made from."""

    idle: bool = False
    awaiting_approval: bool = False
    shutdown_requested: bool = False
    activity: str | None = None
    recent_activities: tuple[str, ...] = ()

    @property
    def flags(self) -> StatusFlags:
        return StatusFlags(
            idle=self.idle,
            awaiting_approval=self.awaiting_approval,
            shutdown_requested=self.shutdown_requested,
        )


def describe_teammate_activity(facts: TeammateFacts) -> str:
    """stopping, awaiting approval, idle, else the latest activity, else "working"."""
    if facts.shutdown_requested:
        return "stopping"
    if facts.awaiting_approval:
        return "awaiting approval"
    if facts.idle:
        return "idle"
    if facts.activity:
        return facts.activity
    if facts.recent_activities:
        return facts.recent_activities[-1]
    return "working"


def _activity_text(activity: Any) -> str | None:
    """A ToolActivity record ({tool_name, description}) or a plain string as one line."""
    if isinstance(activity, str):
        return activity or None
    if isinstance(activity, Mapping):
        text = activity.get("description") or activity.get("tool_name")
        return str(text) if text else None
    return None


def progress_activities(progress: Any) -> tuple[str, ...]:
    """The recent activities of an AgentProgress record, oldest first, as text."""
    if not isinstance(progress, Mapping):
        return ()
    recent = progress.get("recent_activities") or ()
    if isinstance(recent, Sequence) and not isinstance(recent, str):
        return tuple(t for a in recent if (t := _activity_text(a)))
    return ()


def teammate_facts_from_task(task: Mapping[str, Any]) -> TeammateFacts:
    """Facts of an in-process teammate (or local agent) task record."""
    progress = task.get("progress")
    last = _activity_text(progress.get("last_activity")) if isinstance(progress, Mapping) else None
    return TeammateFacts(
        idle=bool(task.get("is_idle")),
        awaiting_approval=bool(task.get("awaiting_plan_approval")),
        shutdown_requested=bool(task.get("shutdown_requested")),
        activity=last,
        recent_activities=progress_activities(progress),
    )


def teammate_facts_from_status(status: Mapping[str, Any] | None, state: str) -> TeammateFacts:
    """Facts of a team member from its status file and derived state (active, idle, ...)."""
    s: Mapping[str, Any] = status or {}
    recent = s.get("recent_activities") or ()
    texts = tuple(str(a) for a in recent if a) if isinstance(recent, list | tuple) else ()
    activity = s.get("activity")
    return TeammateFacts(
        idle=state == "idle",
        awaiting_approval=bool(s.get("awaiting_approval")),
        shutdown_requested=state == "stopping" or bool(s.get("shutdown_requested")),
        activity=str(activity) if activity else None,
        recent_activities=texts,
    )


_MEMBER_TASK_STATUS: Final = {"dead": "failed", "left": "completed"}


def member_activity(state: str, facts: TeammateFacts) -> str:
    """The activity line of a member: none once dead or departed, else the teammate activity."""
    if state in ("dead", "left"):
        return ""
    return describe_teammate_activity(facts)


def member_icon(state: str, facts: TeammateFacts) -> tuple[str, str]:
    """(icon, rich style) of a member in `state` (dead ✘ red, left ✔, else as a running task)."""
    status = _MEMBER_TASK_STATUS.get(state, "running")
    flags = facts.flags if status == "running" else None
    return status_icon(status, flags), status_style(status, flags)


def task_icon(task: Mapping[str, Any]) -> tuple[str, str]:
    """(icon, rich style) of a task record; teammates show idle/approval/stopping."""
    status = str(task.get("status", "pending"))
    flags = None
    if task.get("type") == "in_process_teammate" and status == "running":
        flags = teammate_facts_from_task(task).flags
    return status_icon(status, flags), status_style(status, flags)


# --------------------------------------------------------------------------- formatting

TYPE_LABELS: Final = {
    "local_bash": "shell",
    "local_agent": "agent",
    "remote_agent": "remote",
    "in_process_teammate": "teammate",
    "local_workflow": "workflow",
    "monitor_mcp": "mcp",
    "dream": "dream",
}


def type_label(task: Mapping[str, Any]) -> str:
    """A short type name: shell, monitor, agent, remote, teammate, workflow, mcp, dream."""
    kind = str(task.get("type", "?"))
    if kind == "local_bash" and task.get("kind") == "monitor":
        return "monitor"
    return TYPE_LABELS.get(kind, kind)


def status_text(task: Mapping[str, Any]) -> str:
    """The status word, with a failed shell's exit code: `failed(2)`."""
    status = str(task.get("status", "?"))
    result = task.get("result")
    if status == "failed" and isinstance(result, Mapping) and result.get("code") is not None:
        return f"failed({result['code']})"
    return status


def format_age(seconds: float) -> str:
    """`4.2s`, `3.1m`, `1.5h`, `2.0d`."""
    secs = max(0.0, seconds)
    if secs < 60:
        return f"{secs:.1f}s"
    if secs < 3600:
        return f"{secs / 60:.1f}m"
    if secs < 86400:
        return f"{secs / 3600:.1f}h"
    return f"{secs / 86400:.1f}d"


def task_age(task: Mapping[str, Any], now: float) -> str:
    """How long the task ran (or has been running at `now`)."""
    start = task.get("start_time")
    if not isinstance(start, int | float):
        return "-"
    end = task.get("end_time")
    return format_age((end if isinstance(end, int | float) else now) - start)


def parse_timestamp(value: Any) -> float | None:
    """Epoch seconds from an epoch number or an ISO-8601 string; None when neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


_NAMED_COLORS: Final = {"orange": "dark_orange", "pink": "hot_pink"}
_TMUX_COLOUR: Final = re.compile(r"^colou?r(\d{1,3})$")


def rich_color(color: str | None) -> str:
    """A member colour (tmux palette name, e.g. `colour33`) as a rich colour; "" when unknown."""
    if not color:
        return ""
    match = _TMUX_COLOUR.match(color)
    if match:
        return f"color({int(match.group(1)) % 256})"
    return _NAMED_COLORS.get(color, color)


def one_line(text: Any, width: int = 80, *, line_sep: str = " ") -> str:
    """`text` on one line (its lines joined with `line_sep`, runs of blanks made one), cut to
    `width` characters with an ellipsis."""
    lines = (" ".join(part.split()) for part in str(text or "").splitlines())
    flat = line_sep.join(line for line in lines if line)
    return flat if len(flat) <= width else flat[: max(0, width - 1)].rstrip() + "…"


def agent_notes(task: Mapping[str, Any]) -> str:
    """What an agent waits on or has spent: `  [waits: shoal approve a1b2c3d4e.1 (Bash)]`,
    `  [waiting for the lease of a1b2c3d4e]`, `  [waiting for the model for 8 s]`,
    `  [budget: 1,200/20,000 tokens, 3/40 tool uses]`, `  [main session, in the background]`."""
    waiting = task.get("waiting_for")
    shown = ""
    if isinstance(waiting, dict) and waiting.get("request_id"):
        from shoal.core.consent import brief  # (only when one waits: ps starts without it)

        request_id = str(waiting["request_id"])
        inputs = waiting.get("input")
        what = brief(inputs, request_id) if isinstance(inputs, dict) else ""
        shown = f"  [waits: shoal approve {request_id} ({waiting.get('tool')})"
        shown += f": {what}]" if what else "]"
    elif isinstance(waiting, dict) and waiting.get("lease"):
        shown = f"  [waiting for the lease of {waiting['lease']}]"
    progress = task.get("progress")
    running = task.get("status") == "running"
    if running and isinstance(progress, Mapping) and progress.get("summary"):
        shown += f"  [{progress['summary']}]"  # (e.g. "waiting for the model for 8 s")
    budget = task.get("budget")
    if isinstance(budget, dict) and budget:
        usage = task.get("usage") or {}
        progress = task.get("progress") or {}
        spent = {
            "tokens": usage.get("total_tokens", progress.get("token_count", 0)),
            "tool_uses": usage.get("tool_uses", progress.get("tool_use_count", 0)),
        }
        parts = [
            f"{spent[key]:,}/{int(budget[key]):,} {key.replace('_', ' ')}"
            for key in ("tokens", "tool_uses")
            if key in budget
        ]
        if "seconds" in budget:
            parts.append(f"{int(budget['seconds'])}s")
        shown += f"  [budget: {', '.join(parts)}]"
    if task.get("violations"):
        shown += f"  [{len(task['violations'])} lease violation(s)]"
    if task.get("agent_type") == "main-session" and running:
        where = "in the background" if task.get("is_backgrounded", True) else "in its chat"
        shown += f"  [main session, {where}]"
    return shown
