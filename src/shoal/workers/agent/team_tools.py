"""The team tools an agent sees beside the file tools: SendMessage, TaskCreate, TaskGet,
TaskList, TaskUpdate (the team's shared task list), TaskOutput and TaskStop (tasks of the
team's leader). Names and argument names are what the model sees; keep them exactly.

They work on the team's files (the list, the inboxes, the session's output files) and, for
what changes a running task, ask the leader through its control channel. A refusal is a
ToolFailure: a tool error for the model, never a crash of the agent.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import AliasChoices, Field

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.workers.agent.tool_args import ToolArgs, ToolFailure

# What one TaskOutput call shows of a task's output (the original's 65KB), read by seeking:
# an output of any size is never read whole.
TASK_OUTPUT_MAX_BYTES: Final = 65_536


class LeaderPort(Protocol):
    """How an agent reaches its team's leader (its control channel, its session's records);
    given by the orchestrator, which this layer does not import."""

    def call(self, op: str, args: dict[str, Any]) -> Any:
        """Ask the leader to carry out `op` (blocking); raises its refusal."""
        ...

    def task_records(self) -> dict[str, dict[str, Any]]:
        """The session's task records by id (live and evicted)."""
        ...


class SendMessageArgs(ToolArgs):
    to: str = Field(description="A member's name, '*' for every member, or an agent task id")
    message: str = Field(min_length=1, description="The text to send")


class TaskCreateArgs(ToolArgs):
    subject: str = Field(min_length=1, description="A short title, in the imperative")
    description: str = Field("", description="What has to be done")
    activeForm: str | None = Field(None, description="Present continuous form for spinners")
    metadata: dict[str, Any] | None = Field(None, description="Free-form data")


class TaskGetArgs(ToolArgs):
    taskId: str = Field(description="The id of a task of the shared list")


class TaskListArgs(ToolArgs):
    pass


class TaskUpdateArgs(ToolArgs):
    taskId: str = Field(description="The id of a task of the shared list")
    status: str | None = Field(None, description="pending, in_progress or completed")
    owner: str | None = Field(None, description="The member that owns it")
    subject: str | None = None
    description: str | None = None
    activeForm: str | None = None
    metadata: dict[str, Any] | None = None
    addBlockedBy: list[str] | None = None
    addBlocks: list[str] | None = None


class TaskOutputArgs(ToolArgs):
    task_id: str = Field(description="The id of a background task (e.g. b1a2b3c4d)")
    offset: int | None = Field(
        None,
        ge=0,
        description="Read from this byte of the output (a previous call names it); "
        "omitted: its last 65,536 bytes",
    )


class TaskStopArgs(ToolArgs):
    task_id: str = Field(
        validation_alias=AliasChoices("task_id", "shell_id"),
        description="The id of the background task to stop",
    )


class TeamCreateArgs(ToolArgs):
    team_name: str = Field(description="The new team's name ([a-z][a-z0-9_-]*)")
    description: str = Field("", description="What the team is for")


class TeamDeleteArgs(ToolArgs):
    team_name: str = Field(description="The team to delete (it must have no active members)")


class AgentArgs(ToolArgs):
    description: str = Field(min_length=1, description="A short (3-5 word) name for the task")
    prompt: str = Field(min_length=1, description="The task for the agent to carry out")
    subagent_type: str | None = Field(
        None, description="The agent type (see `shoal agents`); omitted: a fork when forking is on"
    )


# Opens the first message of a fork: a fork's history carries it, so a fork cannot fork.
FORK_TAG: Final = "<fork-boilerplate>"
TERMINAL: Final = frozenset({"completed", "failed", "killed"})
SUBAGENT_POLL_S: Final = 0.1

