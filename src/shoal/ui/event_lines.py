"""One human line per event record (`shoal events` without --json, a foreground leader's log).

Records are the JSON objects of `events.jsonl` (`Event.to_record()`): plain dicts, so reading
the stream needs no model. An unknown subtype still gets a line, its fields shown as key=value.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

_SKIP: Final = frozenset({"type", "subtype", "session_id", "ts", "uuid"})
_PREVIEW: Final = 120


def _one_line(text: Any, limit: int = _PREVIEW) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _message_words(msg: Mapping[str, Any]) -> str:
    """What a message says in words: a task notification's summary (and, unless it
    completed, what it ended with), not its XML; any other message's text."""
    if msg.get("kind") != "task_notification":
        return str(msg.get("text") or "")
    raw = msg.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    words = str(msg.get("summary") or data.get("summary") or data.get("status") or "")
    if data.get("status") not in (None, "completed") and data.get("result"):
        words += f": {data['result']}"
    return words


def event_line(record: Mapping[str, Any], *, leader_view: bool = False) -> str | None:
    """`HH:MM:SS what  id  detail` for one event; None for what a leader's log leaves out
    (`leader_view`: only starts, ends, stalls, notes and messages, as it always printed)."""
    ts = record.get("ts")
    stamp = datetime.fromtimestamp(ts if isinstance(ts, (int, float)) else time.time())
    head = stamp.strftime("%H:%M:%S")
    kind, sub = record.get("type"), record.get("subtype")
    task = record.get("task_id", "")
    if kind == "message":
        msg = record.get("message") or {}
        return (
            f"{head} message   from {msg.get('from')} [{msg.get('kind')}] "
            f"{_one_line(_message_words(msg))}"
        ).rstrip()
    if sub == "task_started":
        return f"{head} started   {task}  {_one_line(record.get('description'))}"
    if sub == "task_terminated":
        return f"{head} {record.get('status', ''):<9} {task}  {_one_line(record.get('summary'))}"
    if sub == "task_stalled":
        return f"{head} waiting?  {task}  last line: {_one_line(record.get('prompt'))}"
    if sub == "note":
        return f"{head} note      {_one_line(record.get('text'), 200)}"
    if leader_view:
        return None
    if sub == "leader_started":
        how = "resumed" if record.get("resumed") else "started"
        return f"{head} leader    {how} for team {record.get('team')} (pid {record.get('pid')})"
    if sub == "leader_stopped":
        return f"{head} leader    stopped (team {record.get('team')})"
    if sub == "task_progress":
        what = record.get("activity") or record.get("summary") or ""
        counts = f"{record.get('tool_use_count', 0)} tools, {record.get('token_count', 0)} tokens"
        return f"{head} progress  {task}  {_one_line(what)} ({counts})".replace("  ()", "")
    if sub == "task_notification":
        to = record.get("owner") or "the lead"
        return f"{head} notified  {task}  {to}: {record.get('status')}"
    if sub == "teammate_spawned":
        return (
            f"{head} spawned   {task}  {record.get('name')} on {record.get('backend')}"
            f" ({_one_line(record.get('why'), 60)})"
        )
    if sub == "teammate_ready":
        return f"{head} ready     {task}  {record.get('name')}"
    rest = " ".join(
        f"{k}={_one_line(v, 60)}" for k, v in record.items() if k not in _SKIP and v is not None
    )
    label = f"{kind}:{sub}" if sub else str(kind)
    return f"{head} {label}  {rest}".rstrip()
