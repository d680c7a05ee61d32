"""What a teammate's status file says as it works (`teams/{team}/status/{name}.json`): the
latest activity and the ones before it, each with its time, its progress (tool uses, tokens,
summary), the messages it received (their texts cut, for views), and whatever the runner sets
(its run state among them). Each change is written at once, and handed to an in-process lead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from shoal.core.tasks import TEAMMATE_MESSAGES_UI_CAP
from shoal.mailbox.schema import AnyMessage
from shoal.teams.store import Teams

RECENT_ACTIVITIES: Final = 5
# Message texts kept in the status file (for views) are cut to this many characters.
STATUS_TEXT_CAP: Final = 500


class TeammateStatus:
    """One teammate's status file: its fields as last written, and the counts they come from."""

    def __init__(
        self,
        teams: Teams,
        team: str,
        name: str,
        on_status: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.teams = teams
        self.team = team
        self.name = name
        self.on_status = on_status
        self.fields: dict[str, Any] = {}
        self.messages: deque[dict[str, Any]] = deque(maxlen=TEAMMATE_MESSAGES_UI_CAP)
        self.activities: deque[str] = deque(maxlen=RECENT_ACTIVITIES)
        self.activity_times: deque[float] = deque(maxlen=RECENT_ACTIVITIES)  # (epoch s)
        self.tool_uses = 0
        self.tokens = 0  # the brain's conversation's count after its latest turn
        self.turn_steps = 0
        self.summary: str | None = None

    def write(self, **changes: Any) -> None:
        """Set `changes` and write the file (an activity that changed gets its start time)."""
        if "activity" in changes and changes["activity"] != self.fields.get("activity"):
            changes["activity_at"] = time.time()  # (epoch s: when it began)
        self.fields.update(changes)
        self.fields["messages"] = list(self.messages)
        self.teams.write_status(self.team, self.name, self.fields)
        if self.on_status is not None:
            self.on_status(dict(self.fields))

    def remember(self, msg: AnyMessage) -> None:
        """A message received, kept for views (written with the next change)."""
        text = (
            msg.text
            if msg.text is None or len(msg.text) <= STATUS_TEXT_CAP
            else (msg.text[:STATUS_TEXT_CAP] + "…")
        )
        self.messages.append(
            {"from": msg.from_, "kind": msg.kind, "text": text, "sent_at": msg.sent_at}
        )

    def step(self, text: str) -> None:
        """One step of a turn (a tool use), counted and written at once."""
        self.turn_steps += 1
        self.activities.append(text)
        self.activity_times.append(time.time())
        self.summary = text  # (as it works; its turn's end says how the turn went)
        self.write(
            activity=text,
            recent_activities=list(self.activities),
            activity_times=list(self.activity_times),
            progress=self.progress(),
        )

    def end_turn(self, steps: int, tokens: int) -> None:
        """A turn ended, having reported `steps` (an aborted one reports none, but those it
        took were counted as they ran) and its conversation's `tokens` (0: not told)."""
        self.tool_uses += max(steps, self.turn_steps)
        self.tokens = tokens or self.tokens
        self.turn_steps = 0

    def progress(self) -> dict[str, Any]:
        return {
            "tool_use_count": self.tool_uses + self.turn_steps,
            "token_count": self.tokens,
            "summary": self.summary,
        }
