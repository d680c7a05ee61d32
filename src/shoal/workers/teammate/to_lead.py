"""What a teammate tells its lead: a message of a given kind (ready and idle notices, shutdown
answers, plan approval requests, texts), shown on its console unless the console has a line
of its own for it; and a turn's end, as the `task_notification` of the lead's teammate task.
A message that cannot be sent is said on the console: it never ends the teammate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import ShoalError
from shoal.core.notify import task_notification_xml
from shoal.core.taskrecords import TaskUsage
from shoal.mailbox.router import deliver_to, send, task_notification_message
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams
from shoal.workers.teammate.brains import TurnResult
from shoal.workers.teammate.console import Console

# Messages to the lead the console does not list as sent: an idle notice is the `idle` line
# itself, a plan approval request the `plan` line.
QUIET_SENDS: Final = frozenset({"idle_notification", "plan_approval_request"})


def tell_lead(
    teams: Teams,
    team: str,
    name: str,
    console: Console,
    kind: str,
    *,
    text: str | None = None,
    summary: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Send the lead a message of `kind` from teammate `name`."""
    try:
        send(
            teams.directory(team),
            to=LEAD_NAME,
            sender=name,
            kind=kind,
            text=text,
            summary=summary,
            data=data,
        )
    except (ShoalError, OSError) as exc:
        console.line("error", f"cannot send a {kind} to {LEAD_NAME}: {exc}")
        return
    if kind not in QUIET_SENDS and console.enabled:
        about = text or summary
        if kind == "shutdown_response" and data is not None:
            about = "approved" if data.get("approve") else f"rejected: {data.get('reason')}"
        console.sent(kind, LEAD_NAME, about)


def report_turn(
    teams: Teams,
    team: str,
    name: str,
    console: Console,
    *,
    task_id: str | None,
    output_file: Path,
    subject: str,
    result: TurnResult,
    aborted: bool,
    started: float,
    list_task_id: Any,
) -> str:
    """Tell the lead how a turn ended (`task_id`: the lead's teammate task, else the member's
    agent id); returns the turn's one-line summary."""
    status = "completed" if result.ok else ("killed" if aborted else "failed")
    summary = f'{name}: "{subject[:80]}" ' + (
        "completed" if result.ok else ("was aborted" if aborted else "failed")
    )
    task_id = task_id or f"{name}@{team}"
    xml = task_notification_xml(
        task_id=task_id,
        task_type="in_process_teammate",
        output_file=str(output_file),
        status=status,
        summary=summary,
        result=result.result,
        usage=TaskUsage(
            total_tokens=result.tokens,
            tool_uses=result.steps,
            duration_ms=int((time.monotonic() - started) * 1000),
        ),
    )
    try:
        directory = teams.directory(team)
        deliver_to(
            directory.inbox(LEAD_NAME),
            task_notification_message(
                sender=name,
                to=LEAD_NAME,
                xml=xml,
                summary=summary,
                task_id=task_id,
                status=status,
                task_type="in_process_teammate",
                output_file=str(output_file),
                result=result.result[-2000:],
                list_task_id=list_task_id,
                exit_code=result.exit_code,
            ),
        )
    except (ShoalError, OSError) as exc:
        console.line("error", f"cannot send the result to {LEAD_NAME}: {exc}")
    else:
        console.sent("task_notification", LEAD_NAME, f"{status}: {result.result}")
    return summary
