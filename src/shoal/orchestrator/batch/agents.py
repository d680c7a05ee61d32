"""Agent tasks of a batch run: the spec's members as teammates, each attempt a list task.

An attempt becomes an entry of the team's shared task list, assigned to its member and marked
`auto_claim: false` (only this assignment gives it out; the run's engine decides retries).
The member runs it as a turn and reports to the lead with a `task_notification` naming the
list task; that report is the attempt's `Finished`. Stopping an attempt aborts the member's
current turn. A workflow's members (`WorkflowAgents`) join the team's long-lived leader
without holding up its loop, and are stopped at the workflow's end.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.events import MessageReceived, TaskTerminated
from shoal.mailbox.router import send
from shoal.orchestrator.batch.spec import MemberSpec, TaskSpec
from shoal.orchestrator.batch.state import Finished, Poster, Started
from shoal.orchestrator.leader import Leader
from shoal.teams.models import LEAD_NAME
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import exit_code_of
from shoal.workers.teammate.members import StopCause

READY_TIMEOUT_S = 120.0


class TeammateDispatcher:
    """The AgentDispatcher of this build (see shoal.orchestrator.batch.state.AgentDispatcher).

    Everything runs on the leader's loop thread: `start` before the loop (it runs the loop
    itself until the members are ready), the rest from the loop's `policy` step and from the
    messages the lead receives (`on_message`)."""

    def __init__(self, leader: Leader, post: Poster) -> None:
        self.leader = leader
        self.post = post
        self.tasks = TaskList(leader.teams, leader.team)
        self._by_item: dict[int, str] = {}  # list task id -> handle
        self._attempts: dict[str, tuple[int, str, float]] = {}  # handle -> (item, member, t0)
        self._members: list[str] = []

    def start(self, members: Sequence[MemberSpec], backend: str, cwd: str) -> None:
        """Spawn every member and wait until all are ready (or say which could not start)."""
        if not members:
            return
        batch = spawn_args(members, backend, cwd)
        outcome: dict[str, Any] = {}

        def reply(result: Any, error: ShoalError | None) -> None:
            outcome["result"], outcome["error"] = result, error

        self.leader.spawn(batch, reply)
        self.leader.run_until(lambda: bool(outcome), READY_TIMEOUT_S)
        if not outcome:
            raise ShoalError(f"the run's teammates were not ready within {READY_TIMEOUT_S:g}s")
        if outcome["error"] is not None:
            raise outcome["error"]
        self._members = [m.name for m in members]

    def dispatch(self, task: TaskSpec, member: MemberSpec, attempt: int) -> str:
        """Give one attempt of `task` to `member`; returns the attempt's handle."""
        handle = f"{task.id}#{attempt}"
        item = self.tasks.add(
            task.description or task.id,
            description=task.prompt or "",
            metadata={"auto_claim": False, "run_task": task.id, "attempt": attempt},
        )
        self._by_item[item.id] = handle
        self._attempts[handle] = (item.id, member.name, time.time())
        self.tasks.update(item.id, owner=member.name, assigned_by=LEAD_NAME)
        self.post(Started(handle, time.time()))
        return handle

    def on_message(self, event: MessageReceived) -> None:
        """A member's report of a turn that was an attempt ends that attempt."""
        if event.kind != "task_notification":
            return
        data = event.data
        item_id = data.get("list_task_id")
        handle = self._by_item.pop(item_id, None) if isinstance(item_id, int) else None
        attempt = self._attempts.pop(handle, None) if handle else None
        if handle is None or attempt is None:
            return
        status = data.get("status", "failed")
        result = str(data.get("result") or "")
        self.post(
            Finished(
                handle,
                status if status in ("completed", "failed", "killed") else "failed",
                exit_code=_exit_code(status, data, result),
                started_at=attempt[2],
                ended_at=time.time(),
                output_file=data.get("output_file"),
                error=None if status == "completed" else result[-500:],
            )
        )
        with contextlib.suppress(ShoalError):
            self.tasks.update(attempt[0], status="deleted")  # the run's report keeps it

    def stop(self, handle: str, reason: str) -> None:
        """Abort the attempt's turn; its member reports it killed."""
        attempt = self._attempts.get(handle)
        if attempt is None:
            return
        with contextlib.suppress(ShoalError):
            send(
                self.leader.teams.directory(self.leader.team),
                to=attempt[1],
                sender=LEAD_NAME,
                kind="control",
                data={
                    "request_id": f"stop-{handle}",
                    "op": "abort_turn",
                    "args": {"reason": reason},
                },
            )


