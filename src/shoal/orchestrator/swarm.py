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
import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.errors import ConflictError, ShoalError, UsageError
from shoal.core.names import validate_name
from shoal.core.output import create_output_file, tail
from shoal.core.procs import is_alive
from shoal.core.tasks import (
    RECENT_ACTIVITIES_CAP,
    TEAMMATE_MESSAGES_UI_CAP,
    AgentProgress,
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
from shoal.teams.store import JoinSpec
from shoal.teams.tasklist import TaskList

if TYPE_CHECKING:
    from shoal.orchestrator.leader import Leader
    from shoal.workers.worker import WorkerOptions

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
    ready: bool = False
    reply: Reply | None = None
    deadline: float = 0.0
    launched: float = field(default_factory=time.monotonic)
    log_file: Path | None = None
    shutdown_approved: bool = False
    stop_reason: str | None = None
    in_process: bool = False
    # (inode, size, mtime_ns) of the status file last read; None: read it on the next look.
    status_key: tuple[int, int, int] | None = None
    status: dict[str, Any] | None = None  # the member's status as last applied
    sent: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=TEAMMATE_MESSAGES_UI_CAP)
    )  # what the member sent the lead, for the record's messages


class Swarm:
    """Teammates of one leader."""

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.members: dict[str, MemberRun] = {}
        self._backends: dict[str, Backend] = {}
        self._ready_early: set[str] = set()
        # Statuses handed over by in-process teammates (from their loop's thread), latest per
        # member, applied on the next pass; names being started are kept until they are known.
        self._pushed: dict[str, dict[str, Any]] = {}
        self._push_lock = threading.Lock()
        self._launching: set[str] = set()
        # The options of in-process teammates being started, for the backend's factory.
        self._in_process_options: dict[str, WorkerOptions] = {}
        self._status_dir = leader.layout.status_dir(leader.team)
        self._status_dir_seen: int | None = None
        inproc = InProcessBackend.shared()
        if inproc.factory is None:
            inproc.factory = self._in_process_factory

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
            from shoal.workers.brains import Script

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
        backend, why = choose(str(args.get("backend") or "auto"))
        cwd = str(args.get("cwd") or os.getcwd())
        if not os.path.isdir(cwd):
            raise UsageError(f"working directory {cwd!r} does not exist")
        worktree = None
        if args.get("worktree"):
            worktree = str(self._make_worktree(name, cwd))
            cwd = worktree
        task_id = new_task_id(TaskType.IN_PROCESS_TEAMMATE)
        output = leader.session.output_file(task_id)
        plan_mode = bool(args.get("plan_mode"))
        in_process = isinstance(backend, InProcessBackend)
        from shoal.workers.worker import WorkerOptions

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
                parent_session_id=leader.session.id,
            ),
            permission_mode="plan" if plan.plan_mode else "default",
        )
        with leader.lock:
            leader.registry.register_task(task)
            leader.mark_dirty()
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
            with leader.lock:
                self._launching.discard(plan.name)
                leader.move_task(plan.task_id, TaskStatus.FAILED, error=str(error))
            collector.done(plan.name, None, error)
            return
        self._backends[plan.backend.name] = plan.backend
        with leader.lock:
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
                if plan.name in self._ready_early:
                    self._ready_early.discard(plan.name)
                    self._ready(self.members[plan.name])
            else:
                leader.watch_pid(f"member:{plan.name}", handle.pid)
        leader.emit(
            {
                "type": "system",
                "subtype": "teammate_spawned",
                "name": plan.name,
                "task_id": plan.task_id,
                "backend": plan.backend.name,
                "why": plan.why,
            }
        )

    def adopt(self, task: InProcessTeammateTaskState) -> bool:
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
            ready=True,
        )
        self._backends[backend.name] = backend
        self.leader.watch_pid(f"member:{name}", member.pid)
        return True

    def _in_process_factory(self, spec: SpawnSpec) -> Any:
        from shoal.workers.worker import build_runner

        options = self._in_process_options.pop(spec.name, None)
        if options is None:
            raise ShoalError(f"no worker options for in-process teammate {spec.name!r}")
        runner = build_runner(self.leader.layout, options)
        leader = self.leader

        def ready() -> None:  # called on the in-process loop's thread
            with leader.lock:
                run = self.members.get(spec.name)
                if run is not None:
                    self._ready(run)
                else:  # ready before `_start` has recorded it: it will look here
                    self._ready_early.add(spec.name)

        def status(snapshot: dict[str, Any]) -> None:  # also on the in-process loop's thread
            with self._push_lock:
                self._pushed[spec.name] = snapshot

        runner.config.on_ready = ready
        runner.config.on_status = status
        return runner.run()

    def _make_worktree(self, name: str, cwd: str) -> Path:
        layout, team = self.leader.layout, self.leader.team
        top = subprocess.run(
            ["git", "-C", cwd, "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=False,
        )
        if top.returncode != 0:
            raise UsageError(f"--worktree needs a git repository, and {cwd} is not in one")
        path = layout.ensure(layout.worktrees_dir(team)) / name
        made = subprocess.run(
            ["git", "-C", top.stdout.strip(), "worktree", "add", "--detach", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise ShoalError(f"cannot create a worktree for {name!r}: {made.stderr.strip()}")
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
            run.shutdown_approved = bool(data.get("approve"))
            if not run.shutdown_approved:
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
        if run.ready:
            return
        run.ready = True
        self._update_teammate(run, is_idle=True)  # (its status file may lag behind)
        self.leader.emit(
            {
                "type": "system",
                "subtype": "teammate_ready",
                "name": run.name,
                "task_id": run.task_id,
            }
        )
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
        """Notice teammates that died (or never became ready) and settle their tasks; bring
        the records of the others in step with their status files."""
        self.sync_status()
        now = time.monotonic()
        for run in list(self.members.values()):
            alive = run.backend.is_alive(run.handle)
            if alive and not run.ready and now > run.deadline:
                run.backend.kill(run.handle)
                alive = False
                run.stop_reason = f"not ready within {run.deadline - run.launched:.0f}s"
            if alive:
                continue
            self._ended(run)

    def _ended(self, run: MemberRun, *, settle_member: bool = True) -> None:
        leader = self.leader
        self._refresh(run)  # its last progress and messages
        self.members.pop(run.name, None)
        with self._push_lock:
            self._pushed.pop(run.name, None)
        if settle_member and isinstance(run.backend, InProcessBackend):
            # Its pid is the leader's: the team file must say it is gone.
            with contextlib.suppress(ShoalError):
                leader.teams.leave_many(leader.team, [run.name], departed=run.shutdown_approved)
        leader.unwatch_pid(f"member:{run.name}")
        released: list[Any] = []
        with contextlib.suppress(ShoalError):
            released = TaskList(leader.teams, leader.team).release_member(run.name)
        log = tail(run.log_file, 600).strip() if run.log_file and run.log_file.exists() else ""
        if not run.ready:
            error = (
                f"teammate {run.name!r} died at start"
                + (f" ({run.stop_reason})" if run.stop_reason else "")
                + (f": {log.splitlines()[-1]}" if log else "")
            )
            status, extra = TaskStatus.FAILED, {"error": error}
            if run.reply is not None:
                reply, run.reply = run.reply, None
                reply(None, ShoalError(error + (f"\n{log}" if log else "")))
        elif run.stop_reason == "stopped on request":
            status, extra = TaskStatus.KILLED, {}
        elif run.shutdown_approved:
            status, extra = TaskStatus.COMPLETED, {"result": "shut down on request"}
        else:
            error = run.stop_reason or "the teammate exited unexpectedly"
            status, extra = TaskStatus.FAILED, {"error": error + (f": {log[-300:]}" if log else "")}
        with leader.lock:
            leader.move_task(
                run.task_id,
                status,
                is_idle=False,
                awaiting_plan_approval=False,
                shutdown_requested=False,
                **extra,
            )
            if status == TaskStatus.KILLED:
                leader.registry.mark_notified(run.task_id)
        note = f"teammate {run.name} ended ({status.value})"
        if released:
            note += f"; its tasks {', '.join(str(t.id) for t in released)} went back to pending"
        leader.note(note)

    def stop(self, name: str, reason: str = "stopped on request") -> None:
        """Kill one teammate now (no handshake)."""
        run = self.members.get(name)
        if run is None:
            return
        run.stop_reason = reason
        run.backend.kill(run.handle)
        self._ended(run)

    def member_of_task(self, task_id: str) -> str | None:
        for run in self.members.values():
            if run.task_id == task_id:
                return run.name
        return None

    def shutdown_all(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> list[str]:
        """The shutdown handshake with every teammate; kill who is left after `timeout`.

        Returns the names that had to be killed.
        """
        directory = self.leader.teams.directory(self.leader.team)
        for run in list(self.members.values()):
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            r.backend.is_alive(r.handle) for r in self.members.values()
        ):
            time.sleep(0.02)
        killed = []
        for run in list(self.members.values()):
            if run.backend.is_alive(run.handle):
                killed.append(run.name)
                run.stop_reason = f"did not shut down within {timeout:g}s; killed"
                run.backend.kill(run.handle)
        in_process = [r for r in self.members.values() if isinstance(r.backend, InProcessBackend)]
        with contextlib.suppress(ShoalError):  # one team-file update for all of them
            team = self.leader.team
            self.leader.teams.leave_many(team, [r.name for r in in_process if r.shutdown_approved])
            self.leader.teams.leave_many(
                team, [r.name for r in in_process if not r.shutdown_approved], departed=False
            )
        for run in list(self.members.values()):
            self._ended(run, settle_member=False)
        for backend in self._backends.values():
            with contextlib.suppress(ShoalError):
                backend.close(self.leader.team)
        return killed


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
