"""The CLI's side of the control channel, importing no model and no watcher: is a leader
running, which session is the team's, and a request to the leader with its answer.

Every `shoal sh`, `stop`, `wait` starts a Python process for one question or one request, so
what this module imports is paid on each call (the models, watchdog and psutil were about
0.3 s of a `shoal sh`). The team file is read as plain JSON; anything unexpected in it is read
again through the validating store, which names the problem. The answer is awaited on the
reply inbox's wake socket (mailbox/wake.py), which every delivery pokes, with a look into
`new/` now and then besides.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import time
from pathlib import Path
from typing import Any, Final

import orjson

from shoal.core.clock import iso_now
from shoal.core.errors import ShoalError, UnsafePathError
from shoal.core.ids import new_ulid
from shoal.core.names import LEAD_NAME
from shoal.core.paths import Layout
from shoal.mailbox import wake
from shoal.mailbox.store import Maildir
from shoal.teams.lead import NoLeaderError as NoLeaderError
from shoal.teams.lead import lead_session_id as lead_session_id
from shoal.teams.lead import leader_alive as leader_alive
from shoal.teams.lead import require_leader as require_leader
from shoal.teams.lead import team_record as team_record

REPLY_PREFIX: Final = "cli-"
DEFAULT_TIMEOUT_S: Final = 60.0
LOOK_EVERY_S: Final = 0.25
"""How often a waiting caller looks into its reply inbox without a wake-up (belt and braces)."""


class ControlError(ShoalError):
    """The leader refused a request, or did not answer."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def reply_inbox_path(layout: Layout, team: str, name: str) -> Path | None:
    """Where the reply inbox `name` lives, or None for a name that is not a reply inbox."""
    tail = name[len(REPLY_PREFIX) :]
    if not name.startswith(REPLY_PREFIX) or len(tail) != 16 or tail.strip("0123456789abcdef"):
        return None
    return layout.team_dir(team) / "replies" / name


def request_message(reply_to: str, request_id: str, op: str, args: dict[str, Any]) -> bytes:
    """A control request as its message file holds it (DESIGN.md's message format, kind
    `control`; the leader validates it like any message)."""
    return orjson.dumps(
        {
            "v": 1,
            "id": new_ulid(),
            "from": LEAD_NAME,
            "to": LEAD_NAME,
            "kind": "control",
            "sent_at": iso_now(),
            "text": None,
            "summary": None,
            "data": {"request_id": request_id, "op": op, "args": args},
            "reply_to": reply_to,
        }
    )


class Channel:
    """One reply inbox for a CLI call's requests to the leader: `send` them, then wait for
    their `answer`s in any order (`sh --foreground` starts a task and awaits its end while it
    streams the output)."""

    def __init__(self, layout: Layout, team: str) -> None:
        self.layout, self.team = layout, team
        self.leader = require_leader(layout, team)
        self.name = f"{REPLY_PREFIX}{secrets.token_hex(8)}"
        path = reply_inbox_path(layout, team, self.name)
        assert path is not None
        self.path = path
        self.replies = Maildir.create(path, layout.home)
        try:
            # (bound before any request goes: no wake-up is missed)
            self.listener = wake.Listener(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        self.lead_inbox: Maildir | None = None
        self.answers: dict[str, dict[str, Any]] = {}
        self.checked = time.monotonic()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the reply inbox (answers still to come are dropped with it)."""
        self.listener.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def send(self, op: str, args: dict[str, Any] | None = None) -> str:
        """Send request `op`; its id, for `answer`."""
        if self.lead_inbox is None:
            self.lead_inbox = Maildir.open(self.layout.inbox_dir(self.team, LEAD_NAME))
        request_id = secrets.token_hex(8)
        self.lead_inbox.deliver(request_message(self.name, request_id, op, args or {}))
        return request_id

    def answer(self, request_id: str, timeout: float) -> tuple[bool, Any]:
        """(True, result) once request `request_id` is answered within `timeout` seconds,
        else (False, None); a refusal raises ControlError, and so does a leader that stopped."""
        deadline = time.monotonic() + timeout
        while True:
            for file in self.replies.pending():
                self._take(file)
            reply = self.answers.pop(request_id, None)
            if reply is not None:
                if not reply.get("ok"):
                    code = reply.get("code", 1)
                    raise ControlError(
                        str(reply.get("error", "refused")), code if isinstance(code, int) else 1
                    )
                return True, reply.get("result")
            now = time.monotonic()
            if now - self.checked >= 0.5:
                self.checked = now
                if leader_alive(self.layout, self.team) != self.leader:
                    raise ControlError(f"the leader of team {self.team!r} stopped before answering")
            if now >= deadline:
                return False, None
            select.select([self.listener], [], [], min(LOOK_EVERY_S, deadline - now))
            self.listener.drain()

    def _take(self, file: str) -> None:
        """Read reply `file` into `answers` and remove it (the inbox is this call's alone)."""
        try:
            message = orjson.loads(self.replies.read("new", file))
        except (OSError, UnsafePathError, orjson.JSONDecodeError):
            message = None  # (another user's file among them is dropped unread, as noise is)
        data = message.get("data") if isinstance(message, dict) else None
        if isinstance(data, dict) and isinstance(data.get("request_id"), str):
            self.answers[data["request_id"]] = data
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.replies.path, "new", file))


def call(
    layout: Layout,
    team: str,
    op: str,
    args: dict[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """Ask the leader to carry out `op`; returns its result or raises its error."""
    with Channel(layout, team) as channel:
        done, result = channel.answer(channel.send(op, args), timeout)
    if not done:
        raise ControlError(f"the leader of team {team!r} did not answer within {timeout:g}s")
    return result