def spawn_args(members: Sequence[MemberSpec], backend: str, cwd: str) -> list[dict[str, Any]]:
    """What the leader's `spawn` takes for the spec's `members`, on `backend`, in `cwd`."""
    return [
        {
            "name": m.name,
            "agent": m.agent,
            "script": m.script,
            "cmd": shlex.join(m.command) if m.command else None,
            "prompt": m.prompt,
            "backend": backend,
            "plan_mode": m.plan_mode,
            "worktree": m.worktree,
            "cwd": cwd,
        }
        for m in members
    ]


def _exit_code(status: object, data: Mapping[str, Any], result: str) -> int | None:
    """The exit code of a finished turn: 0 when it completed; for a failure, the code of the
    command that failed (the notification's `exit_code`, else read from its result text), or
    None when no command decided it (a rejected plan, an aborted turn)."""
    if status == "completed":
        return 0
    code = data.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    return exit_code_of(result)


class WorkflowAgents(TeammateDispatcher):
    """A workflow's members as the team's teammates. `begin` asks the leader to spawn them
    and returns at once (the loop runs on; `ready` or `error` is set when they are up or
    could not start); a member still running from before a leader's restart is taken back
    as it is. A member that ends while it holds an attempt fails that attempt; `end` stops
    the members the workflow started."""

    def __init__(self, leader: Leader, post: Poster, workflow_id: str) -> None:
        super().__init__(leader, post)
        self.workflow_id = workflow_id
        self.ready = False
        self.error: str | None = None
        self.names: list[str] = []

    def begin(self, members: Sequence[MemberSpec], backend: str, cwd: str) -> None:
        swarm = self.leader.swarm
        self.names = [m.name for m in members]
        fresh = []
        for m in members:
            holder = self._holder(m.name)
            if holder is None:
                fresh.append(m)
            elif holder != self.workflow_id:
                self.error = (
                    f"teammate {m.name!r} is already running in team {self.leader.team!r}"
                    f" ({'for workflow ' + holder if holder else 'not for this workflow'});"
                    " rename the [[member]] or stop that teammate"
                )
                self.names = []
                return
        if not fresh:
            self._up()
            return
        batch = spawn_args(fresh, backend, cwd)

        def reply(result: Any, error: ShoalError | None) -> None:
            if error is not None:
                self.error = str(error)
            else:
                self._up()
            self.leader.wake()

        try:
            self.leader.spawn(batch, reply)
        except ShoalError as exc:
            self.error = str(exc)
            self.names = []
            return
        for m in fresh:
            run = swarm.members.get(m.name)
            if run is not None:
                self.leader.set_task(run.task_id, workflow_id=self.workflow_id)

    def _holder(self, name: str) -> str | None:
        """None when no teammate `name` runs; else the workflow it runs for ("" for none)."""
        run = self.leader.swarm.members.get(name)
        if run is None or run.ending is not None or not run.backend.is_alive(run.handle):
            return None
        task = self.leader.get(run.task_id)
        return str(getattr(task, "workflow_id", None) or "")

    def _up(self) -> None:
        self.ready = True
        self._members = list(self.names)

    def on_event(self, event: Any) -> None:
        """Messages may end attempts; a member's end fails the attempt it held."""
        if isinstance(event, MessageReceived):
            self.on_message(event)
            return
        if not isinstance(event, TaskTerminated):
            return
        swarm = self.leader.swarm
        name = next((n for n, r in swarm.members.items() if r.task_id == event.task_id), None)
        if name is None:
            task = self.leader.get(event.task_id)
            identity = getattr(task, "identity", None)
            name = getattr(identity, "agent_name", None)
        for handle, (item, member, started) in list(self._attempts.items()):
            if member != name:
                continue
            self._attempts.pop(handle, None)
            self._by_item.pop(item, None)
            self.post(
                Finished(
                    handle,
                    "failed",
                    started_at=started,
                    ended_at=time.time(),
                    error=f"member {member} ended ({event.status}) during the step",
                )
            )

    def stop_all(self, reason: str) -> None:
        """Abort every attempt in flight (each member reports it killed)."""
        for handle in list(self._attempts):
            self.stop(handle, reason)

    def end(self) -> None:
        """Stop the workflow's members (not news: the workflow's end tells it)."""
        for name in self.names:
            with contextlib.suppress(ShoalError):
                self.leader.swarm.stop(
                    name, StopCause.ON_REQUEST, f"workflow {self.workflow_id} ended"
                )
