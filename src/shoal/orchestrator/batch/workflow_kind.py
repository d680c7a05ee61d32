"""The `local_workflow` kind: `shoal run`'s engine inside the team's long-lived leader.

A workflow is one task (`w...`) whose steps are the leader's own shell tasks, each naming it
(`workflow_id`), and, for a spec with `[[member]]`s, turns of those members: they join the
team as its teammates when the workflow starts (without holding up the leader's loop; the
engine begins once they are ready), are listed under it, and are stopped at its end.
`WorkflowKind` is both the kind of those tasks and a policy of the leader's loop: every pass
it feeds each workflow's `BatchRun` what happened to its steps (through a `LeaderShell`, as
`shoal run` does), lets it decide, saves its run record (`RunRecords`) and, at the end, writes
the JSON report and ends the task with the counts. A step's end is not notified on its own:
the workflow's one notification at its end tells them all.

A leader killed mid-workflow leaves the record and the steps: the leader that resumes the
session rebuilds the run from the record (steps that succeeded, also after the last save, are
carried, not run again) and takes the steps still running back as the attempts they are.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import EXIT_OK, ShoalError
from shoal.core.events import (
    Event,
    RunEvent,
    task_started,
    task_terminated,
)
from shoal.core.ids import new_ulid
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    TERMINAL_STATUSES,
    AnyTaskState,
    LocalShellTaskState,
    LocalWorkflowTaskState,
    TaskStatus,
    TaskType,
)
from shoal.orchestrator.batch.agents import WorkflowAgents
from shoal.orchestrator.batch.engine import ENV_TASK, BatchRun
from shoal.orchestrator.batch.leader_shell import WorkflowShell
from shoal.orchestrator.batch.options import resolve_backend
from shoal.orchestrator.batch.recovery import succeeded_attempts, with_recovered
from shoal.orchestrator.batch.report import (
    RecordSaver,
    RunRecords,
    iso,
    plan_resume,
    write_json,
)
from shoal.orchestrator.batch.spec import Spec
from shoal.orchestrator.batch.state import (
    ExecEvent,
    Finished,
)
from shoal.orchestrator.batch.workflow import load_spec
from shoal.orchestrator.leader import Leader
from shoal.workers.kinds import Poll, TaskStore

# The run record is rewritten at most this often while a workflow runs (at once on an end).
RECORD_INTERVAL_S: Final = 1.0
LEADER_STOPPED: Final = "leader shut down"


@dataclass
class _Run:
    """One workflow's live run: the engine, its executor and what it posted."""

    task_id: str
    spec: Spec
    run_id: str
    record: Path
    report: Path
    started_at: float
    resumed_from: str | None
    batch: BatchRun = field(init=False)
    shell: WorkflowShell = field(init=False)
    events: deque[ExecEvent] = field(default_factory=deque)
    stop_reason: str | None = None
    saver: RecordSaver = field(init=False)
    agents: WorkflowAgents | None = None
    begun: bool = False
    backend: str = "process"
    """Where its members run (its shell steps are the leader's processes)."""
    earlier: dict[str, int] = field(default_factory=dict)
    """Spec task id -> its attempts that ended under earlier leaders (a resumed run's engine
    counts its own from 1: the log numbers an attempt with these)."""


