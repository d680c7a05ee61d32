"""A coordinator between its turns: its toolset, its workers' notifications fed in from its
inbox (each acked only once it is in the transcript), which workers are outstanding (a query
of the leader's records, never of its own text), and the wait for the next message, or for
the end once none is outstanding. A replayed coordinator goes on as its recording did.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import ShoalError
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.store import Maildir
from shoal.workers.agent.feed import Feed, recorded_notifications
from shoal.workers.agent.job import AgentJob
from shoal.workers.agent.loop import AgentLoop
from shoal.workers.agent.models import ModelSpec
from shoal.workers.agent.pr_activity import active_subscriptions
from shoal.workers.agent.status_writer import StatusWriter
from shoal.workers.agent.team_tools import LeaderPort
from shoal.workers.agent.transcript import Transcript

COORDINATOR_IDLE_CHECK_S: Final = 1.0
# In the scratchpad: what the coordinator said (its synthesis), for its workers to read.
COORDINATOR_JOURNAL: Final = "coordinator.md"
# What a replayed coordinator is told when its recording answered more requests than it made.
REPLAY_CONTINUE: Final = "(replay: go on as recorded)"


def watch_coordinator_inbox(
    path: Path, home: Path, feed: Feed, stop: threading.Event
) -> threading.Thread:
    """Feed a coordinator its workers' notifications; each is acked only once it is in the
    transcript (a coordinator killed in between gets it again, and sees it once)."""

    def run() -> None:
        while not stop.is_set():
            try:
                serve()
            except Exception as exc:  # (the inbox, not the agent, failed: say so, go on)
                feed.put(
                    f"[shoal: the notification inbox {path} failed ({exc}); retrying]",
                    counted=False,
                )
                stop.wait(1.0)

    def serve() -> None:
        maildir = Maildir.create(path, home)
        with Inbox(maildir) as inbox:

            def acker(delivery: Any) -> Callable[[], None]:
                def ack() -> None:
                    with contextlib.suppress(ShoalError, OSError):
                        inbox.ack(delivery)

                return ack

            while not stop.is_set():
                delivery = inbox.receive(timeout=0.2)
                if delivery is None:
                    continue
                if delivery.message.text:
                    feed.put(delivery.message.text, ack=acker(delivery))
                else:
                    inbox.ack(delivery)

    thread = threading.Thread(target=run, name="coordinator-inbox", daemon=True)
    thread.start()
    return thread


def outstanding_workers(job: AgentJob, leader: LeaderPort, agent: AgentLoop) -> list[str]:
    """A coordinator's workers still running, waiting for a lease, or whose end is not yet in
    its transcript: a query of the leader's records (`worker_of`), which the leader writes
    before it answers the Agent call that started them (the reply follows a state flush)."""
    seen = recorded_notifications(agent)
    records = leader.task_records()
    mine = {task_id for task_id, raw in records.items() if raw.get("worker_of") == job.agent_id}
    return sorted(
        task_id
        for task_id in mine
        if (records.get(task_id) or {}).get("status") not in ("completed", "failed", "killed")
        or task_id not in seen
    )


async def coordinator_wait(
    job: AgentJob, leader: LeaderPort, loop: AgentLoop, feed: Feed, status: StatusWriter
) -> str | None:
    """After a coordinator's turn: the next message to go on with (a worker's notification,
    or the user's), or None when no worker is outstanding and the coordinator is done."""
    replayed = ModelSpec.parse(job.model).provider == "replay"
    while True:
        if loop.attach is not None:
            await loop.attach.idle()  # (an end of its background task may be what wakes it)
        queued = loop.pending()
        if replayed and replay_left(job, loop) <= 0:
            # The recording asked for nothing more: what arrives now (a worker's end that
            # came in another batching than the recording's, after its last request) asks
            # for no model request. It waits for its workers to end, and is done.
            queued = []
        if queued:
            return "\n\n".join(queued)
        outstanding = await asyncio.to_thread(outstanding_workers, job, leader, loop)
        watched = await asyncio.to_thread(
            active_subscriptions, Path(job.output_file).parent.parent, job.agent_id
        )
        if not outstanding and not watched:
            if replay_left(job, loop) > 0:
                # (the recording answered more requests: its notifications came in another
                # batching than this run's, so the replay goes on where the recording did)
                return REPLAY_CONTINUE
            return None
        if outstanding + watched != feed.waiting_shown:
            feed.waiting_shown = outstanding + watched
            what = [f"{len(outstanding)} worker(s): {', '.join(outstanding)}"]
            what = what if outstanding else []
            if watched:  # (a subscription holds it until it unsubscribes or the PR refuses)
                what.append(f"activity on {', '.join(watched)}")
            loop.output.write(f"[waiting for {'; '.join(what)}]\n")
            status.progress(loop.progress, force=True)
        text = await feed.next_message(timeout=COORDINATOR_IDLE_CHECK_S)
        if text is not None and not (replayed and replay_left(job, loop) <= 0):
            return text


def replay_left(job: AgentJob, loop: AgentLoop) -> int:
    """How many recorded responses a replayed coordinator has not given yet (0 otherwise)."""
    from pydantic_ai.messages import ModelResponse

    spec = ModelSpec.parse(job.model)
    if spec.provider != "replay":
        return 0
    recorded = Transcript.load(Path(spec.name)).messages
    given = sum(isinstance(m, ModelResponse) for m in loop.history)
    return sum(isinstance(m, ModelResponse) for m in recorded) - given


def coordinator_tools(job: AgentJob, leader: LeaderPort) -> list[Any]:
    """A coordinator's tools: Agent (background workers), SendMessage, TaskStop and the PR
    activity pair."""
    from pydantic_ai import Tool

    from shoal.workers.agent.team_tools import COORDINATOR_TOOL_SPECS, CoordinatorTools
    from shoal.workers.agent.tool_args import schema_of
    from shoal.workers.agent.tool_calls import tool_function

    handler = CoordinatorTools(
        Path(job.home), job.team, job.task_id, leader, cwd=job.cwd, model=job.model
    )
    return [
        Tool.from_schema(tool_function([handler], name, model), name, text, schema_of(model))
        for name, model, text in COORDINATOR_TOOL_SPECS
    ]
