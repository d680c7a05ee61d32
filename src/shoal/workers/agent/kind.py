"""`local_agent` tasks for the leader's loop: start a runner on a backend, read its progress,
settle it from its status file, kill it without waiting, resume it with late messages.

Backends: `process` (a runner process in a session of its own, logged beside its job),
`tmux` (the same runner in a pane of the team's window, printing the live readable
transcript), `in-process` (runners as coroutines on one event loop inside the leader: cheap
enough for hundreds). The runner writes only its status file, output file and transcript; the
registry is changed here, on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shoal.core.config import worker_stall_s
from shoal.core.errors import NoSpaceError, ShoalError
from shoal.core.events import TaskProgress, task_started
from shoal.core.faults import pause_point
from shoal.core.filestamp import Stamp
from shoal.core.loopthread import LoopThread
from shoal.core.notify import task_notification_xml
from shoal.core.output import tail
from shoal.core.procs import find_by_argument, is_alive, process_start_time
from shoal.core.secretenv import lost_env_error
from shoal.core.taskrecords import AgentProgress, TaskUsage, ToolActivity
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    LocalAgentTaskState,
    TaskStatus,
    TaskType,
    missing_env,
)
from shoal.mailbox.router import deliver_to, make_message
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.feed import Feed
from shoal.workers.agent.job import (
    AGENTS_DIR,
    EXIT_NO_SPACE,
    NO_SPACE_REASON,
    AgentJob,
    AgentStatus,
    JobLimits,
    JobOutcome,
    job_paths,
    read_changed,
)
from shoal.workers.agent.runner import TURN_SIGNAL, run_job
from shoal.workers.agent.status_writer import StatusWriter
from shoal.workers.agent.team_tools import LeaderPort
from shoal.workers.kinds import TaskStore, end_unannounced
from shoal.workers.process_kind import ProcessKind, spawn_logged
from shoal.workers.shell.process import ShellProcess

AGENT_BACKENDS: Final = ("process", "tmux", "in-process")
# The process entry of a runner (in the orchestrator: it gives the runner its leader port).
RUNNER_MODULE: Final = "shoal.workers.agent.entry"
# task_progress events of one agent are emitted at most this often.
PROGRESS_EVENT_INTERVAL_S: Final = 1.0
# What a tmux pane's runner gets of the leader's environment (with the task's own variables).
PANE_ENV: Final = ("SHOAL_", "ANTHROPIC_", "OPENAI_", "PATH", "HOME", "LANG", "LC_")
# Messages a running agent has been sent but not yet drained, kept in its record.
PENDING_CAP: Final = 50
OVER_BUDGET: Final = "over budget: "  # (a stop reason so marked ends the agent `failed`)
SCRATCHPAD: Final = "scratchpad"  # sessions/{s}/scratchpad/: coordinator mode's shared files


class AgentStartError(ShoalError):
    """An agent's runner could not be started (or asked something it cannot do)."""


@dataclass
class _Live:
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


