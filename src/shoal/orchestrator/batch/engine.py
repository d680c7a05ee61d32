"""The batch-run scheduler behind `shoal run`: `BatchRun`, a pure state machine.

`BatchRun` holds plain data and moves through a `tick()` of named steps — enforce timeouts,
apply the halt policy, submit what is ready — plus `feed()` for what the executors report
(`Started`, `Finished`). It talks to the world through two small interfaces: a
`ShellExecutor` (the leader, in production; a stand-in in unit tests) and an
`AgentDispatcher` (teammates, for `prompt` tasks), and takes its clock injected. The leader's
`policy` step drives it (see `driver.py`): it has no thread or loop of its own.
The run state it moves, and those interfaces, are in `state.py`; the verdict it reaches
(counts, exit code) in `verdict.py`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from shoal.core.errors import ShoalError
from shoal.core.events import RunEvent
from shoal.core.tasks import TaskStatus
from shoal.orchestrator.batch import verdict
from shoal.orchestrator.batch.exitcodes import INTERRUPTED, OK
from shoal.orchestrator.batch.report import REPORT_VERSION
from shoal.orchestrator.batch.spec import HaltPolicy, Spec, SpecError, SpecIssue
from shoal.orchestrator.batch.state import (
    FINAL_STATUSES,
    STOP_HALT,
    STOP_INTERRUPT,
    STOP_TIMEOUT,
    AgentDispatcher,
    Attempt,
    ExecEvent,
    Finished,
    Refused,
    RunStatus,
    ShellExecutor,
    ShellRequest,
    Stalled,
    Started,
    TaskRun,
)

# Shell tasks handed to the leader ahead of free job slots, so a slot never waits for the
# engine: at least this many, or 4 x `jobs` when that is more. They are handed out in batches
# of half of it (each hand-out is one state.json write).
MIN_PREFETCH: Final = 16
# Environment of every task: which spec task and which attempt it is.
ENV_TASK: Final = "SHOAL_RUN_TASK"
ENV_ATTEMPT: Final = "SHOAL_RUN_ATTEMPT"

AGENTS_UNAVAILABLE: Final = "agent tasks need teammates, not available in this build"


def check_agents(spec: Spec, factory: object | None) -> None:
    """Refuse (SpecError, exit 2) a spec with members or agent tasks when there is no
    dispatcher: they are never skipped or faked."""
    if factory is not None:
        return
    issues = [
        SpecIssue(t.line, f'task "{t.id}": {AGENTS_UNAVAILABLE} (use run = "..." for now)')
        for t in spec.agent_tasks
    ]
    issues += [
        SpecIssue(m.line, f'member "{m.name}": {AGENTS_UNAVAILABLE}; remove the [[member]]')
        for m in spec.members
    ]
    if issues:
        raise SpecError(spec.display, issues)


EventSink = Callable[[RunEvent], None]
AttemptHook = Callable[[TaskRun, Attempt], None]


class BatchRun:
    """The scheduler of one run: dependencies gate starts, failures skip dependents, failed
    attempts are retried, attempts past their timeout are stopped, and the halt policy stops
    the run early. No threads and no processes of its own: drive it with `feed` and `tick`."""

    def __init__(
        self,
        spec: Spec,
        *,
        shell: ShellExecutor,
        agents: AgentDispatcher | None = None,
        jobs: int = 1,
        halt: HaltPolicy | None = None,
        carried: Mapping[str, Mapping[str, Any]] | None = None,
        emit: EventSink | None = None,
        on_attempt_end: AttemptHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.shell = shell
        self.agents = agents
        self.jobs = jobs
        self.halt = halt or HaltPolicy()
        # With a halt policy, hand out only what can start at once: a task queued ahead in the
        # leader would start the moment a failing task's slot frees, before the halt applies.
        self.prefetch = 0 if self.halt.when != "never" else max(MIN_PREFETCH, 4 * jobs)
        self.tasks: dict[str, TaskRun] = {t.id: TaskRun(t) for t in spec.tasks}
        self.carried = dict(carried or {})
        self._emit_cb = emit
        self._on_attempt_end = on_attempt_end
        self._clock = clock
        self._wall = wall
        self._dependents = spec.dependents()
        self._ready: deque[TaskRun] = deque()
        self._delayed: list[tuple[float, TaskRun]] = []
        """Tasks waiting out their retry_delay: (monotonic time it ends, task)."""
        self._handles: dict[str, tuple[TaskRun, Attempt]] = {}
        self._live: dict[str, tuple[TaskRun, Attempt]] = {}
        self._shell_inflight = 0
        self._busy_members: set[str] = set()
        self._unfinished = len(self.tasks)
        self.failures = 0
        """Tasks that ended failed, timed out, or killed by someone other than this run."""
        self.successes = 0
        self.halted: str | None = None
        self.interrupted: str | None = None
        self.version = 0
        """Bumped on every change (the driver saves the run record when it moves)."""
        self.settled: list[str] = []
        """Ids of the tasks given their verdict, in order (the record's journal reads it)."""

    # -- events out -----------------------------------------------------------------------------

    def _emit(self, subtype: str, **fields: Any) -> None:
        self.version += 1
        if self._emit_cb is not None:
            self._emit_cb(RunEvent(subtype=subtype, **fields))

    # -- start -------------------------------------------------------------------------------

    def begin(self) -> None:
        """Take over the carried results and queue what can start at once."""
        for run in self.tasks.values():
            old = self.carried.get(run.spec.id)
            if old is not None:
                run.carried = old
                run.move(RunStatus.SUCCEEDED)
                run.reason = "succeeded in a previous run (not run again)"
                self._unfinished -= 1
        for run in self.tasks.values():
            if run.final:
                continue
            # (an `always` task waits for its `after` tasks to end, however they end)
            run.waiting_on = sum(
                1
                for d in run.spec.after
                if not (self.tasks[d].final if run.spec.always else self.tasks[d].succeeded)
            )
            if run.waiting_on == 0:
                self._ready.append(run)
        self.version += 1

    @property
    def done(self) -> bool:
        """True when every task has its verdict."""
        return self._unfinished == 0

    # -- the tick ------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """One pass: stop attempts past their timeout, apply the halt policy, release retries
        whose delay is over, submit what is ready (each step a method a test can call on its
        own)."""
        now = self._clock() if now is None else now
        self.enforce_timeouts(now)
        self.apply_halt()
        self.release_retries(now)
        self.schedule()

    def release_retries(self, now: float) -> None:
        """Tasks whose retry delay is over become ready, ahead of tasks not tried yet."""
        due = [run for at, run in self._delayed if at <= now]
        if not due:
            return
        self._delayed = [(at, run) for at, run in self._delayed if at > now]
        self._ready.extendleft(reversed(due))

    def enforce_timeouts(self, now: float) -> None:
        """Stop every running attempt past its deadline (it ends as timed_out)."""
        for run, attempt in list(self._live.values()):
            if attempt.deadline is None or attempt.stop is not None or now < attempt.deadline:
                continue
            attempt.stop = STOP_TIMEOUT
            label = run.spec.timeout_label
            self._emit(
                "task_timed_out",
                id=run.spec.id,
                attempt=attempt.number,
                task_id=attempt.handle,
                timeout=label,
                timeout_s=run.spec.timeout,
            )
            self._stop(run, attempt, f"timed out after {label}")

    def apply_halt(self) -> None:
        """Once the halt policy triggers: start nothing more; with `now`, kill what runs."""
        if self.halted or self.interrupted:
            return
        policy = self.halt
        if not policy.triggered(self.failures, self.successes, len(self.tasks)):
            return
        seen = self.failures if policy.on == "fail" else self.successes
        verb = "failed" if policy.on == "fail" else "succeeded"
        self.halted = f"halt {policy.text}: {seen} task{'s' if seen != 1 else ''} {verb}"
        running = [(r, a) for r, a in self._live.values() if a.status == RunStatus.RUNNING]
        self._emit(
            "halted",
            reason=self.halted,
            policy=policy.text,
            killing=len(running) if policy.when == "now" else 0,
        )
        self._close_pending(f"not started: {self.halted}", keep_always=True)
        for handle, (run, attempt) in list(self._live.items()):
            queued = attempt.status == RunStatus.QUEUED and not run.spec.is_agent
            if queued and self.shell.cancel(handle, f"not started: {self.halted}"):
                attempt.stop = STOP_HALT
                continue
            if policy.when == "now" and attempt.stop is None:
                attempt.stop = STOP_HALT
                self._stop(run, attempt, f"killed: {self.halted}")

    def schedule(self) -> None:
        """Submit ready tasks: shell attempts while job slots (plus a prefetch) are free,
        agent attempts when their member is free."""
        if self.interrupted or not self._ready:
            return
        if self.halted:  # (after a halt, only `always` tasks still start)
            self._ready = deque(r for r in self._ready if r.spec.always)
        room = self._room()
        batch: list[TaskRun] = []
        taken: set[str] = set()  # (a task readied twice is submitted once)
        deferred: list[TaskRun] = []
        while self._ready and (room is None or len(batch) < room):
            run = self._ready.popleft()
            if run.status != RunStatus.PENDING or run.spec.id in taken:
                continue
            taken.add(run.spec.id)
            if run.spec.is_agent:
                if run.spec.assign in self._busy_members:
                    deferred.append(run)
                else:
                    self._dispatch_agent(run)
                continue
            batch.append(run)
        self._ready.extendleft(reversed(deferred))
        if batch:
            self._submit_shell(batch)

    def _room(self) -> int | None:
        """How many shell attempts may be handed to the executor now (None: no limit)."""
        if self.jobs <= 0:
            return None
        free = self.jobs + self.prefetch - self._shell_inflight
        if self._shell_inflight > self.jobs and free < self.prefetch // 2:
            return 0  # slots are covered: refill in batches, not one by one
        return max(0, free)

    def _submit_shell(self, batch: list[TaskRun]) -> None:
        requests = []
        for run in batch:
            spec = run.spec
            number = len(run.attempts) + 1
            label = spec.description or spec.command_line
            requests.append(
                ShellRequest(
                    command=spec.argv,
                    description=f"[{spec.id}] {label}",
                    cwd=spec.cwd,
                    env={**spec.env, ENV_TASK: spec.id, ENV_ATTEMPT: str(number)},
                    timeout=spec.timeout,
                    junit=spec.junit,
                    num_cpus=spec.num_cpus,
                    num_gpus=spec.num_gpus,
                    resources=spec.resources,
                )
            )
        handles = self.shell.submit(requests)
        for run, handle in zip(batch, handles, strict=True):
            attempt = Attempt(number=len(run.attempts) + 1, handle=None)
            run.attempts.append(attempt)
            if isinstance(handle, Refused):
                self._attempt_ended(run, attempt, Finished("", "failed", error=handle.error))
                continue
            attempt.handle = handle
            run.move(RunStatus.QUEUED)
            self._handles[handle] = self._live[handle] = (run, attempt)
            self._shell_inflight += 1
        self.version += 1

    def _dispatch_agent(self, run: TaskRun) -> None:
        attempt = Attempt(number=len(run.attempts) + 1, handle=None)
        run.attempts.append(attempt)
        if self.agents is None or run.spec.assign is None:
            # check_agents refuses such a spec before a run starts; this is a guard.
            self._attempt_ended(run, attempt, Finished("", "failed", error=AGENTS_UNAVAILABLE))
            return
        member = self.spec.member(run.spec.assign)
        try:
            handle = self.agents.dispatch(run.spec, member, attempt.number)
        except ShoalError as exc:
            self._attempt_ended(run, attempt, Finished("", "failed", error=str(exc)))
            return
        attempt.handle = handle
        run.move(RunStatus.QUEUED)
        self._handles[handle] = self._live[handle] = (run, attempt)
        self._busy_members.add(member.name)
        self.version += 1

    def _stop(self, run: TaskRun, attempt: Attempt, reason: str) -> None:
        assert attempt.handle is not None
        if run.spec.is_agent and self.agents is not None:
            self.agents.stop(attempt.handle, reason)
        else:
            self.shell.stop(attempt.handle, reason)

    # -- events in -------------------------------------------------------------------------------

    def feed(self, event: ExecEvent) -> None:
        """Apply one executor event (unknown handles are ignored)."""
        entry = self._handles.get(event.handle)
        if entry is None:
            return
        run, attempt = entry
        if isinstance(event, Started):
            if attempt.status != RunStatus.QUEUED:
                return
            attempt.move(RunStatus.RUNNING)
            attempt.started_at = event.at
            if not run.final:
                run.move(RunStatus.RUNNING)
            if run.spec.timeout is not None:
                late = max(0.0, self._wall() - event.at)
                attempt.deadline = self._clock() - late + run.spec.timeout
            self._emit("task_started", id=run.spec.id, attempt=attempt.number, task_id=event.handle)
        elif isinstance(event, Stalled):
            self._emit("task_stalled", id=run.spec.id, task_id=event.handle, prompt=event.prompt)
        else:
            self._attempt_ended(run, attempt, event)

    def _attempt_ended(self, run: TaskRun, attempt: Attempt, event: Finished) -> None:
        if attempt.status in FINAL_STATUSES:
            return  # a duplicate report
        if attempt.handle is not None and self._live.pop(attempt.handle, None) is not None:
            if run.spec.is_agent:
                self._busy_members.discard(run.spec.assign or "")
            else:
                self._shell_inflight -= 1
        attempt.exit_code = event.exit_code
        attempt.ended_at = event.ended_at or self._wall()
        if event.started_at is not None:
            attempt.started_at = event.started_at
        elif not event.ran:
            attempt.started_at = None
        attempt.output_file = event.output_file
        attempt.error = event.error
        attempt.junit_error = event.junit_error
        attempt.host = event.host
        attempt.junit_failures = event.junit_failures
        attempt.move(self._outcome(attempt, event))
        self.version += 1
        if attempt.started_at is not None and self._on_attempt_end is not None:
            self._on_attempt_end(run, attempt)
        if run.final:
            return  # the run was interrupted or halted meanwhile and gave its verdict already
        retry = attempt.status in (RunStatus.FAILED, RunStatus.TIMED_OUT)
        if retry and len(run.attempts) <= run.spec.retries and self._may_start():
            run.move(RunStatus.PENDING)
            delay = run.spec.delay_before(attempt.number + 1)
            if delay > 0:
                self._delayed.append((self._clock() + delay, run))
            else:
                self._ready.appendleft(run)
            self._emit(
                "task_retrying",
                id=run.spec.id,
                attempt=attempt.number,
                status=attempt.status.value,
                exit_code=attempt.exit_code,
                reason=self._reason(run, attempt),
                next_attempt=attempt.number + 1,
                attempts_max=run.spec.retries + 1,
                delay_s=delay,
            )
            return
        self._finalize(run, attempt.status, self._reason(run, attempt))
        self.apply_halt()

    def _outcome(self, attempt: Attempt, event: Finished) -> RunStatus:
        if event.status == TaskStatus.COMPLETED.value:
            return RunStatus.SUCCEEDED
        if event.status != TaskStatus.KILLED.value:
            return RunStatus.FAILED
        if not event.ran and attempt.stop in (STOP_HALT, STOP_INTERRUPT):
            return RunStatus.SKIPPED
        if attempt.stop == STOP_TIMEOUT:
            return RunStatus.TIMED_OUT
        return RunStatus.KILLED

    def _reason(self, run: TaskRun, attempt: Attempt) -> str | None:
        status = attempt.status
        if status == RunStatus.SUCCEEDED:
            return None
        if status == RunStatus.TIMED_OUT:
            return f"timed out after {run.spec.timeout_label}"
        if status == RunStatus.FAILED:
            if attempt.error:
                return attempt.error
            return f"exit code {attempt.exit_code}" if attempt.exit_code is not None else "failed"
        if attempt.stop == STOP_HALT:
            prefix = "killed" if status == RunStatus.KILLED else "not started"
            return f"{prefix}: {self.halted}"
        if attempt.stop == STOP_INTERRUPT:
            prefix = "killed" if status == RunStatus.KILLED else "not started"
            return f"{prefix}: interrupted ({self.interrupted})"
        return f"killed: {attempt.error}" if attempt.error else "killed"

    def _may_start(self) -> bool:
        return not (self.halted or self.interrupted)

    def _finalize(self, run: TaskRun, status: RunStatus, reason: str | None) -> None:
        """Give `run` its verdict; dependents of a task that did not succeed are skipped."""
        work = [(run, status, reason)]
        while work:
            task, verdict, why = work.pop()
            if task.final:
                continue
            task.move(verdict)
            task.reason = why
            self._unfinished -= 1
            self.version += 1
            self.settled.append(task.spec.id)
            last = task.attempts[-1] if task.attempts else None
            if verdict == RunStatus.SUCCEEDED:
                self.successes += 1
            elif verdict in (RunStatus.FAILED, RunStatus.TIMED_OUT) or (
                verdict == RunStatus.KILLED and (last is None or last.stop is None)
            ):
                self.failures += 1
            self._emit_verdict(task)
            for child_id in self._dependents[task.spec.id]:
                child = self.tasks[child_id]
                if verdict != RunStatus.SUCCEEDED and not child.spec.always:
                    continue
                child.waiting_on -= 1
                if child.waiting_on == 0 and child.status == RunStatus.PENDING:
                    self._ready.append(child)
            if verdict == RunStatus.SUCCEEDED:
                continue
            said = {
                RunStatus.FAILED: "failed",
                RunStatus.TIMED_OUT: "timed out",
                RunStatus.KILLED: "was killed",
                RunStatus.SKIPPED: "was skipped",
            }[verdict]
            for child_id in reversed(self._dependents[task.spec.id]):
                child = self.tasks[child_id]
                if child.status == RunStatus.PENDING and not child.spec.always:
                    work.append((child, RunStatus.SKIPPED, f'dependency "{task.spec.id}" {said}'))

    def _emit_verdict(self, run: TaskRun) -> None:
        if run.status == RunStatus.SKIPPED:
            self._emit("task_skipped", id=run.spec.id, reason=run.reason)
            return
        info = run.to_json()
        self._emit(
            "task_finished",
            id=run.spec.id,
            status=run.status.value,
            attempts=info["attempts"],
            exit_code=info["exit_code"],
            duration_s=info["duration_s"],
            output_file=info["output_file"],
            reason=run.reason,
        )

    def _close_pending(self, reason: str, *, keep_always: bool = False) -> None:
        """Give every task not handed out yet its verdict: a task waiting to be retried keeps
        its last outcome, the rest are skipped with `reason` (no cascade needed: all go).
        With `keep_always` (a halt), `always` tasks not tried yet stay, to run once what
        they wait for has ended."""
        ready = [r for r in self._ready if keep_always and r.spec.always]
        self._ready.clear()
        self._delayed.clear()
        for run in self.tasks.values():
            if run.status != RunStatus.PENDING:
                continue
            if keep_always and run.spec.always and not run.attempts:
                continue
            if run.attempts:
                last = run.attempts[-1]
                self._finalize(run, last.status, self._reason(run, last))
            else:
                self._finalize(run, RunStatus.SKIPPED, reason)
        self._ready.extendleft(reversed(ready))

    # -- ending --------------------------------------------------------------------------------

    def interrupt(self, why: str) -> None:
        """Start nothing more; live attempts are marked as stopped by the interrupt (the
        driver's leader shutdown kills them) and waiting tasks are skipped."""
        if self.interrupted:
            return
        self.interrupted = why
        # (what runs is stopped; what was handed out and not started yet never starts)
        running = self.running
        self._emit("interrupted", reason=why, running=running, queued=len(self._live) - running)
        self._close_pending(f"not started: interrupted ({why})")
        for _run, attempt in self._live.values():
            if attempt.stop is None:
                attempt.stop = STOP_INTERRUPT

    def abandon(self) -> None:
        """After the executors are gone: attempts that never reported an end are killed (or
        skipped, if they never started)."""
        for handle, (_run, attempt) in list(self._live.items()):
            if attempt.stop is None:
                attempt.stop = STOP_INTERRUPT
            ran = attempt.started_at is not None
            self.feed(Finished(handle, TaskStatus.KILLED.value, ran=ran, error="lost"))
        for run in self.tasks.values():
            if not run.final:  # only reachable through a bug; never leave a task without verdict
                self._finalize(run, RunStatus.KILLED, "killed: the run ended before it did")

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which a running attempt times out or a retry delay
        ends."""
        deadlines = [
            a.deadline for _, a in self._live.values() if a.deadline is not None and a.stop is None
        ]
        deadlines += [at for at, _ in self._delayed]
        return min(deadlines) if deadlines else None

    def counts(self) -> dict[str, int]:
        """Tasks by verdict (plus `total`, and `resumed`: carried from a previous run)."""
        return verdict.counts(self.tasks.values())

    @property
    def running(self) -> int:
        """Attempts started and not ended."""
        return sum(1 for _, a in self._live.values() if a.status == RunStatus.RUNNING)

    def exit_code(self) -> int:
        """As exitcodes.EXIT_CODES says (verdict.py picks it)."""
        return verdict.exit_code(
            self.spec,
            self.tasks,
            interrupted=bool(self.interrupted),
            halted_on_success=bool(self.halted) and self.halt.on == "success" and not self.failures,
        )

    def status(self) -> str:
        """running, succeeded, failed or interrupted."""
        if not self.done:
            return "interrupted" if self.interrupted else "running"
        code = self.exit_code()
        return {OK: "succeeded", INTERRUPTED: "interrupted"}.get(code, "failed")

    def report(self, **meta: Any) -> dict[str, Any]:
        """The JSON report (also the run record): `meta` fields, summary, tasks."""
        return {
            "v": REPORT_VERSION,
            **meta,
            "status": self.status(),
            "exit_code": self.exit_code() if self.done else None,
            "halted": self.halted,
            "interrupted": self.interrupted,
            "counts": self.counts(),
            "tasks": [r.to_json() for r in self.tasks.values()],
        }