TEAM_TOOL_SPECS: Final[tuple[tuple[str, type[ToolArgs], str], ...]] = (
    ("SendMessage", SendMessageArgs, "Send a message to a teammate, everyone, or an agent."),
    ("TaskCreate", TaskCreateArgs, "Add a task to the team's shared task list."),
    ("TaskGet", TaskGetArgs, "Read one task of the team's shared task list."),
    ("TaskList", TaskListArgs, "List the team's shared task list."),
    ("TaskUpdate", TaskUpdateArgs, "Change a task of the team's shared task list."),
    ("TaskOutput", TaskOutputArgs, "Read the output of a background task."),
    ("TaskStop", TaskStopArgs, "Stop a running background task."),
    ("Agent", AgentArgs, "Run a subagent on a task and wait for its answer."),
    (
        "TeamCreate",
        TeamCreateArgs,
        "Create a team (a lead, an empty list, no members yet); a taken name gets a word slug; "
        "refused while this agent's leader leads a team (one team per leader).",
    ),
    (
        "TeamDelete",
        TeamDeleteArgs,
        "Delete a team; refused while it has active members (ask them to shut down first).",
    ),
)


def signed(sender: str, text: str) -> str:
    """An agent's message as its recipient reads it: headed by the sending agent's id, so no
    agent's words pass for the lead's (or another agent's)."""
    return f"[message from agent {sender}]\n{text}"


def _list_id(raw: str) -> int:
    text = raw.strip().lstrip("#")
    if not text.isdigit():
        raise ToolFailure(f"{raw!r} is not a task id of the shared list (a number)")
    return int(text)


