"""The leader: one thread owns a team's task registry and runs its loop of named steps.

Everything that happens elsewhere — a message in the lead's inbox, a control request, a call
from another thread, a teammate's status, a pidfd saying a process ended — enters through a
queue or a wake-up and is handled by a step of the tick, in this order:

    reap, deliver mail, answer control, teammates, output, stalls, orphans, task list,
    policy, notify, evict, start, persist

Each step is a method a test can call without sleeping, and none blocks: a kill is a state
(TERM sent, deadline recorded), finished by a later `reap`. What a kind of task does lives
behind the `TaskKind` protocol (workers/), resume in `session.py`, the control channel in
`control.py`; the leader never branches on a task's type. Between ticks it sleeps in a
selector on the pidfds of live processes and a wake-up pipe.
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from shoal.core.config import Limits
from shoal.core.errors import ConflictError, CorruptFileError, ShoalError, TaskError
from shoal.core.events import Event, LeaderStarted, LeaderStopped, MessageReceived, Note
from shoal.core.paths import Layout
from shoal.core.procs import current_identity, is_alive
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    LocalShellTaskState,
    TaskStatus,
    TaskType,
    evolve,
    new_task_id,
    parse_task_state,
)
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import notify_owner
from shoal.mailbox.schema import AnyMessage, ControlMessage
from shoal.mailbox.store import Maildir
from shoal.orchestrator.control import ControlServer, ShellSpec
from shoal.orchestrator.registry import TaskRegistry
from shoal.orchestrator.session import Session, Snapshot, new_session_id, notify_once, resume
from shoal.orchestrator.swarm import Swarm
from shoal.teams.models import LEAD_NAME, TeamFile
from shoal.teams.store import MemberState, Teams
from shoal.teams.tasklist import TaskList
from shoal.workers import shell
from shoal.workers.kinds import Poll, TaskKind

__all__ = ["Leader", "Policy", "TaskError"]

EventSink = Callable[[Event], None]
T = TypeVar("T")

# How often the shared task list is checked for tasks of members that are gone.
RELEASE_INTERVAL_S: Final = 5.0
# state.json is rewritten at most this often by the loop (requests from users force a write).
PERSIST_INTERVAL_S: Final = 0.2
# With SHOAL_STRICT_STEPS=1 (the test suite sets it) a step that raises stops the loop with
# its exception instead of becoming a note: a bug in a step fails the test that hit it.
STRICT_ENV: Final = "SHOAL_STRICT_STEPS"


class Policy(Protocol):
    """Something the `policy` step consults every pass (the batch engine of `shoal run`)."""

    def on_event(self, event: Event) -> None:
        """An event the leader emitted (called on the loop's thread, at once)."""
        ...

    def step(self, leader: Leader, now: float) -> None:
        """Decide: submit tasks, stop tasks, or ask the leader to stop."""
        ...

    def next_due(self) -> float | None:
        """The next monotonic time the policy must run at, if any."""
        ...


class Leader:
    """The supervisor of one team's background tasks (one per team, one per process)."""

    def __init__(
        self,
        layout: Layout,
        team: str,
        *,
        limits: Limits | None = None,
        jobs: int = 0,
        on_event: EventSink | None = None,
        strict: bool | None = None,
    ) -> None:
        self.layout = layout
        self.team = team
        self.teams = Teams(layout)
        self._limits = limits or Limits()
        self.jobs = jobs
        self.on_event = on_event
        self.strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        self.registry = TaskRegistry()
        self.queue: deque[str] = deque()  # pending tasks, in order, waiting for a job slot
        self.session: Session
        self.created_at = time.time()
        self.notes: list[str] = []
        self.policies: list[Policy] = []
        self.shell = shell.ShellKind()
        self.swarm = Swarm(self)
        self.kinds: dict[TaskType, TaskKind] = {}
        for kind in (self.shell, self.swarm):
            for task_type in kind.types:
                self.kinds[task_type] = kind
        self.control = ControlServer(layout, team, self)
        self.snapshot = Snapshot()
        self._identity = current_identity()
        # What tasks inherit, as a plain dict: handing posix_spawn `os.environb` itself costs a
        # Python-level lookup per variable on every start.
        self._environ: dict[bytes, bytes] = dict(os.environb)
        self._mail: queue.SimpleQueue[AnyMessage] = queue.SimpleQueue()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._waiters: dict[str, list[Callable[[AnyTaskState], None]]] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pidfds: dict[str, int] = {}
        self._step_errors: dict[str, str] = {}
        self._last_release = 0.0
        self._loop_thread: threading.Thread | None = None
        self._stop_requested = False
        self._stopping = False  # shutting down: tasks are being stopped, nothing new starts
        self._closed = False
        self._inbox: Inbox | None = None
        self._subscription: Any = None

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> Leader:
        """Become the team's leader: resume its last session or begin a new one."""
        if not self.teams.exists(self.team):
            self.teams.create(self.team)
        me, my_start = self._identity

        def claim(tf: TeamFile) -> TeamFile:
            # Checked and taken under the team file's lock: two `shoal up` at once, one leader.
            lead = tf.member(LEAD_NAME)
            if lead is None:
                raise CorruptFileError(self.layout.team_file(self.team), "it lists no team-lead")
            if lead.pid not in (None, me) and is_alive(lead.pid, lead.pid_started_at):
                raise ConflictError(
                    f"a leader already runs for team {self.team!r} (pid {lead.pid}); "
                    f"stop it with `shoal down --team {self.team}`"
                )
            update = {"pid": me, "pid_started_at": my_start, "backend": "leader"}
            return tf.with_member(lead.model_copy(update={**update, "cwd": os.getcwd()}))

        tf = self.teams.update(self.team, claim)
        _raise_fd_limit()  # a thousand in-process teammates hold a thousand inbox files
        resumed = resume(self, tf.lead_session_id)
        self.teams.update(
            self.team, lambda t: t.model_copy(update={"lead_session_id": self.session.id})
        )
        self.persist(force=True)
        self.emit(LeaderStarted(team=self.team, pid=me, resumed=resumed))
        maildir = Maildir.create(self.layout.inbox_dir(self.team, LEAD_NAME), self.layout.home)
        self._inbox = Inbox(maildir, lead=LEAD_NAME)
        self._subscription = self._inbox.subscribe(self._on_message)
        return self

    def new_session(self, session_id: str | None = None) -> Session:
        """Lead session `session_id` (a new one by default)."""
        self.session = Session(self.layout, session_id or new_session_id()).ensure()
        return self.session

    # -- the store interface of task kinds and the swarm -----------------------------------------

    @property
    def limits(self) -> Limits:
        return self._limits

    @property
    def environ(self) -> dict[bytes, bytes]:
        return self._environ

    @property
    def identity(self) -> tuple[int, float]:
        """(pid, start time) of the leader's process."""
        return self._identity

    @property
    def session_id(self) -> str:
        return self.session.id

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def procs(self) -> dict[str, shell.ShellProcess]:
        """Live shell processes by task id."""
        return self.shell.procs

    def get(self, task_id: str) -> AnyTaskState | None:
        return self.registry.get(task_id)

    def register(self, task: AnyTaskState) -> AnyTaskState:
        """Add a task to the registry (state.json is written on the next persist)."""
        stored = self.registry.register_task(task)
        self.snapshot.dirty = True
        return stored

    def update_task(self, task_id: str, updater: Callable[[Any], AnyTaskState]) -> bool:
        changed = self.registry.update_task_state(task_id, updater)
        if changed:
            self.snapshot.dirty = True
        return changed

    def _answer_waiters(self) -> None:
        """Hand each ended task's final record to whoever waits for it (a `stop` reply)."""
        for task_id in [
            i for i in self._waiters if (t := self.registry.get(i)) is None or t.is_terminal
        ]:
            final = self.registry.get(task_id)
            waiters = self._waiters.pop(task_id)
            if final is None:  # (evicted: its final record is in the history)
                raw = self.session.history().get(task_id)
                final = parse_task_state(raw) if raw is not None else None
            if final is not None:
                for waiter in waiters:
                    waiter(final)

    def set_task(self, task_id: str, **changes: Any) -> bool:
        """Change fields of a task (same values: no change, no write)."""
        return self.update_task(task_id, lambda t: evolve(t, **changes))

    def move_task(self, task_id: str, status: TaskStatus, **changes: Any) -> bool:
        """Move a task through the transition table (the registry checks the move)."""

        def move(task: AnyTaskState) -> AnyTaskState:
            if status == task.status:
                return task if task.is_terminal else evolve(task, **changes)
            return evolve(task, status=status, **changes)

        return self.update_task(task_id, move)

    def mark_notified(self, task_id: str) -> bool:
        marked = self.registry.mark_notified(task_id)
        self.snapshot.dirty = self.snapshot.dirty or marked
        return marked

    def mark_dirty(self) -> None:
        """Something in the registry changed outside `update_task` (state.json must be written)."""
        self.snapshot.dirty = True

    def emit(self, event: Event) -> None:
        """Append an event to the session's stream and hand it to the sink and the policies."""
        record = self.session.emit(event)
        for policy in self.policies:
            policy.on_event(record)
        if self.on_event is not None:
            self.on_event(record)

    def note(self, text: str) -> None:
        """A line for the person running the leader (also an event)."""
        self.notes.append(text)
        self.emit(Note(text=text))

    def notify_owner(
        self, task: AnyTaskState, xml: str, summary: str, *, status: str, msg_id: str | None
    ) -> None:
        owner = task.owner
        if not owner or owner == LEAD_NAME:
            return  # the lead reads notifications from the event stream
        try:
            notify_owner(
                self.teams.directory(self.team),
                owner,
                xml=xml,
                summary=summary,
                task_id=task.id,
                status=status,
                task_type=task.type.value,
                output_file=task.output_file,
                message_id=msg_id,
            )
        except ShoalError as exc:
            self.note(f"could not notify {owner} about {task.id}: {exc}")

    def output_file(self, task_id: str) -> Path:
        return self.session.output_file(task_id)

    def watch_pid(self, key: str, pid: int | None) -> None:
        """Wake the loop when process `pid` exits (a pidfd in the selector)."""
        if pid is None or key in self._pidfds:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self.wake()  # already gone: the next pass finds out
            return
        self._pidfds[key] = fd
        self._selector.register(fd, selectors.EVENT_READ, key)

    def unwatch_pid(self, key: str) -> None:
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            self._selector.unregister(fd)
            os.close(fd)

    def wake(self) -> None:
        """Make the loop run its steps now (from any thread)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # -- requests (from the control server, a policy, or another thread through `call`) ----------

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the loop's thread (at once when called there); its Future has the result."""
        future: Future[T] = Future()
        if self._owns():
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
            return future
        if self._closed:
            future.set_exception(TaskError(f"the leader of team {self.team!r} has stopped"))
            return future
        self._calls.put((fn, future))
        self.wake()
        return future

    def _owns(self) -> bool:
        """True on the thread that owns the registry (the loop's, or anyone's when none runs)."""
        return self._loop_thread is None or threading.current_thread() is self._loop_thread

    def make_shell_task(self, command: list[str], **options: Any) -> LocalShellTaskState:
        """Build (and check) a new pending shell task; nothing is registered yet."""
        owner, agent_id = LEAD_NAME, None
        agent = options.pop("agent", None)
        if agent:
            name = agent.split("@", 1)[0]
            if self.teams.read(self.team).member(name) is None:
                raise TaskError(f"no member {name!r} in team {self.team!r} to own the task")
            owner = agent_id = name
        task_id = new_task_id(TaskType.LOCAL_BASH)
        return shell.new_task(
            command,
            task_id=task_id,
            output_file=str(self.session.output_file(task_id)),
            owner=owner,
            agent_id=agent_id,
            **options,
        )

    def submit(self, tasks: list[LocalShellTaskState]) -> list[LocalShellTaskState]:
        """Register tasks and start them now (or as job slots free); one state write."""
        if not self._owns():
            return self.call(lambda: self.submit(tasks)).result()
        for task in tasks:
            self.register(task)
            self.queue.append(task.id)
        self.start_pending()
        self.persist(force=True)
        self.wake()
        current = [self.registry.get(t.id) for t in tasks]
        return [t for t in current if isinstance(t, LocalShellTaskState)]

    def submit_shell(self, command: list[str], **options: Any) -> LocalShellTaskState:
        """Register one shell task and start it (see `make_shell_task` for the options)."""
        return self.submit([self.make_shell_task(command, **options)])[0]

    def start_shell(self, specs: list[ShellSpec]) -> list[AnyTaskState]:
        tasks = [  # all checked before any runs
            self.make_shell_task(
                list(s.command),
                description=s.description,
                agent=s.agent,
                cwd=s.cwd,
                env=s.env,
                kind=s.kind,
                background=s.background,
            )
            for s in specs
        ]
        return list(self.submit(tasks))

    def stop(
        self,
        task_id: str,
        on_done: Callable[[AnyTaskState], None] | None = None,
        reason: str = STOPPED_ON_REQUEST,
    ) -> AnyTaskState:
        """Begin stopping a task (never waits); `on_done` gets its final state once it ended."""
        task = self.registry.get(task_id)
        if task is None:
            if task_id in self.session.history():
                raise TaskError(f"task {task_id} already finished")
            raise TaskError(f"no task {task_id} in team {self.team!r} (see `shoal ps --all`)")
        if task.is_terminal:
            raise TaskError(f"task {task_id} already finished ({task.status.value})")
        if on_done is not None:
            self._waiters.setdefault(task_id, []).append(on_done)
        if task_id in self.queue:  # (never started: its kind ends it at once)
            self.queue.remove(task_id)
        self.kinds[task.type].kill(task, self, reason)
        self.persist(force=True)
        self._answer_waiters()
        return self.registry.get(task_id) or task

    def stop_task(
        self, task_id: str, reason: str = STOPPED_ON_REQUEST, *, timeout: float = 60.0
    ) -> AnyTaskState:
        """Stop a task and wait until it has ended (from a thread other than the loop's; on
        the loop's own thread this only begins the stop, as `stop` does)."""
        if self._loop_thread is not None and self._owns():
            return self.stop(task_id, reason=reason)
        done: Future[AnyTaskState] = Future()
        started = self.call(lambda: self.stop(task_id, done.set_result, reason))
        started.result(timeout)  # (raises what `stop` refused)
        if self._loop_thread is None:  # nobody else runs the loop: run it here until it ended
            self.run_until(done.done, timeout)
        return done.result(timeout)

    def spawn(self, members: list[dict[str, Any]], answer: Callable[..., None]) -> None:
        self.swarm.spawn_many(members, answer)

    def request_stop(self) -> dict[str, Any]:
        """Ask the loop to shut down (from any thread): stop every task, then return."""
        self._stop_requested = True
        self.wake()
        return {
            "stopping": True,
            "running": self.shell.running(),
            "teammates": sorted(self.swarm.members),
        }

    # -- the loop --------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Run ticks until `stop` is set, or until `request_stop` and every task has ended."""
        self._loop_thread = threading.current_thread()
        next_tick = 0.0
        try:
            while not (stop is not None and stop.is_set()):
                next_tick = self._pass(next_tick)
                if self._stopping and self._drained():
                    break
        finally:
            self._loop_thread = None

    def _pass(self, next_tick: float) -> float:
        """Sleep until something is due, then run a tick (or the quick steps between ticks)."""
        now = time.monotonic()
        self._wait(max(0.0, self._next_due(next_tick) - now))
        if self._stop_requested and not self._stopping:
            self.begin_shutdown()
        if time.monotonic() >= next_tick:
            self.tick()
            return time.monotonic() + self._limits.poll_interval
        self.quick_tick()
        return next_tick

    def _next_due(self, next_tick: float) -> float:
        due = [next_tick]
        if self.snapshot.dirty:
            due.append(self.snapshot.last_write + PERSIST_INTERVAL_S)
        due += [d for k in self._kinds() if (d := k.next_due()) is not None]
        due += [d for p in self.policies if (d := p.next_due()) is not None]
        return min(due)

    def _wait(self, timeout: float) -> None:
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 4096):
                        pass
            else:
                for kind in self._kinds():
                    if kind.on_exit(key.data):
                        break

    def run_until(self, until: Callable[[], bool], timeout: float) -> None:
        """Run the loop on this thread until `until()` holds (when no other thread runs it)."""
        deadline = time.monotonic() + timeout
        next_tick = 0.0
        while not until() and time.monotonic() < deadline:
            next_tick = self._pass(min(next_tick, time.monotonic() + 0.05))

    def _kinds(self) -> Iterable[TaskKind]:
        return (self.shell, self.swarm)

    def _step(self, name: str, fn: Callable[[], None]) -> None:
        """Run one step; a failure (a full disk, a broken team file) is a note, once per new
        error, and the leader carries on rather than taking every task down with it. In strict
        mode (tests) it is raised: a bug in a step must fail the test that hit it."""
        try:
            fn()
        except Exception as exc:
            if self.strict:
                raise
            message = f"{name} failed: {exc!r}"
            if self._step_errors.get(name) != message:
                self._step_errors[name] = message
                with contextlib.suppress(Exception):
                    self.note(message)
        else:
            self._step_errors.pop(name, None)

    def tick(self) -> None:
        """One full pass of every step."""
        now, mono = time.time(), time.monotonic()
        self._step("reap", self.reap)
        self._step("deliver mail", self.deliver_mail)
        self._step("answer control", self.answer_control)
        self._step("teammates", self.swarm.check)
        self._step("output", lambda: self.poll_live(Poll.OUTPUT, mono))
        self._step("stalls", lambda: self.poll_live(Poll.STALLS, mono))
        self._step("orphans", self.cleanup_orphans)
        self._step("task list", lambda: self.release_orphaned_tasks(mono))
        self._step("policy", lambda: self.apply_policies(mono))
        self._step("notify", self.notify)
        self._step("evict", lambda: self.evict(now))
        self._step("start", self.start_pending)
        self._step("persist", self.persist)

    def quick_tick(self) -> None:
        """The steps that must not wait for the next full tick (between ticks, on a wake-up)."""
        now, mono = time.time(), time.monotonic()
        self._step("reap", lambda: self.reap(only_signalled=True))
        self._step("deliver mail", self.deliver_mail)
        self._step("answer control", self.answer_control)
        self._step("teammates", self.swarm.check)
        self._step("policy", lambda: self.apply_policies(mono))
        self._step("notify", self.notify)
        self._step("evict", lambda: self.evict(now))
        self._step("start", self.start_pending)
        self._step("persist", self.persist)

    # -- the steps -------------------------------------------------------------------------------

    def reap(self, *, only_signalled: bool = False) -> None:
        """Settle processes that ended and kills that are due (all live tasks, or only those a
        pidfd or a deadline points at)."""
        now = time.monotonic()
        for kind in (self.shell,):
            ids = kind.signalled() if only_signalled else kind.live()
            for task_id in list(ids):
                task = self.registry.get(task_id)
                if task is not None:
                    kind.poll(task, self, now, Poll.REAP)

    def poll_live(self, what: Poll, now: float) -> None:
        """Ask each live task's kind to look at `what` (output deltas, stalls)."""
        for kind in (self.shell,):
            for task_id in list(kind.live()):
                task = self.registry.get(task_id)
                if task is not None:
                    kind.poll(task, self, now, what)

    def deliver_mail(self) -> None:
        """Messages that reached the lead: an event each, and the swarm's reactions."""
        while True:
            try:
                msg = self._mail.get_nowait()
            except queue.Empty:
                return
            self.emit(MessageReceived(message=msg.model_dump(mode="json", by_alias=True)))
            self.swarm.on_message(msg)

    def answer_control(self) -> None:
        """Control requests from the inbox, then calls from other threads of this process."""
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

    def cleanup_orphans(self) -> None:
        """Kill shell tasks whose owning agent has exited or left the team."""
        owned = [
            t
            for t in self.registry.get_all_tasks()
            if isinstance(t, LocalShellTaskState) and t.agent_id and not t.is_terminal
        ]
        if not owned:
            return
        states = {v.member.name: v.state for v in self.teams.members(self.team)}
        for task in owned:
            if states.get(task.agent_id or "") in (MemberState.DEAD, MemberState.LEFT, None):
                self.kinds[task.type].kill(task, self, f"its agent {task.agent_id} exited")

    def release_orphaned_tasks(self, now: float) -> None:
        """Every few seconds: list tasks owned by members that died or left go back to pending
        (teammates this leader runs are settled at once when they end)."""
        if now - self._last_release < RELEASE_INTERVAL_S:
            return
        self._last_release = now
        try:
            released = TaskList(self.teams, self.team).release_orphaned()
        except ShoalError as exc:
            self.note(f"could not check the task list: {exc}")
            return
        if released:
            self.note(
                "tasks of departed members went back to pending: "
                + ", ".join(f"{t.id} ({t.subject})" for t in released)
            )

    def apply_policies(self, now: float) -> None:
        for policy in list(self.policies):
            policy.step(self, now)

    def notify(self) -> None:
        """Send each terminal task's notification exactly once; answer who waits for an end."""
        for task in self.registry.terminal_tasks():
            if not task.notified:
                extras = self.kinds[task.type].notification(task)
                if notify_once(self, task, extras):
                    self.snapshot.dirty = True
        if self._waiters:
            self._answer_waiters()

    def evict(self, now: float) -> None:
        """Drop terminal, notified tasks (after their grace) into history."""
        for task in self.registry.evict(now):
            self.session.record_history(task)
            self.snapshot.dirty = True

    def start_pending(self) -> None:
        """Start queued tasks while job slots are free (`jobs` 0 means no limit)."""
        while self.queue and not self._stopping:
            if self.jobs > 0 and self.shell.running() >= self.jobs:
                return
            task = self.registry.get(self.queue.popleft())
            if task is not None and task.status == TaskStatus.PENDING:
                self.kinds[task.type].start(task, self)

    def persist(self, *, force: bool = False) -> None:
        """Write state.json if anything changed (at most every PERSIST_INTERVAL_S unless forced);
        see `Snapshot` for why the throttle is safe."""
        if not force and not self.snapshot.due(PERSIST_INTERVAL_S):
            return
        me, started = self._identity
        leader = (
            None
            if self._stopping and not self.shell.running()
            else {"pid": me, "started_at": started, "jobs": self.jobs}
        )
        self.snapshot.write(self.session, self.team, self.created_at, leader, self.registry)

    # -- inbox -----------------------------------------------------------------------------------

    def _on_message(self, msg: AnyMessage) -> None:
        """From the inbox watcher's thread: hand the message to the loop."""
        if isinstance(msg, ControlMessage):
            self._calls.put((lambda: self.control.handle(msg), Future()))
        else:
            self._mail.put(msg)
        self.wake()

    # -- shutdown --------------------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Stop starting things; ask teammates to shut down; begin killing every task."""
        if self._stopping:
            return
        self._stopping = True
        self.reap()  # (what ended already keeps its own result)
        self.swarm.begin_shutdown()
        for task_id in list(self.queue):
            self.move_task(task_id, TaskStatus.KILLED, kill_reason="leader shut down")
        self.queue.clear()
        for task_id in list(self.shell.live()):
            task = self.registry.get(task_id)
            if task is not None:
                self.shell.kill(task, self, STOPPED_ON_REQUEST)
        self.persist(force=True)

    def _drained(self) -> bool:
        return not self.shell.running() and not self.swarm.members and not self.control.pending

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop every task this leader owns, notify, persist and step down as lead."""
        if self._closed:
            return
        self._loop_thread = None  # (the loop has returned: this thread owns the registry now)
        self.begin_shutdown()
        self.run_until(self._drained, timeout)
        if not self._drained():  # (past the timeout: the last resort waits)
            self.shell.kill_all_now(self._limits.kill_grace)
            self.swarm.kill_all()
            self.reap()
        if self._subscription is not None:
            self._subscription.stop()
        self.answer_control()  # (requests that came meanwhile hear that it stopped)
        self.notify()
        self.persist(force=True)
        if self._inbox is not None:
            self._inbox.close()
        with contextlib.suppress(ShoalError):
            me, _ = current_identity()
            lead = self.teams.read(self.team).member(LEAD_NAME)
            if lead is not None and lead.pid == me:
                self.teams.update_member(self.team, LEAD_NAME, pid=None, pid_started_at=None)
        self.emit(LeaderStopped(team=self.team))
        self._closed = True
        self._selector.close()
        self.session.close()
        for fd in (self._wake_r, self._wake_w, *self._pidfds.values()):
            with contextlib.suppress(OSError):
                os.close(fd)


def _raise_fd_limit(want: int = 65536) -> None:
    """Raise this process's soft limit of open files towards the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
