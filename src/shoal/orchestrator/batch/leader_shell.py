"""The engine's shell on a leader: each attempt a shell task of the run's leader (a remote
one for `--backend ray`), and the leader's events about it the engine's `Started`, `Finished`
and `Stalled`; for a workflow, its steps (`WorkflowShell`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from shoal.core.errors import ShoalError, TaskError
from shoal.core.events import Event, TaskStalled, TaskStarted, TaskTerminated
from shoal.core.tasks import LocalShellTaskState, RemoteAgentTaskState, TaskStatus
from shoal.orchestrator.batch.engine import ENV_TASK
from shoal.orchestrator.batch.junit import FileStamp, check_written, failed_cases, stamp
from shoal.orchestrator.batch.ray_backend import RayShellMixin, RayTarget
from shoal.orchestrator.batch.recovery import ENV_RUN
from shoal.orchestrator.batch.state import (
    ExecEvent,
    Finished,
    Poster,
    Refused,
    ShellRequest,
    Stalled,
    Started,
)
from shoal.orchestrator.leader import Leader


class LeaderShell:
    """The engine's ShellExecutor: attempts are shell tasks of the run's leader, and the
    leader's events about them become `Started`/`Finished`/`Stalled` (all on the loop's
    thread; nothing here waits)."""

    def __init__(self, leader: Leader, post: Poster, run_id: str = "") -> None:
        self.leader = leader
        self.post = post
        self.run_id = run_id
        self.known: set[str] = set()
        self.junit: dict[str, tuple[str, FileStamp | None]] = {}
        """Handle -> (the JUnit report it must write, that file's stamp before it started)."""
        self.task_options: dict[str, Any] = {}
        """Extra fields of every task it makes (a workflow's steps name it: `workflow_id`)."""

    def submit(self, requests: Sequence[ShellRequest]) -> list[str | Refused]:
        """Build and submit the shell tasks in one go (one state write)."""
        out: list[str | Refused] = []
        tasks: list[LocalShellTaskState] = []
        for req in requests:
            try:
                env = {**req.env, ENV_RUN: self.run_id} if self.run_id else req.env
                task = self.leader.make_shell_task(
                    req.command,
                    description=req.description,
                    cwd=req.cwd,
                    env=env,
                    **self.task_options,
                )
            except TaskError as exc:
                out.append(Refused(str(exc)))
                continue
            self.known.add(task.id)
            if req.junit is not None:
                self.junit[task.id] = (req.junit, stamp(req.junit))
            tasks.append(task)
            out.append(task.id)
        if tasks:
            self.leader.submit(tasks)
        return out

    def stop(self, handle: str, reason: str) -> None:
        """Begin stopping a task (TERM to its group; the leader's reap sends KILL later)."""
        with contextlib.suppress(ShoalError):  # it finished meanwhile
            self.leader.stop(handle, reason=reason)

    def cancel(self, handle: str, reason: str) -> bool:
        """Kill a task still waiting for a job slot; False once it has started."""
        task = self.leader.get(handle)
        if task is None or task.status != TaskStatus.PENDING:
            return False
        self.leader.stop(handle, reason=reason)
        return True

    def on_event(self, event: Event) -> None:
        if isinstance(event, TaskStarted) and event.task_id in self.known:
            self.post(Started(event.task_id, event.ts or time.time()))
        elif isinstance(event, TaskTerminated) and event.task_id in self.known:
            self.known.discard(event.task_id)
            self.post(self._finished(event))
        elif isinstance(event, TaskStalled) and event.task_id in self.known:
            self.post(Stalled(event.task_id, event.prompt))

    def _finished(self, event: TaskTerminated) -> Finished:
        # (read now: the task is still in the registry, it is evicted after its end is told)
        state = self.leader.get(event.task_id)
        if not isinstance(state, LocalShellTaskState):
            return Finished(event.task_id, event.status, error="lost")
        ran = state.pid is not None
        status, error = state.status.value, state.error or state.kill_reason
        junit, before = self.junit.pop(event.task_id, (None, None))
        junit_error = None
        if junit is not None and ran:
            # (a report left from before this attempt is not its report, whatever its end)
            junit_error = check_written(junit, before)
        if junit_error is not None and state.status == TaskStatus.COMPLETED:
            # A task that says it succeeded without a usable report did not: the run's
            # verdict must not be green on tests nobody saw.
            status, error = TaskStatus.FAILED.value, junit_error
        failures: tuple[dict[str, str], ...] = ()
        if junit is not None and junit_error is None and status != TaskStatus.COMPLETED.value:
            # (kept now: a retry overwrites the report, and a test that failed before it
            # passed is a flaky test the merged report must show)
            failures = tuple(failed_cases(junit))
        return Finished(
            event.task_id,
            status,
            exit_code=state.result.code if state.result is not None else None,
            started_at=state.start_time if ran else None,
            ended_at=state.end_time,
            output_file=state.output_file,
            error=error,
            ran=ran,
            junit_error=junit_error,
            junit_failures=failures,
        )


class RayShell(RayShellMixin, LeaderShell):
    """The engine's ShellExecutor for `--backend ray`: attempts are remote shell tasks."""

    def __init__(self, leader: Leader, post: Poster, run_id: str, target: RayTarget) -> None:
        LeaderShell.__init__(self, leader, post, run_id)
        self.target = target

    def _finished(self, event: TaskTerminated) -> Finished:
        state = self.leader.get(event.task_id)
        if not isinstance(state, RemoteAgentTaskState):
            return Finished(event.task_id, event.status, error="lost")
        return self.remote_finished(event, state)


class Unattached:
    """The shell executor before the leader exists (the engine submits nothing then)."""

    def submit(self, requests: Sequence[ShellRequest]) -> list[str | Refused]:
        return [Refused("the run has no leader yet") for _ in requests]

    def stop(self, handle: str, reason: str) -> None:
        return None

    def cancel(self, handle: str, reason: str) -> bool:
        return False


class WorkflowShell(LeaderShell):
    """The engine's executor for one workflow: its attempts are the leader's shell tasks,
    marked as the workflow's steps. After a resume, a request for a step whose task of the
    earlier leader still runs gets that task back instead of a new one."""

    def __init__(self, leader: Leader, post: Callable[[ExecEvent], None], run_id: str) -> None:
        super().__init__(leader, post, run_id)
        self.leftovers: dict[str, LocalShellTaskState] = {}
        """Spec task id -> its live task of the earlier leader (resume only)."""
        self.handles: list[str] = []
        """Every task it started or took back, in order."""
        self.taken_back: set[str] = set()
        """The tasks of the earlier leader it took back while they ran (resume only)."""

    def submit(self, requests: Sequence[ShellRequest]) -> list[str | Refused]:
        out: list[str | Refused | None] = [None] * len(requests)
        fresh: list[int] = []
        for index, req in enumerate(requests):
            left = self.leftovers.pop(req.env.get(ENV_TASK, ""), None)
            if left is None:
                fresh.append(index)
                continue
            self.known.add(left.id)
            out[index] = left.id
            if left.status == TaskStatus.RUNNING:
                self.taken_back.add(left.id)
                self.post(Started(left.id, left.start_time))
        made = super().submit([requests[i] for i in fresh]) if fresh else []
        for index, handle in zip(fresh, made, strict=True):
            out[index] = handle
        self.handles += [h for h in out if isinstance(h, str)]
        return [h if h is not None else Refused("lost") for h in out]
