"""Coordinator mode: an agent that dispatches workers and does not execute.

What lives here: the coordinator's system prompt (shoal's own text, the package data file
`coordinator_prompt.md`), its user-context block (the workers' tools, the MCP servers, the
scratchpad), where its workers' notifications arrive (a maildir per coordinator agent id, so
a resumed coordinator reads what came while it was down), the permission mode its workers get
(never above its own),
and the run budget: what is spent and what an `Agent(budget=...)` may still take.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import UsageError
from shoal.core.paths import Layout
from shoal.core.tasks import LocalAgentTaskState
from shoal.workers.agent.filters import ASYNC_AGENT_ALLOWED_TOOLS
from shoal.workers.agent.launch import SCRATCHPAD
from shoal.workers.agent.permissions import narrowest

PROMPT_FILE: Final = "coordinator_prompt.md"
ENV_FLAG: Final = "SHOAL_COORDINATOR_MODE"
# Tools a worker never gets: team management, messaging (it reports by its result) and the
# seed's structured-output tool.
INTERNAL_WORKER_TOOLS: Final = frozenset(
    {"TeamCreate", "TeamDelete", "SendMessage", "SyntheticOutput"}
)
SIMPLE_WORKER_TOOLS: Final = ("Bash", "Read", "Edit")
# A worker's own `Agent` would let it dispatch too: workers do not nest.
WORKER_TOOLS: Final = tuple(sorted(ASYNC_AGENT_ALLOWED_TOOLS - INTERNAL_WORKER_TOOLS - {"Agent"}))
BUDGET_KEYS: Final = ("tokens", "tool_uses", "seconds")
# A budget key -> the limit of JobLimits that enforces it on a worker.
BUDGET_LIMITS: Final = {"tokens": "max_tokens", "tool_uses": "max_tool_uses", "seconds": "timeout"}


def env_mode(env: Mapping[str, str]) -> bool:
    """Whether $SHOAL_COORDINATOR_MODE asks for coordinator mode."""
    return env.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


def system_prompt() -> str:
    """The coordinator's system prompt (package data, not a string in code)."""
    return (
        resources.files("shoal.workers.agent.coordinator").joinpath(PROMPT_FILE).read_text("utf-8")
    )


def worker_tools(simple: bool) -> tuple[str, ...]:
    """What a coordinator's workers may use (before a read-only worker loses Write and Edit)."""
    return SIMPLE_WORKER_TOOLS if simple else WORKER_TOOLS


def scratchpad_dir(session_dir: Path) -> Path:
    """`sessions/{s}/scratchpad/`: every worker may read and write there without asking."""
    return session_dir / SCRATCHPAD


CONTEXT_OPEN: Final = "<coordinator-context>"


def user_context(simple: bool, mcp_servers: Iterable[str], scratchpad: Path) -> str:
    """The coordinator's context block (the seed's getCoordinatorUserContext)."""
    lines = [
        CONTEXT_OPEN,
        "Workers started with the Agent tool have these tools: "
        + ", ".join(worker_tools(simple))
        + ". A worker without a write_set is read-only: it has no Write and no Edit.",
    ]
    servers = sorted(mcp_servers)
    if servers:
        lines.append(
            "Workers also have the tools of these MCP servers: " + ", ".join(servers) + "."
        )
    lines.append(
        f"Scratchpad directory: {scratchpad}\nWorkers can read and write there without a "
        "permission prompt, whatever their write set: use it for knowledge that workers share "
        "(a synthesis, a plan, findings too long for a prompt)."
    )
    lines.append("</coordinator-context>")
    return "\n".join(lines)


def worker_permission(coordinator_mode: str, defined: str | None = None) -> str:
    """A worker runs in its coordinator's mode, or the narrower one its definition names:
    never above it (a lease limits where a worker writes, not whether it asks)."""
    return narrowest(coordinator_mode, defined)


