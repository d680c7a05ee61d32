"""The teammate runner: one loop shared by every backend (a process, a pane, or in-process).

join -> watch the inbox -> tell the lead it is ready -> loop: next message by priority, a
turn of the brain, progress into the status file, the result to the lead as a
`task_notification`, idle (one notice per change), then claim the next open task. While a
turn runs, shutdown requests, aborts and plan answers are still read.

The run state (idle, busy, stopping, stopped) is a `RunState` (runstate.py); it changes only
through `move_run_state`, and is what the status file's `state` says (status.py). What the
teammate sends its lead, a turn's result among it, is to_lead.py's; its part in the task list
is claims.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.sandbox import Policy
from shoal.mailbox.inbox import Delivery, Inbox
from shoal.mailbox.router import send
from shoal.mailbox.schema import (
    AnyMessage,
    ControlMessage,
    PlanApprovalResponseMessage,
    ShutdownRequestMessage,
    TaskAssignmentMessage,
)
from shoal.mailbox.store import Maildir
from shoal.mailbox.watcher import Watcher, shared_watcher
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import Brain, TurnAborted, TurnContext, TurnResult
from shoal.workers.teammate.claims import TaskClaims
from shoal.workers.teammate.commands import (
    STATUS_KEY,
    CommandRecord,
    dump,
    settle_previous_run,
)
from shoal.workers.teammate.console import Console
from shoal.workers.teammate.runstate import RunState, move_run_state
from shoal.workers.teammate.status import TeammateStatus
from shoal.workers.teammate.to_lead import report_turn, tell_lead

# Kinds read even while a turn runs.
SIDE_KINDS = frozenset({"shutdown_request", "control", "plan_approval_response"})
# How often an idle teammate looks at the task list anyway (a stat; it is read only when
# changed). Changes wake it at once through the watcher; this is the safety net.
IDLE_RECHECK_S = 30.0


@dataclass
class RunnerConfig:
    """How one teammate runs."""

    team: str
    name: str
    brain: Brain
    output_file: Path
    cwd: str
    task_id: str | None = None  # the lead's teammate task id, used in notifications
    plan_mode: bool = False
    sandbox: Policy | None = None  # its commands' kernel sandbox (`--sandbox`)
    backend: str = "process"
    pane_id: str | None = None
    member_pid: int | None = None
    """The pid the team file names for this member, when not this process: the pane's stub of
    a worker forked onto a tmux pane's terminal (teams/backends/pane_stub.py)."""
    joined: bool = False  # the spawner already joined it (in-process batches)
    claim_tasks: bool = True
    agent_type: str = "scripted"
    env: dict[str, str] = field(default_factory=dict)
    # In-process teammates tell their lead (same process) they are ready by this call instead
    # of a message through the inboxes.
    on_ready: Callable[[], None] | None = None
    # In-process teammates also hand each new status to their lead (a copy of what goes into
    # the status file), so that a thousand of them cost the lead no file reads.
    on_status: Callable[[dict[str, Any]], None] | None = None
    # The teammate's output file may not grow past this many bytes (None: no cap); a command
    # that takes it past is killed and its turn fails.
    output_cap: int | None = None
    # Where the teammate shows its work as it happens, one line per event (the worker's
    # stdout: its pane, or its log file); off in-process, where stdout is the leader's.
    console: Console = field(default_factory=Console.off)