class WorkflowKind:
    """The TaskKind of `local_workflow` tasks, and the leader policy that runs them."""

    types = frozenset({TaskType.LOCAL_WORKFLOW})

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.records = RunRecords(leader.layout)
        self.runs: dict[str, _Run] = {}
        self._adopted: list[str] = []
        """Workflows of the resumed session, rebuilt at the first policy step (by then every
        task of the session is registered and its kind has adopted it)."""

    # -- TaskKind ------------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, LocalWorkflowTaskState)
        try:
            spec = load_spec(task.spec_path or "")
        except ShoalError as exc:  # (changed since it was checked)
            store.move_task(task.id, TaskStatus.FAILED, error=str(exc))
            store.emit(task_started(store.get(task.id) or task))
            return
        run_id = new_ulid().lower()
        run = self._new_run(task.id, spec, run_id, carried={}, resumed_from=None)
        store.move_task(
            task.id,
            TaskStatus.RUNNING,
            start_time=time.time(),
            run_id=run_id,
            total_steps=len(spec.tasks),
            record_file=str(run.record),
            report_file=str(run.report),
        )
        store.emit(task_started(store.get(task.id) or task))
        self._log(run, f"started: {len(spec.tasks)} step(s) of {spec.path} (run {run_id})")
        self._begin(run)
        store.wake()

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        """Nothing to poll: a workflow moves in the policy step, on its steps' events."""

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        """Stop the workflow's running steps (TERM; the leader's reap ends them) and skip the
        rest; it ends killed once every step has its verdict."""
        if task.id in self._adopted:  # (rebuilt once: here, not again by the next step)
            self._adopted.remove(task.id)
            self._rebuild(task.id)
        run = self.runs.get(task.id)
        if run is None:
            store.move_task(task.id, TaskStatus.KILLED, kill_reason=reason)
            if reason == STOPPED_ON_REQUEST:
                self._quiet_end(task.id)
            return
        self._interrupt(run, reason)
        store.set_task(task.id, kill_reason=reason)
        self.step(self.leader, time.monotonic())

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        if task.status == TaskStatus.RUNNING:
            self._adopted.append(task.id)

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        result = getattr(task, "result", None)
        return {"result": result} if result else {}

    def live(self) -> Iterable[str]:
        return [*self.runs, *self._adopted]

    def signalled(self) -> Iterable[str]:
        return ()

    def on_exit(self, key: str) -> bool:
        return False

    def next_due(self) -> float | None:
        """Now, when a workflow has news or waits to be rebuilt; else its next timeout or
        retry (one method for the loop's kinds and its policies alike)."""
        if self._adopted or any(run.events for run in self.runs.values()):
            return 0.0
        due = [d for run in self.runs.values() if (d := run.batch.next_deadline()) is not None]
        return min(due) if due else None

    def running(self) -> int:
        """A workflow holds no job slot of its own: its steps do."""
        return 0

    # -- the policy ----------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        for run in list(self.runs.values()):
            run.shell.on_event(event)
            if run.agents is not None:
                run.agents.on_event(event)

    def step(self, leader: Any, now: float) -> None:
        """Feed every workflow what its steps did, let its engine decide, save its record."""
        while self._adopted:
            self._rebuild(self._adopted.pop(0))
        for run in list(self.runs.values()):
            if self.leader.stopping and run.stop_reason is None:
                self._interrupt(run, LEADER_STOPPED)
            if not run.begun:
                self._await_members(run)
                continue
            self._quiet_steps(run)
            ended = self._drain(run)
            batch = run.batch
            if not batch.done and not batch.interrupted:
                batch.tick(now)
                ended = self._drain(run) or ended
            if batch.done:
                self._finish(run)
            else:
                self._sync(run, force=ended)

    # -- the workflow's life -----------------------------------------------------------------

    def _begin(self, run: _Run) -> None:
        """Begin the engine; a spec with members first brings them up (see `_await_members`)."""
        spec = run.spec
        if run.agents is not None and spec.members:
            backend, why = resolve_backend(None, spec.settings.backend)
            run.backend = backend
            names = ", ".join(m.name for m in spec.members)
            self._log(run, f"members {names} join team {self.leader.team} as {backend} ({why})")
            run.agents.begin(spec.members, backend, str(spec.path.parent))
            self._await_members(run)
            return
        run.begun = True
        run.batch.begin()

    def _await_members(self, run: _Run) -> None:
        """The engine begins once the members are ready; members that cannot start fail the
        workflow, with nothing of it run."""
        agents = run.agents
        if run.stop_reason is not None and not run.begun:
            run.begun = True
            run.batch.begin()
            run.batch.interrupt(run.stop_reason)
            return
        if agents is None or agents.ready:
            run.begun = True
            run.batch.begin()
            return
        if agents.error is None:
            return
        self.runs.pop(run.task_id, None)
        agents.end()
        error = f"its members could not start: {agents.error}"
        self._log(run, f"ended failed: {error}")
        self.leader.move_task(run.task_id, TaskStatus.FAILED, error=error)

    def _new_run(
        self,
        task_id: str,
        spec: Spec,
        run_id: str,
        *,
        carried: dict[str, dict[str, Any]],
        resumed_from: str | None,
    ) -> _Run:
        session = self.leader.session
        run = _Run(
            task_id=task_id,
            spec=spec,
            run_id=run_id,
            record=self.records.path(self._record_key(task_id), spec.path),
            report=session.dir / "workflows" / f"{task_id}.json",
            started_at=time.time(),
            resumed_from=resumed_from,
        )
        run.shell = WorkflowShell(self.leader, run.events.append, run_id)
        run.saver = RecordSaver(
            self.records, self._record_key(task_id), spec.path, run_id, RECORD_INTERVAL_S
        )
        run.shell.task_options = {"workflow_id": task_id}
        run.batch = BatchRun(
            spec,
            shell=run.shell,
            jobs=spec.settings.jobs,
            halt=spec.settings.halt,
            carried=carried,
            emit=lambda event: self._on_run_event(run, event),
        )
        if spec.members or spec.agent_tasks:
            run.agents = WorkflowAgents(self.leader, run.events.append, task_id)
            run.batch.agents = run.agents
        # The leader's queue is the team's, not this run's: hand out only what may start now,
        # so that `[run] jobs` holds whatever the leader's own limit is.
        run.batch.prefetch = 0
        self.runs[task_id] = run
        return run

    def _record_key(self, task_id: str) -> str:
        """Records of workflows sit apart from `shoal run`'s (`runs/{team}/{id}/...`)."""
        return f"{self.leader.team}/{task_id}"

    def _rebuild(self, task_id: str) -> None:
        """Continue a workflow of the resumed session from its run record: what succeeded is
        carried, the steps still running are taken back, the rest runs again."""
        task = self.leader.get(task_id)
        if not isinstance(task, LocalWorkflowTaskState) or task.is_terminal:
            return
        steps = self._steps_of(task_id)
        try:
            spec = load_spec(task.spec_path or "")
        except ShoalError as exc:
            for step in steps:
                if isinstance(step, LocalShellTaskState) and not step.is_terminal:
                    self.leader.stop(step.id)
            self.leader.move_task(task_id, TaskStatus.FAILED, error=f"cannot continue: {exc}")
            return
        run_id = task.run_id or new_ulid().lower()
        previous = self.records.load(self._record_key(task_id), spec.path) or {
            "run_id": run_id,
            "tasks": [],
        }
        recovered = succeeded_attempts(previous, steps)
        if recovered:
            previous = with_recovered(previous, recovered)
        carried = plan_resume(spec, previous)
        run = self._new_run(task_id, spec, run_id, carried=carried, resumed_from=run_id)
        run.shell.handles = list(task.steps)
        run.earlier = _ended_attempts(steps, carried)
        for step in steps:
            if not isinstance(step, LocalShellTaskState):
                continue
            spec_id = (step.env or {}).get(ENV_TASK, "")
            if not step.is_terminal and spec_id and spec_id not in carried:
                run.shell.leftovers[spec_id] = step
            elif step.is_terminal and not step.notified:
                self._quiet_end(step.id)
        self._begin(run)
        if run.begun:
            run.batch.tick()
        for left in run.shell.leftovers.values():  # (not asked for: its step is not due now)
            with contextlib.suppress(ShoalError):
                self.leader.stop(left.id, reason=f"not part of workflow {task_id} any more")
        run.shell.leftovers.clear()
        self._log(
            run,
            f"continued by a resumed leader: {len(carried)} step(s) carried from the run "
            f"record, {len(run.shell.taken_back)} running step(s) taken back",
        )
        self._sync(run, force=True)

    def _steps_of(self, task_id: str) -> list[LocalShellTaskState | dict[str, Any]]:
        """The workflow's shell tasks in the registry and, ended and evicted, in history."""
        live: list[LocalShellTaskState | dict[str, Any]] = [
            t
            for t in self.leader.registry.get_all_tasks()
            if isinstance(t, LocalShellTaskState) and t.workflow_id == task_id
        ]
        seen = {t.id for t in live if isinstance(t, LocalShellTaskState)}
        live += [
            rec
            for tid, rec in self.leader.history().items()
            if rec.get("workflow_id") == task_id and tid not in seen
        ]
        return live

    def _interrupt(self, run: _Run, reason: str) -> None:
        """Start nothing more, skip what waits, and stop the steps in flight."""
        if run.stop_reason is not None:
            return
        run.stop_reason = reason
        if run.begun:
            run.batch.interrupt(reason)
        for handle in list(run.shell.known):
            run.shell.stop(handle, reason)
        if run.agents is not None:
            run.agents.stop_all(reason)

    def _quiet_steps(self, run: _Run) -> None:
        """Steps that ended: their end is announced (the engine hears of it) but not notified
        on its own (the workflow's notification counts it)."""
        for handle in list(run.shell.known):
            step = self.leader.get(handle)
            if step is not None and step.is_terminal and not step.notified:
                self._quiet_end(handle)

    def _quiet_end(self, task_id: str) -> None:
        if self.leader.mark_notified(task_id):
            final = self.leader.get(task_id)
            if final is not None:
                self.leader.emit(task_terminated(final))

    def _drain(self, run: _Run) -> bool:
        """Feed the engine what its executor posted; True when an attempt ended."""
        ended = False
        while run.events:
            event = run.events.popleft()
            ended = ended or isinstance(event, Finished)
            run.batch.feed(event)
        return ended

    def _on_run_event(self, run: _Run, event: RunEvent) -> None:
        """An engine event: into the session's stream (naming the workflow) and its log."""
        fields = event.model_dump(exclude={"type", "subtype", "session_id", "ts"})
        self.leader.emit(RunEvent(subtype=event.subtype, workflow_id=run.task_id, **fields))
        step = fields.get("id")
        if event.subtype == "task_started":
            self._log(run, _started_line(run, str(step), fields))
        elif event.subtype == "task_finished":
            why = f" ({fields['reason']})" if fields.get("reason") else ""
            self._log(run, f"step {step}: {fields.get('status')}{why}")
        elif event.subtype in ("task_skipped", "task_retrying", "task_timed_out"):
            self._log(run, f"step {step}: {event.subtype[5:]} ({fields.get('reason') or ''})")

    def _log(self, run: _Run, text: str) -> None:
        """A line of the workflow's output file (`shoal logs w...`)."""
        task = self.leader.get(run.task_id)
        if task is None:
            return
        with contextlib.suppress(OSError), open(task.output_file, "a", encoding="utf-8") as fh:
            fh.write(f"{iso(time.time())} {text}\n")

    def _meta(self, run: _Run) -> dict[str, Any]:
        """The run-level fields of its report (those of `shoal run --report`, and its id)."""
        ended = time.time() if run.batch.done else None
        return {
            "run_id": run.run_id,
            "workflow_id": run.task_id,
            "spec": str(run.spec.path),
            "team": self.leader.team,
            "session_id": self.leader.session.id,
            "backend": run.backend,
            "jobs": run.batch.jobs,
            "halt": run.batch.halt.text,
            "resumed_from": run.resumed_from,
            "started_at": iso(run.started_at),
            "ended_at": iso(ended),
            "duration_s": round((ended or time.time()) - run.started_at, 3),
            "files": {"record": str(run.record), "report": str(run.report), "junit": None},
        }

    def _sync(self, run: _Run, *, force: bool = False) -> None:
        """The task's progress fields and the run record, when the run moved on (the record
        whole at most every RECORD_INTERVAL_S, an ended attempt's verdict journaled at once)."""
        batch = run.batch
        if not run.saver.sync(
            batch.version,
            batch.settled,
            lambda: batch.report(**self._meta(run)),
            lambda step_id: batch.tasks[step_id].to_json(),
            ended=force,
        ):
            return
        counts = batch.counts()
        running = [r.spec.id for r in batch.tasks.values() if r.status.value == "running"]
        self.leader.set_task(
            run.task_id,
            counts=counts,
            completed_steps=counts["total"] - counts["pending"] - counts["running"],
            current_step=", ".join(running) or None,
            steps=tuple(run.shell.handles),
        )

    def _finish(self, run: _Run) -> None:
        """Every step has its verdict: the report, the record, and the task's end."""
        batch = run.batch
        report = batch.report(**self._meta(run))
        self.runs.pop(run.task_id, None)
        if run.agents is not None:
            run.agents.end()
        self.records.save(self._record_key(run.task_id), run.spec.path, report)
        problem = None
        try:
            self.leader.layout.ensure(run.report.parent)
            write_json(run.report, report)
        except (ShoalError, OSError) as exc:
            problem = f"could not write the report {run.report}: {exc}"
        counts = report["counts"]
        said = counts_text(counts)
        result = f"{said}; report: {run.report}" + (f" ({problem})" if problem else "")
        self._log(run, f"ended {report['status']}: {result}")
        changes: dict[str, Any] = {
            "counts": counts,
            "completed_steps": counts["total"],
            "current_step": None,
            "steps": tuple(run.shell.handles),
            "result": result,
        }
        if run.stop_reason is not None:
            self.leader.move_task(
                run.task_id, TaskStatus.KILLED, kill_reason=run.stop_reason, **changes
            )
            if run.stop_reason == STOPPED_ON_REQUEST:
                self._quiet_end(run.task_id)
        elif report["exit_code"] == EXIT_OK and problem is None:
            self.leader.move_task(run.task_id, TaskStatus.COMPLETED, **changes)
        else:
            self.leader.move_task(run.task_id, TaskStatus.FAILED, error=problem or said, **changes)


