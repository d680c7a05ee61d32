"""Sending: resolve recipients through a directory, build a validated message, deliver it.

Routes: a member name, `*` (every alive member but the sender), `uds:<socket>` (a peer over a
unix socket, uid checked with SO_PEERCRED), `bridge:<session>` (another session's lead inbox).
The router knows no team file: a `Directory` (the team layer's) answers who is who. An unknown
name is an error and no inbox is ever created by sending.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shoal.core.clock import iso_now
from shoal.core.errors import UsageError
from shoal.core.ids import new_ulid
from shoal.core.names import validate_name
from shoal.mailbox.schema import AnyMessage, build, encode
from shoal.mailbox.store import Maildir

BROADCAST = "*"
UDS_PREFIX = "uds:"
BRIDGE_PREFIX = "bridge:"


class Directory(Protocol):
    """Who the recipients are; implemented by the team layer."""

    @property
    def lead_name(self) -> str: ...

    def inbox(self, name: str) -> Path: ...

    def broadcast(self, sender: str) -> list[tuple[str, Path]]: ...

    def bridge_inbox(self, session: str) -> Path: ...


@dataclass(frozen=True)
class SendResult:
    """What `send` did: the message id and who it went to."""

    id: str
    message: AnyMessage
    recipients: list[str] = field(default_factory=list)


def new_message_id() -> str:
    """A new ULID string (time-ordered, unique; see core/ids.py's `new_ulid`)."""
    return new_ulid()


def make_message(
    *,
    sender: str,
    to: str,
    kind: str = "text",
    text: str | None = None,
    summary: str | None = None,
    data: dict[str, Any] | None = None,
    reply_to: str | None = None,
    message_id: str | None = None,
) -> AnyMessage:
    """Build and validate a message (kind-specific `data` checked here, before delivery)."""
    fields: dict[str, Any] = {
        "v": 1,
        "id": message_id or new_message_id(),
        "from": sender,
        "to": to,
        "kind": kind,
        "sent_at": iso_now(),
        "text": text,
        "summary": summary,
        "reply_to": reply_to,
    }
    if data is not None:
        fields["data"] = data
    return build(fields)


def deliver_to(inbox: Path, message: AnyMessage, *, durable: bool = False) -> str:
    """Deliver an already-built message into one inbox directory (which must exist)."""
    return _maildir(inbox).deliver(encode(message), durable=durable)


_OPENED: dict[Path, Maildir] = {}


def _maildir(inbox: Path) -> Maildir:
    """The inbox at `inbox`, fully checked (no symlinks, all four directories) the first time
    this process uses it; later sends only check that it is still a real directory."""
    opened = _OPENED.get(inbox)
    if opened is not None:
        try:
            still = stat.S_ISDIR(os.lstat(inbox).st_mode)  # gone, or swapped for a link?
        except FileNotFoundError:
            still = False
        if still:
            return opened
    opened = Maildir.open(inbox)
    if inbox.parent.name != "replies":  # one-off reply inboxes are not worth remembering
        _OPENED[inbox] = opened
    return opened


UdsSender = Callable[[str, bytes], None]


def send(
    directory: Directory,
    *,
    to: str,
    sender: str,
    kind: str = "text",
    text: str | None = None,
    summary: str | None = None,
    data: dict[str, Any] | None = None,
    reply_to: str | None = None,
    durable: bool = False,
    uds_send: UdsSender | None = None,
) -> SendResult:
    """Send one message; returns its id once it is durably in every recipient's `new/`."""
    validate_name(sender, "sender name")
    if not to:
        raise UsageError("no recipient given")
    message = make_message(
        sender=sender, to=to, kind=kind, text=text, summary=summary, data=data, reply_to=reply_to
    )
    raw = encode(message)
    if to == BROADCAST:
        targets = directory.broadcast(sender)
    elif to.startswith(UDS_PREFIX):
        from shoal.mailbox.uds import send_uds

        (uds_send or send_uds)(to[len(UDS_PREFIX) :], raw)
        return SendResult(message.id, message, [to])
    elif to.startswith(BRIDGE_PREFIX):
        targets = [(to, directory.bridge_inbox(to[len(BRIDGE_PREFIX) :]))]
    else:
        targets = [(to, directory.inbox(to))]
    for _, inbox in targets:
        _maildir(inbox).deliver(raw, durable=durable)
    return SendResult(message.id, message, [name for name, _ in targets])


def task_notification_message(
    *,
    sender: str,
    to: str,
    xml: str,
    summary: str,
    task_id: str,
    status: str,
    task_type: str,
    output_file: str | None,
    message_id: str | None = None,
    **extra: Any,
) -> AnyMessage:
    """The one builder of `task_notification` messages: the XML as text, its plain summary
    (never scraped back out of the escaped XML) and the fields a reader acts on as data."""
    return make_message(
        sender=sender,
        to=to,
        kind="task_notification",
        text=xml,
        summary=summary,
        data={
            "task_id": task_id,
            "status": status,
            "task_type": task_type,
            "summary": summary,
            "output_file": output_file,
            **extra,
        },
        message_id=message_id,
    )


def notify_owner(directory: Directory, owner: str, **fields: Any) -> str:
    """Deliver a task's notification (`task_notification_message`'s fields) to its owner's
    inbox; returns the message id."""
    message = task_notification_message(sender=directory.lead_name, to=owner, **fields)
    deliver_to(directory.inbox(owner), message)
    return message.id
