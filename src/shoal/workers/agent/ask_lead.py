"""How a background agent asks the lead: a `permission_request` in the lead's inbox, then a
wait for the answer (`Feed.answer`); its status and its readable output say what it waits on
meanwhile, and how to answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from shoal.core.consent import brief
from shoal.core.paths import Layout
from shoal.mailbox.router import deliver_to, make_message
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.feed import Feed
from shoal.workers.agent.job import AgentJob
from shoal.workers.agent.progress import Output
from shoal.workers.agent.status_writer import StatusWriter
from shoal.workers.teammate.console import PREVIEW_CHARS


class Consent:
    """How a background agent asks the lead: a `permission_request` in the lead's inbox, then
    a wait for the answer (`Feed.answer`); its status says what it waits on meanwhile."""

    def __init__(self, job: AgentJob, feed: Feed, status: StatusWriter) -> None:
        self.job = job
        self.feed = feed
        self.status = status
        self.asked = 0

    async def ask(self, tool: str, shown: dict[str, Any]) -> tuple[bool, str | None]:
        self.asked += 1
        request_id = f"{self.job.task_id}.{self.asked}"
        future: asyncio.Future[tuple[bool, str | None]] = asyncio.get_running_loop().create_future()
        self.feed.waiting[request_id] = future
        layout = Layout(self.job.home)
        # In the readable transcript (and so in a pane): what it waits for, and how to answer.
        output = Output(Path(self.job.output_file), echo=self.job.echo)
        try:
            self.status.waiting = {"request_id": request_id, "tool": tool, "input": shown}
            self.status.flush()
            deliver_to(
                layout.inbox_dir(self.job.team, LEAD_NAME),
                make_message(
                    sender=LEAD_NAME,
                    to=LEAD_NAME,
                    kind="permission_request",
                    summary=f"agent {self.job.task_id} asks to run {tool}",
                    data={
                        "request_id": request_id,
                        "tool": tool,
                        "input": {"agent": self.job.task_id, **shown},
                    },
                ),
            )
            what = brief(shown, request_id, limit=PREVIEW_CHARS)  # (a cut one says so)
            output.write(
                f"[asks the lead to run {tool}{f' ({what})' if what else ''}: "
                f"shoal approve {request_id} | shoal reject {request_id}]\n"
            )
            approved, reason = await future
            verdict = "approved" if approved else f"rejected: {reason or 'no reason given'}"
            output.write(f"[{tool} {verdict}]\n")
            return approved, reason
        finally:
            self.feed.waiting.pop(request_id, None)
            self.status.waiting = None
            self.status.flush()
