"""Message files: one frozen model per kind (a discriminated union), decoded once at the border."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shoal.core.errors import UsageError
from shoal.core.validation import first_error
from shoal.mailbox.store import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES

KINDS = (
    "text", "task_assignment", "task_notification", "idle_notification", "progress",
    "shutdown_request", "shutdown_response", "plan_approval_request", "plan_approval_response",
    "permission_request", "permission_response", "control", "control_reply",
)  # fmt: skip


class _Data(BaseModel):
    """Payload base: unknown keys are kept (forward compatible), known ones are typed."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)


class TextData(_Data):
    pass


class TaskAssignmentData(_Data):
    task_id: int | str
    subject: str
    description: str = ""
    assigned_by: str | None = None


class TaskNotificationData(_Data):
    task_id: str
    status: Literal["running", "completed", "failed", "killed"]
    task_type: str | None = None
    summary: str | None = None
    output_file: str | None = None
    result: str | None = None
    exit_code: int | None = None  # of the command that decided a teammate's turn, if one did


class IdleNotificationData(_Data):
    idle_reason: str = "available"
    completed_task_id: int | str | None = None


class ProgressData(_Data):
    tool_use_count: int = 0
    token_count: int = 0
    activity: str | None = None
    summary: str | None = None


class ShutdownRequestData(_Data):
    request_id: str
    reason: str | None = None


class ShutdownResponseData(_Data):
    request_id: str
    approve: bool
    reason: str | None = None


class PlanApprovalRequestData(_Data):
    request_id: str
    plan: str


class PlanApprovalResponseData(_Data):
    request_id: str
    approve: bool
    feedback: str | None = None


class PermissionRequestData(_Data):
    request_id: str
    tool: str
    input: dict[str, Any] = Field(default_factory=dict)


class PermissionResponseData(_Data):
    request_id: str
    approve: bool
    reason: str | None = None


class ControlData(_Data):
    request_id: str
    op: str
    args: dict[str, Any] = Field(default_factory=dict)


class ControlReplyData(_Data):
    request_id: str
    ok: bool
    result: Any = None
    error: str | None = None


class _MessageBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, defer_build=True)

    v: Literal[1] = 1
    id: str
    from_: str = Field(alias="from")
    to: str
    sent_at: str
    text: str | None = None
    summary: str | None = None
    reply_to: str | None = None
    kind: str
    data: _Data


class TextMessage(_MessageBase):
    kind: Literal["text"] = "text"
    data: TextData = Field(default_factory=TextData)


class TaskAssignmentMessage(_MessageBase):
    kind: Literal["task_assignment"] = "task_assignment"
    data: TaskAssignmentData


class TaskNotificationMessage(_MessageBase):
    kind: Literal["task_notification"] = "task_notification"
    data: TaskNotificationData


class IdleNotificationMessage(_MessageBase):
    kind: Literal["idle_notification"] = "idle_notification"
    data: IdleNotificationData = Field(default_factory=IdleNotificationData)


class ProgressMessage(_MessageBase):
    kind: Literal["progress"] = "progress"
    data: ProgressData = Field(default_factory=ProgressData)


class ShutdownRequestMessage(_MessageBase):
    kind: Literal["shutdown_request"] = "shutdown_request"
    data: ShutdownRequestData


class ShutdownResponseMessage(_MessageBase):
    kind: Literal["shutdown_response"] = "shutdown_response"
    data: ShutdownResponseData


class PlanApprovalRequestMessage(_MessageBase):
    kind: Literal["plan_approval_request"] = "plan_approval_request"
    data: PlanApprovalRequestData


class PlanApprovalResponseMessage(_MessageBase):
    kind: Literal["plan_approval_response"] = "plan_approval_response"
    data: PlanApprovalResponseData


class PermissionRequestMessage(_MessageBase):
    kind: Literal["permission_request"] = "permission_request"
    data: PermissionRequestData


class PermissionResponseMessage(_MessageBase):
    kind: Literal["permission_response"] = "permission_response"
    data: PermissionResponseData


class ControlMessage(_MessageBase):
    kind: Literal["control"] = "control"
    data: ControlData


class ControlReplyMessage(_MessageBase):
    kind: Literal["control_reply"] = "control_reply"
    data: ControlReplyData


Message = Annotated[
    TextMessage
    | TaskAssignmentMessage
    | TaskNotificationMessage
    | IdleNotificationMessage
    | ProgressMessage
    | ShutdownRequestMessage
    | ShutdownResponseMessage
    | PlanApprovalRequestMessage
    | PlanApprovalResponseMessage
    | PermissionRequestMessage
    | PermissionResponseMessage
    | ControlMessage
    | ControlReplyMessage,
    Field(discriminator="kind"),
]
AnyMessage = _MessageBase


@functools.cache
def _adapter() -> TypeAdapter[Message]:
    # Built on first use (with the models' deferred schemas): a CLI call that sends one
    # message should not pay for building every kind's schema at import.
    return TypeAdapter(Message)


class DecodeError(ValueError):
    """A message file that cannot be decoded; `reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Each kind's class, to validate one kind without building the schemas of all of them.
_BY_KIND: dict[str, type[_MessageBase]] = {
    cls.model_fields["kind"].default: cls for cls in get_args(get_args(Message)[0])
}


def _validate(obj: Any) -> AnyMessage:
    """Validate a decoded message as the class its `kind` names (ValidationError if bad)."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:  # the union's error names the kinds there are
        msg: AnyMessage = _adapter().validate_python(obj)
        return msg
    return cls.model_validate(obj)


def _first_error(exc: ValidationError, obj: Any) -> str:
    """The first error of a message, its location under its kind as the discriminated union
    reports it (a kind's own class validated it)."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return first_error(exc, within=kind if kind in _BY_KIND else None)


def decode(raw: bytes) -> AnyMessage:
    """Decode and validate a message file's bytes; any failure is one DecodeError."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message is {len(raw)} bytes, over the {MAX_MESSAGE_BYTES} byte cap")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None
    try:
        return _validate(obj)
    except ValidationError as exc:
        raise DecodeError(f"invalid message: {_first_error(exc, obj)}") from None


def build(fields: dict[str, Any]) -> AnyMessage:
    """Build a message from plain fields (validated per kind); bad input is a UsageError."""
    try:
        return _validate(fields)
    except ValidationError as exc:
        kind = fields.get("kind")
        raise UsageError(f"invalid {kind!r} message: {_first_error(exc, fields)}") from None


def encode(msg: AnyMessage) -> bytes:
    """The message file's bytes (compact orjson, `from` spelled as on disk)."""
    return orjson.dumps(msg.model_dump(mode="json", by_alias=True))
