"""The control channel's protocol: one request model per operation, and the reply.

A client makes an ephemeral reply inbox (`teams/{team}/replies/cli-{hex}`), sends a `control`
message to the lead with `reply_to` naming it, and waits for the `control_reply`
(channel/client.py); the leader validates the request into its model here (`parse_request`),
carries it out (orchestrator/control.py) and answers with a `ControlReply` whose exit code is
a declared field. The client and the server import the same models, so the two ends cannot
drift: `OPERATIONS` is read from the models' `op` fields, not listed a second time.
"""

from __future__ import annotations

import functools
import os
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shoal.core.cmdsize import command_problem, environ_bytes, spec_problem
from shoal.core.errors import EXIT_FAILED, EXIT_OK, ShoalError, TaskError, UsageError
from shoal.core.validation import first_error

# -- requests and replies, one model per operation ---------------------------------------------


class AttachmentAck(BaseModel):
    """What of a task's output is in the agent's transcript: through byte `offset`, with
    `total_lines` lines shown so far; `final`: its end too. `run`: the task's `restarts` (a
    task run again in place starts a new output file: an ack of the run before is void)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    offset: int = Field(ge=0)
    total_lines: int = Field(0, ge=0)
    final: bool = False
    run: int = Field(0, ge=0)


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
    task_ids: list[str] = Field(default_factory=list)  # (only these; none: every finished one)
    successful_only: bool = False  # (only those that completed)


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


def _ops(model: type[BaseModel]) -> tuple[str, ...]:
    """The operations a request model answers to (the values of its `op` Literal)."""
    return typing.get_args(model.model_fields["op"].annotation)


QUEUE_REQUESTS: tuple[type[BaseModel], ...] = typing.get_args(QueueRequest)
VIEW_REQUESTS: tuple[type[BaseModel], ...] = typing.get_args(ViewRequest)
REQUESTS: tuple[type[BaseModel], ...] = typing.get_args(typing.get_args(ControlRequest)[0])
"""Every request model, once."""

OPERATIONS: tuple[str, ...] = tuple(op for model in REQUESTS for op in _ops(model))
"""Every operation's name, read from the models (a name is never listed twice)."""


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
        # (its location starts with the union's tag: dropped)
        raise TaskError(f"bad {op!r} request: {first_error(exc, op, drop=1)}") from None


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
