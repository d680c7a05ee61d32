"""Task notifications: the `<task-notification>` XML, human summaries and SDK event records."""

from __future__ import annotations

import re
from typing import Final

from shoal.core.taskrecords import TaskUsage
from shoal.core.tasks import (
    InProcessTeammateTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    TaskStateBase,
    TaskStatus,
    TaskType,
)

NOTIFICATION_OPEN_TAG: Final = "<task-notification>"
NOTIFICATION_CLOSE_TAG: Final = "</task-notification>"
# (what xml.sax.saxutils.escape does with both quotes as entities; that module imports
# urllib.request, and with it http.client, ssl and email: 30 ms on every leader's start)
_XML_ENTITIES: Final = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}
)


def xml_escape(value: object) -> str:
    """`value` as text safe inside an XML element or attribute (&, <, > and both quotes)."""
    return str(value).translate(_XML_ENTITIES)


def _value(enum_or_str: TaskType | TaskStatus | str) -> str:
    return enum_or_str.value if isinstance(enum_or_str, TaskType | TaskStatus) else enum_or_str


def task_notification_xml(
    *,
    task_id: str,
    task_type: TaskType | str,
    output_file: str,
    status: TaskStatus | str,
    summary: str,
    tool_use_id: str | None = None,
    result: str | None = None,
    usage: TaskUsage | None = None,
    output_tail: str | None = None,
) -> str:
    """The `<task-notification>` block of the seed, every value XML-escaped.

    `tool_use_id`, `result`, `usage` and `output_tail` add their element only when given
    (`result` and `usage` are for agent tasks; `output_tail` for stall notices).
    """
    lines = [NOTIFICATION_OPEN_TAG, f"<task-id>{xml_escape(task_id)}</task-id>"]
    if tool_use_id is not None:
        lines.append(f"<tool-use-id>{xml_escape(tool_use_id)}</tool-use-id>")
    lines += [
        f"<task-type>{xml_escape(_value(task_type))}</task-type>",
        f"<output-file>{xml_escape(output_file)}</output-file>",
        f"<status>{xml_escape(_value(status))}</status>",
        f"<summary>{xml_escape(summary)}</summary>",
    ]
    if result is not None:
        lines.append(f"<result>{xml_escape(result)}</result>")
    if usage is not None:
        lines.append(
            f"<usage><total_tokens>{usage.total_tokens}</total_tokens>"
            f"<tool_uses>{usage.tool_uses}</tool_uses>"
            f"<duration_ms>{usage.duration_ms}</duration_ms></usage>"
        )
    if output_tail is not None:
        lines.append(f"<output-tail>{xml_escape(output_tail)}</output-tail>")
    lines.append(NOTIFICATION_CLOSE_TAG)
    return "\n".join(lines)


def summary_for(task: TaskStateBase) -> str:
    """Human wording of a terminal task's outcome, e.g. `Task "build" completed successfully`."""
    name = f'Task "{task.description}"'
    if task.status == TaskStatus.COMPLETED:
        return f"{name} completed successfully"
    if task.status == TaskStatus.FAILED:
        if isinstance(task, LocalShellTaskState) and task.result is not None:
            return f"{name} failed with exit code {task.result.code}"
        error: str | None = getattr(task, "error", None)
        return f"{name} failed: {error}" if error else f"{name} failed"
    if task.status == TaskStatus.KILLED:
        reason: str | None = getattr(task, "kill_reason", None)
        return f"{name} was stopped: {reason}" if reason else f"{name} was stopped"
    raise ValueError(f"task {task.id} is {task.status.value}, not terminal: it has no outcome yet")


def stall_summary(description: str) -> str:
    """The summary sent once when a shell seems stuck at an interactive prompt."""
    return f'Task "{description}" appears to be waiting for interactive input'


def task_notification_for(
    task: TaskStateBase,
    summary: str | None = None,
    *,
    result: str | None = None,
    usage: TaskUsage | None = None,
) -> str:
    """The notification XML of a terminal task; `result` and `usage` are what its kind adds
    (agent tasks' own fields when not given)."""
    if isinstance(task, LocalAgentTaskState | InProcessTeammateTaskState):
        result = result if result is not None else task.result
        usage = usage if usage is not None else task.usage
    return task_notification_xml(
        task_id=task.id,
        task_type=task.type,
        output_file=task.output_file,
        status=task.status,
        summary=summary if summary is not None else summary_for(task),
        tool_use_id=task.tool_use_id,
        result=result,
        usage=usage,
    )


def stall_notification_xml(task: TaskStateBase, tail: str) -> str:
    """The one-off notice that a running task appears to wait for input, with its output tail."""
    return task_notification_xml(
        task_id=task.id,
        task_type=task.type,
        output_file=task.output_file,
        status=task.status,
        summary=stall_summary(task.description),
        tool_use_id=task.tool_use_id,
        output_tail=tail,
    )


def is_task_notification(text: str) -> bool:
    """True if `text` is a task notification rather than a user message (by its opening tag)."""
    return text.lstrip().startswith(NOTIFICATION_OPEN_TAG)


# A notification of a task's end (not a notice, such as "appears stalled", of a running one);
# group 1 is its task id.
END_NOTIFICATION: Final = re.compile(
    r"<task-notification>\s*<task-id>([^<]+)</task-id>(?:(?!</task-notification>).)*?"
    r"<status>(?:completed|failed|killed)</status>",
    re.DOTALL,
)
