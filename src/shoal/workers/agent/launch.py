"""Starting an agent's runner on its backend, and what the kind holds in memory about a
running agent (`AgentRun`).

Backends: `process` (a runner process in a session of its own, logged beside its job),
`tmux` (the same runner in a pane of the team's window, printing the live readable
transcript), `in-process` (runners as coroutines on one event loop inside the leader: cheap
enough for hundreds). Each is given the job file the leader wrote (job.py) before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import NoSpaceError, ShoalError
from shoal.core.filestamp import Stamp
from shoal.core.loopthread import LoopThread
from shoal.core.procs import process_start_time
from shoal.core.tasks import AnyTaskState, LocalAgentTaskState
from shoal.workers.agent.feed import Feed
from shoal.workers.agent.job import AGENTS_DIR, AgentJob, JobLimits, JobOutcome
from shoal.workers.agent.runner import run_job
from shoal.workers.agent.status_writer import StatusWriter
from shoal.workers.agent.team_tools import LeaderPort
from shoal.workers.kinds import TaskStore
from shoal.workers.process_kind import spawn_logged
from shoal.workers.shell.process import ShellProcess

AGENT_BACKENDS: Final = ("process", "tmux", "in-process")
# The process entry of a runner (it gives the runner its leader port).
RUNNER_MODULE: Final = "shoal.workers.agent.entry"
# What a tmux pane's runner gets of the leader's environment (with the task's own variables).
PANE_ENV: Final = ("SHOAL_", "ANTHROPIC_", "OPENAI_", "PATH", "HOME", "LANG", "LC_")
SCRATCHPAD: Final = "scratchpad"  # sessions/{s}/scratchpad/: coordinator mode's shared files


class AgentStartError(ShoalError):
    """An agent's runner could not be started (or asked something it cannot do)."""


@dataclass
class AgentRun:
    """What the kind holds in memory about one running agent."""

    task_id: str
    status_file: Path
    inbox: Path
    proc: ShellProcess | None = None  # process and tmux backends
    future: Future[Any] | None = None  # in-process
    feed: Feed | None = None  # in-process
    status_seen: Stamp | None = None
    # The `waiting` of the status file last read: the record follows the file's changes only,
    # so a file read again (its stamp not yet settled) never undoes an answer the lead gave.
    status_waiting: Any = None
    last_event: float = 0.0
    last_activity: float = field(default_factory=time.monotonic)  # a status written, or none
    busy: bool = False  # running a command, or waiting for a permission answer
    stall_told: bool = False
    handle: Any = None  # the tmux pane's backend handle
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # An in-process run whose outcome the full disk kept out of its status file.
    unsaved: JobOutcome | None = None
    # Messages sent to it (its record's pending_messages, before the cap) and, of them, how
    # many its runner says reached the conversation: the difference is what still waits.
    sent: int = 0
    drained: int = 0