class AgentKind(ProcessKind[_Live]):
    """The `local_agent` task kind (see the module docstring)."""

    types = frozenset({TaskType.LOCAL_AGENT})

    def __init__(self, home: Path, team: str, leader: LeaderPort) -> None:
        self.home = home
        self.team = team
        self.leader = leader  # what an in-process runner reaches its leader through
        self.runs: dict[str, _Live] = {}
        super().__init__(self.runs)
        self._host = LoopThread("shoal-agents")  # (the in-process runners' loop)
        self._tmux: Any = None
        self.stall_s = worker_stall_s(home)
        # Set by the leader: resume a finished agent with messages that came too late.
        self.resume_with: Callable[[LocalAgentTaskState, list[str]], Any] | None = None
        # Set by the leader: a coordinator's or a worker's spending moved (the run budget).
        self.on_spent: Callable[[LocalAgentTaskState], Any] | None = None

    # -- the protocol ------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, LocalAgentTaskState)
        job_file, status_file, inbox = job_paths(session_dir_of(task), task.id)
        live = _Live(task.id, status_file, inbox)
        lost = missing_env(task)
        if lost:  # (never run without them: its commands would see them unset)
            why = lost_env_error(task.id, lost, "shoal agent")
            store.move_task(task.id, TaskStatus.FAILED, error=f"could not start the agent: {why}")
            store.emit(task_started(store.get(task.id) or task))
            return
        try:
            job = self._job(task, status_file, inbox)
            job_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            job.save(job_file)
            if not store.write_ahead(task.id):
                store.emit(task_started(store.get(task.id) or task))
                return
            if task.backend == "in-process":
                self._start_in_process(live, job, store)
                changes: dict[str, Any] = {"pid": os.getpid()}
            elif task.backend == "tmux":
                changes = self._start_tmux(live, job, job_file, task, store)
            else:
                changes = self._start_process(live, job_file, task, store)
        except (ShoalError, OSError) as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=f"could not start the agent: {exc}")
            store.emit(task_started(store.get(task.id) or task))
            return
        pause_point("spawned")
        self._running(task, live, store, **changes)

    def _poll_output(self, ids: list[str], store: TaskStore, now: float) -> None:
        for task_id in ids:
            live = self.runs.get(task_id)
            if live is not None:
                self._read_status(live, store)

    def _poll_stalls(self, ids: list[str], store: TaskStore, now: float) -> None:
        for task_id in ids:
            live = self.runs.get(task_id)
            if live is not None and not live.stall_told and not live.busy:
                self._check_stall(live, store, time.monotonic())

    def _check_stall(self, live: _Live, store: TaskStore, now: float) -> None:
        """A coordinator's worker silent (no model response, no tool activity) for stall_s
        tells its coordinator once that it appears stalled."""
        if now - live.last_activity < self.stall_s:
            return
        task = store.get(live.task_id)
        if not isinstance(task, LocalAgentTaskState) or task.worker_of is None:
            return
        live.stall_told = True
        quiet = int(now - live.last_activity)
        summary = f'Worker "{task.description}" appears stalled (no activity for {quiet}s)'
        xml = task_notification_xml(
            task_id=task.id,
            task_type=task.type,
            output_file=task.output_file,
            status=task.status,
            summary=summary,
            output_tail=tail(task.output_file, 1024),
        )
        store.notify_owner(task, xml, summary, status="running", msg_id=None)
        store.note(f"worker {task.id} appears stalled; its coordinator was told")

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        if task.is_terminal:
            return
        live = self.runs.get(task.id)
        store.set_task(task.id, kill_reason=reason)
        if live is None:  # never started
            ended = TaskStatus.FAILED if reason.startswith(OVER_BUDGET) else TaskStatus.KILLED
            store.move_task(task.id, ended, error=reason)
            return
        if live.future is not None:
            live.future.cancel()
            return  # its done callback wakes the loop; REAP settles it
        if live.proc is not None and task.id not in self.killing:
            if not self._begin_kill(task.id, live.proc, store):
                live.proc.poll()
            store.wake()

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """A task of an earlier leader: watch its runner if it still runs, else settle it from
        the status it left (a runner that died mid-run leaves a failed task and its transcript,
        from which `shoal agent --resume` continues)."""
        assert isinstance(task, LocalAgentTaskState)
        job_file, status_file, inbox = job_paths(session_dir_of(task), task.id)
        live = _Live(task.id, status_file, inbox)
        if task.status == TaskStatus.RUNNING and task.pid is None:
            found = self._find_runner(task, job_file, status_file, store)
            if found is None:
                return
            task = found
        if (
            task.backend != "in-process"
            and task.pid is not None
            and is_alive(task.pid, task.pid_started_at)
        ):
            live.proc = ShellProcess(task.pid, task.pid_started_at, child=False)
            self._count_from(live, task)
            self.runs[task.id] = live
            store.watch_pid(task.id, task.pid)
            store.note(f"adopted agent {task.id} (pid {task.pid})")
            return
        if task.status == TaskStatus.PENDING:
            return  # (queued again by the caller)
        self.runs[task.id] = live
        self._settle(live, store, unattended=True)

    @staticmethod
    def _count_from(live: _Live, task: LocalAgentTaskState) -> None:
        """What an adopted runner drained so far, and so what its record's pending messages
        are of (one drained after the last leader's last look stays listed until it ends)."""
        status = AgentStatus.load(live.status_file)
        live.drained = status.drained if status is not None else 0
        live.sent = live.drained + len(task.pending_messages)

    def _find_runner(
        self, task: LocalAgentTaskState, job_file: Path, status_file: Path, store: TaskStore
    ) -> LocalAgentTaskState | None:
        """A task its leader wrote ahead as running but died before recording the runner's
        pid: the runner found by its job file in the process table (the task, with its pid),
        or, with none and no status either, the attempt ended (None): never started again."""
        found = None
        if task.backend != "in-process":
            found = find_by_argument(str(job_file), since=task.start_time or 0.0)
        if found is not None:
            store.set_task(task.id, pid=found[0], pid_started_at=found[1])
            current = store.get(task.id)
            return current if isinstance(current, LocalAgentTaskState) else None
        if status_file.exists():
            return task  # (it ran, and left its status: settled from it)
        store.move_task(
            task.id,
            TaskStatus.FAILED,
            error="its leader stopped while starting it, and it was not started again "
            f"(shoal agent --resume {task.id} starts it)",
        )
        store.note(f"agent {task.id} was being started when its leader stopped; ended it")
        return None

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        if not isinstance(task, LocalAgentTaskState):
            return {}
        return {"result": task.result, "usage": task.usage}

    def _process(self, run: _Live) -> ShellProcess | None:
        return run.proc

    def _has_news(self, run: _Live) -> bool:
        return run.future is not None and run.future.done()  # (an in-process run ended)

    def send(
        self, task: LocalAgentTaskState, text: str, store: TaskStore, *, sender: str | None = None
    ) -> None:
        """Queue `text` for a running agent: drained at its next tool-round boundary. `sender`:
        the agent that sent it (None: the lead)."""
        live = self.runs.get(task.id)
        if live is not None and live.feed is not None:
            live.feed.put(text)
        else:
            deliver_to(
                live.inbox if live is not None else job_paths(session_dir_of(task), task.id)[2],
                make_message(sender=sender or LEAD_NAME, to=task.id, kind="text", text=text),
            )
        if live is not None:
            live.sent += 1
        pending = (*task.pending_messages, text)[-PENDING_CAP:]
        store.set_task(task.id, pending_messages=pending)

    def answer(
        self,
        task: LocalAgentTaskState,
        request_id: str,
        approve: bool,
        reason: str | None,
        store: TaskStore,
    ) -> None:
        """Give a waiting agent the lead's answer to its permission request `request_id`."""
        live = self.runs.get(task.id)
        if live is None or task.is_terminal:
            raise AgentStartError(f"agent {task.id} is not running; nothing waits on {request_id}")
        if live.feed is not None:
            if not live.feed.answer(request_id, approve, reason):
                raise AgentStartError(f"agent {task.id} is not waiting on {request_id}")
        else:
            deliver_to(
                live.inbox,
                make_message(
                    sender="team-lead",
                    to=task.id,
                    kind="permission_response",
                    data={"request_id": request_id, "approve": approve, "reason": reason},
                ),
            )
        if approve and task.permission_mode == "plan" and _asked_tool(live, task) == "ExitPlanMode":
            # Its plan approved, the agent goes on in default: so may the agents it starts
            # from now on (their ceiling is read from this record).
            store.set_task(task.id, waiting_for=None, permission_mode="default")
        else:
            store.set_task(task.id, waiting_for=None)

    def abort_turn(self, task: LocalAgentTaskState) -> None:
        """Stop the agent's turn in progress (`shoal stop --turn`); it then waits for the
        next message. Never waits itself."""
        live = self.runs.get(task.id)
        if live is None or task.is_terminal:
            raise AgentStartError(f"agent {task.id} is not running")
        if live.feed is not None:
            live.feed.abort_turn()
        elif live.proc is not None:
            try:
                os.kill(live.proc.pid, TURN_SIGNAL)
            except ProcessLookupError:
                raise AgentStartError(f"agent {task.id} has just ended") from None

    def kill_all_now(self, grace: float) -> None:
        """Stop every runner, waiting (for cleanup at exit, when no loop runs)."""
        for live in list(self.runs.values()):
            if live.future is not None:
                live.future.cancel()
        super().kill_all_now(grace)

    # -- starting ----------------------------------------------------------------------------

    def _job(self, task: LocalAgentTaskState, status_file: Path, inbox: Path) -> AgentJob:
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
        self, live: _Live, job_file: Path, task: LocalAgentTaskState, store: TaskStore
    ) -> dict[str, Any]:
        live.proc = spawn_logged(
            self._argv(job_file), self._environ(store, task), job_file.with_suffix(".log")
        )
        return {"pid": live.proc.pid, "pid_started_at": live.proc.started_at}

    def _start_tmux(
        self,
        live: _Live,
        job: AgentJob,
        job_file: Path,
        task: LocalAgentTaskState,
        store: TaskStore,
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
                name=task.id,
                argv=self._argv(job_file),
                cwd=job.cwd,
                home=self.home,
                env={k: v for k, v in env.items() if k.startswith(PANE_ENV)},
                secret_env=_env_values(task),  # (never on tmux's command line)
            )
        )
        live.handle = handle
        live.proc = ShellProcess(handle.pid, process_start_time(handle.pid), child=False)
        return {
            "pid": handle.pid,
            "pid_started_at": live.proc.started_at,
            "pane_id": handle.pane_id,
        }

    def _start_in_process(self, live: _Live, job: AgentJob, store: TaskStore) -> None:
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in store.environ.items()}
        env.update(job.env_values)
        feed = Feed()
        status = StatusWriter(Path(job.status_file), None)
        live.feed = feed

        async def main() -> None:
            outcome = await run_job(job, env, feed, status, self.leader)
            try:
                status.done(outcome, list(feed.late))
            except NoSpaceError:  # (settled from memory, and the cause said)
                live.unsaved = outcome

        live.future = asyncio.run_coroutine_threadsafe(main(), self._host.loop())
        live.future.add_done_callback(lambda _f: store.wake())

    # -- the steps ---------------------------------------------------------------------------

    def _is_done(self, task_id: str, run: _Live) -> bool:
        if run.future is not None:
            return run.future.done()  # (an in-process run)
        return super()._is_done(task_id, run)

    def _settle_run(self, task_id: str, run: _Live, store: TaskStore) -> None:
        self._settle(run, store)

    def _read_status(self, live: _Live, store: TaskStore) -> AgentStatus | None:
        status = read_changed(live)
        if status is None:
            return None
        live.last_activity = time.monotonic()
        live.busy = bool(status.commands) or status.waiting is not None
        progress = _progress(status.progress, status.updated_at or None)
        task = store.get(live.task_id)
        if status.waiting != live.status_waiting:
            live.status_waiting = status.waiting
            if isinstance(task, LocalAgentTaskState) and task.waiting_for != status.waiting:
                store.set_task(live.task_id, waiting_for=status.waiting)
        if isinstance(task, LocalAgentTaskState) and status.violations != task.violations:
            store.set_task(live.task_id, violations=status.violations)
        if isinstance(task, LocalAgentTaskState):
            self._conversation(live, status, task, store)
        if progress is not None and isinstance(task, LocalAgentTaskState):
            store.set_task(live.task_id, progress=progress)
            if self.on_spent is not None and (task.coordinator or task.worker_of):
                self.on_spent(task)
            now = time.monotonic()
            if now - live.last_event >= PROGRESS_EVENT_INTERVAL_S and status.state == "running":
                live.last_event = now
                store.emit(
                    TaskProgress(
                        task_id=live.task_id,
                        tool_use_count=progress.tool_use_count,
                        token_count=progress.token_count,
                        activity=progress.last_activity.description
                        if progress.last_activity
                        else None,
                        summary=progress.summary,
                    )
                )
        return status

    @staticmethod
    def _conversation(
        live: _Live, status: AgentStatus, task: LocalAgentTaskState, store: TaskStore
    ) -> None:
        """The record's pending messages less those the runner drained (one by one, as it
        takes them), and its messages for views as the runner gathered them."""
        changes: dict[str, Any] = {}
        if status.drained != live.drained:
            live.drained = status.drained
            waiting = max(0, live.sent - live.drained)
            changes["pending_messages"] = task.pending_messages[-waiting:] if waiting else ()
        if status.messages and status.messages != task.messages:
            changes["messages"] = status.messages
        if status.from_disk and not task.disk_loaded:
            changes["disk_loaded"] = True
        if changes:
            store.set_task(live.task_id, **changes)

    def _settle(self, live: _Live, store: TaskStore, *, unattended: bool = False) -> None:
        """Give an ended agent its final state from its status file."""
        self._forget(live.task_id, store)
        if live.handle is not None and self._tmux is not None:
            with contextlib.suppress(ShoalError, OSError):
                self._tmux.kill(live.handle)
        live.status_seen = None
        self._read_status(live, store)
        status = AgentStatus.load(live.status_file)
        task = store.get(live.task_id)
        if not isinstance(task, LocalAgentTaskState) or task.is_terminal:
            return
        for pgid, started in status.commands if status is not None else ():
            # A runner killed -9 mid-command: the command (its own group) goes with it.
            if is_alive(pgid, started):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                store.note(f"killed the command agent {task.id} left running (group {pgid})")
        outcome = status.outcome if status is not None else None
        if outcome is None and live.unsaved is not None:
            outcome = live.unsaved
            store.note(f"agent {task.id}: {NO_SPACE_REASON}; its outcome is kept from memory")
        late = list(status.undrained) if status is not None else []
        late += _unread(live.inbox)
        if status is not None and status.note:
            store.note(f"agent {task.id} resumed from a damaged transcript: {status.note}")
        if outcome is not None:
            usage = TaskUsage(
                total_tokens=outcome.total_tokens,
                tool_uses=outcome.tool_uses,
                duration_ms=outcome.duration_ms,
            )
            progress = (task.progress or AgentProgress()).model_copy(
                update={"summary": outcome.error or _first_line(outcome.result)}
            )
            if task.kill_reason and task.kill_reason.startswith(OVER_BUDGET):
                store.move_task(
                    task.id,
                    TaskStatus.FAILED,
                    result=outcome.result or None,
                    usage=usage,
                    progress=progress,
                    error=task.kill_reason,
                    pending_messages=(),
                )
                self._over_budget(task, store, late)
                return
            elif outcome.status == "killed" or task.kill_reason:
                store.move_task(
                    task.id,
                    TaskStatus.KILLED,
                    usage=usage,
                    progress=progress,
                    error=task.kill_reason or outcome.error,
                    pending_messages=(),
                )
                self._stopped(task, store, late)
                return
            elif outcome.status == "completed":
                store.move_task(
                    task.id,
                    TaskStatus.COMPLETED,
                    result=outcome.result,
                    usage=usage,
                    progress=progress,
                    pending_messages=(),
                )
            else:
                store.move_task(
                    task.id,
                    TaskStatus.FAILED,
                    result=outcome.result or None,
                    error=outcome.error,
                    usage=usage,
                    progress=progress,
                    pending_messages=(),
                )
        else:
            code = live.proc.returncode() if live.proc is not None else None
            if task.kill_reason and task.kill_reason.startswith(OVER_BUDGET):
                store.move_task(task.id, TaskStatus.FAILED, error=task.kill_reason)
                self._over_budget(task, store, late)
                return
            if task.kill_reason:
                store.move_task(task.id, TaskStatus.KILLED, error=task.kill_reason)
                self._stopped(task, store, late)
                return
            how = (
                "ended while no leader was running, without an outcome"
                if unattended
                else NO_SPACE_REASON
                if code == EXIT_NO_SPACE
                else f"exited with code {code} without an outcome"
                if code is not None
                else "ended without an outcome (killed?)"
            )
            store.move_task(
                task.id,
                TaskStatus.FAILED,
                error=f"the agent's runner {how}; its transcript is kept (shoal agent "
                f"--resume {task.id} continues it)",
            )
        if late and self.resume_with is not None:
            final = store.get(task.id)
            if isinstance(final, LocalAgentTaskState):
                self.resume_with(final, late)

    def _over_budget(self, task: LocalAgentTaskState, store: TaskStore, late: list[str]) -> None:
        """A worker its run's budget stopped is not continued by messages that came late
        (a continuation would spend what the run no longer has)."""
        if late:
            store.note(f"agent {task.id} ran out of budget; {len(late)} late message(s) dropped")

    def _stopped(self, task: LocalAgentTaskState, store: TaskStore, late: list[str]) -> None:
        """A killed agent is not resumed by messages that came too late (they are noted);
        one stopped on request is not news: no notification, as for shells. A coordinator's
        worker is the exception: its coordinator waits for every worker's end."""
        if late:
            store.note(f"agent {task.id} was stopped; {len(late)} message(s) to it were dropped")
        if task.kill_reason in (None, STOPPED_ON_REQUEST) and task.worker_of is None:
            end_unannounced(store, task.id)


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


