"""`run_batch`: a spec's tasks on a leader in this process, the engine one policy of its loop.

The run starts a leader for its team, adds a `BatchPolicy` to it and runs the leader's loop on
this thread. Every pass, the loop's `policy` step feeds the engine what happened (task starts
and ends, read from the leader's typed events as they are emitted) and lets it decide: what
to submit, what to stop, whether the run is over. There is no second loop, thread or pipe:
a signal sets a flag and wakes the leader, and `shoal down` stops the run the way Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, Protocol

from shoal.core.errors import (
    ShoalError,
    UsageError,
)
from shoal.core.events import (
    Event,
    MessageReceived,
    RunEvent,
    RunResult,
)
from shoal.core.ids import new_ulid
from shoal.core.names import validate_name
from shoal.core.paths import Layout
from shoal.core.tasks import LocalShellTaskState, TaskStatus
from shoal.orchestrator.batch.agents import TeammateDispatcher
from shoal.orchestrator.batch.ci import summary_rows
from shoal.orchestrator.batch.engine import BatchRun, check_agents
from shoal.orchestrator.batch.exitcodes import INFRASTRUCTURE, OK
from shoal.orchestrator.batch.leader_shell import LeaderShell, RayShell, Unattached
from shoal.orchestrator.batch.options import (
    RunOptions,
    RunOutcome,
    default_run_team,
    resolve_backend,
)
from shoal.orchestrator.batch.ray_backend import RayTarget, prepare
from shoal.orchestrator.batch.recovery import (
    ended_attempts,
    succeeded_attempts,
    with_recovered,
)
from shoal.orchestrator.batch.report import (
    JoblogWriter,
    RecordSaver,
    RunRecords,
    iso,
    plan_resume,
    write_json,
    write_junit,
)
from shoal.orchestrator.batch.results import ResultsDir
from shoal.orchestrator.batch.retention import (
    configured_keep,
    make_run_team,
    prune_sessions,
    remove_run_team,
)
from shoal.orchestrator.batch.spec import RAY_BACKEND, Spec
from shoal.orchestrator.batch.state import (
    AgentDispatcher,
    Attempt,
    ExecEvent,
    Finished,
    Poster,
    RunStatus,
    Started,
    TaskRun,
)
from shoal.orchestrator.cleanup import CleanupRegistry
from shoal.orchestrator.leader import Leader

# The run record (what --resume reads) is rewritten at most this often while the run goes on
# (and a verdict is journaled at once: RecordSaver).
RECORD_INTERVAL_S: Final = 1.0
# Why a task queued by an earlier leader, and never started, is dropped by a run.
NEVER_STARTED: Final = "never started: queued by an earlier leader of the team"

Sink = Callable[[dict[str, Any]], None]
AgentDispatcherFactory = Callable[[Leader, Poster], AgentDispatcher]


def agent_dispatcher_factory() -> AgentDispatcherFactory | None:
    """The dispatcher of this build for agent tasks: the spec's members as teammates."""
    return TeammateDispatcher


class _OnMessage(Protocol):
    def on_message(self, event: MessageReceived) -> None: ...


