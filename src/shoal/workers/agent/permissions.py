"""Permission modes: what an agent may do without asking, and how it asks.

    default            Write, Edit and Bash ask the lead first
    acceptEdits        Bash asks; file edits do not
    plan               Write, Edit and Bash are refused until ExitPlanMode's plan is approved
                       (then the agent goes on in `default`)
    bypassPermissions  nothing asks
    bubble             as default: the question goes to the parent (for a background agent,
                       the lead)

The modes form a ladder, plan < default < acceptEdits < bypassPermissions (`bubble` ranks as
the mode of the agent it asks: its parent's, never above default, since it asks as default
does). A child (subagent, fork, coordinator worker, resumed agent) never ranks above its
parent: what a definition, a flag or a message asks for can only narrow (`narrowest`). Only
the user's own command line or `SHOAL_HOME/config.toml` starts an agent in bypassPermissions.

Besides Write, Edit and Bash, two things run commands and are gated as Bash is: a shared-list
task whose `metadata.run` a teammate will run (TaskCreate, TaskUpdate), and every MCP tool
(`mcp__*`: its server can do anything). In plan mode both are refused until the plan is
approved; an MCP tool's own `readOnlyHint` is the server's claim, not taken on trust.

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

from shoal.core.errors import UsageError
from shoal.mailbox.store import MAX_MESSAGE_BYTES
from shoal.workers.agent.tool_args import ToolArgs, ToolFailure

# The ladder, lowest first: a mode may do without asking all that the modes below it may.
LADDER: Final = ("plan", "default", "acceptEdits", "bypassPermissions")
BUBBLE: Final = "bubble"
MODES: Final = (*LADDER, BUBBLE)
# Only these sources may start an agent in bypassPermissions (never a project file or a model).
BYPASS_SOURCES: Final = "the command line (--permission-mode) or SHOAL_HOME/config.toml"

# Tools that change something (files, or anything a command does).
GATED_TOOLS: Final = frozenset({"Write", "Edit", "Bash"})
# A gated "command": Bash, a list task's metadata.run, an MCP tool.
COMMAND: Final = "Bash"
ASKS: Final[dict[str, frozenset[str]]] = {
    "default": GATED_TOOLS,
    "bubble": GATED_TOOLS,
    "acceptEdits": frozenset({COMMAND}),
    "bypassPermissions": frozenset(),
    "plan": frozenset(),
}
MCP_PREFIX: Final = "mcp__"
TASK_TOOLS: Final = frozenset({"TaskCreate", "TaskUpdate"})


def check_mode(mode: str, what: str = "permission mode") -> str:
    """`mode` if it is a permission mode; a UsageError naming the choices otherwise."""
    if mode not in MODES:
        raise UsageError(f"unknown {what} {mode!r} (choose from {', '.join(MODES)})")
    return mode


def rank(mode: str, parent: str | None = None) -> int:
    """Where `mode` stands on the ladder; `bubble` stands where `parent` does (never above
    default: it asks as default does), and at default with no parent known."""
    if mode == BUBBLE:
        return min(rank(parent) if parent not in (None, BUBBLE) else 1, 1)
    return LADDER.index(check_mode(mode))


def narrowest(parent: str, *asked: str | None) -> str:
    """The mode a child of a `parent`-mode agent gets when `asked` (a definition's, a flag's,
    a sender's; None: no say) ask for theirs: the lowest of them all, never above `parent`.
    `bubble` asked under a parent that ranks at default or above stays `bubble` (it forwards
    the questions); under plan it is plan."""
    best = parent
    for mode in asked:
        if mode is None:
            continue
        check_mode(mode)
        if mode == BUBBLE:
            best = BUBBLE if rank(best, parent) >= 1 else "plan"
        elif rank(mode, parent) < rank(best, parent):
            best = mode
    return best


class ExitPlanModeArgs(ToolArgs):
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
    (a prompt that cut them could show a harmless start and hide `; curl …|sh`); for a task
    tool, the `metadata.run` it would set, and for an MCP tool, all its arguments. A request
    too big for one message is refused, as a tool error naming the size and the way out."""
    if tool.startswith(MCP_PREFIX):
        shown = {"arguments": orjson.dumps(args, default=str).decode()}
    else:
        keep = ("command", "description", "file_path", "old_string", "new_string", "content",
                "plan")  # fmt: skip
        shown = {k: str(v) for k, v in args.items() if k in keep and v is not None}
        if tool in TASK_TOOLS:
            shown["command"] = str(task_run(args))
    size = len(orjson.dumps(shown))
    if size > MAX_MESSAGE_BYTES - _ENVELOPE_BYTES:
        raise ToolFailure(
            f"this {tool} call is {size:,} bytes, over the {MAX_MESSAGE_BYTES:,} a request for "
            "consent can carry whole; write the long part to a file in smaller pieces and run "
            "or edit it from there"
        )
    return shown


def task_run(args: dict[str, Any]) -> Any:
    """The command a TaskCreate/TaskUpdate sets as the task's `metadata.run` (None: none)."""
    metadata = args.get("metadata")
    return metadata.get("run") if isinstance(metadata, dict) else None


def gated_as(tool: str, args: dict[str, Any]) -> str | None:
    """The gated tool a call counts as (`Bash` for a command however it is given), or None
    when it changes nothing the modes guard."""
    if tool in GATED_TOOLS:
        return tool
    if tool.startswith(MCP_PREFIX):
        return COMMAND
    if tool in TASK_TOOLS and task_run(args) is not None:
        return COMMAND
    return None


class Gate:
    """The permission check in front of the gated tools of one agent. `approved` is the mode
    an approved plan leaves the agent in (`default` for an agent; a teammate goes back to
    what it was started with)."""

    def __init__(
        self,
        mode: str,
        ask: Asker | None,
        approved: str = "default",
        on_approved: Callable[[str], None] | None = None,
    ) -> None:
        self.mode = mode
        self.ask = ask
        self.approved = approved
        # Told the new mode once a plan is approved (what the mode decides besides this gate,
        # such as the command sandbox, follows it).
        self.on_approved = on_approved

    async def check(self, tool: str, args: dict[str, Any]) -> None:
        """Return when `tool` may run; a ToolFailure (for the model) when it may not."""
        gated = gated_as(tool, args)
        if gated is None:
            return
        what = tool
        if tool in TASK_TOOLS:
            what = f"{tool} with metadata.run (a command a teammate runs)"
        elif tool.startswith(MCP_PREFIX):
            what = f"{tool} (an MCP tool: its server may run anything)"
        if self.mode == "plan":
            raise ToolFailure(
                f"permission mode plan: {what} is refused until your plan is approved; "
                "call ExitPlanMode with the plan"
            )
        if gated not in ASKS.get(self.mode, GATED_TOOLS):
            return
        if self.ask is None:
            raise ToolFailure(f"{what} needs the lead's consent, and there is no one to ask")
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
        approved, reason = await self.ask("ExitPlanMode", describe("ExitPlanMode", {"plan": plan}))
        if not approved:
            raise ToolFailure(f"the lead rejected the plan{': ' + reason if reason else ''}")
        self.mode = self.approved
        if self.on_approved is not None:
            self.on_approved(self.mode)
        return "the plan was approved; carry it out" + (f" ({reason})" if reason else "")
