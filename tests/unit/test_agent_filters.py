"""The tool filter layers, each list a named constant, applied in the seed's order."""

from __future__ import annotations

from shoal.workers.agent.filters import (
    ALL_AGENT_DISALLOWED_TOOLS,
    ASYNC_AGENT_ALLOWED_TOOLS,
    CUSTOM_AGENT_DISALLOWED_TOOLS,
    IN_PROCESS_TEAMMATE_ALLOWED_TOOLS,
    filter_tools,
)
from shoal.workers.agent.runner import ALL_TOOL_NAMES

ALL = [*ALL_TOOL_NAMES, "Agent", "ExitPlanMode", "TeamCreate", "mcp__time__now"]


def test_mcp_tools_are_always_allowed() -> None:
    assert "mcp__time__now" in filter_tools(ALL, custom=True, background=True)


def test_every_agent_loses_the_globally_disallowed() -> None:
    kept = filter_tools(ALL, background=False)
    assert not set(kept) & ALL_AGENT_DISALLOWED_TOOLS
    assert "Agent" in kept


def test_custom_agents_lose_agent_too() -> None:
    assert "Agent" not in filter_tools(ALL, custom=True, background=False)
    assert CUSTOM_AGENT_DISALLOWED_TOOLS > ALL_AGENT_DISALLOWED_TOOLS


def test_background_agents_keep_only_the_async_list() -> None:
    kept = filter_tools(ALL, background=True)
    assert set(kept) - {"mcp__time__now"} <= ASYNC_AGENT_ALLOWED_TOOLS
    assert {"Bash", "Read", "TaskCreate", "SendMessage"} <= set(kept)


def test_teammates_keep_agent_and_their_list() -> None:
    kept = filter_tools(ALL, background=True, teammate=True)
    assert set(kept) >= IN_PROCESS_TEAMMATE_ALLOWED_TOOLS


def test_plan_mode_allows_exit_plan_mode() -> None:
    assert "ExitPlanMode" not in filter_tools(ALL)
    assert "ExitPlanMode" in filter_tools(ALL, plan_mode=True)


def test_explicit_lists_narrow_what_the_layers_kept() -> None:
    assert filter_tools(ALL, only=["Read", "TeamCreate"]) == ["Read"]
    assert "Bash" not in filter_tools(ALL, without=["Bash"])


def test_team_management_stays_with_the_lead() -> None:
    """TeamCreate and TeamDelete exist as tools, and no background agent or teammate gets them."""
    assert {"TeamCreate", "TeamDelete"} <= set(ALL_TOOL_NAMES)
    assert not {"TeamCreate", "TeamDelete"} & set(filter_tools(ALL_TOOL_NAMES, teammate=True))
