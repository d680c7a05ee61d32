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
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from shoal.core.errors import ShoalError, UsageError
from shoal.core.events import TeammateReady, TeammateSpawned
from shoal.core.output import create_output_file, tail
from shoal.core.procs import is_alive
from shoal.core.taskrecords import TeammateIdentity
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    InProcessTeammateTaskState,
    TaskStatus,
    TaskType,
)
from shoal.mailbox.router import send
from shoal.mailbox.schema import AnyMessage
from shoal.mailbox.watcher import shared_watcher as get_watcher
from shoal.teams.backends.base import Backend, Handle, SpawnSpec, get_backend
from shoal.teams.backends.inprocess import InProcessBackend
from shoal.teams.colors import pick_color
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import JoinSpec
from shoal.workers.kinds import Poll, TaskStore
from shoal.workers.teammate.members import (
    SHUTDOWN_TIMEOUT_S,
    BatchReply,
    MemberRecords,
    MemberRun,
    Phase,
    Reply,
    StopCause,
    SwarmHost,
    _cut,
    _outcome,
    ready_timeout,
)
from shoal.workers.teammate.spawn_plan import SpawnBatch, SpawnPlan, plan_spawn
from shoal.workers.teammate.worker import WorkerOptions, build_runner


class Swarm(MemberRecords):
    """Teammates of one leader: the task kind of `in_process_teammate` tasks."""

    types = frozenset({TaskType.IN_PROCESS_TEAMMATE})

    def __init__(self, host: SwarmHost) -> None:
        super().__init__(host)
        self._backends: dict[str, Backend] = {}
        self._ready_early: set[str] = set()
        self._ready_signals: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._exited: set[str] = set()
        self._shutdown_deadline: float | None = None
        self._shutdown_timeout = SHUTDOWN_TIMEOUT_S
        # The options of in-process teammates being started, for the backend's factory.
        self._in_process_options: dict[str, WorkerOptions] = {}
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
        for name in names:  # a dead one not yet noticed is settled before a new one replaces it
            run = self.members.get(name)
            if run is not None and run.ending is None and not run.backend.is_alive(run.handle):
                self._ended(run)
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
        collector = SpawnBatch(len(plans), reply)
        for plan in plans:
            self._start(plan, collector)
        leader.wake()

    def _plan(self, args: dict[str, Any], tf: Any) -> SpawnPlan:
        return plan_spawn(self.leader, self.members, self._in_process, args, tf)

    def _start(self, plan: SpawnPlan, collector: SpawnBatch) -> None:
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
            plan.backend.on_done(handle, partial(self._on_done, plan.name))
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

    def check(self, full: bool = True) -> None:
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
        exited, self._exited = self._exited, set()
        if full or late:
            runs = list(self.members.values())
        else:  # between ticks: only those with news (an end signalled, a kill or deadline due)
            runs = [
                r
                for r in self.members.values()
                if r.name in exited
                or r.ending is not None
                or (not r.became_ready and now > r.deadline)
            ]
        for run in runs:
            alive = run.backend.is_alive(run.handle)
            if run.ending is not None:  # being killed: KILL once its grace is over
                if run.ending.advance(now, alive=alive):
                    run.backend.kill(run.handle)  # (what is left: its pane, its zombie)
                    ended.append(run)
                continue
            if alive and not run.became_ready and now > run.deadline:
                run.end_because(
                    StopCause.NOT_READY, f"not ready within {run.deadline - run.launched:.0f}s"
                )
                alive = not self._begin_kill(run)
            elif alive and late:
                timeout = self._shutdown_timeout
                run.end_because(
                    StopCause.SHUTDOWN_TIMEOUT, f"did not shut down within {timeout:g}s; killed"
                )
                self.leader.note(f"killed teammate {run.name}: it did not shut down in time")
                alive = not self._begin_kill(run)
            if not alive and run.ending is None:
                ended.append(run)
        for run in ended:
            self._ended(run, settle_member=False)
        self._leave([r for r in ended if r.in_process])
        if self._shutdown_deadline is not None and not self.members:
            self._close_backends()

    def _ended(self, run: MemberRun, *, settle_member: bool = True) -> None:
        leader = self.leader
        self._refresh(run)  # its last progress and messages
        if run.cause is None and (run.status or {}).get("shutdown_requested"):
            # It approved a shutdown and ended before its answer reached the lead's inbox: its
            # own status says so (an in-process teammate's end is seen at once, its mail not).
            run.end_because(StopCause.SHUTDOWN_APPROVED)
        self.members.pop(run.name, None)
        with self._push_lock:
            self._pushed.pop(run.name, None)
        if settle_member and run.in_process:
            self._leave([run])
        leader.unwatch_pid(f"member:{run.name}")
        run.move(Phase.ENDED)
        settled, released = self._settle_tasks(run.name)
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
        if settled.describe(run.name):
            note += f"; {settled.describe(run.name)}"
        if released:
            note += f"; its tasks {', '.join(str(t.id) for t in released)} went back to pending"
        leader.note(note)

    def stop(
        self, name: str, cause: StopCause = StopCause.ON_REQUEST, detail: str | None = None
    ) -> None:
        """Kill one teammate now (no handshake); `detail` says why, in words."""
        run = self.members.get(name)
        if run is None:
            return
        run.end_because(cause, detail)
        if self._begin_kill(run):
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

    def _close_backends(self) -> None:
        for backend in self._backends.values():
            with contextlib.suppress(ShoalError):
                backend.close(self.leader.team)
        self._backends.clear()

    # -- the TaskKind protocol (teammates are started by `spawn`, supervised by `check`) -----

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        store.move_task(task.id, TaskStatus.FAILED, error="a teammate starts with `shoal spawn`")

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        """Nothing per task: `check` looks at every teammate at once (one stat of the status
        directory for a thousand quiet ones)."""

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        name = self.member_of_task(task.id)
        if name is None:
            store.move_task(task.id, TaskStatus.KILLED)
            return
        if reason == STOPPED_ON_REQUEST:
            self.stop(name)
        else:  # (killed for a reason of the leader's, e.g. a shutdown: it says which)
            self.stop(name, StopCause.KILLED, reason)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, InProcessTeammateTaskState)
        if self.adopt_member(task):
            store.note(f"adopted teammate {task.identity.agent_name} ({task.id})")
        else:
            name = task.identity.agent_name
            settled, released = self._settle_tasks(name)
            if settled.describe(name) or released:
                back = ", ".join(str(t.id) for t in released)
                store.note(
                    f"teammate {name} ended while no leader was running"
                    + (f"; {settled.describe(name)}" if settled.describe(name) else "")
                    + (f"; its tasks {back} went back to pending" if back else "")
                )
            store.move_task(
                task.id, TaskStatus.FAILED, error="the teammate ended while no leader was running"
            )

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        return {}  # (result and usage are the task's own fields)

    def live(self) -> Iterable[str]:
        return [r.task_id for r in self.members.values()]

    def signalled(self) -> Iterable[str]:
        return ()  # (`check` looks at the members whose end was signalled, in its own step)

    def _on_done(self, name: str) -> None:
        """An in-process teammate's coroutine ended (called on its loop's thread)."""
        self._exited.add(name)
        self.leader.wake()

    def on_exit(self, key: str) -> bool:
        if key.startswith("member:"):
            self._exited.add(key.removeprefix("member:"))
            return True
        return False

    def next_due(self) -> float | None:
        due = [r.deadline for r in self.members.values() if not r.became_ready]
        due += [r.ending.next_due() for r in self.members.values() if r.ending is not None]
        if self._shutdown_deadline is not None and self.members:
            due.append(self._shutdown_deadline)
        return min(due, default=None)

    def running(self) -> int:
        return 0  # (teammates take no job slots)