class BatchPolicy:
    """The leader's `policy` step for one run: feed the engine, let it decide, save the
    record, and end the loop once every task has its verdict (or the run is interrupted)."""

    def __init__(self, driver: _Driver, leader: Leader) -> None:
        self.driver = driver
        self.leader = leader
        self.events: deque[ExecEvent] = deque()
        self.shell: LeaderShell = (
            RayShell(leader, self.events.append, driver.run_id, driver.ray)
            if driver.ray is not None
            else LeaderShell(leader, self.events.append, driver.run_id)
        )
        self.listeners: list[_OnMessage] = []
        self.finished = threading.Event()

    def on_event(self, event: Event) -> None:
        if isinstance(event, RunEvent | RunResult) or self.driver.options.forward_leader_events:
            self.driver.to_sink(event.to_record())
        self.shell.on_event(event)
        if isinstance(event, MessageReceived):
            for listener in self.listeners:
                listener.on_message(event)

    def drain(self) -> bool:
        """Feed the engine what happened; True when an attempt ended."""
        batch = self.driver.batch
        ended = False
        while self.events:
            event = self.events.popleft()
            ended = ended or isinstance(event, Finished)
            batch.feed(event)
        return ended

    def drain_starts(self) -> None:
        """Feed the engine the starts it has not seen, keeping every other event queued in
        its order (a start always comes before its attempt's end, so none is overtaken)."""
        rest: deque[ExecEvent] = deque()
        while self.events:
            event = self.events.popleft()
            if isinstance(event, Started):
                self.driver.batch.feed(event)
            else:
                rest.append(event)
        self.events.extend(rest)

    def step(self, leader: Leader, now: float) -> None:
        batch, driver = self.driver.batch, self.driver
        # The interrupt first: the ends its shutdown brought (the kills) are news of the
        # interrupt, not a run that ended on its own with tasks killed.
        if not batch.done and (driver.signal is not None or leader.stopping):
            self.drain_starts()  # (so that the interrupt knows what runs)
            if driver.signal is not None:
                batch.interrupt(signal.Signals(driver.signal).name)
            else:
                batch.interrupt("its leader was stopped (shoal down)")
        ended = self.drain()
        if batch.interrupted or batch.done:
            self.finished.set()
            return
        batch.tick(now)
        ended = self.drain() or ended  # (refusals at submit end attempts at once)
        if batch.done:
            self.finished.set()
        # An end is saved at once: a --resume after a crash must not run a success again.
        driver.save_record(ended=ended)

    def next_due(self) -> float | None:
        """Now, when there is news and the leader's queue may run dry (or a signal came);
        else the next timeout. News that can wait is read on the next pass, which a running
        task's end brings soon: one pass per end, not two."""
        if self.driver.signal is not None:
            return 0.0
        if self.events and len(self.leader.scheduler.queue) < max(1, self.driver.jobs):
            return 0.0
        return self.driver.batch.next_deadline()


def run_batch(
    spec: Spec,
    layout: Layout,
    options: RunOptions | None = None,
    sink: Sink | None = None,
    *,
    agents_factory: AgentDispatcherFactory | None = None,
    leader_setup: Callable[[Leader], object] | None = None,
) -> RunOutcome:
    """Run `spec` to its end on a leader of its team in this process; returns the outcome.

    Everything is checked before anything starts (a bad spec, agent tasks without teammates,
    an unwritable report path, a leader already running for the team). SIGINT, SIGTERM and
    SIGHUP (when called on the main thread) stop the run: every task is killed, the reports
    are written with status interrupted, and the exit code is 130. `sink` receives every
    run event record (and, with `forward_leader_events`, the leader's own). `leader_setup`
    is called with the run's leader before it starts (the CLI gives it the workflow kind, so
    that a resumed session's workflows are handled).
    """
    driver = _Driver(spec, layout, options or RunOptions(), sink, agents_factory)
    driver.leader_setup = leader_setup
    return driver.run()