def _asked_tool(live: _Live, task: LocalAgentTaskState) -> str | None:
    """The tool of the permission request a running agent waits on (from its record, else
    from its status file, written before the request was sent)."""
    waiting = task.waiting_for
    if waiting is None:
        status = AgentStatus.load(live.status_file)
        waiting = status.waiting if status is not None else None
    tool = (waiting or {}).get("tool")
    return tool if isinstance(tool, str) else None


def _unread(inbox: Path) -> list[str]:
    """Texts of messages still waiting in an agent's inbox (it ended before draining them)."""
    texts: list[str] = []
    new = inbox / "new"
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(new)):
            path = new / entry
            with contextlib.suppress(OSError, ValueError):
                import orjson

                record = orjson.loads(path.read_bytes())
                if isinstance(record, dict) and record.get("text"):
                    texts.append(str(record["text"]))
                path.unlink()
    return texts


def _first_line(text: str) -> str | None:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:200] or None


def _progress(raw: Mapping[str, Any], seen: float | None = None) -> AgentProgress | None:
    """The progress of a runner's status; each activity at the time the runner gives it
    (`seen`, when the status was written, for a runner that gave none)."""
    if not raw:
        return None
    texts = [a for a in raw.get("recent_activities") or () if isinstance(a, str)]
    times = [t for t in raw.get("recent_activity_times") or () if isinstance(t, int | float)]
    if len(times) != len(texts):
        times = [seen or time.time()] * len(texts)
    recent = tuple(
        ToolActivity(tool_name=a.split("(", 1)[0], description=a, at=at)
        for a, at in zip(texts, times, strict=True)
    )
    last = raw.get("last_activity")
    last_at = raw.get("last_activity_at")
    return AgentProgress(
        tool_use_count=int(raw.get("tool_use_count") or 0),
        token_count=int(raw.get("token_count") or 0),
        latest_input_tokens=int(raw.get("latest_input_tokens") or 0),
        cumulative_output_tokens=int(raw.get("cumulative_output_tokens") or 0),
        last_activity=ToolActivity(
            tool_name=last.split("(", 1)[0],
            description=last,
            at=last_at if isinstance(last_at, int | float) else seen or time.time(),
        )
        if isinstance(last, str)
        else None,
        recent_activities=recent,
        summary=raw.get("summary") if isinstance(raw.get("summary"), str) else None,
    )
