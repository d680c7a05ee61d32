"""The control channel: CLI commands that change state ask the leader through its inbox.

A client makes an ephemeral reply inbox (`teams/{team}/replies/cli-{hex}`), sends a `control`
message to the lead with `reply_to` naming it, and waits for the `control_reply`. With no
leader running it fails at once, naming `shoal up`.

On the leader's side, `ControlServer` answers them from the loop's "answer control" step: the
request is validated into one model per operation (`ping, sh, stop, await, spawn, down, agent,
agent_send, permission, pr_subscribe, pr_unsubscribe, task_attachments`, and the queue's
`group_add, group_rm, group_list, parallel, pause, resume, restart, clean, send_input`, and
the views' `hold, release, background`), carried out through the narrow `ControlTarget`
interface, and answered with a `ControlReply` whose exit code is a declared field. `stop`,
`await` and `spawn` answer later (once the task has ended, once the teammates are ready), so
the loop never waits for them.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shoal.core.cmdsize import command_problem, environ_bytes, spec_problem
from shoal.core.errors import EXIT_FAILED, EXIT_OK, ShoalError, TaskError, UsageError
from shoal.core.paths import Layout
from shoal.core.tasks import AnyTaskState
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.schema import ControlMessage
from shoal.orchestrator.client import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from shoal.orchestrator.client import ControlError as ControlError
from shoal.orchestrator.client import NoLeaderError as NoLeaderError
from shoal.orchestrator.client import call as call
from shoal.orchestrator.client import reply_inbox_path as reply_inbox_path
from shoal.orchestrator.client import require_leader as require_leader
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.attachments import AttachmentAck

# -- requests and replies, one model per operation ---------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class ShellSpec(_Request):
    """One shell task to start (the fields of `shoal sh`)."""

    command: list[str] = Field(default_factory=list)
    description: str | None = None
    agent: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    """Variables of its environment (`--env`): their values stay in the leader's memory, the
    task's record keeps their names."""
    kind: str = "bash"
    background: bool = True
    # When and where it starts (see orchestrator/scheduling.py); ids may be unique prefixes.
    label: str | None = None
    group: str | None = None
    priority: int = 0
    after: list[str] = Field(default_factory=list)
    after_any: list[str] = Field(default_factory=list)
    delay: float | None = None
    """Seconds from when the leader receives the request before it may start."""
    timeout: float | None = None
    retries: int = 0
    retry_delay: float | None = None
    stdin: bool = False
    """A FIFO as its stdin, kept open for `shoal send-input` (else /dev/null)."""
    sandbox: dict[str, Any] | None = None
    """The kernel sandbox policy to confine it to (an agent's background Bash; sandbox.py)."""


class PingRequest(_Request):
    op: Literal["ping"] = "ping"


class ShRequest(ShellSpec):
    """Start one shell task, or the `batch` of them (all checked before any starts)."""

    op: Literal["sh"] = "sh"
    batch: list[ShellSpec] | None = None


class StopRequest(_Request):
    op: Literal["stop"] = "stop"
    task_id: str
    turn: bool = False  # only an agent's turn in progress (it waits for the next message)


class AwaitRequest(_Request):
    """Answered once the task has ended (at once when it has), with its final record: how
    `sh --foreground` learns the end without waiting for the next state.json."""

    op: Literal["await"] = "await"
    task_id: str


class SpawnRequest(_Request):
    """Start a teammate, or the `batch` of them; the fields are `shoal spawn`'s."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)

    op: Literal["spawn"] = "spawn"
    batch: list[dict[str, Any]] | None = None

    def members(self) -> list[dict[str, Any]]:
        """The spawn arguments of each teammate asked for."""
        if self.batch is not None:
            return self.batch
        return [dict(self.model_extra or {})]


class DownRequest(_Request):
    op: Literal["down"] = "down"


class AgentRequest(_Request):
    """Start a `local_agent` task; `spec` has the fields of `shoal agent` (AgentSpec)."""

    op: Literal["agent"] = "agent"
    spec: dict[str, Any]


class AgentSendRequest(_Request):
    """A message for an agent task: queued while it runs, else it resumes it."""

    op: Literal["agent_send"] = "agent_send"
    task_id: str
    text: str = Field(min_length=1)
    sender: str | None = None  # the agent task whose SendMessage sent it (None: the user)
    env: dict[str, str] | None = None  # `agent --resume --env`: for the resumed agent only


class PermissionRequest(_Request):
    """The lead's answer to an agent's permission request."""

    op: Literal["permission"] = "permission"
    request_id: str
    approve: bool
    reason: str | None = None


class PrSubscribeRequest(_Request):
    """A coordinator's subscribe_pr_activity / unsubscribe_pr_activity (`agent`: its task)."""

    op: Literal["pr_subscribe", "pr_unsubscribe"]
    agent: str
    repo: str
    number: int


