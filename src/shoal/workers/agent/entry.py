"""The process entry of an agent's runner (the process and tmux backends):
`python -m shoal.workers.agent.entry JOB_FILE`.

It runs workers/agent/runner.py's `run_job` with what only this layer may give it: the
team's leader through its control channel (background shells, SendMessage to agents,
TaskStop) and the session's task records (TaskOutput). SIGTERM, SIGINT and SIGHUP end the run
`killed`, its status written; the transcript keeps what was said.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.channel import client as control
from shoal.core.errors import NoSpaceError, ShoalError
from shoal.core.paths import Layout
from shoal.teams.session import current_session
from shoal.workers.agent.feed import Feed, watch_inbox
from shoal.workers.agent.job import EXIT_NO_SPACE, AgentJob, JobOutcome
from shoal.workers.agent.runner import KILLED_ERROR, TURN_SIGNAL, run_job
from shoal.workers.agent.status_writer import StatusWriter


@dataclass(frozen=True)
class ControlPort:
    """An agent's way to its team's leader: the control channel and the session's files."""

    layout: Layout
    team: str

    def call(self, op: str, args: dict[str, Any]) -> Any:
        return control.call(self.layout, self.team, op, args)

    def task_records(self) -> dict[str, dict[str, Any]]:
        session = current_session(self.layout, self.team)
        if session is None:
            return {}
        # The live records first: a task evicted between the two reads is then in the
        # history (eviction appends it there before it leaves state.json), never in neither.
        live = session.read_tasks_raw()
        return {**session.history(), **live}


async def _main_async(job: AgentJob) -> int:
    status = StatusWriter(Path(job.status_file), os.getpid())
    feed = Feed()
    stop = threading.Event()
    if job.inbox:
        watch_inbox(Path(job.inbox), Path(job.home), feed, stop)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    loop.add_signal_handler(TURN_SIGNAL, feed.abort_turn_now)  # `shoal stop --turn`
    port = ControlPort(Layout(job.home), job.team)
    outcome: JobOutcome
    try:
        outcome = await run_job(job, os.environ, feed, status, port)
    except asyncio.CancelledError:  # (a signal before the run began)
        outcome = JobOutcome(status="killed", error=KILLED_ERROR)
    stop.set()
    try:
        status.done(outcome, list(feed.late))
    except NoSpaceError as exc:  # (the leader names the cause from the exit code)
        print(f"shoal: error: {exc}", file=sys.stderr)
        return EXIT_NO_SPACE
    return 0 if outcome.status == "completed" else 1


def main(argv: list[str] | None = None) -> int:
    """Run the job file given as the one argument."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shoal.workers.agent.entry JOB_FILE", file=sys.stderr)
        return 2
    try:
        job = AgentJob.load(Path(args[0]))
    except (ShoalError, ValueError) as exc:
        print(f"shoal: error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_main_async(job))


if __name__ == "__main__":
    sys.exit(main())
