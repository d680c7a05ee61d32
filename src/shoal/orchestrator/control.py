"""The control server: the leader's side of the control channel (channel/protocol.py).

`ControlServer` answers requests from the loop's "answer control" step: each request, already
validated into its model, goes to its handler through one table (model -> handler; a test
checks that every model of the protocol has one), is carried out through the narrow
`ControlTarget` interface, and is answered with a `ControlReply`. `stop`, `await` and `spawn`
answer later (once the task has ended, once the teammates are ready), so the loop never waits.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any, Protocol

from shoal.channel.client import reply_inbox_path
from shoal.channel.protocol import (
    QUEUE_REQUESTS,
    VIEW_REQUESTS,
    AgentRequest,
    AgentSendRequest,
    AwaitRequest,
    ControlReply,
    ControlRequest,
    DownRequest,
    DreamRequest,
    MonitorRequest,
    PermissionRequest,
    PingRequest,
    PrSubscribeRequest,
    QueueRequest,
    RemoteAnswerRequest,
    RemoteRequest,
    RestartRequest,
    ShellSpec,
    ShRequest,
    SpawnRequest,
    StopRequest,
    TaskAttachmentsRequest,
    ViewRequest,
    WorkflowRequest,
    check_sizes,
    parse_request,
)
from shoal.core.errors import EXIT_FAILED, ShoalError, TaskError, UsageError
from shoal.core.paths import Layout
from shoal.core.tasks import AnyTaskState
from shoal.core.validation import first_error
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.schema import ControlMessage
from shoal.teams.models import LEAD_NAME

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


STARTS = (
    ShRequest, SpawnRequest, AgentRequest, RestartRequest, RemoteRequest, DreamRequest,
    MonitorRequest, WorkflowRequest,
)  # fmt: skip
"""Requests that start something: refused while the leader shuts down."""


def _validated(model: Any, spec: dict[str, Any], what: str) -> Any:
    """`spec` validated into `model` (a kind's spec, imported on the leader's side only);
    UsageError naming the first problem."""
    from pydantic import ValidationError

    try:
        return model.model_validate(spec)
    except ValidationError as exc:
        raise UsageError(f"bad {what} request: {first_error(exc, 'spec')}") from None


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
        if self.target.stopping and isinstance(request, STARTS):
            raise TaskError(f"the leader of team {self.team!r} is shutting down; nothing started")
        handler = self._handlers.get(type(request))
        if handler is None:  # (a model in the union without a handler: a bug, named)
            raise TaskError(f"no handler for the {request.op!r} request")
        handler(request, answer)

    # -- handlers, one per request model (`_handlers`) ------------------------------------------

    def _ping(self, request: PingRequest, answer: Answer) -> None:
        answer({"session_id": self.target.session_id, "pid": os.getpid()}, None)

    def _sh(self, request: ShRequest, answer: Answer) -> None:
        specs = request.batch if request.batch is not None else [request]
        check_sizes(specs, batch=request.batch is not None)
        records = [t.model_dump(mode="json") for t in self.target.start_shell(list(specs))]
        answer(records if request.batch is not None else records[0], None)

    def _stop(self, request: StopRequest, answer: Answer) -> None:
        if request.turn:
            answer(self.target.stop_turn(request.task_id).model_dump(mode="json"), None)
            return
        self.target.stop(request.task_id, lambda final: answer(final.model_dump(mode="json"), None))

    def _await(self, request: AwaitRequest, answer: Answer) -> None:
        self.target.await_end(
            request.task_id, lambda final: answer(final.model_dump(mode="json"), None)
        )

    def _spawn(self, request: SpawnRequest, answer: Answer) -> None:
        def spawned(result: Any, error: BaseException | None) -> None:
            if error is None and request.batch is None and isinstance(result, list):
                result = result[0]
            answer(result, error)

        self.target.spawn(request.members(), spawned)

    def _agent(self, request: AgentRequest, answer: Answer) -> None:
        from shoal.workers.agent.spec import AgentSpec  # (leader side only)

        spec = _validated(AgentSpec, request.spec, "agent")
        answer(self.target.start_agent(spec).model_dump(mode="json"), None)

    def _remote(self, request: RemoteRequest, answer: Answer) -> None:
        from shoal.workers.remote.spec import RemoteSpec  # (leader side only)

        spec = _validated(RemoteSpec, request.spec, "remote")
        answer(self.target.start_remote(spec).model_dump(mode="json"), None)

    def _dream(self, request: DreamRequest, answer: Answer) -> None:
        from shoal.workers.dream.kind import DreamSpec  # (leader side only)

        spec = _validated(DreamSpec, request.spec, "dream")
        answer(self.target.start_dream(spec).model_dump(mode="json"), None)

    def _monitor(self, request: MonitorRequest, answer: Answer) -> None:
        answer(self.target.start_monitor(request).model_dump(mode="json"), None)

    def _workflow(self, request: WorkflowRequest, answer: Answer) -> None:
        answer(self.target.start_workflow(request.spec_path).model_dump(mode="json"), None)

    def _remote_answer(self, request: RemoteAnswerRequest, answer: Answer) -> None:
        done = self.target.answer_remote(request.task_id, request.approve, request.text)
        answer(done.model_dump(mode="json"), None)

    def _agent_send(self, request: AgentSendRequest, answer: Answer) -> None:
        target = self.target
        answer(
            target.send_to_agent(request.task_id, request.text, request.sender, request.env), None
        )

    def _queue(self, request: QueueRequest, answer: Answer) -> None:
        answer(self.target.queue_control(request), None)

    def _view(self, request: ViewRequest, answer: Answer) -> None:
        answer(self.target.view_request(request), None)

    def _pr(self, request: PrSubscribeRequest, answer: Answer) -> None:
        answer(self.target.pr_activity(request), None)

    def _attachments(self, request: TaskAttachmentsRequest, answer: Answer) -> None:
        answer(self.target.task_attachments(request), None)

    def _permission(self, request: PermissionRequest, answer: Answer) -> None:
        target = self.target
        answer(target.answer_permission(request.request_id, request.approve, request.reason), None)

    def _down(self, request: DownRequest, answer: Answer) -> None:
        answer(self.target.request_stop(), None)

    @functools.cached_property
    def _handlers(self) -> dict[type, Callable[[Any, Answer], None]]:
        """Request model -> handler; `test_control_table` checks every model has one."""
        table: dict[type, Callable[[Any, Answer], None]] = {
            PingRequest: self._ping,
            ShRequest: self._sh,
            StopRequest: self._stop,
            AwaitRequest: self._await,
            SpawnRequest: self._spawn,
            DownRequest: self._down,
            AgentRequest: self._agent,
            AgentSendRequest: self._agent_send,
            PermissionRequest: self._permission,
            PrSubscribeRequest: self._pr,
            TaskAttachmentsRequest: self._attachments,
            RemoteRequest: self._remote,
            RemoteAnswerRequest: self._remote_answer,
            DreamRequest: self._dream,
            MonitorRequest: self._monitor,
            WorkflowRequest: self._workflow,
        }
        table.update(dict.fromkeys(QUEUE_REQUESTS, self._queue))
        table.update(dict.fromkeys(VIEW_REQUESTS, self._view))
        return table

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