class TaskAttachmentsRequest(_Request):
    """An agent's runner, before a model request: record `acks` (what earlier answers put
    in its transcript), then (`fetch`) the new output of the background tasks agent task
    `agent` owns; `idle`: it waits for a message, so their ends reach it as notifications
    (workers/agent/attachments.py)."""

    op: Literal["task_attachments"] = "task_attachments"
    agent: str
    acks: list[AttachmentAck] = Field(default_factory=list)
    fetch: bool = True
    idle: bool = False


class RemoteRequest(_Request):
    """Start a `remote_agent` task; `spec` has the fields of workers.remote.RemoteSpec."""

    op: Literal["remote"] = "remote"
    spec: dict[str, Any]


class RemoteAnswerRequest(_Request):
    """The lead's answer to a remote ultraplan (`shoal approve`/`reject` of an `r...` id)."""

    op: Literal["remote_answer"] = "remote_answer"
    task_id: str
    approve: bool
    text: str | None = None


class MonitorRequest(_Request):
    """Start a `monitor_mcp` task on SERVER of an MCP config (workers/monitor.py)."""

    op: Literal["monitor"] = "monitor"
    server: str
    config: str
    tool: str | None = None
    every: float | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    cwd: str | None = None


class WorkflowRequest(_Request):
    """Start a `local_workflow` task: a `shoal run` spec run by this leader (workflow.py)."""

    op: Literal["workflow"] = "workflow"
    spec_path: str


class DreamRequest(_Request):
    """Start a `dream` task; `spec` has the fields of workers.dream.kind.DreamSpec."""

    op: Literal["dream"] = "dream"
    spec: dict[str, Any]


class GroupAddRequest(_Request):
    op: Literal["group_add"] = "group_add"
    name: str
    parallel: int = 0


class GroupRemoveRequest(_Request):
    op: Literal["group_rm"] = "group_rm"
    name: str


class GroupListRequest(_Request):
    op: Literal["group_list"] = "group_list"


class ParallelRequest(_Request):
    """Change a group's parallelism (the default group's is the leader's --jobs)."""

    op: Literal["parallel"] = "parallel"
    parallel: int
    group: str = "default"


class PauseRequest(_Request):
    """Pause (SIGSTOP) or resume (SIGCONT) tasks, or a whole group."""

    op: Literal["pause", "resume"]
    task_ids: list[str] = Field(default_factory=list)
    group: str | None = None


class RestartRequest(_Request):
    """Run a finished shell task again (a new id, or the same one `in_place`)."""

    op: Literal["restart"] = "restart"
    task_id: str
    in_place: bool = False


class CleanRequest(_Request):
    """Drop finished tasks from the session's listing (and their output files)."""

    op: Literal["clean"] = "clean"
    force: bool = False  # (also tasks in their panel grace, or held by a view)


class SendInputRequest(_Request):
    """Write to a running shell task's stdin (or close it: `eof`)."""

    op: Literal["send_input"] = "send_input"
    task_id: str
    text: str = ""
    newline: bool = True
    eof: bool = False


class HoldRequest(_Request):
    """A view holds a task while it shows it (never evicted meanwhile; orchestrator/holds.py):
    renewed within `lease_s`, ended by `release` or by the view's process (`pid`) ending."""

    op: Literal["hold"] = "hold"
    task_id: str
    holder: str = Field(min_length=1)
    pid: int | None = None
    pid_started_at: float | None = None
    lease_s: float = Field(default=30.0, gt=0)


class ReleaseRequest(_Request):
    """A view lets go of the task it held."""

    op: Literal["release"] = "release"
    task_id: str
    holder: str = Field(min_length=1)


class BackgroundRequest(_Request):
    """`shoal chat`'s Ctrl+B twice (`background`) and `/fg` (not): a main-session query's
    record moves to the background (the pill counts it) or back to the foreground."""

    op: Literal["background"] = "background"
    task_id: str
    background: bool = True


ViewRequest = HoldRequest | ReleaseRequest | BackgroundRequest
"""Requests of the views about the tasks they show, answered at once."""

