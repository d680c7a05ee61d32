"""Typed records of the session's event stream (`events.jsonl`, `--output-format stream-json`).

Every event the leader emits is one of these frozen models, built here or by the code that
owns its subject, and read back with `parse_event`, so no code matches dicts by a `subtype`
string. On disk an event is `{"type": ..., "subtype": ..., fields..., "session_id", "ts"}`
(`to_record`); readers ignore fields they do not know, and records of kinds they do not know
parse as None.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError

from shoal.core.notify import summary_for, task_notification_for
from shoal.core.tasks import TaskStateBase

_TAIL_KEYS = ("session_id", "ts")


class Event(BaseModel):
    """One event record. `session_id` and `ts` are set when the session writes it."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    type: str
    session_id: str | None = None
    ts: float | None = None

    def to_record(self) -> dict[str, Any]:
        """The JSON-able record, `type` and `subtype` first and `session_id`/`ts` last."""
        raw = self.model_dump(mode="json")
        tail = {k: raw.pop(k) for k in _TAIL_KEYS}
        return {**raw, **{k: v for k, v in tail.items() if v is not None}}

    def __getitem__(self, key: str) -> Any:
        """A field by name, as in the record (`event["subtype"]`); KeyError if absent."""
        if key in type(self).model_fields:
            return getattr(self, key)
        extra = self.model_extra or {}
        if key in extra:
            return extra[key]
        raise KeyError(key)

    def stamped(self, session_id: str, ts: float) -> Event:
        """This event as written by session `session_id` at `ts`."""
        return self.model_copy(update={"session_id": session_id, "ts": ts})


class SystemEvent(Event):
    """An event of the task framework or the leader."""

    type: Literal["system"] = "system"
    subtype: str


class LeaderStarted(SystemEvent):
    subtype: Literal["leader_started"] = "leader_started"
    team: str
    pid: int
    resumed: bool


class LeaderStopped(SystemEvent):
    subtype: Literal["leader_stopped"] = "leader_stopped"
    team: str


class Note(SystemEvent):
    """A line for the person running the leader."""

    subtype: Literal["note"] = "note"
    text: str


class TaskStarted(SystemEvent):
    subtype: Literal["task_started"] = "task_started"
    task_id: str
    tool_use_id: str | None = None
    description: str
    task_type: str


class TaskProgress(SystemEvent):
    """A running task reported progress (agents: tool uses, tokens, the latest activity)."""

    subtype: Literal["task_progress"] = "task_progress"
    task_id: str
    tool_use_count: int = 0
    token_count: int = 0
    activity: str | None = None
    summary: str | None = None


class TaskTerminated(SystemEvent):
    subtype: Literal["task_terminated"] = "task_terminated"
    task_id: str
    status: str
    summary: str


class TaskNotified(SystemEvent):
    """A terminal task's one notification: `notification` is the XML, `summary` its text."""

    subtype: Literal["task_notification"] = "task_notification"
    task_id: str
    owner: str | None = None
    status: str
    notification: str
    summary: str | None = None


class TaskStalled(SystemEvent):
    subtype: Literal["task_stalled"] = "task_stalled"
    task_id: str
    prompt: str
    notification: str
    summary: str | None = None


class TeammateSpawned(SystemEvent):
    subtype: Literal["teammate_spawned"] = "teammate_spawned"
    name: str
    task_id: str
    backend: str
    why: str


class TeammateReady(SystemEvent):
    subtype: Literal["teammate_ready"] = "teammate_ready"
    name: str
    task_id: str


class MessageReceived(Event):
    """A message that reached the lead's inbox (other than a control request)."""

    type: Literal["message"] = "message"
    message: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.message.get("kind") or "")

    @property
    def data(self) -> dict[str, Any]:
        data = self.message.get("data")
        return data if isinstance(data, dict) else {}


class _OpenEvent(Event):
    """An event whose fields vary by subtype (kept as extra fields, read with `get`)."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)

    subtype: str

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the event, or `default`."""
        return (self.model_extra or {}).get(key, default)


class RunEvent(_OpenEvent):
    """An event of a batch run (`shoal run`); its fields depend on the subtype, see README."""

    type: Literal["run"] = "run"


class RunResult(_OpenEvent):
    """The last event of a batch run: its verdict."""

    type: Literal["result"] = "result"


def _tag(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "system":
            return f"system:{value.get('subtype')}"
        return str(kind)
    kind = getattr(value, "type", None)
    return f"system:{value.subtype}" if kind == "system" else str(kind)


AnyEvent = Annotated[
    Annotated[LeaderStarted, Tag("system:leader_started")]
    | Annotated[LeaderStopped, Tag("system:leader_stopped")]
    | Annotated[Note, Tag("system:note")]
    | Annotated[TaskStarted, Tag("system:task_started")]
    | Annotated[TaskProgress, Tag("system:task_progress")]
    | Annotated[TaskTerminated, Tag("system:task_terminated")]
    | Annotated[TaskNotified, Tag("system:task_notification")]
    | Annotated[TaskStalled, Tag("system:task_stalled")]
    | Annotated[TeammateSpawned, Tag("system:teammate_spawned")]
    | Annotated[TeammateReady, Tag("system:teammate_ready")]
    | Annotated[MessageReceived, Tag("message")]
    | Annotated[RunEvent, Tag("run")]
    | Annotated[RunResult, Tag("result")],
    Discriminator(_tag),
]


@functools.cache
def _adapter() -> TypeAdapter[AnyEvent]:
    """The events' validator, built on first use: a process that only writes events never
    pays for building all of them."""
    return TypeAdapter(AnyEvent)


def parse_event(record: Any) -> Event | None:
    """The event a record holds, or None for a record of a kind this build does not know (or
    one that does not validate: a reader of another tool's stream must not fail on it)."""
    if isinstance(record, Event):
        return record
    try:
        return _adapter().validate_python(record)
    except ValidationError:
        return None


# -- the task framework's events, built in one place ------------------------------------------


def task_started(task: TaskStateBase) -> TaskStarted:
    """`task_started` of `task`."""
    return TaskStarted(
        task_id=task.id,
        tool_use_id=task.tool_use_id,
        description=task.description,
        task_type=task.type.value,
    )


def task_terminated(task: TaskStateBase, summary: str | None = None) -> TaskTerminated:
    """`task_terminated` of a terminal `task`."""
    return TaskTerminated(
        task_id=task.id,
        status=task.status.value,
        summary=summary if summary is not None else summary_for(task),
    )


def task_notified(
    task: TaskStateBase, summary: str | None = None, extras: Mapping[str, Any] | None = None
) -> TaskNotified:
    """The notification event of a terminal `task`: the XML (with its kind's `extras`, such
    as result and usage) and its plain-text summary."""
    text = summary if summary is not None else summary_for(task)
    return TaskNotified(
        task_id=task.id,
        owner=task.owner,
        status=task.status.value,
        notification=task_notification_for(task, text, **(extras or {})),
        summary=text,
    )
