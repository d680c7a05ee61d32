"""The leader's side of a swarm: spawning teammates, waiting for them to be ready, noticing
when they die, and the shutdown handshake.

Each teammate is also a task in the leader's registry (type `in_process_teammate`, whatever
its backend), so it has an id, a status and exactly one notification like any other task. The
record follows the member's status file (idle, awaiting approval, progress, messages) and the
messages the member sends the lead.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol

from shoal.core import git
from shoal.core.errors import ConflictError, ShoalError, UsageError
from shoal.core.events import TeammateReady, TeammateSpawned
from shoal.core.names import validate_name
from shoal.core.output import create_output_file, tail
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.tasks import (
    RECENT_ACTIVITIES_CAP,
    STOPPED_ON_REQUEST,
    TEAMMATE_MESSAGES_UI_CAP,
    AgentProgress,
    AnyTaskState,
    InProcessTeammateTaskState,
    TaskStatus,
    TaskType,
    TeammateIdentity,
    ToolActivity,
    new_task_id,
)
from shoal.mailbox.router import send
from shoal.mailbox.schema import AnyMessage
from shoal.mailbox.watcher import shared_watcher as get_watcher
from shoal.teams.backends.base import Backend, Handle, SpawnSpec, choose, get_backend
from shoal.teams.backends.inprocess import InProcessBackend
from shoal.teams.colors import pick_color
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import JoinSpec, Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.brains import Script
from shoal.workers.kinds import Poll, TaskStore
from shoal.workers.worker import WorkerOptions, build_runner

SPAWN_TIMEOUT_S = float(os.environ.get("SHOAL_SPAWN_TIMEOUT", "30"))
# A batch of process teammates larger than the machine starts slower: each member past
# 4 per CPU adds this much to everyone's ready timeout (they share the CPUs while starting).
SPAWN_TIMEOUT_PER_MEMBER_S = 0.5


def ready_timeout(batch: int, in_process: bool) -> float:
    """Seconds a teammate launched in a batch of `batch` has to become ready."""
    if in_process:  # (no interpreter to start: they do not slow each other down)
        return SPAWN_TIMEOUT_S
    crowd = max(0, batch - 4 * (os.cpu_count() or 1))
    return SPAWN_TIMEOUT_S + SPAWN_TIMEOUT_PER_MEMBER_S * crowd


SHUTDOWN_TIMEOUT_S = float(os.environ.get("SHOAL_SHUTDOWN_TIMEOUT", "10"))
# A file changed less than this long ago may change again within the filesystem's timestamp
# granularity without its mtime moving: it is looked at once more on the next pass.
STATUS_SETTLE_NS = 50_000_000
# Texts of messages kept in a teammate's task record are cut to this many characters (the
# record is in state.json: 50 messages of a thousand teammates must stay a few MB at most).
MESSAGE_TEXT_CAP = 200

Reply = Callable[[dict[str, Any] | None, ShoalError | None], None]
BatchReply = Callable[[list[dict[str, Any]] | None, ShoalError | None], None]


class Phase(StrEnum):
    """Where a teammate this leader started is in its run."""

    STARTING = "starting"  # launched, not ready yet (the lead sends it nothing)
    READY = "ready"  # told the lead it is ready; takes work
    STOPPING = "stopping"  # asked to shut down (the handshake), or being killed
    ENDED = "ended"


PHASE_TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.STARTING: frozenset({Phase.READY, Phase.STOPPING, Phase.ENDED}),
    Phase.READY: frozenset({Phase.STOPPING, Phase.ENDED}),
    Phase.STOPPING: frozenset({Phase.READY, Phase.ENDED}),  # (ready while being asked)
    Phase.ENDED: frozenset(),
}


class IllegalPhase(ShoalError):
    """A teammate run moved in a way PHASE_TRANSITIONS does not allow (a bug)."""


def check_phase(name: str, current: Phase, new: Phase) -> None:
    """Refuse a move that is not in PHASE_TRANSITIONS (staying put is always allowed)."""
    if new != current and new not in PHASE_TRANSITIONS[current]:
        allowed = ", ".join(sorted(PHASE_TRANSITIONS[current])) or "none: it has ended"
        raise IllegalPhase(
            f"teammate {name}: illegal move {current} -> {new} (allowed: {allowed})"
        )


class StopCause(StrEnum):
    """Why a teammate's run ended, when the swarm knows (None: it exited by itself)."""

    ON_REQUEST = "stopped on request"  # `shoal stop`: killed, and not news
    SHUTDOWN_APPROVED = "shut down on request"  # it approved the lead's shutdown_request
    NOT_READY = "not ready in time"
    SHUTDOWN_TIMEOUT = "did not shut down in time"