QueueRequest = (
    GroupAddRequest
    | GroupRemoveRequest
    | GroupListRequest
    | ParallelRequest
    | PauseRequest
    | RestartRequest
    | CleanRequest
    | SendInputRequest
)
"""Requests about queued and running tasks (pueue's verbs), answered at once."""

ControlRequest = Annotated[
    PingRequest
    | ShRequest
    | StopRequest
    | AwaitRequest
    | SpawnRequest
    | DownRequest
    | AgentRequest
    | AgentSendRequest
    | PermissionRequest
    | PrSubscribeRequest
    | TaskAttachmentsRequest
    | RemoteRequest
    | RemoteAnswerRequest
    | DreamRequest
    | MonitorRequest
    | WorkflowRequest
    | QueueRequest
    | ViewRequest,
    Field(discriminator="op"),
]


@functools.cache
def _requests() -> TypeAdapter[ControlRequest]:
    """The requests' validator, built on first use (building it at import cost every process
    that loads this module, a `shoal run` with no request to read included, 20 ms)."""
    return TypeAdapter(ControlRequest)


OPERATIONS = (
    "ping",
    "sh",
    "stop",
    "await",
    "spawn",
    "down",
    "agent",
    "agent_send",
    "permission",
    "pr_subscribe",
    "pr_unsubscribe",
    "task_attachments",
    "remote",
    "remote_answer",
    "dream",
    "monitor",
    "workflow",
    "group_add",
    "group_rm",
    "group_list",
    "parallel",
    "pause",
    "resume",
    "restart",
    "clean",
    "send_input",
    "hold",
    "release",
    "background",
)


def check_sizes(specs: Sequence[ShellSpec], *, batch: bool) -> None:
    """Refuse (UsageError, nothing started) a request with a task too big to exec with this
    process's environment, which its tasks inherit, or to answer within the message cap."""
    base = environ_bytes(os.environb)
    for number, spec in enumerate(specs, 1):
        fields = spec.model_dump(include=set(ShellSpec.model_fields))
        problem = command_problem(spec.command, env=spec.env, base_env_bytes=base) or (
            spec_problem(fields)
        )
        if problem is not None:
            where = f"command {number} of the batch of {len(specs)}: " if batch else ""
            raise UsageError(where + problem)


def parse_request(op: str, args: dict[str, Any]) -> ControlRequest:
    """The request `op` with `args`, validated; TaskError naming what is wrong."""
    if op not in OPERATIONS:
        raise TaskError(f"unknown control operation {op!r}")
    try:
        return _requests().validate_python({**args, "op": op})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or op
        raise TaskError(f"bad {op!r} request: {where}: {first['msg']}") from None


class ControlReply(BaseModel):
    """The answer to one request: `result` when ok, else `error` and the exit code `code`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: str
    ok: bool
    result: Any = None
    error: str | None = None
    code: int = EXIT_OK

    @classmethod
    def success(cls, request_id: str, result: Any) -> ControlReply:
        return cls(request_id=request_id, ok=True, result=result)

    @classmethod
    def failure(cls, request_id: str, error: BaseException) -> ControlReply:
        """A refusal (a ShoalError, with its exit code) or a bug (exit 1, named as such)."""
        if isinstance(error, ShoalError):
            return cls(request_id=request_id, ok=False, error=str(error), code=error.exit_code)
        return cls(
            request_id=request_id,
            ok=False,
            error=f"internal error: {error!r}",
            code=EXIT_FAILED,
        )

    def data(self) -> dict[str, Any]:
        """The `control_reply` message's data (a success carries no code, as ever)."""
        if self.ok:
            return {"request_id": self.request_id, "ok": True, "result": self.result}
        return {
            "request_id": self.request_id,
            "ok": False,
            "error": self.error,
            "code": self.code,
        }


Answer = Callable[[Any, BaseException | None], None]