@dataclass
class TeamTools:
    """The team tools of one agent task (`task_id`) of team `team`."""

    home: Path
    team: str
    task_id: str
    leader: LeaderPort
    cwd: str = "."
    model: str | None = None  # what a subagent inherits
    fork: bool = False  # Agent without subagent_type forks this agent
    in_fork: bool = False  # this agent is a fork (it cannot fork again)

    @property
    def layout(self) -> Layout:
        return Layout(self.home)

    def _tasklist(self) -> Any:
        from shoal.teams.store import Teams
        from shoal.teams.tasklist import TaskList

        return TaskList(Teams(self.layout), self.team)

    async def sendmessage(self, args: SendMessageArgs) -> str:
        from shoal.core.tasks import TASK_ID_PATTERN

        if TASK_ID_PATTERN.fullmatch(args.to) and args.to[0] == "a":
            answer = await asyncio.to_thread(
                self.leader.call,
                "agent_send",
                {"task_id": args.to, "text": args.message, "sender": self.task_id},
            )
            return f"sent to agent {args.to} (task {answer['task_id']})"
        from shoal.mailbox.router import send
        from shoal.teams.store import Teams

        result = await asyncio.to_thread(
            send,
            Teams(self.layout).directory(self.team),
            to=args.to,
            sender=self.task_id,  # (signed as this agent: never as the lead)
            text=signed(self.task_id, args.message),
            summary=f"from agent {self.task_id}",
        )
        return f"sent to {', '.join(result.recipients) or args.to} (message {result.id})"

    def taskcreate(self, args: TaskCreateArgs) -> str:
        item = self._tasklist().add(
            args.subject,
            description=args.description,
            active_form=args.activeForm,
            metadata=args.metadata,
        )
        return f"created task #{item.id}: {item.subject}"

    def taskget(self, args: TaskGetArgs) -> str:
        return json.dumps(self._tasklist().get(_list_id(args.taskId)).to_json(), indent=1)

    def tasklist(self, args: TaskListArgs) -> str:
        items = self._tasklist().list()
        if not items:
            return "the task list is empty"
        return "\n".join(
            f"#{t.id} [{t.status}] {t.subject}" + (f" (owner {t.owner})" if t.owner else "")
            for t in items
        )

    def taskupdate(self, args: TaskUpdateArgs) -> str:
        changes: dict[str, Any] = {}
        for field_name, key in (
            ("status", "status"),
            ("subject", "subject"),
            ("description", "description"),
            ("metadata", "metadata"),
        ):
            value = getattr(args, field_name)
            if value is not None:
                changes[key] = value
        if args.owner is not None:
            changes["owner"] = args.owner or None
        if args.activeForm is not None:
            changes["active_form"] = args.activeForm
        changes["add_blocked_by"] = [_list_id(i) for i in args.addBlockedBy or ()]
        changes["add_blocks"] = [_list_id(i) for i in args.addBlocks or ()]
        item = self._tasklist().update(_list_id(args.taskId), **changes)
        return f"updated task #{item.id}: [{item.status}] {item.subject}"

    def taskoutput(self, args: TaskOutputArgs) -> str:
        from shoal.core.output import read_window

        task = self.leader.task_records().get(args.task_id)
        if task is None:
            raise ToolFailure(f"no task {args.task_id} in team {self.team}")
        try:
            text, start, end, size = read_window(
                task["output_file"], args.offset, TASK_OUTPUT_MAX_BYTES
            )
        except (OSError, ShoalError) as exc:
            raise ToolFailure(f"cannot read the output of {args.task_id}: {exc}") from None
        lines = [f"status: {task['status']}"]
        if start > 0:
            lines.append(f"[{start:,} earlier bytes not shown: offset=0 reads from the start]")
        if text:
            lines.append(text)
        if args.offset is not None and args.offset > size:
            lines.append(f"[offset {args.offset:,} is past the end: the output has {size:,} bytes]")
        if end < size:
            lines.append(f"[{size - end:,} later bytes not shown: offset={end} reads on]")
        return "\n".join(lines)

    async def taskstop(self, args: TaskStopArgs) -> str:
        try:
            final = await asyncio.to_thread(self.leader.call, "stop", {"task_id": args.task_id})
        except ShoalError as exc:
            raise ToolFailure(str(exc)) from None
        return f"task {args.task_id} is {final['status']}"

    def teamcreate(self, args: TeamCreateArgs) -> str:
        from shoal.teams.founding import found
        from shoal.teams.store import Teams

        # (this agent's leader leads its team: one team per leader, as `team create --team`)
        made = found(Teams(self.layout), args.team_name, args.description, leader_of=self.team)
        return "\n".join(made.lines())

    def teamdelete(self, args: TeamDeleteArgs) -> str:
        from shoal.teams.store import Teams

        if args.team_name == self.team:
            raise ToolFailure(f"team {self.team} is this agent's own team; it cannot delete it")
        Teams(self.layout).delete(args.team_name)
        return f"deleted team {args.team_name}"

    async def agent(self, args: AgentArgs) -> str:
        """Start a subagent (a `local_agent` task of the leader, in-process) and wait for it."""
        spec: dict[str, Any] = {
            "prompt": args.prompt,
            "description": args.description,
            "agent_type": args.subagent_type,
            "cwd": self.cwd,
            "backend": "in-process",
            "inherit_model": self.model,
            "parent_agent": self.task_id,
        }
        if args.subagent_type is None and self.in_fork:
            raise ToolFailure("a fork cannot fork again; give subagent_type to start an agent")
        if args.subagent_type is None and self.fork:
            spec["fork_of"] = self.task_id
        else:
            spec["subagent"] = True  # (it gets no Agent tool: subagents do not nest)
        try:
            record = await asyncio.to_thread(self.leader.call, "agent", {"spec": spec})
        except ShoalError as exc:
            raise ToolFailure(str(exc)) from None
        child = str(record["id"])
        try:
            while True:
                task = (await asyncio.to_thread(self.leader.task_records)).get(child) or {}
                if task.get("status") in TERMINAL:
                    break
                await asyncio.sleep(SUBAGENT_POLL_S)
        except asyncio.CancelledError:  # the parent was stopped: so is its subagent
            import threading

            threading.Thread(
                target=lambda: self.leader.call("stop", {"task_id": child}), daemon=True
            ).start()
            raise
        usage = task.get("usage") or {}
        cost = f"{usage.get('total_tokens', 0)} tokens, {usage.get('tool_uses', 0)} tool uses"
        if task["status"] == "completed":
            return f"agent {child} completed ({cost}):\n{task.get('result') or ''}"
        raise ToolFailure(f"agent {child} {task['status']}: {task.get('error') or 'no result'}")


