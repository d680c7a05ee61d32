"""The run budget's arithmetic (no processes): tokens are an agent's, as the seed counts
them, so a worker continued by a message (a new task whose count goes on) counts once."""

from __future__ import annotations

from typing import Any

from shoal.core.taskrecords import AgentProgress, TaskUsage
from shoal.core.tasks import LocalAgentTaskState, TaskStatus
from shoal.workers.agent.coordinator.mode import left, overspent


def agent(task_id: str, agent_id: str, **kw: Any) -> LocalAgentTaskState:
    fields: dict[str, Any] = {
        "id": task_id,
        "description": "w",
        "output_file": f"/s/tasks/{task_id}.output",
        "agent_id": agent_id,
        "prompt": "p",
        "agent_type": "general-purpose",
    }
    fields.update(kw)
    return LocalAgentTaskState(**fields)


def used(tokens: int, tools: int, ms: int = 1000) -> dict[str, Any]:
    return {
        "status": TaskStatus.COMPLETED,
        "usage": TaskUsage(total_tokens=tokens, tool_uses=tools, duration_ms=ms),
    }


BOSS = agent(
    "a00000001", "a00000001", coordinator=True,
    budget={"tokens": 1000, "tool_uses": 20},
    progress=AgentProgress(token_count=100, tool_use_count=2),
)  # fmt: skip


def test_a_continued_worker_counts_its_tokens_once_and_its_tool_uses_per_task() -> None:
    first = agent("a00000002", "a00000002", worker_of="a00000001", **used(300, 3))
    # (continued by a message: the same agent, its count going on from 300)
    again = agent("a00000003", "a00000002", worker_of="a00000001", resumed_from=first.id,
                  **used(450, 2))  # fmt: skip
    other = agent("a00000004", "a00000004", worker_of="a00000001", **used(200, 4))
    remaining = left(BOSS, [first, again, other])
    assert remaining["tokens"] == 1000 - 100 - 450 - 200  # (not 300 + 450)
    assert remaining["tool_uses"] == 20 - 2 - (3 + 2 + 4)


def test_a_continued_worker_not_yet_reporting_keeps_its_earlier_count() -> None:
    first = agent("a00000002", "a00000002", worker_of="a00000001", **used(300, 3))
    starting = agent("a00000003", "a00000002", worker_of="a00000001", resumed_from=first.id)
    assert left(BOSS, [first, starting])["tokens"] == 1000 - 100 - 300


def test_the_run_is_overspent_by_the_seeds_count() -> None:
    first = agent("a00000002", "a00000002", worker_of="a00000001", **used(600, 1))
    again = agent("a00000003", "a00000002", worker_of="a00000001", **used(850, 1))
    assert overspent(BOSS, [first, again]) is None  # 100 + 850 (summed tasks: 1550)
    other = agent("a00000004", "a00000004", worker_of="a00000001", **used(50, 1))
    why = overspent(BOSS, [first, again, other])  # 100 + 850 + 50
    assert why is not None and "tokens budget (1,000) is spent" in why
