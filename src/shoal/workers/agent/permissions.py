"""Permission modes: what an agent may do without asking, and how it asks.

    default            Write, Edit and Bash ask the lead first
    acceptEdits        Bash asks; file edits do not
    plan               Write, Edit and Bash are refused until ExitPlanMode's plan is approved
                       (then the agent goes on in `default`)
    bypassPermissions  nothing asks
    bubble             as default: the question goes to the parent (for a background agent,
                       the lead)

A background agent asks with a `permission_request` in the lead's inbox (its request id is
`{task_id}.{n}`, shown by `shoal ps`) and waits for the `permission_response` that
`shoal approve ID` or `shoal reject ID --feedback ...` sends. A rejection is a tool error
carrying the feedback: the model hears why, and the agent goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
from pydantic import Field

from shoal.mailbox.store import MAX_MESSAGE_BYTES
from shoal.workers.agent.tools import ToolFailure, _Args

# Tools that change something (files, or anything a command does).
GATED_TOOLS: Final = frozenset({"Write", "Edit", "Bash"})
ASKS: Final[dict[str, frozenset[str]]] = {
    "default": GATED_TOOLS,
    "bubble": GATED_TOOLS,
    "acceptEdits": frozenset({"Bash"}),
    "bypassPermissions": frozenset(),
    "plan": frozenset(),
}


class ExitPlanModeArgs(_Args):
    plan: str = Field(min_length=1, description="The plan, for the lead to approve")


PLAN_TOOL_SPECS: Final = (
    ("ExitPlanMode", ExitPlanModeArgs, "Ask the lead to approve your plan and leave plan mode."),
)

# (tool, what it would do) -> (approved?, the lead's feedback)
Asker = Callable[[str, dict[str, Any]], Awaitable[tuple[bool, str | None]]]


# Room left in a request's message for its envelope (ids, names, the agent's task id).
_ENVELOPE_BYTES: Final = 4096


def describe(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """What a request shows the lead: the arguments that say what the tool would do, whole
    (a prompt that cut them could show a harmless start and hide `; curl …|sh`). A request
    too big for one message is refused, as a tool error naming the size and the way out."""
    keep = ("command", "description", "file_path", "old_string", "new_string", "content", "plan")
    shown = {k: str(v) for k, v in args.items() if k in keep and v is not None}
    size = len(orjson.dumps(shown))
    if size > MAX_MESSAGE_BYTES - _ENVELOPE_BYTES:
        raise ToolFailure(
            f"this {tool} call is {size:,} bytes, over the {MAX_MESSAGE_BYTES:,} a request for "
            "consent can carry whole; write the long part to a file in smaller pieces and run "
            "or edit it from there"
        )
    return shown


class Gate:
    """The permission check in front of the gated tools of one agent."""

    def __init__(self, mode: str, ask: Asker | None) -> None:
        self.mode = mode
        self.ask = ask

    async def check(self, tool: str, args: dict[str, Any]) -> None:
        """Return when `tool` may run; a ToolFailure (for the model) when it may not."""
        if self.mode == "plan" and tool in GATED_TOOLS:
            raise ToolFailure(
                f"permission mode plan: {tool} is refused until your plan is approved; "
                "call ExitPlanMode with the plan"
            )
        if tool not in ASKS.get(self.mode, GATED_TOOLS):
            return
        if self.ask is None:
            raise ToolFailure(f"{tool} needs the lead's consent, and there is no one to ask")
        approved, reason = await self.ask(tool, describe(tool, args))
        if not approved:
            why = f": {reason}" if reason else ""
            raise ToolFailure(f"the lead rejected {tool}{why}")

    async def exitplanmode(self, args: ExitPlanModeArgs) -> str:
        """ExitPlanMode: ask for the plan's approval; approved, the agent leaves plan mode."""
        plan = args.plan
        if self.mode != "plan":
            return "not in plan mode; go ahead"
        if self.ask is None:
            raise ToolFailure("no one to approve the plan")
        approved, reason = await self.ask("ExitPlanMode", {"plan": plan[:8000]})
        if not approved:
            raise ToolFailure(f"the lead rejected the plan{': ' + reason if reason else ''}")
        self.mode = "default"
        return "the plan was approved; carry it out" + (f" ({reason})" if reason else "")
