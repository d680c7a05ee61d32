"""The leader's half of PR activity (workers/agent/pr_activity.py): the subscriptions of its
session as a policy of the loop, their events delivered to the coordinator's notification
inbox, their trouble said in its output and the leader's notes."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from shoal.channel.protocol import PrSubscribeRequest
from shoal.core.config import github_api, pr_poll_s
from shoal.core.errors import TaskError
from shoal.core.tasks import LocalAgentTaskState, TaskStatus
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.store import Maildir
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.github import DEFAULT_API, check_api_url
from shoal.workers.agent.launch import coordinator_inbox
from shoal.workers.agent.pr_activity import (
    PrActivity,
    PrEvent,
    Subscription,
    message_id,
    notification_xml,
)


def pr_policy(leader: Any) -> PrActivity:
    """The session's PR subscriptions (a policy of the loop from the first use)."""
    for policy in leader.policies:
        if isinstance(policy, PrActivity):
            return policy
    session_dir = leader.session.dir
    home = leader.layout.home

    def deliver(sub: Subscription, event: PrEvent) -> None:
        inbox = coordinator_inbox(session_dir, sub.agent_id)
        Maildir.create(inbox, home)
        message = make_message(
            sender=LEAD_NAME,
            to=sub.agent_id,
            text=notification_xml(sub, event),
            summary=f"PR activity: {sub.label} {event.kind}",
            message_id=message_id(sub, event),
        )
        deliver_to(inbox, message, durable=True)

    def say(sub: Subscription, text: str) -> None:
        """Once per spell of trouble: in the leader's notes and the coordinator's output."""
        task = _live(leader, sub.agent_id)
        leader.note(f"PR activity of {sub.label} for {task.id if task else sub.agent_id}: {text}")
        if task is not None:
            with contextlib.suppress(OSError):
                flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
                fd = os.open(task.output_file, flags)
                try:
                    os.write(fd, f"[shoal: {text}]\n".encode())
                finally:
                    os.close(fd)

    policy = PrActivity(
        session_dir,
        interval=pr_poll_s(home),
        deliver=deliver,
        say=say,
        live=lambda agent_id: _live(leader, agent_id) is not None,
        wake=leader.wake,
    )
    leader.policies.append(policy)
    return policy


def _live(leader: Any, agent_id: str) -> LocalAgentTaskState | None:
    """The running task of coordinator `agent_id` (its subscriptions are polled meanwhile)."""
    for task in leader.registry.get_all_tasks():
        if (
            isinstance(task, LocalAgentTaskState)
            and task.coordinator
            and task.agent_id == agent_id
            and task.status is TaskStatus.RUNNING
        ):
            return task
    return None


def pr_request(leader: Any, request: PrSubscribeRequest) -> dict[str, Any]:
    """subscribe_pr_activity / unsubscribe_pr_activity of coordinator task `request.agent`."""
    task = leader.find_agent(request.agent)
    if not task.coordinator:
        raise TaskError(f"agent {task.id} is not a coordinator: PR activity is theirs only")
    policy = pr_policy(leader)
    if request.op == "pr_unsubscribe":
        return policy.unsubscribe(task.agent_id, request.repo, request.number)
    home = leader.layout.home
    api = task.github_api or github_api(home) or DEFAULT_API
    where = "--github-api" if task.github_api else f"github_api in {home / 'config.toml'}"
    return policy.subscribe(task.agent_id, request.repo, request.number, check_api_url(api, where))