class TeammateRunner:
    """Runs one teammate until it is shut down or aborted; `run()` returns its exit code."""

    def __init__(self, layout: Layout, config: RunnerConfig, *, watcher: Watcher | None = None):
        self.layout = layout
        self.config = config
        self.teams = Teams(layout)
        self.tasks = TaskList(self.teams, config.team)
        self.claims = TaskClaims(self.tasks, config.name, layout.tasklist_dir(config.team))
        self.watcher = watcher
        self.name = config.name
        self.team = config.team
        self.console = config.console
        self.exit_code = 0
        # Not started yet counts as idle: nothing is written until `run()` joins the team.
        self._state = RunState.IDLE
        # Why it stops, not a state of its own: True when it approved a shutdown (it then leaves
        # the team), False when aborted. Both stops go through the same `stopping` state.
        self._leave = False
        self._wake: asyncio.Event | None = None
        self._turn: asyncio.Task[TurnResult] | None = None
        self._plan_answers: dict[str, tuple[bool, str | None]] = {}
        # (its lead may set `config.on_status` once the runner is built: it is looked up per write)
        self.status = TeammateStatus(self.teams, config.team, config.name, self._hand_status)
        # Whether the lead has heard of this idle spell (one notice per change): a fact about the
        # notices, not a run state (a teammate is idle before its first turn, and tells no one).
        self._idle_notified = False
        self._turns = 0
        # The commands of the current turn, as listed in the status file until it is settled.
        self._commands: list[CommandRecord] = []
        self._inbox: Inbox | None = None
        self._unwatch_tasks: Callable[[], None] | None = None
        self.ready = asyncio.Event()

    def _hand_status(self, snapshot: dict[str, Any]) -> None:
        if self.config.on_status is not None:
            self.config.on_status(snapshot)

    @property
    def shutdown_approved(self) -> bool:
        """True once the teammate approved a shutdown request (it then leaves the team)."""
        return self._leave

    @property
    def state(self) -> RunState:
        """The run state (what the status file's `state` says once the runner has started)."""
        return self._state

    @property
    def _stopping(self) -> bool:
        """Shut down or aborted: every wait ends and no new turn starts."""
        return self._state in (RunState.STOPPING, RunState.STOPPED)

    def _move(self, target: RunState, **changes: Any) -> None:
        """Move to `target` (IllegalRunTransition if the table forbids it) and write it to the
        status file with `changes`; a refused move changes nothing."""
        self._state = move_run_state(self.name, self._state, target)
        self.status.write(state=target.value, **changes)
        if target is RunState.BUSY:
            self.console.busy(str(changes.get("activity") or "busy"))
        elif target is RunState.IDLE:
            self.console.idle()

    def _begin_stopping(self, **changes: Any) -> None:
        """Enter `stopping` (writing `changes`) unless already stopping or stopped: a second
        shutdown request or SIGTERM is no news, and only its `changes` are written."""
        if not self._stopping:
            self._move(RunState.STOPPING, **changes)
        elif changes:
            self.status.write(**changes)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Join, announce readiness, and serve until shutdown."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        cfg = self.config
        if not cfg.joined:
            self.teams.join(
                self.team,
                self.name,
                pid=cfg.member_pid or os.getpid(),
                agent_type=cfg.agent_type,
                backend=cfg.backend,
                pane_id=cfg.pane_id,
                cwd=cfg.cwd,
                plan_mode_required=cfg.plan_mode,
            )
        wake = self._wake
        self._inbox = Inbox(
            Maildir.open(self.layout.inbox_dir(self.team, self.name)),
            lead=LEAD_NAME,
            watcher=self.watcher or shared_watcher(),
        )

        def wake_loop() -> None:
            loop.call_soon_threadsafe(wake.set)

        self._inbox.add_waker(wake_loop)
        self._watcher = self._inbox._watcher
        if self._watcher is not None and self.config.claim_tasks:
            self._watcher.watch_dir(self.layout.tasklist_dir(self.team), wake_loop)
            self._unwatch_tasks = lambda: self._watcher.unwatch_dir(
                self.layout.tasklist_dir(self.team), wake_loop
            )
        settle_previous_run(self.teams, self.team, self.name)
        self.status.write(
            state=self._state.value,  # idle, unless aborted before it ran
            started_at=time.time(),
            watcher=self._inbox.watcher_mode,
            pid=os.getpid(),
            backend=cfg.backend,
            task_id=cfg.task_id,
        )
        if cfg.on_ready is not None:
            cfg.on_ready()  # a lead in this very process: told directly
        else:
            await self._to_lead(
                "idle_notification", data={"idle_reason": "ready"}, text=f"{self.name} is ready"
            )
        self.console.ready(self.name, self.team, cfg.backend, self._inbox.watcher_mode)
        self.ready.set()
        try:
            await self._serve()
        except asyncio.CancelledError:
            self.exit_code = 143
            raise
        finally:
            self._finish()
        return self.exit_code

    async def _serve(self) -> None:
        assert self._inbox is not None and self._wake is not None
        while not self._stopping:
            delivery = self._inbox.receive(timeout=0)
            if delivery is not None:
                await self._handle(delivery)
                continue
            if self.config.claim_tasks and await self._work_on_next_task():
                continue
            self._become_idle()
            self._wake.clear()
            delivery = self._inbox.receive(timeout=0)
            if delivery is not None:
                await self._handle(delivery)
                continue
            await self._woken(IDLE_RECHECK_S)

    async def _woken(self, timeout: float | None) -> None:
        """Wait until the wake event is set, or `timeout` s.

        Not `asyncio.wait_for`: on Python 3.11 it swallows a cancellation that arrives as the
        event is set (a message woke the loop as the turn was aborted), and an aborted turn would
        then go on waiting.
        """
        assert self._wake is not None
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    def abort(self) -> None:
        """Abort the whole teammate (its current turn too); it exits without a handshake."""
        if not self._stopping:
            self.console.line("abort", "aborting the teammate")
        self._begin_stopping()
        if self._turn is not None:
            self._turn.cancel()
        if self._wake is not None:
            self._wake.set()

    def abort_turn(self) -> bool:
        """Abort only the current turn; the teammate goes on. False when no turn runs."""
        if self._turn is None or self._turn.done():
            return False
        if not self._stopping:
            self.console.line("abort", "aborting the current turn")
        self._turn.cancel()
        return True

    def _finish(self) -> None:
        if self._inbox is not None:
            self._inbox.close()
        if self._unwatch_tasks is not None:
            self._unwatch_tasks()
        with contextlib.suppress(ShoalError, OSError):
            self.tasks.release_member(self.name)
        # Moved outside the suppression: only the write is best effort, never the table.
        self._state = move_run_state(self.name, self._state, RunState.STOPPED)
        with contextlib.suppress(ShoalError, OSError):
            self.status.write(state=RunState.STOPPED.value)
        self.console.line("stopped", f"exit code {self.exit_code}")
        if self._leave and not self.config.joined:
            # (teammates joined by the spawner are marked as departed by it, in one batch)
            with contextlib.suppress(ShoalError, OSError):
                self.teams.leave(self.team, self.name)

    # -- messages ----------------------------------------------------------------------------

    async def _handle(self, delivery: Delivery) -> None:
        assert self._inbox is not None
        msg = delivery.message
        self.status.remember(msg)
        if self.console.enabled:
            self.console.received(msg.kind, msg.from_, _about(msg))
        try:
            await self._dispatch(msg)
        except Exception as exc:  # one bad message must not end the teammate
            self.console.line("error", f"cannot handle that {msg.kind}: {exc!r}")
            await self._to_lead(
                "text",
                text=f"{self.name} could not handle a {msg.kind} message from {msg.from_}: {exc!r}",
            )
        finally:
            self._inbox.ack(delivery)

    async def _dispatch(self, msg: AnyMessage) -> None:
        if msg.kind in SIDE_KINDS:
            await self._handle_side(msg)
        elif isinstance(msg, TaskAssignmentMessage):
            task_id = msg.data.task_id
            if isinstance(task_id, str) and not task_id.isdigit():
                raise ValueError(f"task id {task_id!r} is not a task-list id")
            await self._assigned(int(task_id))
        elif msg.kind == "text":
            await self._run_turn(msg.text or msg.summary or "", None)
        self.status.write(messages=list(self.status.messages))

    async def _handle_side(self, msg: AnyMessage) -> None:
        if isinstance(msg, PlanApprovalResponseMessage):
            self._plan_answers[msg.data.request_id] = (msg.data.approve, msg.data.feedback)
            if self._wake is not None:
                self._wake.set()
        elif msg.kind == "shutdown_request":
            await self._on_shutdown(msg)
        elif msg.kind == "control" and msg.from_ == LEAD_NAME:
            op = msg.data.op  # type: ignore[attr-defined]
            if op == "abort_turn":
                self.abort_turn()
            elif op == "abort":
                self.abort()

    async def _on_shutdown(self, msg: AnyMessage) -> None:
        request_id = msg.data.request_id  # type: ignore[attr-defined]
        policy = getattr(getattr(self.config.brain, "script", None), "on_shutdown", "approve")
        if policy == "ignore":
            self.console.line("shutdown", "request ignored (the script says on_shutdown = ignore)")
            return
        if policy == "reject":
            reason = getattr(self.config.brain, "script").shutdown_reason or "not now"  # noqa: B009
            self.console.line("shutdown", f"rejected: {reason}")
            await self._to_lead(
                "shutdown_response",
                data={"request_id": request_id, "approve": False, "reason": reason},
            )
            return
        self.console.line("shutdown", "approved; leaving the team")
        self._begin_stopping(shutdown_requested=True)
        self._leave = True
        # Answered before the turn is aborted: this may run inside that very turn (reading side
        # messages while it waits for a plan approval), and must not be cut short.
        await self._to_lead("shutdown_response", data={"request_id": request_id, "approve": True})
        # Whatever it was doing, it leaves now: the turn ends, and every wait checks the state.
        self.abort_turn()
        if self._wake is not None:
            self._wake.set()

    # -- turns -------------------------------------------------------------------------------

    async def _assigned(self, task_id: int) -> None:
        try:
            item = self.claims.take_assigned(task_id)
        except ShoalError as exc:
            self.console.line("task", f"cannot take task {task_id}: {exc}")
            await self._to_lead("text", text=f"{self.name} cannot take task {task_id}: {exc}")
            return
        if item is not None:
            self.console.task(f"took assigned task {item.id}: {item.subject}")
            await self._run_turn(item.description or item.subject, item.model_dump(mode="json"))

    async def _work_on_next_task(self) -> bool:
        item = self.claims.claim_next()
        if item is None:
            return False
        self.console.task(f"claimed task {item.id}: {item.subject}")
        await self._run_turn(item.description or item.subject, item.model_dump(mode="json"))
        return True

    async def _run_turn(self, prompt: str, task: dict[str, Any] | None) -> None:
        assert self._inbox is not None and self._wake is not None
        self._idle_notified = False
        self._turns += 1
        started = time.monotonic()
        subject = (task or {}).get("subject") or prompt
        self._move(
            RunState.BUSY,
            current_task=(task or {}).get("id"),
            activity=f"working on {subject[:80]}",
        )
        ctx = TurnContext(
            name=self.name,
            team=self.team,
            prompt=prompt,
            cwd=self.config.cwd,
            output_file=self.config.output_file,
            task=task,
            send=self._send_text,
            update_task=self._update_task,
            approve_plan=self._approve_plan,
            activity=self._activity,
            plan_mode=self.config.plan_mode,
            sandbox=self.config.sandbox,
            env=self.config.env,
            track=self._track_command,
            output_cap=self.config.output_cap,
            console=self.console,
        )
        self._turn = asyncio.create_task(self.config.brain.turn(ctx))
        cancelled = False  # a fact about this turn, not the run: it was cancelled once already
        while not self._turn.done():
            if self._stopping and not cancelled:
                cancelled = True  # the teammate is stopping: its turn must end (once is enough)
                self._turn.cancel()
            side = self._inbox.receive(timeout=0, where=lambda m: m.kind in SIDE_KINDS)
            if side is not None:
                await self._handle(side)
                continue
            self._wake.clear()
            waiter = asyncio.create_task(self._wake.wait())
            try:
                await asyncio.wait({self._turn, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        aborted = self._turn.cancelled()
        try:
            result = None if aborted else self._turn.result()
        except TurnAborted as exc:
            result = TurnResult(False, f"aborted: {exc}")
        except ShoalError as exc:
            result = TurnResult(False, str(exc))
        except OSError as exc:  # (a file it could not read or write: named, with the reason)
            where = f" {exc.filename}" if exc.filename else ""
            result = TurnResult(False, f"{exc.strerror or type(exc).__name__}{where}")
        except Exception as exc:  # a brain bug ends the turn, never the teammate
            result = TurnResult(False, f"internal error: {exc!r}")
        self._turn = None
        if result is None:
            result = TurnResult(False, "turn aborted")
        # A turn cut short because the teammate is stopping was aborted, whatever it raised;
        # so was one whose pane went away (whoever settles the member kills its commands).
        aborted = aborted or ((self._stopping or self._orphaned()) and not result.ok)
        self.status.end_turn(result.steps, result.tokens)
        if task is not None:
            cut_short = not result.ok and (self._stopping or self._orphaned())
            self.claims.settle(int(task["id"]), result, cut_short, self._commands)
        self.status.summary = report_turn(
            self.teams,
            self.team,
            self.name,
            self.console,
            task_id=self.config.task_id,
            output_file=self.config.output_file,
            subject=subject,
            result=result,
            aborted=aborted,
            started=started,
            list_task_id=(task or {}).get("id"),
        )
        # Its task is settled: its commands are no longer anyone's business.
        commands, self._commands = self._commands, []
        ended: dict[str, Any] = {
            "current_task": None,
            "progress": self.status.progress(),
            "last_result": result.result[-500:],
            STATUS_KEY: [],
        }
        if self._stopping:
            self.status.write(**ended)  # it stays stopping: the runner's loop ends next
        else:
            self._move(RunState.IDLE, **ended)
        for record in commands:
            record.remove_side_files()

    def _orphaned(self) -> bool:
        """Whether the pane this teammate runs on has gone: its member pid (the pane's stub)
        died. The leader then settles the member and KILLs its commands, which this
        process, not yet hung up, would otherwise count as the task's failure."""
        pid = self.config.member_pid
        return pid is not None and pid != os.getpid() and not is_alive(pid, None)

    def _track_command(self, record: CommandRecord) -> None:
        """List a command of this turn in the status file before it may run (raises when the
        file cannot be written: the command must not run unrecorded)."""
        self._commands.append(record)
        self.status.write(**{STATUS_KEY: dump(self._commands)})

    def _become_idle(self) -> None:
        if self._state is not RunState.IDLE:
            self._move(RunState.IDLE)
        if self._turns and not self._idle_notified:
            self._idle_notified = True
            asyncio.get_running_loop().create_task(
                self._to_lead(
                    "idle_notification",
                    data={"idle_reason": "available"},
                    text=f"{self.name} is idle",
                )
            )

    # -- brain callbacks -----------------------------------------------------------------------

    def _activity(self, text: str) -> None:
        # Brains report one activity per step (tool use), so the count is live during a turn.
        self.console.step(text)
        self.status.step(text)

    async def _send_text(self, to: str, text: str) -> None:
        send(self.teams.directory(self.team), to=to, sender=self.name, text=text)
        self.console.sent("text", to, text)

    async def _update_task(self, task_id: int, status: str) -> None:
        self.tasks.update(task_id, status=status)

    async def _approve_plan(self, plan: str) -> tuple[bool, str | None]:
        # Waiting for a plan approval is not a run state: it happens inside a busy turn and is
        # written as its own key (`awaiting_approval`) next to `state`, which stays `busy`.
        assert self._wake is not None
        request_id = secrets.token_hex(8)
        self.status.write(
            awaiting_approval={"request_id": request_id, "plan": plan},
            activity="awaiting plan approval",
        )
        self.console.line(
            "plan", f"asks {LEAD_NAME} to approve (shoal approve {self.name}): {plan}"
        )
        await self._to_lead(
            "plan_approval_request", text=plan, data={"request_id": request_id, "plan": plan}
        )
        assert self._inbox is not None
        try:
            while request_id not in self._plan_answers:
                if self._stopping:  # shut down or aborted while waiting: no answer will matter
                    raise TurnAborted("the teammate is stopping")
                side = self._inbox.receive(timeout=0, where=lambda m: m.kind in SIDE_KINDS)
                if side is not None:
                    await self._handle(side)
                    continue
                self._wake.clear()
                if request_id in self._plan_answers or self._stopping:
                    continue
                await self._woken(IDLE_RECHECK_S)
        except BaseException:
            self.status.write(awaiting_approval=None)
            raise
        approved, feedback = self._plan_answers.pop(request_id)
        self.console.line(
            "approval",
            "plan approved" if approved else f"plan rejected: {feedback or 'no reason given'}",
        )
        self.status.write(
            awaiting_approval=None, activity="plan approved" if approved else "plan rejected"
        )
        return approved, feedback

    # -- output --------------------------------------------------------------------------------

    async def _to_lead(
        self,
        kind: str,
        *,
        text: str | None = None,
        summary: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        tell_lead(
            self.teams,
            self.team,
            self.name,
            self.console,
            kind,
            text=text,
            summary=summary,
            data=data,
        )


def _about(msg: AnyMessage) -> str:
    """What a received message is about, for its console line (previewed there)."""
    if isinstance(msg, TaskAssignmentMessage):
        return f"task {msg.data.task_id}: {msg.data.subject}"
    if isinstance(msg, ShutdownRequestMessage):
        return msg.data.reason or msg.text or ""
    if isinstance(msg, PlanApprovalResponseMessage):
        verdict = "approved" if msg.data.approve else "rejected"
        return verdict + (f": {msg.data.feedback}" if msg.data.feedback else "")
    if isinstance(msg, ControlMessage):
        return msg.data.op
    return msg.text or msg.summary or ""