class Launcher:
    """Starts the runners of one leader's agents (the tmux backend and the in-process loop
    are its own)."""

    def __init__(self, home: Path, team: str, leader: LeaderPort) -> None:
        self.home = home
        self.team = team
        self.leader = leader  # what an in-process runner reaches its leader through
        self._host = LoopThread("shoal-agents")  # (the in-process runners' loop)
        self._tmux: Any = None

    def start(
        self,
        run: AgentRun,
        job: AgentJob,
        job_file: Path,
        task: LocalAgentTaskState,
        store: TaskStore,
    ) -> dict[str, Any]:
        """Start the runner of `job` on the task's backend; the task's fields that say where
        it runs (its pid, a pane)."""
        if task.backend == "in-process":
            self._start_in_process(run, job, store)
            return {"pid": os.getpid()}
        if task.backend == "tmux":
            return self._start_tmux(run, job, job_file, store)
        return self._start_process(run, job_file, task, store)

    def close(self, run: AgentRun) -> None:
        """Close the tmux pane of an ended run (if it had one)."""
        if run.handle is not None and self._tmux is not None:
            with contextlib.suppress(ShoalError, OSError):
                self._tmux.kill(run.handle)

    def job(self, task: LocalAgentTaskState, status_file: Path, inbox: Path) -> AgentJob:
        """The job the task's runner is given (written to its job file before it starts)."""
        return AgentJob(
            task_id=task.id,
            agent_id=task.agent_id,
            team=self.team,
            home=str(self.home),
            session_id=session_dir_of(task).name,
            prompt=task.prompt,
            model=task.model or "scripted:",
            agent_type=task.agent_type,
            instructions=task.instructions or "",
            tools=task.tools,
            custom=task.custom,
            fork=task.fork,
            subagent=task.subagent,
            mcp_servers=dict(task.mcp_servers or {}),
            notes=(task.project_note,) if task.project_note else (),
            permission_mode=task.permission_mode,
            limits=JobLimits(
                **{k: v for k, v in (task.limits or {}).items() if k in JobLimits.model_fields}
            ),
            cwd=task.cwd or os.getcwd(),
            env_values=_env_values(task),
            output_file=task.output_file,
            transcript=task.transcript or str(transcript_path(session_dir_of(task), task.agent_id)),
            status_file=str(status_file),
            inbox=None if task.backend == "in-process" else str(inbox),
            resume=task.resumed_from is not None or task.forked_from is not None,
            echo=task.backend == "tmux",
            coordinator=task.coordinator,
            coordinator_inbox=str(coordinator_inbox(session_dir_of(task), task.agent_id))
            if task.coordinator
            else None,
            worker=task.worker_of is not None,
            write_set=task.write_set,
            allow_network=task.allow_network,
            scratchpad=str(session_dir_of(task) / SCRATCHPAD)
            if task.coordinator or task.worker_of is not None
            else None,
        )

    def _argv(self, job_file: Path) -> list[str]:
        return [sys.executable, "-m", RUNNER_MODULE, str(job_file)]

    def _environ(self, store: TaskStore, task: LocalAgentTaskState) -> dict[bytes, bytes]:
        env = dict(store.environ)
        for key, value in _env_values(task).items():
            env[os.fsencode(key)] = os.fsencode(value)
        return env

    def _start_process(
        self, run: AgentRun, job_file: Path, task: LocalAgentTaskState, store: TaskStore
    ) -> dict[str, Any]:
        run.proc = spawn_logged(
            self._argv(job_file), self._environ(store, task), job_file.with_suffix(".log")
        )
        return {"pid": run.proc.pid, "pid_started_at": run.proc.started_at}

    def _start_tmux(
        self, run: AgentRun, job: AgentJob, job_file: Path, store: TaskStore
    ) -> dict[str, Any]:
        from shoal.teams.backends.base import SpawnSpec
        from shoal.teams.backends.tmux import TmuxBackend

        if self._tmux is None:
            self._tmux = TmuxBackend()
        ok, why = self._tmux.available()
        if not ok:
            raise AgentStartError(f"the tmux backend cannot run here: {why}")
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in store.environ.items()}
        handle = self._tmux.spawn(
            SpawnSpec(
                team=self.team,
                name=job.task_id,
                argv=self._argv(job_file),
                cwd=job.cwd,
                home=self.home,
                env={k: v for k, v in env.items() if k.startswith(PANE_ENV)},
                secret_env=dict(job.env_values),  # (never on tmux's command line)
            )
        )
        run.handle = handle
        run.proc = ShellProcess(handle.pid, process_start_time(handle.pid), child=False)
        return {
            "pid": handle.pid,
            "pid_started_at": run.proc.started_at,
            "pane_id": handle.pane_id,
        }

    def _start_in_process(self, run: AgentRun, job: AgentJob, store: TaskStore) -> None:
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in store.environ.items()}
        env.update(job.env_values)
        feed = Feed()
        status = StatusWriter(Path(job.status_file), None)
        run.feed = feed

        async def main() -> None:
            outcome = await run_job(job, env, feed, status, self.leader)
            try:
                status.done(outcome, list(feed.late))
            except NoSpaceError:  # (settled from memory, and the cause said)
                run.unsaved = outcome

        run.future = asyncio.run_coroutine_threadsafe(main(), self._host.loop())
        run.future.add_done_callback(lambda _f: store.wake())


def _env_values(task: LocalAgentTaskState) -> dict[str, str]:
    """The agent's `--env` values, for its runner's environment, never for its job file (a
    record of an older shoal kept them in `env`: they are passed on the same way)."""
    return {**(task.env or {}), **(task.env_values or {})}


def session_dir_of(task: AnyTaskState) -> Path:
    """The session directory a task's files live in (its output file is in tasks/)."""
    return Path(task.output_file).parent.parent


def coordinator_inbox(session_dir: Path, agent_id: str) -> Path:
    """Where the workers of coordinator `agent_id` deliver their notifications."""
    return session_dir / AGENTS_DIR / f"{agent_id}.coordinator.inbox"


def transcript_path(session_dir: Path, agent_id: str) -> Path:
    """Where agent `agent_id`'s transcript (sidechain) is kept."""
    return session_dir / "transcripts" / f"{agent_id}.jsonl"