class SwarmHost(TaskStore, Protocol):
    """What the swarm needs of the leader, beyond what every task kind may do."""

    layout: Layout
    team: str
    teams: Teams

    @property
    def identity(self) -> tuple[int, float]: ...

    @property
    def session_id(self) -> str: ...

    def register(self, task: AnyTaskState) -> AnyTaskState: ...


@dataclass
class _Plan:
    """A checked spawn request, before anything is started."""

    name: str
    agent: str
    backend: Backend
    why: str
    cwd: str
    options: WorkerOptions
    task_id: str
    output: Path
    plan_mode: bool
    worktree: str | None
    prompt: str | None
    in_process: bool
    color: str | None


class _Collector:
    """Answers a spawn batch once every member is ready or has failed."""

    def __init__(self, count: int, reply: BatchReply) -> None:
        self.count = count
        self.reply = reply
        self.results: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, ShoalError] = {}
        self.order: list[str] = []

    def for_member(self, name: str) -> Reply:
        self.order.append(name)

        def answer(result: dict[str, Any] | None, error: ShoalError | None) -> None:
            self.done(name, result, error)

        return answer

    def done(self, name: str, result: dict[str, Any] | None, error: ShoalError | None) -> None:
        if error is not None:
            self.errors[name] = error
        elif result is not None:
            self.results[name] = result
        if len(self.results) + len(self.errors) < self.count:
            return
        if self.errors:
            if self.count == 1:
                self.reply(None, next(iter(self.errors.values())))
            else:
                shown = list(self.errors.items())[:3]
                failed = "; ".join(f"{n}: {e}" for n, e in shown)
                if len(self.errors) > len(shown):
                    failed += f"; and {len(self.errors) - len(shown)} more"
                self.reply(
                    None,
                    ShoalError(
                        f"{len(self.errors)} of {self.count} teammates failed to start ({failed})"
                    ),
                )
            return
        self.reply([self.results[n] for n in self.order if n in self.results], None)


@dataclass
class MemberRun:
    """A teammate this leader started (live handles: never persisted)."""

    name: str
    task_id: str
    backend: Backend
    handle: Handle
    why: str
    prompt: str | None = None
    phase: Phase = Phase.STARTING
    became_ready: bool = False  # (a fact of its history: STOPPING may follow either phase)
    cause: StopCause | None = None
    detail: str | None = None  # the words of `cause`, with its numbers
    reply: Reply | None = None
    deadline: float = 0.0
    launched: float = field(default_factory=time.monotonic)
    log_file: Path | None = None
    in_process: bool = False
    # (inode, size, mtime_ns) of the status file last read; None: read it on the next look.
    status_key: tuple[int, int, int] | None = None
    status: dict[str, Any] | None = None  # the member's status as last applied
    sent: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=TEAMMATE_MESSAGES_UI_CAP)
    )  # what the member sent the lead, for the record's messages

    def move(self, phase: Phase) -> None:
        """Move to `phase` (IllegalTransition if PHASE_TRANSITIONS does not allow it)."""
        check_phase(self.name, self.phase, phase)
        self.phase = phase
        if phase == Phase.READY:
            self.became_ready = True

    def end_because(self, cause: StopCause, detail: str | None = None) -> None:
        """Record why it ends (the first cause stands, but for an explicit stop)."""
        if self.cause is None or cause == StopCause.ON_REQUEST:
            self.cause, self.detail = cause, detail or cause.value


