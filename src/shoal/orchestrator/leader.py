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
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final

from shoal.core.config import Limits
from shoal.core.errors import ShoalError, TaskError
from shoal.core.events import LeaderStarted, LeaderStopped, MessageReceived, task_terminated
from shoal.core.faults import pause_point
from shoal.core.paths import Layout
from shoal.core.procs import current_identity
from shoal.core.tasks import STOPPED_ON_REQUEST, TaskStatus, TaskType
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.schema import AnyMessage, ControlMessage
from shoal.mailbox.store import Maildir
from shoal.orchestrator.agent_requests import AgentRequests
from shoal.orchestrator.control import ControlServer
from shoal.orchestrator.holds import Holds
from shoal.orchestrator.liveness import claim_lead, raise_fd_limit
from shoal.orchestrator.requests import LeaderRequests
from shoal.orchestrator.scheduling import Scheduler
from shoal.orchestrator.session import notify_once, resume
from shoal.orchestrator.store import EventSink, Policy
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import MemberState
from shoal.teams.tasklist import TaskList
from shoal.workers.agent.attachments import AttachmentDesk
from shoal.workers.agent.coordinator.leases import LEASES_FILE
from shoal.workers.agent.entry import ControlPort
from shoal.workers.agent.kind import AgentKind
from shoal.workers.agent.pr_activity import PR_ACTIVITY_FILE, PrActivity
from shoal.workers.agent.pr_feed import pr_policy, pr_request
from shoal.workers.dream.kind import DreamKind, DreamSpec
from shoal.workers.dream.memory import DreamConfig, auto_dream_due, memory_dir
from shoal.workers.kinds import Poll, TaskKind
from shoal.workers.monitor.kind import MonitorKind
from shoal.workers.remote.kind import RemoteKind
from shoal.workers.shell.kind import ShellKind
from shoal.workers.shell.process import ShellProcess
from shoal.workers.teammate.commands import settle_and_release
from shoal.workers.teammate.swarm import Swarm

__all__ = ["Leader", "Policy", "TaskError"]
# How often the shared task list is checked for tasks of members that are gone.
RELEASE_INTERVAL_S: Final = 5.0
# state.json is rewritten at most this often by the loop (requests from users force a write).
PERSIST_INTERVAL_S: Final = 0.2
# With SHOAL_STRICT_STEPS=1 (the test suite sets it) a step that raises stops the loop with
# its exception instead of becoming a note: a bug in a step fails the test that hit it.
STRICT_ENV: Final = "SHOAL_STRICT_STEPS"