class CoordinatorAgentArgs(ToolArgs):
    description: str = Field(min_length=1, description="A short (3-5 word) name for the task")
    prompt: str = Field(
        min_length=1,
        description="The whole task: files, lines, the cause, what to do, how to check it",
    )
    subagent_type: str | None = Field(
        None,
        description='The agent type (see `shoal agents`); omitted or "worker": the built-in worker',
    )
    write_set: Any = Field(
        None,
        description="Globs (relative to the working directory) of the files this worker may "
        "change; omitted: the worker is read-only",
    )
    network: bool = Field(
        False, description="Whether the worker's commands may use the network (off by default)"
    )
    budget: Any = Field(
        None,
        description='Its share of the run budget, e.g. {"tokens": 20000, "tool_uses": 40, '
        '"seconds": 600}; omitted: what the run has left',
    )


class PrActivityArgs(ToolArgs):
    repo: str = Field(description="The repository, owner/name (e.g. octo-org/octo-repo)")
    number: int = Field(ge=1, description="The pull request's number")


COORDINATOR_TOOL_SPECS: Final[tuple[tuple[str, type[ToolArgs], str], ...]] = (
    (
        "Agent",
        CoordinatorAgentArgs,
        "Start a worker in the background; its end arrives as a <task-notification>.",
    ),
    ("SendMessage", SendMessageArgs, "Continue a worker (running or finished) by its task id."),
    ("TaskStop", TaskStopArgs, "Stop a worker (its shells and subagents stop with it)."),
    (
        "subscribe_pr_activity",
        PrActivityArgs,
        "Watch a GitHub pull request: each new comment, review, review comment, finished "
        "check run, push or close arrives as a <pr-activity> notification.",
    ),
    (
        "unsubscribe_pr_activity",
        PrActivityArgs,
        "Stop watching a pull request subscribed to with subscribe_pr_activity.",
    ),
)


@dataclass
class CoordinatorTools(TeamTools):
    """A coordinator's tools: Agent (a background worker), SendMessage, TaskStop, and
    subscribe_pr_activity / unsubscribe_pr_activity (the leader polls GitHub for it)."""

    async def _pr(self, op: str, args: PrActivityArgs) -> dict[str, Any]:
        request = {"agent": self.task_id, "repo": args.repo, "number": args.number}
        try:
            answer: dict[str, Any] = await asyncio.to_thread(self.leader.call, op, request)
        except ShoalError as exc:
            raise ToolFailure(str(exc)) from None
        return answer

    async def subscribe_pr_activity(self, args: PrActivityArgs) -> str:
        answer = await self._pr("pr_subscribe", args)
        pr = f"{args.repo}#{args.number}"
        if answer.get("already"):
            return f"already subscribed to {pr}"
        return (
            f"subscribed to {pr} (at {answer['api']}): what happens from now on arrives as "
            "<pr-activity> notifications; unsubscribe_pr_activity stops them. While you are "
            "subscribed you are not done: unsubscribe when the PR no longer needs you."
        )

    async def unsubscribe_pr_activity(self, args: PrActivityArgs) -> str:
        await self._pr("pr_unsubscribe", args)
        return f"unsubscribed from {args.repo}#{args.number}"

    async def agent(self, args: CoordinatorAgentArgs) -> str:  # type: ignore[override]
        spec: dict[str, Any] = {
            "prompt": args.prompt,
            "description": args.description,
            "agent_type": args.subagent_type,
            "worker_for": self.task_id,
            "write_set": args.write_set,
            "allow_network": args.network,
            "budget": args.budget,
        }
        try:
            record = await asyncio.to_thread(self.leader.call, "agent", {"spec": spec})
        except ShoalError as exc:
            raise ToolFailure(str(exc)) from None
        worker = str(record["id"])
        waiting = (record.get("waiting_for") or {}).get("lease")
        lease = ", ".join(record.get("write_set") or ()) or "none: read-only"
        how = f"waiting for the lease of {waiting}" if waiting else "running"
        return (
            f"started worker {worker} ({args.description}; write set: {lease}): {how}. Its "
            "result arrives as a <task-notification>; SendMessage to it continues it."
        )