class Swarm:
    """Teammates of one leader: the task kind of `in_process_teammate` tasks."""

    types = frozenset({TaskType.IN_PROCESS_TEAMMATE})

    def __init__(self, host: SwarmHost) -> None:
        self.leader = host
        self.members: dict[str, MemberRun] = {}
        self._backends: dict[str, Backend] = {}
        self._ready_early: set[str] = set()
        self._ready_signals: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._exited: set[str] = set()
        self._shutdown_deadline: float | None = None
        self._shutdown_timeout = SHUTDOWN_TIMEOUT_S
        # Statuses handed over by in-process teammates (from their loop's thread), latest per
        # member, applied on the next pass; names being started are kept until they are known.
        self._pushed: dict[str, dict[str, Any]] = {}
        self._push_lock = threading.Lock()
        self._launching: set[str] = set()
        # The options of in-process teammates being started, for the backend's factory.
        self._in_process_options: dict[str, WorkerOptions] = {}
        self._status_dir = host.layout.status_dir(host.team)
        self._status_dir_seen: int | None = None
        # This swarm's own in-process backend: its factory builds this swarm's teammates.
        self._in_process = InProcessBackend(self._in_process_factory)

    # -- spawning ----------------------------------------------------------------------------

    def spawn(self, args: dict[str, Any], reply: Reply) -> None:
        """Start a teammate; `reply` is called once it is ready (or failed to start)."""

        def one(results: list[dict[str, Any]] | None, error: ShoalError | None) -> None:
            reply(results[0] if results else None, error)

        self.spawn_many([args], one)

    def spawn_many(self, batch: list[dict[str, Any]], reply: BatchReply) -> None:
        """Start several teammates with one team-file update; `reply` gets all of them once
        every one is ready, or the failures. Everything is checked before anything starts."""
        leader = self.leader
        team = leader.team
        tf = leader.teams.read(team)
        names = [str(a.get("name") or "") for a in batch]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UsageError(f"teammate name(s) given twice: {', '.join(dupes)}")
        plans = [self._plan(args, tf) for args in batch]
        taken = [m.color for m in tf.members if m.is_active and m.name not in names]
        for plan in plans:
            if plan.color is None:
                plan.color = pick_color(taken)
            taken.append(plan.color)
        me, started = leader.identity
        leader.teams.join_many(
            team,
            [
                JoinSpec(
                    name=p.name,
                    agent_type=p.agent,
                    backend=p.backend.name,
                    cwd=p.cwd,
                    plan_mode_required=p.plan_mode,
                    worktree_path=p.worktree,
                    color=p.color,
                    prompt=p.prompt,
                    # In-process teammates live in this process: joined for good right now.
                    # The others are listed with no pid (dead) until their worker joins.
                    pid=me if p.in_process else None,
                    pid_started_at=started if p.in_process else None,
                )
                for p in plans
            ],
        )
        leader.layout.ensure(leader.layout.team_dir(team) / "logs")
        if any(p.in_process for p in plans):
            get_watcher().watch_root(leader.layout.inboxes_dir(team))
        collector = _Collector(len(plans), reply)
        for plan in plans:
            self._start(plan, collector)
        leader.wake()

    def _plan(self, args: dict[str, Any], tf: Any) -> _Plan:
        leader = self.leader
        team = leader.team
        name = validate_name(str(args.get("name") or ""), "member name")
        if name == LEAD_NAME:
            raise ConflictError(f"{LEAD_NAME!r} is the lead's name; pick another")
        agent = args.get("agent") or "scripted"
        if agent not in ("scripted", "exec"):
            raise UsageError(f"unknown agent {agent!r} (scripted or exec)")
        script, cmd = args.get("script"), args.get("cmd")
        if agent == "exec" and not cmd:
            raise UsageError("--agent exec needs --cmd TEMPLATE (e.g. 'claude -p {prompt}')")
        if script and not Path(script).is_file():
            raise UsageError(f"script {script} does not exist")
        if script:
            Script.load(Path(script))  # refuse a bad script now, not in the teammate
        current = self.members.get(name)
        if current is not None and current.backend.is_alive(current.handle):
            raise ConflictError(f"teammate {name!r} is already running in team {team!r}")
        existing = tf.member(name)
        if (
            existing is not None
            and existing.is_active
            and is_alive(existing.pid, existing.pid_started_at)
        ):
            raise ConflictError(f"member {name!r} is already active in team {team!r}")
        backend, why = choose(
            str(args.get("backend") or "auto"), provided={"in-process": self._in_process}
        )
        cwd = str(args.get("cwd") or os.getcwd())
        if not os.path.isdir(cwd):
            raise UsageError(f"working directory {cwd!r} does not exist")
        worktree = None
        if args.get("worktree"):
            worktree = str(self._make_worktree(name, cwd))
            cwd = worktree
        task_id = new_task_id(TaskType.IN_PROCESS_TEAMMATE)
        output = leader.output_file(task_id)
        plan_mode = bool(args.get("plan_mode"))
        in_process = isinstance(backend, InProcessBackend)
        options = WorkerOptions(
            team=team,
            name=name,
            agent=agent,
            script=str(Path(script).resolve()) if script else None,
            cmd=str(cmd) if cmd else None,
            plan_mode=plan_mode,
            task_id=task_id,
            output=str(output),
            cwd=cwd,
            backend=backend.name,
            joined=in_process,
        )
        return _Plan(
            name=name,
            agent=agent,
            backend=backend,
            why=why,
            cwd=cwd,
            options=options,
            task_id=task_id,
            output=output,
            plan_mode=plan_mode,
            worktree=worktree,
            prompt=args.get("prompt"),
            in_process=in_process,
            color=existing.color if existing and existing.color else None,
        )

    def _start(self, plan: _Plan, collector: _Collector) -> None:
        leader = self.leader
        layout, team = leader.layout, leader.team
        assert plan.color is not None
        if not plan.in_process:  # (in-process ones open it when they first run something)
            os.close(create_output_file(plan.output))  # its directory was checked already
        logs = layout.team_dir(team) / "logs"
        spec = SpawnSpec(
            team=team,
            name=plan.name,
            argv=plan.options.argv(sys.executable, layout.home),
            cwd=plan.cwd,
            home=layout.home,
            color=plan.color,
            log_file=logs / f"{plan.name}.log",
            env={"SHOAL_HOME": str(layout.home)},
        )
        task = InProcessTeammateTaskState(
            id=plan.task_id,
            description=f"teammate {plan.name}",
            output_file=str(plan.output),
            status=TaskStatus.RUNNING,
            owner=LEAD_NAME,
            prompt=str(plan.prompt or ""),
            identity=TeammateIdentity(
                agent_id=f"{plan.name}@{team}",
                agent_name=plan.name,
                team_name=team,
                color=plan.color,
                plan_mode_required=plan.plan_mode,
                parent_session_id=leader.session_id,
            ),
            permission_mode="plan" if plan.plan_mode else "default",
        )
        leader.register(task)
        self._launching.add(plan.name)
        if plan.in_process:
            self._in_process_options[plan.name] = plan.options
        try:
            handle = plan.backend.spawn(spec)
        except Exception as exc:  # whatever the backend raised, the task must not hang
            self._in_process_options.pop(plan.name, None)
            error = (
                exc
                if isinstance(exc, ShoalError)
                else ShoalError(
                    f"cannot start teammate {plan.name!r} with backend {plan.backend.name}: {exc!r}"
                )
            )
            self._launching.discard(plan.name)
            leader.move_task(plan.task_id, TaskStatus.FAILED, error=str(error))
            collector.done(plan.name, None, error)
            return
        self._backends[plan.backend.name] = plan.backend
        self.members[plan.name] = MemberRun(
            name=plan.name,
            task_id=plan.task_id,
            backend=plan.backend,
            handle=handle,
            why=plan.why,
            prompt=plan.prompt,
            reply=collector.for_member(plan.name),
            deadline=time.monotonic() + ready_timeout(collector.count, plan.in_process),
            log_file=spec.log_file,
            in_process=plan.in_process,
        )
        self._launching.discard(plan.name)
        if isinstance(plan.backend, InProcessBackend):
            plan.backend.on_done(handle, leader.wake)
        else:
            leader.watch_pid(f"member:{plan.name}", handle.pid)
        leader.emit(
            TeammateSpawned(
                name=plan.name, task_id=plan.task_id, backend=plan.backend.name, why=plan.why
            )
        )

    def adopt_member(self, task: InProcessTeammateTaskState) -> bool:
        """After a leader restart: take back a teammate that still runs; False if it is gone.

        Process and tmux teammates outlive a crashed leader; in-process ones die with it.
        """
        name = task.identity.agent_name
        member = self.leader.teams.read(self.leader.team).member(name)
        if member is None or member.backend in (None, "in-process") or not member.is_active:
            return False
        if not is_alive(member.pid, member.pid_started_at):
            return False
        backend = get_backend(member.backend)
        handle = Handle(backend=member.backend, pid=member.pid, pane_id=member.pane_id)
        if not backend.is_alive(handle):
            return False
        self.members[name] = MemberRun(
            name=name,
            task_id=task.id,
            backend=backend,
            handle=handle,
            why="adopted after a leader restart",
            phase=Phase.READY,
            became_ready=True,
        )
        self._backends[backend.name] = backend
        self.leader.watch_pid(f"member:{name}", member.pid)
        return True

    def _in_process_factory(self, spec: SpawnSpec) -> Any:
        options = self._in_process_options.pop(spec.name, None)
        if options is None:
            raise ShoalError(f"no worker options for in-process teammate {spec.name!r}")
        runner = build_runner(self.leader.layout, options)
        leader = self.leader

        def ready() -> None:  # called on the in-process loop's thread: handed to the loop
            self._ready_signals.put(spec.name)
            leader.wake()

        def status(snapshot: dict[str, Any]) -> None:  # also on the in-process loop's thread
            with self._push_lock:
                self._pushed[spec.name] = snapshot

        runner.config.on_ready = ready
        runner.config.on_status = status
        return runner.run()

    def _make_worktree(self, name: str, cwd: str) -> Path:
        layout, team = self.leader.layout, self.leader.team
        top = git.toplevel(cwd)
        if top is None:
            raise UsageError(f"--worktree needs a git repository, and {cwd} is not in one")
        path = layout.ensure(layout.worktrees_dir(team)) / name
        try:
            git.worktree_add(top, path, detach=True)
        except git.GitError as exc:
            raise ShoalError(f"cannot create a worktree for {name!r}: {exc.stderr}") from None
        return path

    # -- messages from teammates -------------------------------------------------------------

    def on_message(self, msg: AnyMessage) -> None:
        """React to a teammate's message (readiness, shutdown answers) and bring its task
        record up to date: a member writes its status file before it sends, so the file is at
        least as new as the message (idle, awaiting approval and the like come from there)."""
        run = self.members.get(msg.from_)
        if run is None:
            return
        data = msg.data.model_dump()
        text = msg.summary if msg.kind == "task_notification" and msg.summary else msg.text
        run.sent.append(
            {
                "from": msg.from_,
                "to": msg.to,
                "kind": msg.kind,
                "text": _cut(text),
                "sent_at": msg.sent_at,
            }
        )
        if msg.kind == "idle_notification" and data.get("idle_reason") == "ready":
            self._ready(run)
        elif msg.kind == "shutdown_response":
            if data.get("approve"):
                run.end_because(StopCause.SHUTDOWN_APPROVED)
            else:
                self.leader.note(
                    f"{run.name} declined to shut down: {data.get('reason') or 'no reason given'}"
                )
        self._refresh(run)

    def _update_teammate(self, run: MemberRun, **changes: Any) -> None:
        with contextlib.suppress(ShoalError, TypeError):
            self.leader.set_task(run.task_id, **changes)

    # -- teammate task records in step with status files -------------------------------------

    def sync_status(self) -> None:
        """Copy what changed in members' status files into their task records.

        In-process teammates hand their statuses over directly; the others' files are looked
        at only when the status directory changed (a stat), then only those whose file changed
        are read. A thousand quiet teammates cost one stat a pass.
        """
        if self._pushed:  # (read without the lock: one missed now is seen on the next pass)
            with self._push_lock:
                pushed, self._pushed = self._pushed, {}
            for name, status in pushed.items():
                run = self.members.get(name)
                if run is not None:
                    self._apply_status(run, status)
                elif name in self._launching:  # handed over before `_start` recorded it
                    with self._push_lock:
                        self._pushed.setdefault(name, status)
        if not self.members:
            return
        try:
            mtime = os.stat(self._status_dir).st_mtime_ns
        except OSError:
            return
        if mtime == self._status_dir_seen:
            return
        self._status_dir_seen = mtime if time.time_ns() - mtime > STATUS_SETTLE_NS else None
        for run in self.members.values():
            if not run.in_process:
                found = self._read_status(run)
                if found is not None:
                    self._apply_status(run, found)

    def _read_status(self, run: MemberRun) -> dict[str, Any] | None:
        """The member's status file if it changed since the last read, else None."""
        path = self._status_dir / f"{run.name}.json"
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key == run.status_key:
            return None
        status = self.leader.teams.read_status(self.leader.team, run.name)
        if status is not None:
            settled = time.time_ns() - st.st_mtime_ns > STATUS_SETTLE_NS
            run.status_key = key if settled else None
        return status

    def _refresh(self, run: MemberRun) -> None:
        """Bring one member's record up to date now (its latest status, its messages)."""
        status: dict[str, Any] | None
        if run.in_process:
            with self._push_lock:
                status = self._pushed.pop(run.name, None)
        else:
            status = self._read_status(run)
        if status is None and run.status is None:  # nothing known yet but its messages
            self._update_teammate(run, messages=self._messages(run, {}))
            return
        self._apply_status(run, status if status is not None else run.status or {})

    def _apply_status(self, run: MemberRun, status: dict[str, Any]) -> None:
        run.status = status
        self._update_teammate(
            run,
            is_idle=status.get("state") == "idle",
            awaiting_plan_approval=bool(status.get("awaiting_approval")),
            shutdown_requested=bool(status.get("shutdown_requested")),
            progress=_progress(status),
            messages=self._messages(run, status),
        )

    @staticmethod
    def _messages(run: MemberRun, status: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        """What the member received (its status file lists them) and sent the lead, oldest
        first, the last TEAMMATE_MESSAGES_UI_CAP of them."""
        received = status.get("messages")
        listed = received if isinstance(received, list) else ()
        messages = [m for m in listed if isinstance(m, dict)]
        messages.extend(run.sent)
        messages.sort(key=lambda m: str(m.get("sent_at") or ""))
        return tuple(messages[-TEAMMATE_MESSAGES_UI_CAP:])

    def _ready(self, run: MemberRun) -> None:
        if run.became_ready or run.phase == Phase.ENDED:
            return
        run.move(Phase.READY if run.phase == Phase.STARTING else run.phase)
        run.became_ready = True
        self._update_teammate(run, is_idle=True)  # (its status file may lag behind)
        self.leader.emit(TeammateReady(name=run.name, task_id=run.task_id))
        if run.prompt:
            with contextlib.suppress(ShoalError):
                send(
                    self.leader.teams.directory(self.leader.team),
                    to=run.name,
                    sender=LEAD_NAME,
                    text=run.prompt,
                )
        if run.reply is not None:
            reply, run.reply = run.reply, None
            reply(
                {
                    "name": run.name,
                    "task_id": run.task_id,
                    "backend": run.backend.name,
                    "why": run.why,
                    "pid": run.handle.pid,
                    "pane_id": run.handle.pane_id,
                },
                None,
            )

    # -- supervision -------------------------------------------------------------------------

    def check(self) -> None:
        """Notice teammates that became ready, died, never became ready in time, or outlived
        the shutdown handshake, and settle their tasks; bring the records of the others in
        step with their status files. Never waits for a teammate."""
        while True:
            try:
                name = self._ready_signals.get_nowait()
            except queue.Empty:
                break
            run = self.members.get(name)
            if run is not None:
                self._ready(run)
            elif name in self._launching:  # ready before `_start` has recorded it
                self._ready_signals.put(name)
                break
        self.sync_status()
        now = time.monotonic()
        late = self._shutdown_deadline is not None and now > self._shutdown_deadline
        ended: list[MemberRun] = []
        for run in list(self.members.values()):
            alive = run.backend.is_alive(run.handle)
            if alive and not run.became_ready and now > run.deadline:
                run.end_because(
                    StopCause.NOT_READY, f"not ready within {run.deadline - run.launched:.0f}s"
                )
                run.backend.kill(run.handle)
                alive = False
            elif alive and late:
                timeout = self._shutdown_timeout
                run.end_because(
                    StopCause.SHUTDOWN_TIMEOUT, f"did not shut down within {timeout:g}s; killed"
                )
                self.leader.note(f"killed teammate {run.name}: it did not shut down in time")
                run.backend.kill(run.handle)
                alive = False
            if not alive:
                ended.append(run)
        for run in ended:
            self._ended(run, settle_member=False)
        self._leave([r for r in ended if r.in_process])
        if self._shutdown_deadline is not None and not self.members:
            self._close_backends()

    def _leave(self, runs: list[MemberRun]) -> None:
        """Mark ended in-process teammates as gone in the team file (their pid is the
        leader's, so it cannot tell), in one update per outcome."""
        if not runs:
            return
        team = self.leader.team
        approved = [r.name for r in runs if r.cause == StopCause.SHUTDOWN_APPROVED]
        others = [r.name for r in runs if r.cause != StopCause.SHUTDOWN_APPROVED]
        with contextlib.suppress(ShoalError):
            if approved:
                self.leader.teams.leave_many(team, approved)
            if others:
                self.leader.teams.leave_many(team, others, departed=False)

    def _ended(self, run: MemberRun, *, settle_member: bool = True) -> None:
        leader = self.leader
        self._refresh(run)  # its last progress and messages
        self.members.pop(run.name, None)
        with self._push_lock:
            self._pushed.pop(run.name, None)
        if settle_member and run.in_process:
            self._leave([run])
        leader.unwatch_pid(f"member:{run.name}")
        run.move(Phase.ENDED)
        released: list[Any] = []
        with contextlib.suppress(ShoalError):
            released = TaskList(leader.teams, leader.team).release_member(run.name)
        log = tail(run.log_file, 600).strip() if run.log_file and run.log_file.exists() else ""
        status, extra = _outcome(run, log)
        if status == TaskStatus.FAILED and not run.became_ready and run.reply is not None:
            reply, run.reply = run.reply, None
            reply(None, ShoalError(extra["error"] + (f"\n{log}" if log else "")))
        leader.move_task(
            run.task_id,
            status,
            is_idle=False,
            awaiting_plan_approval=False,
            shutdown_requested=False,
            **extra,
        )
        if status == TaskStatus.KILLED:
            leader.mark_notified(run.task_id)
        note = f"teammate {run.name} ended ({status.value})"
        if released:
            note += f"; its tasks {', '.join(str(t.id) for t in released)} went back to pending"
        leader.note(note)

    def stop(self, name: str, cause: StopCause = StopCause.ON_REQUEST) -> None:
        """Kill one teammate now (no handshake)."""
        run = self.members.get(name)
        if run is None:
            return
        run.end_because(cause)
        run.backend.kill(run.handle)
        self._ended(run)

    def member_of_task(self, task_id: str) -> str | None:
        for run in self.members.values():
            if run.task_id == task_id:
                return run.name
        return None

    def begin_shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """The shutdown handshake: ask every teammate to shut down; `check` kills who is left
        after `timeout` (the inbox reads their answers meanwhile)."""
        if self._shutdown_deadline is not None:
            return
        self._shutdown_timeout = timeout
        self._shutdown_deadline = time.monotonic() + timeout
        directory = self.leader.teams.directory(self.leader.team)
        for run in list(self.members.values()):
            run.move(Phase.STOPPING)
            if not run.backend.is_alive(run.handle):
                continue
            with contextlib.suppress(ShoalError):
                send(
                    directory,
                    to=run.name,
                    sender=LEAD_NAME,
                    kind="shutdown_request",
                    data={
                        "request_id": secrets.token_hex(8),
                        "reason": "the lead is shutting down",
                    },
                )
        if not self.members:
            self._close_backends()

    def kill_all(self) -> None:
        """Kill every teammate now (the last resort of a shutdown past its time)."""
        for run in list(self.members.values()):
            run.end_because(StopCause.SHUTDOWN_TIMEOUT, "killed at shutdown")
            run.backend.kill(run.handle)
            self._ended(run)
        self._close_backends()

    def shutdown_all(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> list[str]:
        """The shutdown handshake, waiting for it (for callers that own no loop); returns the
        names that had to be killed."""
        self.begin_shutdown(timeout)
        killed: list[str] = []
        while self.members:
            late = (
                [n for n, r in self.members.items() if r.backend.is_alive(r.handle)]
                if time.monotonic() > (self._shutdown_deadline or 0)
                else []
            )
            killed += late
            self.check()
            if self.members:
                time.sleep(0.02)
        return killed

    def _close_backends(self) -> None:
        for backend in self._backends.values():
            with contextlib.suppress(ShoalError):
                backend.close(self.leader.team)
        self._backends.clear()

    # -- the TaskKind protocol (teammates are started by `spawn`, supervised by `check`) -----

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        store.move_task(task.id, TaskStatus.FAILED, error="a teammate starts with `shoal spawn`")

    def poll(self, task: AnyTaskState, store: TaskStore, now: float, what: Poll) -> None:
        """Nothing per task: `check` looks at every teammate at once (one stat of the status
        directory for a thousand quiet ones)."""

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        name = self.member_of_task(task.id)
        if name is None:
            store.move_task(task.id, TaskStatus.KILLED)
            return
        if reason == STOPPED_ON_REQUEST:
            self.stop(name)
        else:
            self.stop(name, StopCause.SHUTDOWN_TIMEOUT)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, InProcessTeammateTaskState)
        if self.adopt_member(task):
            store.note(f"adopted teammate {task.identity.agent_name} ({task.id})")
        else:
            store.move_task(
                task.id, TaskStatus.FAILED, error="the teammate ended while no leader was running"
            )

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        return {}  # (result and usage are the task's own fields)

    def live(self) -> Iterable[str]:
        return [r.task_id for r in self.members.values()]

    def signalled(self) -> Iterable[str]:
        exited, self._exited = self._exited, set()
        return [self.members[n].task_id for n in exited if n in self.members]

    def on_exit(self, key: str) -> bool:
        if key.startswith("member:"):
            self._exited.add(key.removeprefix("member:"))
            return True
        return False

    def next_due(self) -> float | None:
        due = [r.deadline for r in self.members.values() if not r.became_ready]
        if self._shutdown_deadline is not None and self.members:
            due.append(self._shutdown_deadline)
        return min(due, default=None)

    def running(self) -> int:
        return 0  # (teammates take no job slots)


def _outcome(run: MemberRun, log: str) -> tuple[TaskStatus, dict[str, Any]]:
    """The final status of an ended teammate's task, from how its run went."""
    if not run.became_ready:
        error = (
            f"teammate {run.name!r} died at start"
            + (f" ({run.detail})" if run.detail else "")
            + (f": {log.splitlines()[-1]}" if log else "")
        )
        return TaskStatus.FAILED, {"error": error}
    if run.cause == StopCause.ON_REQUEST:
        return TaskStatus.KILLED, {}
    if run.cause == StopCause.SHUTDOWN_APPROVED:
        return TaskStatus.COMPLETED, {"result": StopCause.SHUTDOWN_APPROVED.value}
    error = run.detail or "the teammate exited unexpectedly"
    return TaskStatus.FAILED, {"error": error + (f": {log[-300:]}" if log else "")}


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MESSAGE_TEXT_CAP:
        return text
    return text[:MESSAGE_TEXT_CAP] + "…"


def _activity(text: str) -> ToolActivity:
    """An activity line of a status file as a ToolActivity; its first word (e.g. `run` of
    `run: make`) stands for the tool."""
    return ToolActivity(tool_name=text.split(":", 1)[0].split(" ", 1)[0], description=text)


def _progress(status: Mapping[str, Any]) -> AgentProgress | None:
    """The progress a status file reports (counts, summary, latest and recent activities)."""
    raw = status.get("progress")
    counts: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    recent = status.get("recent_activities")
    texts = [a for a in recent if isinstance(a, str) and a] if isinstance(recent, list) else []
    current = status.get("activity")
    if not counts and not texts and not current:
        return None
    summary = counts.get("summary")
    try:
        return AgentProgress(
            tool_use_count=int(counts.get("tool_use_count") or 0),
            token_count=int(counts.get("token_count") or 0),
            last_activity=_activity(str(current)) if current else None,
            recent_activities=tuple(_activity(a) for a in texts[-RECENT_ACTIVITIES_CAP:]),
            summary=str(summary) if summary else None,
        )
    except (TypeError, ValueError):  # (a pydantic ValidationError is a ValueError)
        return None