class ControlTarget(Protocol):
    """What the control server asks of the leader (called on the loop's thread only)."""

    @property
    def session_id(self) -> str: ...

    @property
    def stopping(self) -> bool: ...

    def start_shell(self, specs: list[ShellSpec]) -> list[AnyTaskState]:
        """Check every spec, then register and start them (one state write)."""
        ...

    def stop(
        self,
        task_id: str,
        on_done: Callable[[AnyTaskState], None] | None = None,
        reason: str = "stopped on request",
    ) -> AnyTaskState:
        """Begin stopping a task; `on_done` gets its final state once it ended."""
        ...

    def await_end(self, task_id: str, on_done: Callable[[AnyTaskState], None]) -> None:
        """`on_done` gets the task's final state once it has ended (at once when it has)."""
        ...

    def stop_turn(self, task_id: str) -> AnyTaskState:
        """Stop an agent's turn in progress; answered at once."""
        ...

    def spawn(self, members: list[dict[str, Any]], answer: Answer) -> None:
        """Start teammates; `answer` gets their records once all are ready, or the error."""
        ...

    def request_stop(self) -> dict[str, Any]:
        """Begin shutting down; returns what is being stopped."""
        ...

    def start_agent(self, spec: Any) -> AnyTaskState:
        """Check, register and start one agent task (`spec`: an agent_tasks.AgentSpec)."""
        ...

    def send_to_agent(
        self,
        task_id: str,
        text: str,
        sender: str | None = None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Queue a message for a running agent, or resume a finished one with it (in the
        lower of its mode and the sending agent's; `env`: --env values for the resumed one)."""
        ...

    def answer_permission(
        self, request_id: str, approve: bool, reason: str | None = None
    ) -> dict[str, Any]:
        """Answer an agent's permission request."""
        ...

    def pr_activity(self, request: PrSubscribeRequest) -> dict[str, Any]:
        """Subscribe a coordinator to a PR's activity, or end its subscription."""
        ...

    def task_attachments(self, request: TaskAttachmentsRequest) -> dict[str, Any]:
        """Record an agent's acks, then the new output of its background tasks."""
        ...

    def start_remote(self, spec: Any) -> AnyTaskState:
        """Check, register and start one remote task (`spec`: a workers.remote.RemoteSpec)."""
        ...

    def answer_remote(self, task_id: str, approve: bool, text: str | None) -> AnyTaskState:
        """Answer a remote ultraplan waiting for input or approval."""
        ...

    def start_monitor(self, request: MonitorRequest) -> AnyTaskState:
        """Check, register and start one MCP monitor task."""
        ...

    def start_workflow(self, spec_path: str) -> AnyTaskState:
        """Check a workflow's spec, register its task and start it."""
        ...

    def start_dream(self, spec: Any) -> AnyTaskState:
        """Take the consolidation lock, register and start a dream (`spec`: a DreamSpec)."""
        ...

    def queue_control(self, request: QueueRequest) -> Any:
        """Carry out a request about queued and running tasks; its JSON-able result."""
        ...

    def view_request(self, request: ViewRequest) -> Any:
        """Hold or release a task for a view, or move a main-session query to or from the
        background; its JSON-able result."""
        ...

    def note(self, text: str) -> None: ...

    def flush_state(self) -> None:
        """Write state.json now if anything in the registry changed since the last write."""
        ...


class ControlServer:
    """Answers control requests in the lead's inbox (on the loop's thread, never waiting)."""

    def __init__(self, layout: Layout, team: str, target: ControlTarget) -> None:
        self.layout = layout
        self.team = team
        self.target = target
        self.pending = 0  # requests answered later (stop, spawn) not answered yet

    def handle(self, msg: ControlMessage) -> None:
        """Carry out one request and answer it (now, or once `stop`/`spawn` have finished)."""
        request_id = msg.data.request_id
        answered = False

        def answer(result: Any, error: BaseException | None) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if later:
                self.pending -= 1
            reply = (
                ControlReply.failure(request_id, error)
                if error is not None
                else ControlReply.success(request_id, result)
            )
            # (a client that hears its answer reads the files next: `ps` right after `spawn`
            # must find there what the request did, not wait for the next throttled write)
            self.target.flush_state()
            self.send(msg, reply)

        later = False
        try:
            request = parse_request(msg.data.op, msg.data.args)
            later = isinstance(request, SpawnRequest | AwaitRequest) or (
                isinstance(request, StopRequest) and not request.turn
            )
            if later:
                self.pending += 1
            self._dispatch(request, answer)
        except Exception as exc:  # a bug must not kill the leader; the client hears of it
            answer(None, exc)

    def _dispatch(self, request: ControlRequest, answer: Answer) -> None:
        target = self.target
        starts = (
            ShRequest | SpawnRequest | AgentRequest | RestartRequest | RemoteRequest
            | DreamRequest
            | MonitorRequest
            | WorkflowRequest
        )  # fmt: skip
        if target.stopping and isinstance(request, starts):
            raise TaskError(f"the leader of team {self.team!r} is shutting down; nothing started")
        if isinstance(request, PingRequest):
            answer({"session_id": target.session_id, "pid": os.getpid()}, None)
        elif isinstance(request, ShRequest):
            specs = request.batch if request.batch is not None else [request]
            check_sizes(specs, batch=request.batch is not None)
            started = target.start_shell(list(specs))
            records = [t.model_dump(mode="json") for t in started]
            answer(records if request.batch is not None else records[0], None)
        elif isinstance(request, StopRequest) and request.turn:
            answer(target.stop_turn(request.task_id).model_dump(mode="json"), None)
        elif isinstance(request, StopRequest):
            target.stop(request.task_id, lambda final: answer(final.model_dump(mode="json"), None))
        elif isinstance(request, AwaitRequest):
            target.await_end(
                request.task_id, lambda final: answer(final.model_dump(mode="json"), None)
            )
        elif isinstance(request, SpawnRequest):

            def spawned(result: Any, error: BaseException | None) -> None:
                if error is None and request.batch is None and isinstance(result, list):
                    result = result[0]
                answer(result, error)

            target.spawn(request.members(), spawned)
        elif isinstance(request, AgentRequest):
            from shoal.orchestrator.agent_tasks import AgentSpec  # (leader side only)

            try:
                spec = AgentSpec.model_validate(request.spec)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "spec"
                raise UsageError(f"bad agent request: {where}: {first['msg']}") from None
            answer(target.start_agent(spec).model_dump(mode="json"), None)
        elif isinstance(request, RemoteRequest):
            from shoal.workers.remote import RemoteSpec  # (leader side only)

            try:
                remote = RemoteSpec.model_validate(request.spec)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "spec"
                raise UsageError(f"bad remote request: {where}: {first['msg']}") from None
            answer(target.start_remote(remote).model_dump(mode="json"), None)
        elif isinstance(request, MonitorRequest):
            answer(target.start_monitor(request).model_dump(mode="json"), None)
        elif isinstance(request, WorkflowRequest):
            answer(target.start_workflow(request.spec_path).model_dump(mode="json"), None)
        elif isinstance(request, DreamRequest):
            from shoal.workers.dream.kind import DreamSpec  # (leader side only)

            try:
                dream = DreamSpec.model_validate(request.spec)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "spec"
                raise UsageError(f"bad dream request: {where}: {first['msg']}") from None
            answer(target.start_dream(dream).model_dump(mode="json"), None)
        elif isinstance(request, RemoteAnswerRequest):
            done = target.answer_remote(request.task_id, request.approve, request.text)
            answer(done.model_dump(mode="json"), None)
        elif isinstance(request, AgentSendRequest):
            sent = target.send_to_agent(request.task_id, request.text, request.sender, request.env)
            answer(sent, None)
        elif isinstance(request, QueueRequest):
            answer(target.queue_control(request), None)
        elif isinstance(request, ViewRequest):
            answer(target.view_request(request), None)
        elif isinstance(request, PrSubscribeRequest):
            answer(target.pr_activity(request), None)
        elif isinstance(request, TaskAttachmentsRequest):
            answer(target.task_attachments(request), None)
        elif isinstance(request, PermissionRequest):
            answer(
                target.answer_permission(request.request_id, request.approve, request.reason),
                None,
            )
        else:
            answer(target.request_stop(), None)

    def send(self, msg: ControlMessage, reply: ControlReply) -> None:
        """Deliver `reply` to the client's reply inbox, if it still waits."""
        if not msg.reply_to:
            return
        path = reply_inbox_path(self.layout, self.team, msg.reply_to)
        if path is None or not path.is_dir():
            return  # the client gave up waiting
        try:
            deliver_to(
                path,
                make_message(
                    sender=LEAD_NAME, to=msg.reply_to, kind="control_reply", data=reply.data()
                ),
            )
        except (ShoalError, OSError) as exc:
            # (e.g. an answer over the message cap): the client must not wait for nothing.
            self.target.note(
                f"could not answer the {msg.data.op!r} request {reply.request_id}: {exc}"
            )
            failed = ControlReply(
                request_id=reply.request_id,
                ok=False,
                error=f"the leader could not send its answer: {exc}",
                code=EXIT_FAILED,
            )
            with contextlib.suppress(ShoalError, OSError):
                deliver_to(
                    path,
                    make_message(
                        sender=LEAD_NAME, to=msg.reply_to, kind="control_reply", data=failed.data()
                    ),
                )
