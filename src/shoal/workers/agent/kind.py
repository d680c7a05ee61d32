"""`local_agent` tasks for the leader's loop: start a runner on a backend (launch.py), read
its progress, settle it from its status file, kill it without waiting, resume it with late
messages.

The runner writes only its status file, output file and transcript; the registry is changed
here, on the loop's thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from shoal.core.config import worker_stall_s
from shoal.core.errors import ShoalError
from shoal.core.events import TaskProgress, task_started
from shoal.core.faults import pause_point
from shoal.core.notify import task_notification_xml
from shoal.core.output import tail
from shoal.core.procs import find_by_argument, is_alive
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
from shoal.workers.agent.job import (
    EXIT_NO_SPACE,
    NO_SPACE_REASON,
    AgentStatus,
    job_paths,
    read_changed,
)
from shoal.workers.agent.launch import (
    AgentRun,
    AgentStartError,
    Launcher,
    session_dir_of,
)
from shoal.workers.agent.runner import TURN_SIGNAL
from shoal.workers.agent.team_tools import LeaderPort
from shoal.workers.kinds import TaskStore, end_unannounced
from shoal.workers.process_kind import ProcessKind
from shoal.workers.shell.process import ShellProcess

# task_progress events of one agent are emitted at most this often.
PROGRESS_EVENT_INTERVAL_S: Final = 1.0
# Messages a running agent has been sent but not yet drained, kept in its record.
PENDING_CAP: Final = 50
OVER_BUDGET: Final = "over budget: "  # (a stop reason so marked ends the agent `failed`)


class AgentKind(ProcessKind[AgentRun]):
    """The `local_agent` task kind (see the module docstring)."""

    types = frozenset({TaskType.LOCAL_AGENT})

    def __init__(self, home: Path, team: str, leader: LeaderPort) -> None:
        self.launcher = Launcher(home, team, leader)
        self.runs: dict[str, AgentRun] = {}
        super().__init__(self.runs)
        self.stall_s = worker_stall_s(home)
        # Set by the leader: resume a finished agent with messages that came too late.
        self.resume_with: Callable[[LocalAgentTaskState, list[str]], Any] | None = None
        # Set by the leader: a coordinator's or a worker's spending moved (the run budget).
        self.on_spent: Callable[[LocalAgentTaskState], Any] | None = None

    # -- the protocol ------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, LocalAgentTaskState)
        job_file, status_file, inbox = job_paths(session_dir_of(task), task.id)
        live = AgentRun(task.id, status_file, inbox)
        lost = missing_env(task)
        if lost:  # (never run without them: its commands would see them unset)
            why = lost_env_error(task.id, lost, "shoal agent")
            store.move_task(task.id, TaskStatus.FAILED, error=f"could not start the agent: {why}")
            store.emit(task_started(store.get(task.id) or task))
            return
        try:
            job = self.launcher.job(task, status_file, inbox)
            job_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            job.save(job_file)
            if not store.write_ahead(task.id):
                store.emit(task_started(store.get(task.id) or task))
                return
            changes = self.launcher.start(live, job, job_file, task, store)
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

    def _check_stall(self, live: AgentRun, store: TaskStore, now: float) -> None:
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
        live = AgentRun(task.id, status_file, inbox)
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
    def _count_from(live: AgentRun, task: LocalAgentTaskState) -> None:
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

    def _process(self, run: AgentRun) -> ShellProcess | None:
        return run.proc

    def _has_news(self, run: AgentRun) -> bool:
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

    # -- the steps ---------------------------------------------------------------------------

    def _is_done(self, task_id: str, run: AgentRun) -> bool:
        if run.future is not None:
            return run.future.done()  # (an in-process run)
        return super()._is_done(task_id, run)

    def _settle_run(self, task_id: str, run: AgentRun, store: TaskStore) -> None:
        self._settle(run, store)

    def _read_status(self, live: AgentRun, store: TaskStore) -> AgentStatus | None:
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
        live: AgentRun, status: AgentStatus, task: LocalAgentTaskState, store: TaskStore
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

    def _settle(self, live: AgentRun, store: TaskStore, *, unattended: bool = False) -> None:
        """Give an ended agent its final state from its status file."""
        self._forget(live.task_id, store)
        self.launcher.close(live)
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


def _asked_tool(live: AgentRun, task: LocalAgentTaskState) -> str | None:
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
