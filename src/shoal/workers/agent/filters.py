"""Which tools an agent gets: the seed's filter layers, as data, applied in one order.

1. MCP tools (`mcp__{server}__{tool}`) are always allowed.
2. ALL_AGENT_DISALLOWED_TOOLS are taken from every agent.
3. CUSTOM_AGENT_DISALLOWED_TOOLS are taken from agents of a user's definition as well.
4. A background (async) agent keeps only ASYNC_AGENT_ALLOWED_TOOLS.
5. A teammate additionally keeps Agent (a synchronous subagent) and
   IN_PROCESS_TEAMMATE_ALLOWED_TOOLS.
6. Plan mode allows ExitPlanMode.
Then an explicit `--tools` list keeps only those, and `--disallowed-tools` takes its names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

MCP_PREFIX: Final = "mcp__"
# Tools no agent gets: ending plan mode (re-allowed in plan mode), and managing teams and
# other tasks' lifecycle, which stays with the lead.
ALL_AGENT_DISALLOWED_TOOLS: Final = frozenset(
    {"ExitPlanMode", "TeamCreate", "TeamDelete", "TaskOutput", "TaskStop"}
)
# A user-defined agent does not start agents of its own.
CUSTOM_AGENT_DISALLOWED_TOOLS: Final = ALL_AGENT_DISALLOWED_TOOLS | {"Agent"}
# What a background agent may use: the file and shell tools, the team's shared list, and
# subagents (a custom agent loses these by the layer above).
ASYNC_AGENT_ALLOWED_TOOLS: Final = frozenset(
    {
        "Read", "Write", "Edit", "Glob", "Grep", "Bash",
        "SendMessage", "TaskCreate", "TaskGet", "TaskList", "TaskUpdate", "Agent",
    }
)  # fmt: skip
# A teammate coordinates through the team: messages, the list, and synchronous subagents.
IN_PROCESS_TEAMMATE_ALLOWED_TOOLS: Final = frozenset(
    {"SendMessage", "TaskCreate", "TaskGet", "TaskList", "TaskUpdate", "Agent"}
)
PLAN_MODE_TOOLS: Final = frozenset({"ExitPlanMode"})


def filter_tools(
    tools: Iterable[str],
    *,
    custom: bool = False,
    background: bool = True,
    teammate: bool = False,
    plan_mode: bool = False,
    only: Sequence[str] | None = None,
    without: Sequence[str] = (),
) -> list[str]:
    """The names of `tools` an agent of this kind keeps, in their order."""
    kept: list[str] = []
    for name in tools:
        always = (
            name.startswith(MCP_PREFIX)
            or (plan_mode and name in PLAN_MODE_TOOLS)
            or (teammate and name in IN_PROCESS_TEAMMATE_ALLOWED_TOOLS)
        )
        disallowed = CUSTOM_AGENT_DISALLOWED_TOOLS if custom else ALL_AGENT_DISALLOWED_TOOLS
        ok = always or (
            name not in disallowed and (not background or name in ASYNC_AGENT_ALLOWED_TOOLS)
        )
        if ok and (only is None or name in only) and name not in without:
            kept.append(name)
    return kept
