"""Batch runs (`shoal run SPEC`): the spec (`spec`, `parse`), the scheduler (`engine`) and the
run state it moves (`state`), the reports (`report`), agent tasks on teammates (`agents`), and
`run_batch` (`driver`)."""

from __future__ import annotations

from shoal.orchestrator.batch.driver import (
    AgentDispatcherFactory,
    BatchPolicy,
    RunOptions,
    RunOutcome,
    agent_dispatcher_factory,
    resolve_backend,
    run_batch,
)
from shoal.orchestrator.batch.engine import AGENTS_UNAVAILABLE, BatchRun, check_agents
from shoal.orchestrator.batch.state import (
    FINAL_STATUSES,
    RUN_TRANSITIONS,
    AgentDispatcher,
    Attempt,
    ExecEvent,
    Finished,
    IllegalRunMove,
    Refused,
    RunStatus,
    ShellExecutor,
    ShellRequest,
    Stalled,
    Started,
    TaskRun,
    check_run_move,
)

__all__ = [
    "AGENTS_UNAVAILABLE",
    "FINAL_STATUSES",
    "RUN_TRANSITIONS",
    "AgentDispatcher",
    "AgentDispatcherFactory",
    "Attempt",
    "BatchPolicy",
    "BatchRun",
    "ExecEvent",
    "Finished",
    "IllegalRunMove",
    "Refused",
    "RunOptions",
    "RunOutcome",
    "RunStatus",
    "ShellExecutor",
    "ShellRequest",
    "Stalled",
    "Started",
    "TaskRun",
    "agent_dispatcher_factory",
    "check_agents",
    "check_run_move",
    "resolve_backend",
    "run_batch",
]
