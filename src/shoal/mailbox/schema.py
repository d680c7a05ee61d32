"""Message files: one frozen model per kind (a discriminated union), decoded once at the border."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shoal.core.errors import UsageError

MAX_MESSAGE_BYTES = 1024 * 1024

KINDS = (
    "text", "task_assignment", "task_notification", "idle_notification", "progress",
    "shutdown_request", "shutdown_response", "plan_approval_request", "plan_approval_response",
    "permission_request", "permission_response", "control", "control_reply",
)  # fmt: skip


class _Data(BaseModel):
    """Payload base: unknown keys are kept (forward compatible), known ones are typed."""

    model_config = ConfigDict(frozen=True, extra="allow")


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
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

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

_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


class DecodeError(ValueError):
    """A message file that cannot be decoded; `reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(root)"
    return f"{loc}: {first['msg']}"


def decode(raw: bytes) -> AnyMessage:
    """Decode and validate a message file's bytes; any failure is one DecodeError."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message is {len(raw)} bytes, over the {MAX_MESSAGE_BYTES} byte cap")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None
    try:
        msg: AnyMessage = _ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise DecodeError(f"invalid message: {_first_error(exc)}") from None
    return msg


def build(fields: dict[str, Any]) -> AnyMessage:
    """Build a message from plain fields (validated per kind); bad input is a UsageError."""
    try:
        msg: AnyMessage = _ADAPTER.validate_python(fields)
    except ValidationError as exc:
        kind = fields.get("kind")
        raise UsageError(f"invalid {kind!r} message: {_first_error(exc)}") from None
    return msg


def encode(msg: AnyMessage) -> bytes:
    """The message file's bytes (compact orjson, `from` spelled as on disk)."""
    return orjson.dumps(msg.model_dump(mode="json", by_alias=True))