def check_budget(raw: Any, what: str) -> dict[str, float] | None:
    """`raw` as a budget ({tokens?, tool_uses?, seconds?}, positive numbers) or None."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise UsageError(f'{what} must be an object like {{"tokens": 20000}}, not {raw!r}')
    out: dict[str, float] = {}
    for key, value in raw.items():
        if key not in BUDGET_KEYS:
            raise UsageError(f"{what}: unknown key {key!r} (use {', '.join(BUDGET_KEYS)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise UsageError(f"{what}: {key} must be a positive number, not {value!r}")
        out[key] = value
    return out


def spent(task: LocalAgentTaskState) -> dict[str, float]:
    """What an agent task has used so far, in budget keys."""
    usage = task.usage
    progress = task.progress
    tokens = usage.total_tokens if usage else (progress.token_count if progress else 0)
    tools = usage.tool_uses if usage else (progress.tool_use_count if progress else 0)
    if usage is not None:
        seconds = usage.duration_ms / 1000
    else:
        end = task.end_time if task.end_time is not None else time.time()
        seconds = max(0.0, end - task.start_time)
    return {"tokens": tokens, "tool_uses": tools, "seconds": seconds}


def left(
    coordinator: LocalAgentTaskState,
    workers: Iterable[LocalAgentTaskState],
    *,
    held: bool = True,
) -> dict[str, float]:
    """What the run budget has left: the budget less what the coordinator and its workers
    spent and, with `held`, what running workers asked to be held for them beyond that."""
    budget = coordinator.budget or {}
    workers = list(workers)
    out: dict[str, float] = {}
    for key in BUDGET_KEYS:
        if key not in budget:
            continue
        used = _used(workers, key, held)
        if key != "seconds":
            used += spent(coordinator)[key]
        out[key] = float(budget[key]) - used
    return out


def _used(workers: Iterable[LocalAgentTaskState], key: str, held: bool) -> float:
    """What the workers spent of `key` (with `held`, at least what running ones hold). Tokens
    are an agent's, as the seed counts them: a worker continued by a message is a new task
    whose count goes on from its earlier tasks', so each agent counts once, by its largest;
    tool uses and seconds are each task's own."""
    total = 0.0
    by_agent: dict[str, float] = {}
    for worker in workers:
        used_by = spent(worker)[key]
        share = (worker.budget or {}).get(key)
        kept = worker.budget_held is None or key in worker.budget_held
        if held and kept and share is not None and not worker.is_terminal:
            used_by = max(used_by, float(share))
        if key == "tokens":
            by_agent[worker.agent_id] = max(by_agent.get(worker.agent_id, 0.0), used_by)
        else:
            total += used_by
    return total + sum(by_agent.values())


def overspent(
    coordinator: LocalAgentTaskState, workers: Iterable[LocalAgentTaskState]
) -> str | None:
    """Why the run must stop its running workers (its tokens or tool uses all spent, by the
    coordinator and its workers together), or None. Seconds are each worker's own limit
    and the coordinator's wall time; parallel workers' seconds do not add up to a stop."""
    budget = coordinator.budget or {}
    for key, value in left(coordinator, workers, held=False).items():
        if key != "seconds" and value <= 0:
            return (
                f"the run's {key.replace('_', ' ')} budget ({int(budget[key]):,}) is spent "
                "(by the coordinator and its workers together)"
            )
    return None


def worker_limits(
    asked: Mapping[str, float] | None, remaining: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, Any]]:
    """The budget a new worker gets and the limits that enforce it: what it asked (refused
    when more than the run has left; held for it while it runs), and for each key it did
    not ask, all the run has left as a limit (held for no one: parallel workers share it,
    and the run stops them all when it is spent)."""
    share: dict[str, float] = {}
    for key, value in (asked or {}).items():
        if key in remaining and value > remaining[key]:
            raise UsageError(
                f"budget {key}={value:g} is more than the run has left ({max(0, remaining[key]):g})"
            )
        share[key] = value
    for key, value in remaining.items():
        if value <= 0:
            raise UsageError(
                f"the run's {key.replace('_', ' ')} budget has nothing left (what the run spent "
                "and what running workers asked to hold); no worker can start until running "
                "workers end"
            )
        share.setdefault(key, value)
    limits: dict[str, Any] = {}
    for key, value in share.items():
        limits[BUDGET_LIMITS[key]] = value if key == "seconds" else max(1, int(value))
    return share, limits


def mode_message(stored: bool, asked: bool) -> str | None:
    """What to say when a resumed session's stored mode wins over the asked one."""
    if stored == asked:
        return None
    return (
        "entered coordinator mode to match the resumed session"
        if stored
        else "exited coordinator mode to match the resumed session"
    )


def recorded_run(layout: Layout, ref: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The coordinator record `ref` names (its task id, its agent id, or a session with one
    coordinator) and its workers' records, from any session under `layout`; a UsageError
    says what was not found or what is ambiguous."""
    from shoal.teams.session import Session

    root = layout.sessions_dir
    sessions = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if ref in sessions:
        sessions = [ref]
    for session_id in sessions:
        session = Session(layout, session_id)
        live = session.read_tasks_raw()
        records = {**session.history(), **live}
        bosses = [r for r in records.values() if r.get("coordinator")]
        if session_id == ref:
            if len(bosses) != 1:
                ids = ", ".join(sorted(r["id"] for r in bosses)) or "none"
                raise UsageError(
                    f"session {ref} has {len(bosses)} coordinator runs ({ids}); give one's id"
                )
            chosen = bosses[0]
        else:
            found = [r for r in bosses if ref in (r.get("id"), r.get("agent_id"))]
            if not found:
                continue
            chosen = max(found, key=lambda r: r.get("start_time") or 0)  # (its latest resume)
        workers = [r for r in records.values() if r.get("worker_of") == chosen["agent_id"]]
        return chosen, workers
    raise UsageError(f"no coordinator run {ref!r} in {root} (give a task id or a session id)")


def replay_key(description: str, prompt: str) -> str:
    """How a replayed worker is matched with the recorded one it re-drives."""
    return f"{description}\n{prompt}"
