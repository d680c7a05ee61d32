"""What a detail view shows for each kind of task, and for a team member (rich renderables).

One function per kind, like the seed's detail dialogs: shell (command, exit code), agent and
teammate (prompt, progress, recent activities, messages), remote, dream, workflow, MCP monitor.
The app puts these in its detail screens; they are plain functions so tests can render them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from shoal.core.taskrecords import AgentProgress
from shoal.core.tasks import (
    DreamTaskState,
    InProcessTeammateTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    LocalWorkflowTaskState,
    MonitorMcpTaskState,
    RemoteAgentTaskState,
)
from shoal.ui.source import MemberRow, TaskRow
from shoal.ui.status import (
    describe_teammate_activity,
    member_icon,
    one_line,
    progress_activities,
    status_text,
    task_age,
    task_icon,
    teammate_facts_from_task,
    type_label,
)

MESSAGES_SHOWN = 10
LOG_SHOWN = 10


def _fields(rows: Iterable[tuple[str, Any]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        if value is None or value == "" or value == ():
            continue
        grid.add_row(label, value if isinstance(value, Text) else str(value))
    return grid


def _section(title: str, lines: Sequence[str]) -> RenderableType | None:
    if not lines:
        return None
    body = Text(title, style="bold")
    for line in lines:
        body.append("\n  " + line)
    return body


def _when(ts: Any) -> str:
    if isinstance(ts, int | float):
        return datetime.fromtimestamp(ts).strftime("%H:%M:%S")
    return str(ts)[11:19] if isinstance(ts, str) and len(ts) >= 19 else ""


def _message_lines(messages: Iterable[Any]) -> list[str]:
    out = []
    for m in list(messages)[-MESSAGES_SHOWN:]:
        if not isinstance(m, Mapping):
            out.append(one_line(m, 100))
            continue
        who = m.get("from") or m.get("role") or "?"
        kind = m.get("kind") or m.get("type") or ""
        text = m.get("text") or m.get("summary") or m.get("content") or ""
        stamp = _when(m.get("sent_at") or m.get("at"))
        prefix = f"{stamp} " if stamp else ""
        tag = f" [{kind}]" if kind and kind != "text" else ""
        out.append(f"{prefix}{who}{tag}: {one_line(text, 100)}")
    return out


def _progress_rows(progress: AgentProgress | Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    if progress is None:
        return []
    p = progress.model_dump() if isinstance(progress, AgentProgress) else dict(progress)
    return [
        ("tool uses", p.get("tool_use_count") or 0),
        ("tokens", p.get("token_count") or 0),
        ("summary", p.get("summary")),
    ]


def _header(row: TaskRow, now: float) -> Text:
    icon, style = task_icon(row.record)
    head = Text(f"{icon} ", style=style)
    head.append(f"{type_label(row.record)} {row.id}", style="bold")
    head.append(f"  {status_text(row.record)}", style=style)
    head.append(f"  {task_age(row.record, now)}", style="dim")
    description = row.record.get("description")
    if description:
        head.append("\n" + one_line(description, 200))
    return head


def _result_rows(task: Any) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [("result", getattr(task, "result", None))]
    error = getattr(task, "error", None)
    if error:
        rows.append(("error", Text(str(error), style="red")))
    return rows


def shell_detail(task: LocalShellTaskState) -> list[tuple[str, Any]]:
    """Command, where and how it ran, and how it ended."""
    code = None
    if task.result is not None:
        code = f"{task.result.code}" + (" (interrupted)" if task.result.interrupted else "")
    return [
        ("command", task.command),
        ("kind", task.kind if task.kind != "bash" else None),
        ("cwd", task.cwd),
        ("pid", task.pid),
        ("exit code", code),
        ("killed because", task.kill_reason),
        ("error", task.error),
        ("agent", task.agent_id),
        ("workflow", task.workflow_id),
        ("output", task.output_file),
    ]


def agent_detail(task: LocalAgentTaskState) -> tuple[list[tuple[str, Any]], list[Any]]:
    """Fields of a local agent, then extra sections."""
    fields: list[tuple[str, Any]] = [
        ("agent", task.agent_id),
        ("type", task.agent_type),
        ("model", task.model),
        ("prompt", task.prompt),
        *_progress_rows(task.progress),
        ("queued messages", len(task.pending_messages) or None),
        *_result_rows(task),
    ]
    sections = [
        _section("Recent activities", list(progress_activities(_dump(task.progress)))),
        _section("Messages", _message_lines(task.messages)),
    ]
    return fields, sections


def teammate_detail(task: InProcessTeammateTaskState) -> tuple[list[tuple[str, Any]], list[Any]]:
    """Fields of an in-process teammate, then extra sections."""
    facts = teammate_facts_from_task(task.model_dump(mode="json"))
    fields: list[tuple[str, Any]] = [
        ("teammate", task.identity.agent_id),
        ("team", task.identity.team_name),
        ("activity", describe_teammate_activity(facts)),
        ("plan mode", "required" if task.identity.plan_mode_required else None),
        ("awaiting approval", "yes" if task.awaiting_plan_approval else None),
        ("permissions", task.permission_mode),
        ("model", task.model),
        ("prompt", task.prompt),
        *_progress_rows(task.progress),
        *_result_rows(task),
    ]
    sections = [
        _section("Recent activities", list(facts.recent_activities)),
        _section("Messages", _message_lines(task.messages)),
    ]
    return fields, sections


def remote_detail(task: RemoteAgentTaskState) -> tuple[list[tuple[str, Any]], list[Any]]:
    """Fields of a remote agent (ultraplan phase, session), then todo list and log."""
    fields: list[tuple[str, Any]] = [
        ("remote type", task.remote_task_type),
        ("title", task.title),
        ("session", task.session_id),
        ("command", task.command),
        ("ultraplan phase", task.ultraplan_phase if task.is_ultraplan else None),
        ("long running", "yes" if task.is_long_running else None),
        ("review", _kv(task.review_progress) if task.review_progress else None),
        *_result_rows(task),
    ]
    todos = [
        f"[{'x' if t.get('status') == 'completed' else ' '}] {one_line(t.get('content', t), 90)}"
        for t in task.todo_list
    ]
    log = _message_lines(task.log[-LOG_SHOWN:])
    return fields, [_section("Todo list", todos), _section("Log", log)]


def dream_detail(task: DreamTaskState) -> tuple[list[tuple[str, Any]], list[Any]]:
    """Phase, sessions reviewed, files touched and the last turns of a dream."""
    fields: list[tuple[str, Any]] = [
        ("phase", task.phase),
        ("sessions reviewing", task.sessions_reviewing),
        ("files touched", len(task.files_touched)),
    ]
    turns = [
        f"{one_line(t.text, 90)} ({t.tool_use_count} tool{'' if t.tool_use_count == 1 else 's'})"
        for t in task.turns[-LOG_SHOWN:]
    ]
    return fields, [
        _section("Files touched", list(task.files_touched[-LOG_SHOWN:])),
        _section("Turns", turns),
    ]


def workflow_detail(task: LocalWorkflowTaskState) -> list[tuple[str, Any]]:
    """Workflow name, spec and step progress."""
    steps = f"{task.completed_steps}/{task.total_steps}" if task.total_steps else None
    return [
        ("workflow", task.workflow),
        ("spec", task.spec_path),
        ("steps", steps),
        ("current step", task.current_step),
        ("counts", ", ".join(f"{k} {v}" for k, v in (task.counts or {}).items() if v) or None),
        ("step tasks", " ".join(task.steps) or None),
        ("report", task.report_file),
        ("run record", task.record_file),
        ("killed because", task.kill_reason),
        *_result_rows(task),
    ]


def monitor_detail(task: MonitorMcpTaskState) -> list[tuple[str, Any]]:
    """MCP server, target and events seen."""
    return [
        ("server", task.server_name),
        ("target", task.target),
        ("events", task.event_count),
        ("last event", _when(task.last_event_at)),
        ("error", task.error),
    ]


def _dump(progress: AgentProgress | None) -> dict[str, Any] | None:
    return progress.model_dump(mode="json") if progress is not None else None


def _kv(data: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in data.items())


def task_detail(row: TaskRow, now: float, output: Sequence[str] = ()) -> RenderableType:
    """The detail view of one task, by kind; `output` is the tail shown under a shell."""
    parts: list[RenderableType | None] = [_header(row, now)]
    task = row.state
    fields: list[tuple[str, Any]]
    sections: list[Any] = []
    if isinstance(task, LocalShellTaskState):
        fields = shell_detail(task)
    elif isinstance(task, LocalAgentTaskState):
        fields, sections = agent_detail(task)
    elif isinstance(task, InProcessTeammateTaskState):
        fields, sections = teammate_detail(task)
    elif isinstance(task, RemoteAgentTaskState):
        fields, sections = remote_detail(task)
    elif isinstance(task, DreamTaskState):
        fields, sections = dream_detail(task)
    elif isinstance(task, LocalWorkflowTaskState):
        fields = workflow_detail(task)
    elif isinstance(task, MonitorMcpTaskState):
        fields = monitor_detail(task)
    else:
        fields = [("invalid record", Text(row.error or "unknown task type", style="red"))]
    parts.append(_fields(fields))
    parts.extend(sections)
    if output:
        parts.append(_section("Output (last lines)", list(output)))
    return Group(*(p for p in parts if p is not None))


def member_detail(member: MemberRow) -> RenderableType:
    """The detail view of a team member: its status file, messages and a pending plan."""
    icon, style = member_icon(member.state, member.facts)
    head = Text(f"{icon} ", style=style)
    head.append(member.name, style="bold")
    head.append(f"  {member.state}", style=style)
    s = member.status
    progress = s.get("progress") if isinstance(s.get("progress"), Mapping) else None
    fields: list[tuple[str, Any]] = [
        ("activity", member.activity),
        ("type", member.agent_type),
        ("backend", member.backend),
        ("pid", member.pid),
        ("task", s.get("task_id")),
        ("current task", s.get("current_task")),
        ("watcher", s.get("watcher")),
        ("prompt", member.prompt),
        *_progress_rows(progress),
        ("last result", one_line(s.get("last_result"), 200) if s.get("last_result") else None),
    ]
    parts: list[RenderableType | None] = [head, _fields(fields)]
    plan = member.pending_plan
    if plan is not None and member.facts.awaiting_approval:
        text = Text("Plan awaiting approval (a approve, r reject)", style="bold yellow")
        text.append("\n" + str(plan.get("plan") or ""))
        parts.append(text)
    recent = s.get("recent_activities")
    if isinstance(recent, list):
        parts.append(_section("Recent activities", [one_line(a, 100) for a in recent]))
    messages = s.get("messages")
    if isinstance(messages, list):
        parts.append(_section("Messages", _message_lines(messages)))
    return Group(*(p for p in parts if p is not None))
