"""The control channel: CLI commands that change state ask the leader through its inbox.

A client makes an ephemeral reply inbox (`teams/{team}/replies/cli-{hex}`), sends a `control`
message to the lead with `reply_to` naming it, and waits for the `control_reply`. With no
leader running it fails at once, naming `shoal up`.
"""

from __future__ import annotations

import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.store import Maildir
from shoal.orchestrator.liveness import leader_alive
from shoal.teams.models import LEAD_NAME

REPLY_NAME = re.compile(r"^cli-[0-9a-f]{16}$")
DEFAULT_TIMEOUT_S = 60.0


class NoLeaderError(ShoalError):
    """No leader runs for the team."""


class ControlError(ShoalError):
    """The leader refused a request, or did not answer."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def reply_inbox_path(layout: Layout, team: str, name: str) -> Path | None:
    """Where the reply inbox `name` lives, or None for a name that is not a reply inbox."""
    if not REPLY_NAME.fullmatch(name):
        return None
    return layout.team_dir(team) / "replies" / name


def require_leader(layout: Layout, team: str) -> tuple[int, float]:
    """The running leader's (pid, start time), or NoLeaderError naming `shoal up`."""
    alive = leader_alive(layout, team)
    if alive is None:
        raise NoLeaderError(
            f"no leader is running for team {team!r}; start one with `shoal up --team {team}`"
        )
    return alive


def call(
    layout: Layout,
    team: str,
    op: str,
    args: dict[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """Ask the leader to carry out `op`; returns its result or raises its error."""
    pid, started = require_leader(layout, team)
    name = f"cli-{secrets.token_hex(8)}"
    path = reply_inbox_path(layout, team, name)
    assert path is not None
    maildir = Maildir.create(path, layout.home)
    request_id = secrets.token_hex(8)
    try:
        with Inbox(maildir) as inbox:
            lead_inbox = layout.inbox_dir(team, LEAD_NAME)
            deliver_to(
                lead_inbox,
                make_message(
                    sender=LEAD_NAME,
                    to=LEAD_NAME,
                    kind="control",
                    reply_to=name,
                    data={"request_id": request_id, "op": op, "args": args or {}},
                ),
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                delivery = inbox.receive(timeout=0.5)
                if delivery is None:
                    if leader_alive(layout, team) != (pid, started):
                        raise ControlError(f"the leader of team {team!r} stopped before answering")
                    continue
                inbox.ack(delivery)
                data = delivery.message.data
                if getattr(data, "request_id", None) != request_id:
                    continue
                if not getattr(data, "ok", False):
                    extra = data.model_dump()
                    raise ControlError(
                        str(getattr(data, "error", "refused")), int(extra.get("code", 1))
                    )
                return getattr(data, "result", None)
            raise ControlError(f"the leader of team {team!r} did not answer within {timeout:g}s")
    finally:
        shutil.rmtree(path, ignore_errors=True)