class Leader(LeaderRequests):
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
        super().__init__(layout, team, limits, on_event)
        self.jobs = jobs
        self.strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        self.shell = ShellKind()
        self.swarm = Swarm(self)
        self.agents = AgentKind(layout.home, team, ControlPort(layout, team))
        self.agent_requests = AgentRequests(self)
        self.agents.resume_with = self.agent_requests.resume_agent
        self.agents.on_spent = self.agent_requests.check_run_budget
        self.attachments = AttachmentDesk()
        self.remote = RemoteKind()
        self.dreams = DreamKind(layout.home)
        self.monitors = MonitorKind()
        self.kinds: dict[TaskType, TaskKind] = {}
        for kind in (self.shell, self.swarm, self.agents, self.remote, self.monitors, self.dreams):
            for task_type in kind.types:
                self.kinds[task_type] = kind
        self.control = ControlServer(layout, team, self)
        self.scheduler = Scheduler(self)
        self.policies.append(self.scheduler)
        self.holds = Holds()  # (views' holds on tasks: holds.py)
        self.policies.append(self.holds)
        self._mail: queue.SimpleQueue[AnyMessage] = queue.SimpleQueue()
        self._calls = queue.SimpleQueue()
        self._step_errors: dict[str, str] = {}
        self._last_release = 0.0
        self._loop_thread = None
        self._stop_requested = False
        self._stopping = False  # shutting down: tasks are being stopped, nothing new starts
        self._closed = False
        self._inbox: Inbox | None = None
        self._subscription: Any = None

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> Leader:
        """Become the team's leader: resume its last session or begin a new one."""
        self.layout.check()  # (a home another user can write in could drive this leader)
        if not self.teams.exists(self.team):
            self.teams.create(self.team)
        # Checked before the lead is claimed: an inbox another user can write in is refused
        # before this process says it leads.
        maildir = Maildir.create(self.layout.inbox_dir(self.team, LEAD_NAME), self.layout.home)
        tf = claim_lead(self.teams, self.team, self._identity)
        raise_fd_limit()  # a thousand in-process teammates hold a thousand inbox files
        resumed = resume(self, tf.lead_session_id)
        if resumed:
            with contextlib.suppress(ShoalError):
                self.scheduler.restore(self.session.read_state().groups)
            if (self.session.dir / LEASES_FILE).exists():
                # (leases of ended holders are released at the policy's first step)
                self.agent_requests.lease_policy()
            if (self.session.dir / PR_ACTIVITY_FILE).exists():
                self._step("pr activity", self._resume_pr_activity)
        self.teams.update(
            self.team, lambda t: t.model_copy(update={"lead_session_id": self.session_id})
        )
        self.persist(force=True)
        self.emit(LeaderStarted(team=self.team, pid=self._identity[0], resumed=resumed))
        self._inbox = Inbox(maildir, lead=LEAD_NAME)
        self._subscription = self._inbox.subscribe(self._on_message)
        self.auto_dream()
        return self

    def auto_dream(self) -> None:
        """At the start: a dream when `auto_dream` is on and enough sessions and hours have
        passed since the last consolidation (a refusal, e.g. another dream, is a note)."""
        try:
            config = DreamConfig.load(self.layout.home)
            if not config.auto:
                return
            memory = memory_dir(self.layout.home, Path.cwd())
            due = auto_dream_due(config, memory, self.layout.sessions_dir, now=time.time())
            if due is not None:
                task = self.start_dream(DreamSpec(cwd=os.getcwd(), reason=f"auto dream: {due}"))
                self.note(f"started dream {task.id}: {due}")
        except ShoalError as exc:
            self.note(f"no automatic dream: {exc}")

    # -- the store interface: see store.py; requests: see requests.py ---------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def queue(self) -> deque[str]:
        """The scheduler's queue of tasks waiting to start (read by policies that see the
        leader only as a store)."""
        return self.scheduler.queue

    @property
    def procs(self) -> dict[str, ShellProcess]:
        """Live shell processes by task id."""
        return self.shell.procs

    def slots_used(self) -> int:
        """Job slots taken (`--jobs` caps them): running shell tasks and remote jobs in flight."""
        return self.shell.running() + self.remote.running()

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
        return dict.fromkeys(self.kinds.values())  # (each once, in order)

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
        self._step("teammates", lambda: self.swarm.check(full=False))
        self._step("policy", lambda: self.apply_policies(mono))
        self._step("notify", self.notify)
        self._step("evict", lambda: self.evict(now, new_round=False))
        self._step("start", self.start_pending)
        self._step("persist", self.persist)

    # -- the steps -------------------------------------------------------------------------------

    def reap(self, *, only_signalled: bool = False) -> None:
        """Settle processes that ended and kills that are due (all live tasks, or only those a
        pidfd or a deadline points at)."""
        now = time.monotonic()
        for kind in self._kinds():
            kind.poll(self, now, Poll.REAP, kind.signalled() if only_signalled else None)

    def poll_live(self, what: Poll, now: float) -> None:
        """Ask each kind to look at `what` (output deltas, stalls) of its live tasks."""
        for kind in self._kinds():
            kind.poll(self, now, what)

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
        """End the tasks whose owning agent has exited or left the team (the registry's
        ownership tree: one query, one place that stops them)."""
        states: dict[str, MemberState] | None = None

        def departed(name: str) -> bool:
            nonlocal states
            agent = self.registry.get(name)  # an agent task: gone once it has ended
            if agent is not None and agent.type == TaskType.LOCAL_AGENT:
                return agent.is_terminal
            if states is None:  # (the team file is read once a pass, and only if asked)
                states = {v.member.name: v.state for v in self.teams.members(self.team)}
            return states.get(name) in (MemberState.DEAD, MemberState.LEFT, None)

        for task, reason in self.registry.orphans(departed):
            kind = self.kinds.get(task.type)
            if kind is not None:
                kind.kill(task, self, reason)

    def release_orphaned_tasks(self, now: float) -> None:
        """Every few seconds: list tasks owned by members that died or left go back to pending.

        The teammates this leader runs are left out: the swarm settles each when it notices its
        end, and a death it has not noticed yet must not be settled here first. Of the others
        (a dead leader's teammates, members that joined on their own), the commands their status
        files list are killed before their tasks go back, and a task whose last command had
        finished takes the outcome of its exit code instead of running a second time."""
        if now - self._last_release < RELEASE_INTERVAL_S:
            return
        self._last_release = now
        tasks = TaskList(self.teams, self.team)
        try:
            gone = tasks.orphaned_owners(skip=self.swarm.members.keys())
        except ShoalError as exc:
            self.note_failure("task list", f"could not check the task list: {exc}", exc)
            return
        released: list[Any] = []
        for name in gone:
            try:
                settled, back = settle_and_release(self.teams, self.team, name)
            except ShoalError as exc:
                self.note_failure("task list", f"could not settle the tasks of {name}: {exc}", exc)
                continue
            released += back
            done = settled.describe(name)
            if done:
                self.note(f"departed member {name}: {done}")
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
            if not task.notified and self.attachments.holds(task, self.registry.get):
                # (its agent's next attachment tells the end: announced now, notified then)
                if task.id not in self.snapshot.announced:
                    self.emit(task_terminated(task))
                    self.snapshot.announced.add(task.id)
            elif not task.notified:
                extras = self.kinds[task.type].notification(task)
                if notify_once(self, task, extras):
                    self.snapshot.dirty = True
        if self._waiters:
            self._answer_waiters()

    def evict(self, now: float, *, new_round: bool = True) -> None:
        """Drop terminal, notified tasks (after their grace) into history on the round after
        they became evictable, as the seed does (not on a full disk)."""
        self.evict_to_history(now, new_round=new_round)

    def start_pending(self) -> None:
        """Start queued tasks while their group has free slots (`jobs` is the default group's;
        0 means no limit), highest priority first (see scheduling.py)."""
        self.scheduler.start_pending()

    def persist(self, *, force: bool = False) -> None:
        """Write state.json if anything changed (at most every PERSIST_INTERVAL_S unless forced,
        or once every task has ended: then nothing is gained by waiting, and `shoal wait`
        sees the last end at once); see `Snapshot` for why the throttle is safe. First, what a
        full disk held back."""
        self.write_held_back()
        settled = self.snapshot.dirty and self.registry.live == 0
        if not force and not settled and not self.snapshot.due(PERSIST_INTERVAL_S):
            return
        self.write_snapshot(self._leader_record(), groups=self.scheduler.dump())

    def _leader_record(self) -> dict[str, Any] | None:
        """state.json's `leader`: who leads (None once it has stopped its last task)."""
        me, started = self._identity
        if self._stopping and not self.shell.running():
            return None
        return {"pid": me, "started_at": started, "jobs": self.jobs}

    def write_ahead(self, task_id: str) -> bool:
        """Move `task_id` to running and write state.json now, before its kind spawns anything
        for it: a leader killed after this point is followed by one that adopts the runner or
        ends the attempt, and never starts it a second time (with the lease it holds, set when
        it was admitted). False, with the task failed and the reason, when the disk refused."""
        self.move_task(task_id, TaskStatus.RUNNING, start_time=time.time())
        if self.write_snapshot(self._leader_record(), groups=self.scheduler.dump()):
            pause_point("started-ahead")
            return True
        self.move_task(
            task_id,
            TaskStatus.FAILED,
            error=f"not started: its start could not be recorded (no space left on device "
            f"writing {self.session.state_file})",
        )
        return False

    def flush_state(self) -> None:
        """Write state.json now if anything changed (before a control reply: what a request
        did is on disk by the time its client hears of it)."""
        if self.snapshot.dirty and self._loop_thread in (None, threading.current_thread()):
            self.persist(force=True)

    def _resume_pr_activity(self) -> None:
        """A resumed session's PR subscriptions are polled again (a bad file is a note)."""
        pr_policy(self)

    def pr_activity(self, request: Any) -> dict[str, Any]:
        """A coordinator's subscribe_pr_activity or unsubscribe_pr_activity (pr_feed.py)."""
        return pr_request(self, request)

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
        for task_id in self.scheduler.drop_queued():
            self.move_task(task_id, TaskStatus.KILLED, kill_reason="leader shut down")
        for kind in (self.shell, self.agents, self.remote, self.monitors, self.dreams):
            for task_id in list(kind.live()):
                task = self.registry.get(task_id)
                if task is not None:
                    kind.kill(task, self, STOPPED_ON_REQUEST)
        self.persist(force=True)

    def _drained(self) -> bool:
        return (
            not self.shell.running()
            and not self.agents.running()
            and not self.remote.jobs
            and not self.monitors.procs
            and not self.dreams.running()
            and not self.swarm.members
            and not self.control.pending
        )

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop every task this leader owns, notify, persist and step down as lead."""
        if self._closed:
            return
        self._loop_thread = None  # (the loop has returned: this thread owns the registry now)
        self.begin_shutdown()
        self.run_until(self._drained, timeout)
        if not self._drained():  # (past the timeout: the last resort waits)
            self.shell.kill_all_now(self._limits.kill_grace)
            self.agents.kill_all_now(self._limits.kill_grace)
            self.dreams.kill_all_now(self._limits.kill_grace)
            self.swarm.kill_all()
            self.reap()
        if self._subscription is not None:
            self._subscription.stop()
        # Mail the inbox took (and acknowledged) after the loop's last pass: an event each,
        # like the rest, or it would be lost with the queue (a teammate's last words).
        self.deliver_mail()
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
        self.remote.close()
        for policy in self.policies:
            if isinstance(policy, PrActivity):
                policy.close()
        self._selector.close()
        self.session.close()
        for fd in (self._wake_r, self._wake_w, *self._pidfds.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
