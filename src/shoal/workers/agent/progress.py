"""What an agent run shows of itself as it goes: its progress (tool uses, tokens, the 5
latest activities, each with its time, and a summary: the latest thing the agent said, else
its latest tool call), the conversation's messages as views list them (the last 50), and the
readable output file (what the model said, the tools it called, the first lines of their
results).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from shoal.core.paths import FILE_MODE
from shoal.core.taskstatus import AGENT_MESSAGES_UI_CAP, MESSAGE_TEXT_CAP

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

RECENT_ACTIVITIES: Final = 5


@dataclass
class Progress:
    """The seed's agent progress (its ProgressTracker): counts, the latest activity and the
    five before it (each with the time it was made), the summary. Tokens count as the seed
    counts them: each request's input is the whole conversation so far, so only the latest
    request's counts, beside every output.

    Beside it, what the runner reports with it but not as progress: the conversation's last
    messages (`messages`, for views) and how many pending messages reached it (`drained`)."""

    tool_use_count: int = 0
    latest_input_tokens: int = 0  # the latest request's input, cache reads and writes included
    cumulative_output_tokens: int = 0
    last_activity: str | None = None
    recent_activities: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_ACTIVITIES))
    activity_times: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_ACTIVITIES))
    summary: str | None = None
    messages: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=AGENT_MESSAGES_UI_CAP)
    )
    drained: int = 0
    from_disk: bool = False  # `messages` began with a conversation read back (a resume)

    @property
    def token_count(self) -> int:
        return self.latest_input_tokens + self.cumulative_output_tokens

    def count(self, usage: Any) -> None:
        """Count one model response's usage (pydantic-ai's RequestUsage, whose input_tokens
        holds the cache reads and writes of every provider)."""
        self.latest_input_tokens = usage.input_tokens
        self.cumulative_output_tokens += usage.output_tokens

    def count_history(self, messages: Sequence[ModelMessage]) -> None:
        """Count the responses of a conversation read back (a resumed agent goes on)."""
        from pydantic_ai.messages import ModelResponse

        for message in messages:
            if isinstance(message, ModelResponse):
                self.count(message.usage)

    def note(self, activity: str, at: float | None = None) -> None:
        self.last_activity = activity
        self.recent_activities.append(activity)
        self.activity_times.append(time.time() if at is None else at)

    def said(self, role: str, text: str, kind: str = "text", at: float | None = None) -> None:
        """One message of the conversation, for views (its text cut to MESSAGE_TEXT_CAP)."""
        text = text.strip()
        if not text:
            return
        cut = text if len(text) <= MESSAGE_TEXT_CAP else text[:MESSAGE_TEXT_CAP] + "…"
        at = time.time() if at is None else at
        self.messages.append({"role": role, "kind": kind, "text": cut, "at": at})

    def to_record(self) -> dict[str, Any]:
        return {
            "tool_use_count": self.tool_use_count,
            "token_count": self.token_count,
            "latest_input_tokens": self.latest_input_tokens,
            "cumulative_output_tokens": self.cumulative_output_tokens,
            "last_activity": self.last_activity,
            "last_activity_at": self.activity_times[-1] if self.activity_times else None,
            "recent_activities": list(self.recent_activities),
            "recent_activity_times": list(self.activity_times),
            "summary": self.summary,
        }


def summary_of(text: str) -> str | None:
    """The first line of what the agent said, cut to 200 characters, for its summary."""
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()[:200]
    return None


def conversation_messages(
    messages: Iterable[ModelMessage], into: Progress | None = None
) -> list[dict[str, Any]]:
    """The messages of a conversation as views show them (user texts, assistant texts and
    tool calls; the last AGENT_MESSAGES_UI_CAP), e.g. of a transcript read back from disk."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart

    progress = into if into is not None else Progress()
    for message in messages:
        at = getattr(message, "timestamp", None)
        when = at.timestamp() if at is not None else None
        if isinstance(message, ModelRequest):
            for text in prompt_texts([message]):
                progress.said("user", text, at=when)
        elif isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, TextPart):
                    progress.said("assistant", part.content, at=when)
                elif isinstance(part, ToolCallPart):
                    line = describe_call(part.tool_name, part.args_as_dict())
                    progress.said("assistant", line, "tool_use", at=when)
    return list(progress.messages)


def describe_call(name: str, args: Any) -> str:
    """`Bash(ls -la)`: a tool call in one short line, for progress and the readable output."""
    if isinstance(args, dict):
        for key in ("description", "command", "file_path", "pattern", "to", "prompt"):
            if isinstance(args.get(key), str):
                return f"{name}({args[key][:80]})"
    return f"{name}()"


class Output:
    """The task's readable output file: what the model said, the tools it called, their
    results (first lines)."""

    def __init__(self, path: Path | None, *, echo: bool | Callable[[str], None] = False) -> None:
        self.path = path
        # Also shown live (a tmux pane): True for stdout, or a function given each text (a
        # teammate's console).
        self.echo = echo

    def write(self, text: str) -> None:
        if not text:
            return
        if callable(self.echo):
            self.echo(text)
        elif self.echo:
            with contextlib.suppress(OSError):
                sys.stdout.write(text)
                sys.stdout.flush()
        if self.path is None:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def short_result(text: str, lines: int = 6) -> str:
    """A tool result's first `lines` lines, as the readable output shows it."""
    kept = [line[:200] for line in text.splitlines()[:lines]]
    more = len(text.splitlines()) - len(kept)
    body = "\n".join(f"  ⎿ {line}" if i == 0 else f"    {line}" for i, line in enumerate(kept))
    return body + (f"\n    … {more} more line(s)" if more > 0 else "")


def prompt_texts(messages: Sequence[ModelMessage]) -> list[str]:
    """The text of every user prompt part of `messages`. A part's content is a string, or a
    list when several queued messages reached one request together (its strings count)."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    texts: list[str] = []
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if not isinstance(part, UserPromptPart):
                continue
            if isinstance(part.content, str):
                texts.append(part.content)
            else:
                texts += [item for item in part.content if isinstance(item, str)]
    return texts
