"""Batch runs (`shoal run SPEC`): the spec (`spec`, `parse`), the scheduler (`engine`), the
run state it moves (`state`) and its verdict (`verdict`), the reports (`report`), the engine's
shell on a leader (`leader_shell`), agent tasks on teammates (`agents`), a run's options
(`options`), and `run_batch` (`driver`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from shoal.orchestrator.batch.driver import (
        AgentDispatcherFactory,
        BatchPolicy,
        agent_dispatcher_factory,
        run_batch,
    )
    from shoal.orchestrator.batch.engine import AGENTS_UNAVAILABLE, BatchRun, check_agents
    from shoal.orchestrator.batch.options import RunOptions, RunOutcome, resolve_backend
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

# The package's names are imported on first use: `shoal.orchestrator.batch.spec` (what the
# CLI's duration options parse with) must not cost the import of the driver and the leader.
_WHERE: Final = {
    "AGENTS_UNAVAILABLE": "shoal.orchestrator.batch.engine",
    "AgentDispatcher": "shoal.orchestrator.batch.state",
    "AgentDispatcherFactory": "shoal.orchestrator.batch.driver",
    "Attempt": "shoal.orchestrator.batch.state",
    "BatchPolicy": "shoal.orchestrator.batch.driver",
    "BatchRun": "shoal.orchestrator.batch.engine",
    "ExecEvent": "shoal.orchestrator.batch.state",
    "FINAL_STATUSES": "shoal.orchestrator.batch.state",
    "Finished": "shoal.orchestrator.batch.state",
    "IllegalRunMove": "shoal.orchestrator.batch.state",
    "RUN_TRANSITIONS": "shoal.orchestrator.batch.state",
    "Refused": "shoal.orchestrator.batch.state",
    "RunOptions": "shoal.orchestrator.batch.options",
    "RunOutcome": "shoal.orchestrator.batch.options",
    "RunStatus": "shoal.orchestrator.batch.state",
    "ShellExecutor": "shoal.orchestrator.batch.state",
    "ShellRequest": "shoal.orchestrator.batch.state",
    "Stalled": "shoal.orchestrator.batch.state",
    "Started": "shoal.orchestrator.batch.state",
    "TaskRun": "shoal.orchestrator.batch.state",
    "agent_dispatcher_factory": "shoal.orchestrator.batch.driver",
    "check_agents": "shoal.orchestrator.batch.engine",
    "check_run_move": "shoal.orchestrator.batch.state",
    "resolve_backend": "shoal.orchestrator.batch.options",
    "run_batch": "shoal.orchestrator.batch.driver",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


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