class _Driver:
    """One `run_batch` call: the leader and its policy, signals, and the files."""

    def __init__(
        self,
        spec: Spec,
        layout: Layout,
        options: RunOptions,
        sink: Sink | None,
        agents_factory: AgentDispatcherFactory | None,
    ) -> None:
        self.spec = spec
        self.layout = layout
        self.options = options
        self.sink = sink
        self.leader_setup: Callable[[Leader], object] | None = None
        settings = spec.settings
        named = options.team or settings.team
        self.team = validate_name(named or default_run_team(spec.path), "team name")
        # A team the user named is theirs: it may hold more than this run, so it is kept.
        self.own_team = named is None
        self.team_kept = True
        self.jobs = settings.jobs if options.jobs is None else options.jobs
        self.halt = options.halt or settings.halt
        self.ray: RayTarget | None = None
        if (options.backend or settings.backend) == RAY_BACKEND:
            # Shell tasks go to the cluster (checked and uploaded now, before anything
            # starts); members still run here, on the backend this machine has.
            self.ray = prepare(
                spec,
                options.ray,
                insecure=options.ray_insecure,
                keep_workdirs=options.keep_workdirs,
            )
            self.backend, self.backend_why = resolve_backend(None, "auto")
        else:
            self.backend, self.backend_why = resolve_backend(options.backend, settings.backend)
        self.factory = agents_factory if agents_factory is not None else agent_dispatcher_factory()
        check_agents(spec, self.factory)
        for path in (options.junit, options.report, options.joblog):
            if path is not None and not path.absolute().parent.is_dir():
                raise UsageError(f"cannot write {path}: directory {path.parent} does not exist")
        self.results = (
            ResultsDir(options.results, (t.id for t in spec.tasks)) if options.results else None
        )
        self.errors: list[str] = []
        self.keep_sessions = options.keep_sessions
        if self.keep_sessions is None and self.own_team:
            self.keep_sessions = configured_keep(layout.home)
        self.records = RunRecords(layout)
        self.previous = self.records.load(self.team, spec.path) if options.resume else None
        self.rerun_why: dict[str, str] = {}
        """On --resume: tasks that succeeded before and run again, and why."""
        self.carried = plan_resume(spec, self.previous, self.rerun_why) if self.previous else {}
        self.run_id = new_ulid().lower()
        self.started_at = time.time()
        self.signal: int | None = None
        self.joblog: JoblogWriter | None = None
        self.unlogged: list[dict[str, Any]] = []
        """On --resume: attempts of the previous run its leader did not log (it was gone)."""
        self.leader: Leader | None = None
        self.policy: BatchPolicy | None = None
        self.batch = BatchRun(
            spec,
            shell=Unattached(),
            jobs=self.jobs,
            halt=self.halt,
            carried=self.carried,
            emit=self.emit,
            on_attempt_end=self._log_attempt,
        )
        self.saver = RecordSaver(self.records, self.team, spec.path, self.run_id, RECORD_INTERVAL_S)

    # -- plumbing ------------------------------------------------------------------------------

    def emit(self, event: RunEvent | RunResult) -> None:
        """A run event: into the session's event stream (once there is one) and to the sink
        (through the policy, which sees every event the leader emits)."""
        if isinstance(event, RunEvent):
            event = self._with_output_file(event)
            if event.subtype == "task_finished":
                self._copy_result(event["id"], event.get("output_file"))
        if self.leader is not None and self.policy is not None:
            self.leader.emit(event)
        else:
            self.to_sink(event.to_record())

    def _with_output_file(self, event: RunEvent) -> RunEvent:
        """`task_started` names the attempt's output file, so that it can be followed as it
        grows (`--output tag`); agent attempts have theirs only once they end."""
        if event.subtype != "task_started" or self.leader is None:
            return event
        task = self.leader.get(str(event.get("task_id")))
        if not isinstance(task, LocalShellTaskState):
            return event
        return RunEvent(**{**event.model_dump(), "output_file": task.output_file})

    def _copy_result(self, task_id: str, output_file: str | None) -> None:
        """`--results`: copy a task's output once it has its verdict. A failed copy is an
        error of the run (said at the end, exit 1), not the end of it."""
        if self.results is None or not output_file:
            return
        try:
            self.results.copy(task_id, output_file)
        except OSError as exc:
            self.errors.append(
                f"could not copy the output of {task_id} to {self.results.file_for(task_id)}: "
                f"{exc.strerror or exc}"
            )

    def to_sink(self, record: dict[str, Any]) -> None:
        """Show an event. A sink whose output is gone (a closed pipe: `shoal run ... | head`)
        is dropped: progress is a courtesy, the run and its files are what count."""
        if self.sink is None:
            return
        try:
            self.sink(record)
        except OSError:
            self.sink = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum
        if self.leader is not None:
            self.leader.wake()

    def _log_attempt(self, run: TaskRun, attempt: Attempt) -> None:
        if self.joblog is not None:
            self.joblog.write(
                seq=run.spec.seq,
                started_at=attempt.started_at,
                ended_at=attempt.ended_at,
                exit_code=attempt.exit_code,
                killed=attempt.status in (RunStatus.KILLED, RunStatus.TIMED_OUT),
                command=run.spec.command_line,
                host=attempt.host,
            )

    def meta(self) -> dict[str, Any]:
        """The run-level fields of the report."""
        ended = time.time() if self.batch.done else None
        return {
            "run_id": self.run_id,
            "spec": str(self.spec.path),
            "team": self.team,
            "session_id": self.leader.session.id if self.leader is not None else None,
            "backend": self.backend,
            "jobs": self.jobs,
            "halt": self.halt.text,
            "resumed_from": (self.previous or {}).get("run_id"),
            "started_at": iso(self.started_at),
            "ended_at": iso(ended),
            "duration_s": round((ended or time.time()) - self.started_at, 3),
            "files": {
                "record": str(self.records.path(self.team, self.spec.path)),
                "report": str(self.options.report) if self.options.report else None,
                "junit": str(self.options.junit) if self.options.junit else None,
                "joblog": str(self.options.joblog) if self.options.joblog else None,
                "results": str(self.options.results) if self.options.results else None,
            },
        }

    def save_record(self, *, ended: bool = False, full: bool = False) -> None:
        """Keep the run record up to date: whole at most every RECORD_INTERVAL_S (or when
        `full`), and when an attempt `ended`, its verdict journaled at once."""
        batch = self.batch
        self.saver.sync(
            batch.version,
            batch.settled,
            lambda: batch.report(**self.meta()),
            lambda task_id: batch.tasks[task_id].to_json(),
            ended=ended,
            full=full,
        )

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        on_main = threading.current_thread() is threading.main_thread()
        previous_handlers: dict[int, Any] = {}
        if on_main:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                previous_handlers[sig] = signal.signal(sig, self._on_signal)
        cleanup = CleanupRegistry()
        try:
            make_run_team(self.layout, self.team, f"shoal run {self.spec.path.name}")
            leader = Leader(self.layout, self.team, jobs=self.jobs)
            if self.leader_setup is not None:
                self.leader_setup(leader)
            leader.start()
            self.leader = leader
            cleanup.register("leader", leader.shutdown)
            self._recover(leader)
            self._stop_leftovers(leader)
            policy = self.policy = BatchPolicy(self, leader)
            self.batch.shell = policy.shell
            leader.policies.append(policy)
            if self.factory is not None and (self.spec.members or self.spec.agent_tasks):
                agents = self.factory(leader, policy.events.append)
                self.batch.agents = agents
                if isinstance(agents, TeammateDispatcher):
                    policy.listeners.append(agents)
                if self.spec.members:
                    self._note(
                        f"members run as {self.backend}: {self.backend_why}",
                        backend=self.backend,
                        why=self.backend_why,
                    )
                agents.start(self.spec.members, self.backend, str(self.spec.path.parent))
            # Opened (and an old joblog truncated) only once the members are up.
            if self.options.joblog is not None:
                self.joblog = JoblogWriter(self.options.joblog, append=self.options.resume)
                for attempt in self.unlogged:  # (ended while no leader watched them)
                    self.joblog.write(**attempt)
            for task_id, why in self.rerun_why.items():
                self._note(
                    f"task {task_id} succeeded in run {(self.previous or {}).get('run_id')} "
                    f"but {why}: it runs again"
                )
            self._begin()
            leader.run(policy.finished)
        finally:
            cleanup.run_all()  # the leader's shutdown kills whatever still runs
            self._remove_team()
            self._prune_sessions()
            if on_main:
                for signum, handler in previous_handlers.items():
                    signal.signal(signum, handler)
        return self._finish()

    def _remove_team(self) -> None:
        """Delete the run's own team once its leader stepped down (retention.py says when
        it is kept); a team named by the user, or asked for with --keep-team, stays."""
        if self.leader is None or not self.own_team or self.options.keep_team:
            return
        kept = remove_run_team(self.layout, self.team)
        if kept is not None:
            self._note_after(kept)
            return
        self.team_kept = False

    def _prune_sessions(self) -> None:
        """Session retention (`--keep-sessions`): the team's oldest finished sessions go."""
        if self.keep_sessions is None or self.leader is None:
            return
        removed = prune_sessions(self.layout, self.team, self.keep_sessions, self.leader.session.id)
        if removed:
            self._note_after(
                f"removed {len(removed)} old session(s) of team {self.team} (keeping "
                f"{self.keep_sessions}): {' '.join(removed)}"
            )

    def _note_after(self, text: str) -> None:
        """A note once the leader is gone: into the session's events and to the sink."""
        event = RunEvent(subtype="note", text=text)
        if self.leader is not None:
            self.to_sink(self.leader.session.emit(event).to_record())
        else:
            self.to_sink(event.to_record())

    def _recover(self, leader: Leader) -> None:
        """On --resume: tasks of the previous run that succeeded after its last record save
        (or after its leader died: the resumed leader settled them from their exit files)
        count as succeeded, and are not run again."""
        previous = self.previous
        if previous is None or previous.get("session_id") != leader.session.id:
            return
        session_tasks: list[LocalShellTaskState | dict[str, Any]] = [
            t for t in leader.registry.get_all_tasks() if isinstance(t, LocalShellTaskState)
        ]
        session_tasks += leader.history().values()
        self.unlogged = ended_attempts(previous, session_tasks)
        recovered = succeeded_attempts(previous, session_tasks)
        if not recovered:
            return
        self.previous = with_recovered(previous, recovered)
        self.carried = plan_resume(self.spec, self.previous, self.rerun_why)
        self.batch.carried = dict(self.carried)
        self._note(
            f"{len(recovered)} task(s) of run {previous.get('run_id')} succeeded after its "
            f"last record (while no leader watched them) and are not run again: "
            + " ".join(sorted(recovered))
        )

    def _stop_leftovers(self, leader: Leader) -> None:
        """Stop tasks a crashed earlier leader of this team left (resumed with its session):
        they are not part of this run, and would otherwise take its job slots. Those it had
        queued and never started are dropped, and said so apart (nothing of them ran)."""
        left = [t for t in leader.registry.get_all_tasks() if not t.is_terminal]
        running = [t.id for t in left if t.status != TaskStatus.PENDING]
        queued = [t.id for t in left if t.status == TaskStatus.PENDING]
        # The queued go first: waiting for a running one to end runs the leader's ticks, whose
        # start step would otherwise start the queued in the slot it frees.
        for task_id in queued:
            with contextlib.suppress(ShoalError):
                leader.stop_task(task_id, NEVER_STARTED)
        for task_id in running:
            with contextlib.suppress(ShoalError):
                leader.stop_task(task_id)
        if running:
            self._note(
                f"stopped {len(running)} task(s) left running by an earlier leader of team "
                f"{self.team}: {' '.join(running)}"
            )
        if queued:
            self._note(
                f"{len(queued)} task(s) queued by an earlier leader of team {self.team} never "
                f"started; dropped: {' '.join(queued)}"
            )

    def _note(self, text: str, **fields: Any) -> None:
        """A `note` run event: something a person should know, shown once."""
        self.emit(RunEvent(subtype="note", text=text, **fields))

    def _begin(self) -> None:
        batch = self.batch
        batch.begin()
        counts = batch.counts()
        self.emit(
            RunEvent(
                subtype="run_started",
                run_id=self.run_id,
                spec=str(self.spec.path),
                team=self.team,
                session_id=self.leader.session.id if self.leader else None,
                jobs=self.jobs,
                backend=self.backend,
                halt=self.halt.text,
                total=counts["total"],
                resumed=counts["resumed"],
                resumed_from=(self.previous or {}).get("run_id"),
                resume_requested=self.options.resume,
            )
        )
        self.save_record(full=True)

    def _finish(self) -> RunOutcome:
        if self.policy is not None:
            self.policy.drain()
        if self.signal is not None and not self.batch.interrupted and not self.batch.done:
            self.batch.interrupt(signal.Signals(self.signal).name)
        self.batch.abandon()
        if self.joblog is not None:
            self.joblog.close()
        report = self.batch.report(**self.meta())
        record = self.records.save(self.team, self.spec.path, report)
        self._copy_carried(report)
        errors = list(self.errors)
        for path, writer in ((self.options.report, write_json), (self.options.junit, write_junit)):
            if path is None:
                continue
            try:
                writer(path, report)
            except (ShoalError, OSError) as exc:
                errors.append(f"could not write {path}: {exc}")
        code = report["exit_code"]
        if errors and code == OK:
            code = INFRASTRUCTURE  # (the tasks did their part; the run could not do its own)
        rows = summary_rows(report)
        result = RunResult(
            summary=[row.to_json() for row in rows],
            subtype=report["status"],
            exit_code=code,
            run_id=self.run_id,
            team=self.team,
            session_id=report["session_id"],
            counts=report["counts"],
            duration_s=report["duration_s"],
            halted=report["halted"],
            interrupted=report["interrupted"],
            files=report["files"],
            errors=errors,
            team_kept=self.team_kept,
        )
        if self.leader is not None:
            stamped = self.leader.session.emit(result)
            self.to_sink(stamped.to_record())
            self.leader.session.close()
        else:
            self.to_sink(result.to_record())
        return RunOutcome(code, report, record, tuple(rows))

    def _copy_carried(self, report: dict[str, Any]) -> None:
        """`--results` on --resume: the outputs of tasks that succeeded in the previous run
        are copied too, so the directory holds every task's."""
        if self.results is None:
            return
        for task in report["tasks"]:
            if task["id"] not in self.results.copied and task.get("resumed"):
                self._copy_result(task["id"], task.get("output_file"))
