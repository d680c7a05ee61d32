"""The process entry of an agent's runner (the process and tmux backends):
`python -m shoal.workers.agent.entry JOB_FILE`.

It runs workers/agent/runner.py's `run_job` with what only this layer may give it: the
team's leader through its control channel (background shells, SendMessage to agents,
TaskStop) and the session's task records (TaskOutput). SIGTERM, SIGINT and SIGHUP end the run
`killed` (job_process.py), its status written; the transcript keeps what was said; SIGUSR1
stops the turn in progress only.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.channel import client as control
from shoal.core.errors import NoSpaceError
from shoal.core.paths import Layout
from shoal.teams.session import current_session
from shoal.workers.agent.feed import Feed, watch_inbox
from shoal.workers.agent.job import EXIT_NO_SPACE, AgentJob
from shoal.workers.agent.job_process import exit_code, main_of, until_signalled
from shoal.workers.agent.runner import TURN_SIGNAL, run_job
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
    asyncio.get_running_loop().add_signal_handler(TURN_SIGNAL, feed.abort_turn_now)  # --turn
    port = ControlPort(Layout(job.home), job.team)
    outcome = await until_signalled(lambda: run_job(job, os.environ, feed, status, port))
    stop.set()
    try:
        status.done(outcome, list(feed.late))
    except NoSpaceError as exc:  # (the leader names the cause from the exit code)
        print(f"shoal: error: {exc}", file=sys.stderr)
        return EXIT_NO_SPACE
    return exit_code(outcome)


def main(argv: list[str] | None = None) -> int:
    """Run the job file given as the one argument."""
    return main_of("shoal.workers.agent.entry", AgentJob.load, _main_async, argv)


if __name__ == "__main__":
    sys.exit(main())
