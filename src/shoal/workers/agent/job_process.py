"""The process a runner job runs in (`python -m MODULE JOB_FILE`: an agent's runner, a
dream's): the job file read from the one argument (2, with a usage line or what is wrong with
the file, when it cannot be), the run under SIGTERM, SIGINT and SIGHUP, each of which ends it
`killed`, and the exit code of its outcome (0 when completed, else 1).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from shoal.core.errors import ShoalError
from shoal.workers.agent.job import JobOutcome

if TYPE_CHECKING:
    from shoal.workers.agent.loop import Outcome

J = TypeVar("J")

KILLED_ERROR: Final = "stopped"
END_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main_of(
    module: str,
    load: Callable[[Path], J],
    run: Callable[[J], Coroutine[Any, Any, int]],
    argv: list[str] | None = None,
) -> int:
    """Run the job file given as the one argument of `python -m module`: `load` reads it,
    `run` runs it to its exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} JOB_FILE", file=sys.stderr)
        return 2
    try:
        job = load(Path(args[0]))
    except (ShoalError, OSError, ValueError) as exc:
        print(f"shoal: error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(job))


async def until_signalled(run: Callable[[], Awaitable[JobOutcome]]) -> JobOutcome:
    """`run()`'s outcome; END_SIGNALS cancel it (the run then ends `killed` of its own, or,
    when a signal came before it began, here)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in END_SIGNALS:
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await run()
    except asyncio.CancelledError:  # (a signal before the run began)
        return JobOutcome(status="killed", error=KILLED_ERROR)


def exit_code(outcome: JobOutcome) -> int:
    """A runner process's exit code: 0 when its run completed, else 1."""
    return 0 if outcome.status == "completed" else 1


def job_outcome(outcome: Outcome) -> JobOutcome:
    """How a run of the agent loop ended, as the status file says it."""
    return JobOutcome(
        status="completed" if outcome.status == "completed" else "failed",
        result=outcome.result,
        error=outcome.error,
        total_tokens=outcome.total_tokens,
        tool_uses=outcome.tool_uses,
        turns=outcome.turns,
        duration_ms=outcome.duration_ms,
    )
