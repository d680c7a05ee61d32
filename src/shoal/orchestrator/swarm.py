"""The leader's side of a swarm: spawning teammates, waiting for them to be ready, noticing
when they die, and the shutdown handshake.

Each teammate is also a task in the leader's registry (type `in_process_teammate`, whatever
its backend), so it has an id, a status and exactly one notification like any other task.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.errors import ConflictError, ShoalError, UsageError
from shoal.core.names import validate_name
from shoal.core.output import create_output_file, tail
from shoal.core.procs import is_alive
from shoal.core.tasks import (
    InProcessTeammateTaskState,
    TaskStatus,
    TaskType,
    TeammateIdentity,
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

SPAWN_TIMEOUT_S = float(os.environ.get("SHOAL_SPAWN_TIMEOUT", "30"))
SHUTDOWN_TIMEOUT_S = float(os.environ.get("SHOAL_SHUTDOWN_TIMEOUT", "10"))

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
    argv: list[str]
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
    log_file: Path | None = None
    shutdown_approved: bool = False
    stop_reason: str | None = None


class Swarm:
    """Teammates of one leader."""

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.members: dict[str, MemberRun] = {}
        self._backends: dict[str, Backend] = {}
        self._ready_early: set[str] = set()
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
        layout, team = leader.layout, leader.team
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
        argv = [
            sys.executable,
            "-m",
            "shoal",
            "--home",
            str(layout.home),
            "worker",
            "--team",
            team,
            "--name",
            name,
            "--agent",
            agent,
            "--task-id",
            task_id,
            "--output",
            str(output),
            "--cwd",
            cwd,
            "--backend",
            backend.name,
        ]
        if script:
            argv += ["--script", str(Path(script).resolve())]
        if cmd:
            argv += ["--cmd", str(cmd)]
        if plan_mode:
            argv.append("--plan-mode")
        if in_process:
            argv.append("--joined")
        return _Plan(
            name=name,
            agent=agent,
            backend=backend,
            why=why,
            cwd=cwd,
            argv=argv,
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
            argv=plan.argv,
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
        try:
            handle = plan.backend.spawn(spec)
        except Exception as exc:  # whatever the backend raised, the task must not hang
            error = (
                exc
                if isinstance(exc, ShoalError)
                else ShoalError(
                    f"cannot start teammate {plan.name!r} with backend {plan.backend.name}: {exc!r}"
                )
            )
            with leader.lock:
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
                deadline=time.monotonic() + SPAWN_TIMEOUT_S,
                log_file=spec.log_file,
            )
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
        from shoal.workers.worker import runner_from_argv

        runner = runner_from_argv(self.leader.layout, spec.argv)
        leader = self.leader

        def ready() -> None:  # called on the in-process loop's thread
            with leader.lock:
                run = self.members.get(spec.name)
                if run is not None:
                    self._ready(run)
                else:  # ready before `_start` has recorded it: it will look here
                    self._ready_early.add(spec.name)

        runner.config.on_ready = ready
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
        """React to a teammate's message (readiness, shutdown answers, progress)."""
        run = self.members.get(msg.from_)
        if run is None:
            return
        data = msg.data.model_dump()
        if msg.kind == "idle_notification" and data.get("idle_reason") == "ready":
            self._ready(run)
        elif msg.kind == "idle_notification":
            self._update_teammate(run, is_idle=True)
        elif msg.kind == "task_notification":
            self._update_teammate(run, is_idle=False)
        elif msg.kind == "plan_approval_request":
            self._update_teammate(run, awaiting_plan_approval=True)
        elif msg.kind == "shutdown_response":
            run.shutdown_approved = bool(data.get("approve"))
            if not run.shutdown_approved:
                self.leader.note(
                    f"{run.name} declined to shut down: {data.get('reason') or 'no reason given'}"
                )

    def _update_teammate(self, run: MemberRun, **changes: Any) -> None:
        with contextlib.suppress(ShoalError, TypeError):
            self.leader.set_task(run.task_id, **changes)

    def _ready(self, run: MemberRun) -> None:
        if run.ready:
            return
        run.ready = True
        self._update_teammate(run, is_idle=True)
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
        """Notice teammates that died (or never became ready) and settle their tasks."""
        now = time.monotonic()
        for run in list(self.members.values()):
            alive = run.backend.is_alive(run.handle)
            if alive and not run.ready and now > run.deadline:
                run.backend.kill(run.handle)
                alive = False
                run.stop_reason = f"not ready within {SPAWN_TIMEOUT_S:g}s"
            if alive:
                continue
            self._ended(run)

    def _ended(self, run: MemberRun, *, settle_member: bool = True) -> None:
        leader = self.leader
        self.members.pop(run.name, None)
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
            leader.move_task(run.task_id, status, is_idle=False, **extra)
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