def counts_text(counts: dict[str, int]) -> str:
    """`3 steps: 1 succeeded, 1 failed, 1 skipped` (verdicts with none left out)."""
    parts = [
        f"{counts[k]} {k.replace('_', ' ')}"
        for k in ("succeeded", "failed", "timed_out", "killed", "skipped")
        if counts.get(k)
    ]
    if counts.get("resumed"):
        parts.append(f"{counts['resumed']} carried from before a restart")
    total = counts.get("total", 0)
    return f"{total} step{'s' if total != 1 else ''}: {', '.join(parts) or 'none ran'}"


def install(leader: Leader) -> WorkflowKind:
    """Give `leader` the workflow kind (before its `start`, so that a resumed session's
    workflows are adopted). The team's long-lived leader and a `shoal run`'s leader (which
    may resume a session of a team named with --team) both have it."""
    kind = WorkflowKind(leader)
    for task_type in kind.types:
        leader.kinds[task_type] = kind
    leader.policies.append(kind)
    return kind


def _ended_attempts(
    steps: Iterable[LocalShellTaskState | dict[str, Any]], carried: Mapping[str, Any]
) -> dict[str, int]:
    """Spec task id -> how many of its attempts (`steps`, live or from history) have ended,
    for the tasks a resumed run does again (a carried one does not run)."""
    counts: dict[str, int] = {}
    for step in steps:
        if isinstance(step, LocalShellTaskState):
            env, ended = step.env or {}, step.is_terminal
        else:
            env = step.get("env") or {}
            ended = step.get("status") in TERMINAL_STATUSES  # (a str enum: "failed" matches)
        spec_id = env.get(ENV_TASK) if isinstance(env, dict) else None
        if ended and isinstance(spec_id, str) and spec_id and spec_id not in carried:
            counts[spec_id] = counts.get(spec_id, 0) + 1
    return counts


def _started_line(run: _Run, step: str, fields: Mapping[str, Any]) -> str:
    """The log line of an attempt's start: a first start, a start again (a retry, or a step
    whose attempt ended while no leader ran), or a running task taken back by a resumed
    leader, with the attempt's number over the whole workflow."""
    task_id = fields.get("task_id")
    number = run.earlier.get(step, 0) + int(fields.get("attempt") or 1)
    if task_id in run.shell.taken_back:
        return f"step {step}: taken back, still running as {task_id} (attempt {number})"
    if number > 1:
        return f"step {step}: started again as {task_id} (attempt {number})"
    return f"step {step}: started as {task_id}"
