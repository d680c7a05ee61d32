"""The sidechain transcript: `sessions/{s}/transcripts/{agent_id}.jsonl`, one model message
(request or response, pydantic-ai's message JSON) per line, appended as it happens:

    {"v": 1, "message": {...}}
    {"v": 1, "truncate": 7}      the conversation from message 7 on is replaced by what follows

A conversation whose earlier messages changed (pydantic-ai replaces a request that took a
queued message with a copy; a stopped turn drops its round in flight) is never rewritten in
place: a `truncate` record says from where the lines after it stand instead.

A kill -9 loses at most the line being written: `load` keeps the good prefix, reports the
first bad line, and drops a trailing response whose tool calls never got their results (the
round in flight), so a resumed run redoes that round instead of answering a half-done one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from shoal.core.errors import NoSpaceError, is_no_space
from shoal.core.jsonio import append_line, atomic_write
from shoal.core.paths import FILE_MODE

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


# What `load` says of a last round whose tool calls have no results (it is dropped, redone).
IN_FLIGHT_NOTE = "the last round's tool calls have no results; that round is redone"


@dataclass
class Loaded:
    """What `load` could use of a transcript, and what it could not."""

    messages: list[ModelMessage] = field(default_factory=list)
    problem: str | None = None  # the first bad line, or a dropped round in flight


def _adapter() -> Any:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter


class Transcript:
    """Appends messages to one agent's transcript file (0600, never through a symlink)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._kept: list[ModelMessage] = []  # the conversation as the file now says it

    @property
    def written(self) -> int:
        """How many messages of the conversation are on disk."""
        return len(self._kept)

    def resume(self, messages: Sequence[ModelMessage]) -> None:
        """The file already holds `messages` (a conversation loaded from it)."""
        self._kept = list(messages)

    def append(self, messages: Sequence[ModelMessage]) -> None:
        """Bring the file up to `messages` (callers pass the whole history each time): the
        new ones appended, after a `truncate` record when earlier ones changed."""
        same = 0
        for old, new_message in zip(self._kept, messages, strict=False):
            if old is not new_message and old != new_message:
                break
            same += 1
        if same == len(self._kept) == len(messages):
            return
        records = _adapter().dump_python(list(messages[same:]), mode="json")
        lines = [orjson.dumps({"v": 1, "truncate": same})] if same < len(self._kept) else []
        lines += [orjson.dumps({"v": 1, "message": r}) for r in records]
        data = b"".join(line + b"\n" for line in lines)
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, _FLAGS, FILE_MODE)
        except OSError as exc:
            if is_no_space(exc):
                raise NoSpaceError.from_os_error(exc, self.path, what="transcript") from None
            raise
        try:
            # Whole lines or none: a short write is carried on, and what a full disk cut off
            # is taken back (NoSpaceError), so no record is ever glued to a torn one. What
            # failed stays unwritten here and goes with the next append.
            append_line(fd, data, self.path, what="transcript")
        finally:
            os.close(fd)
        self._kept = list(messages)

    def adopt(self, loaded: Loaded) -> None:
        """Continue from `loaded` (read from this file). When it could not use all of the
        file (a torn or bad line, a round in flight), the file is rewritten to hold exactly
        what it used, so what is appended next follows it (the old bytes are kept beside it
        as `{name}.corrupt` when a line was bad)."""
        if loaded.problem is not None and self.path.exists():
            if ":" in loaded.problem and "line(s) ignored" in loaded.problem:
                with contextlib.suppress(OSError):
                    shutil.copyfile(self.path, self.path.with_name(self.path.name + ".corrupt"))
            records = _adapter().dump_python(list(loaded.messages), mode="json")
            data = b"".join(orjson.dumps({"v": 1, "message": r}) + b"\n" for r in records)
            atomic_write(self.path, data)
            os.chmod(self.path, FILE_MODE)
        self._kept = list(loaded.messages)

    @staticmethod
    def load(path: Path) -> Loaded:
        """The good prefix of a transcript, and what was wrong with the rest."""
        loaded = Loaded()
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            loaded.problem = f"{path}: no transcript"
            return loaded
        adapter = _adapter()
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
                if not isinstance(record, dict) or record.get("v") != 1:
                    raise ValueError("not a transcript record")
                if "truncate" in record:
                    cut = record["truncate"]
                    if not isinstance(cut, int) or not 0 <= cut <= len(loaded.messages):
                        raise ValueError(f"truncate {cut!r} is past the conversation")
                    del loaded.messages[cut:]
                    continue
                loaded.messages.extend(adapter.validate_python([record["message"]]))
            except Exception as exc:  # orjson, pydantic and key errors alike: stop here
                rest = len(raw.splitlines()) - number + 1
                loaded.problem = (
                    f"{path}:{number}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]} "
                    f"(used the {number - 1} line(s) before it; {rest} line(s) ignored)"
                )
                break
        if _in_flight(loaded.messages):
            loaded.messages.pop()
            note = IN_FLIGHT_NOTE
            loaded.problem = f"{loaded.problem}; {note}" if loaded.problem else f"{path}: {note}"
        return loaded


def _in_flight(messages: list[ModelMessage]) -> bool:
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    return bool(messages) and (
        isinstance(messages[-1], ModelResponse)
        and any(isinstance(p, ToolCallPart) for p in messages[-1].parts)
    )
