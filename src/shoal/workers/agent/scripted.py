"""The scripted model: a deterministic TOML script of texts and tool calls, one turn per model
request, run through pydantic-ai's `FunctionModel` (no network, no randomness).

    final = "done: {last}"          # the answer once the turns run out (optional)

    [[turn]]
    text = "Listing the files."     # optional text before the calls
    [[turn.call]]
    tool = "Bash"
    args = { command = "ls", description = "list files" }

    [[turn]]
    text = "ls printed {last}"      # a turn without calls is the final answer
    wait_for = "/tmp/go"            # (any turn) answered only once this file exists
    usage = { input = 40, cache_read = 10, cache_write = 1, output = 7 }
                                    # (any turn) what its request reports it cost; omitted:
                                    # pydantic-ai's estimate

Strings (texts and every string inside `args`) are templates: `{prompt}` the latest user
message, `{last}` the latest tool result, `{result_N}` the N-th tool result of the whole
conversation (from 1), `{turn}` this turn's number (from 1), `{notified}` the `<result>` of
the latest task notification (a coordinator's), `{attached}` the `<task-output>` blocks the
request being answered carries (what the agent's background tasks wrote since the last
request: attachments.py; "(nothing attached)" when it carries none; they are never the
`{prompt}`), `{{`/`}}` literal braces. Turns count across the conversation, so a resumed
agent goes on with the next turn.

A coordinator's workers run on the coordinator's model, so one script can hold theirs too:
`[[worker]]` tables, each with `match` (a regex searched in the worker's prompt; omitted: any
worker), its own `[[worker.turn]]`s and `final`. A conversation that does not open with the
coordinator's context block is a worker's: it follows the first `[[worker]]` that matches its
prompt (with none matching, the top-level turns).

    [[worker]]
    match = "^Research"
    [[worker.turn]]
    [[worker.turn.call]]
    tool = "Grep"
    args = { pattern = "def divide" }

A coordinator hears of its workers' ends as they come, one or several to a request, so its
later turns are better keyed to how many have come than to their number: an `[[after]]` table
with `notifications = N` is played once, at the first request when at least N end
notifications are in the conversation (in the order the tables are written); a request with
no turn and no `[[after]]` due gets `final`. An `[[after]]` without calls needs a text that
opens with fixed words (that is how it is known to have been played).

    [[after]]
    notifications = 2
    text = "Both research results are in: implementing."
    [[after.call]]
    tool = "Agent"
    args = { description = "fix divide", prompt = "...", write_set = ["calc/ops.py"] }
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from shoal.core.errors import UsageError
from shoal.core.notify import END_NOTIFICATION
from shoal.workers.agent.attachments import is_attachment

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

_FIELD: Final = re.compile(r"^(prompt|last|turn|notified|attached|result_[1-9][0-9]*)$")
_RESULT: Final = re.compile(r"<result>(.*?)</result>", re.DOTALL)
_DEFAULT: Final = "default_script.toml"


@dataclass(frozen=True)
class Call:
    """One tool call of a turn."""

    tool: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class Turn:
    """What the model answers to one request: an optional text, then its tool calls."""

    text: str
    calls: tuple[Call, ...]
    wait_for: str | None = None  # a file whose existence this turn's answer waits for
    usage: Mapping[str, int] | None = None  # what its request reports (USAGE_KEYS)


COORDINATOR_OPENING: Final = "<coordinator-context>"
# A turn's `usage` keys: its request's input as Anthropic reports it (the uncached input, the
# cache reads, the cache writes) and its output.
USAGE_KEYS: Final = ("input", "cache_read", "cache_write", "output")


@dataclass(frozen=True)
class Script:
    """A checked script: its turns and the final answer once they run out, and the scripts of
    a coordinator's workers (by a regex on their prompt)."""

    turns: tuple[Turn, ...]
    final: str = "done"
    source: str = "the default script"
    workers: tuple[tuple[re.Pattern[str] | None, Script], ...] = ()
    after: tuple[tuple[int, Turn], ...] = ()  # (end notifications needed, the turn)

    def for_conversation(self, first_prompt: str) -> Script:
        """The script a conversation that opened with `first_prompt` follows."""
        if not self.workers or first_prompt.lstrip().startswith(COORDINATOR_OPENING):
            return self
        for pattern, script in self.workers:
            if pattern is None or pattern.search(first_prompt):
                return script
        return self

    @classmethod
    def default(cls) -> Script:
        """The embedded default (a package data file)."""
        text = resources.files("shoal.workers.agent").joinpath(_DEFAULT).read_text()
        return cls.parse(text, "the default script")

    @classmethod
    def load(cls, path: Path) -> Script:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read script {path}: {exc}") from None
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> Script:
        """Check a script's TOML; every problem is a UsageError naming the file and turn."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{source}: {exc}") from None
        unknown = set(data) - {"turn", "final", "worker", "after"}
        if unknown:
            raise UsageError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}")
        raw_workers = data.get("worker", [])
        if not isinstance(raw_workers, list):
            raise UsageError(f"{source}: `worker` must be an array of tables ([[worker]])")
        workers: list[tuple[re.Pattern[str] | None, Script]] = []
        for i, raw in enumerate(raw_workers, 1):
            where = f"{source}: worker {i}"
            if not isinstance(raw, dict) or set(raw) - {"match", "turn", "final"}:
                raise UsageError(f"{where}: only match, final and [[worker.turn]] are allowed")
            match = raw.get("match")
            try:
                pattern = re.compile(match) if isinstance(match, str) else None
            except re.error as exc:
                raise UsageError(f"{where}: match {match!r} is not a regex: {exc}") from None
            if match is not None and not isinstance(match, str):
                raise UsageError(f"{where}: match must be a string (a regex)")
            inner = {k: v for k, v in raw.items() if k != "match"}
            workers.append((pattern, cls._from(inner, where)))
        return cls._from(data, source, tuple(workers))

    @classmethod
    def _from(
        cls,
        data: dict[str, Any],
        source: str,
        workers: tuple[tuple[re.Pattern[str] | None, Script], ...] = (),
    ) -> Script:
        raw_turns = data.get("turn", [])
        if not isinstance(raw_turns, list):
            raise UsageError(f"{source}: `turn` must be an array of tables ([[turn]])")
        turns = tuple(_turn(t, f"{source}: turn {i}") for i, t in enumerate(raw_turns, 1))
        final = data.get("final", "done")
        if not isinstance(final, str):
            raise UsageError(f"{source}: final must be a string")
        _check_template(final, f"{source}: final")
        raw_after = data.get("after", [])
        if not isinstance(raw_after, list):
            raise UsageError(f"{source}: `after` must be an array of tables ([[after]])")
        after: list[tuple[int, Turn]] = []
        for i, raw in enumerate(raw_after, 1):
            where = f"{source}: after {i}"
            if not isinstance(raw, dict):
                raise UsageError(f"{where}: must be a table")
            count = raw.get("notifications")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise UsageError(f"{where}: needs notifications = N (a whole number)")
            turn = _turn({k: v for k, v in raw.items() if k != "notifications"}, where)
            if not turn.calls and not _fixed_prefix(turn.text):
                raise UsageError(f"{where}: a text-only [[after]] must open with fixed words")
            after.append((count, turn))
        return cls(turns, final, source, workers, tuple(after))


def _turn(raw: Any, where: str) -> Turn:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: must be a table")
    unknown = set(raw) - {"text", "call", "wait_for", "usage"}
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    text = raw.get("text", "")
    if not isinstance(text, str):
        raise UsageError(f"{where}: text must be a string")
    _check_template(text, where)
    calls: list[Call] = []
    for j, call in enumerate(raw.get("call", []), 1):
        here = f"{where}, call {j}"
        if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
            raise UsageError(f'{here}: needs tool = "NAME"')
        args = call.get("args", {})
        if not isinstance(args, dict) or set(call) - {"tool", "args"}:
            raise UsageError(f"{here}: only tool and args (a table) are allowed")
        _check_templates(args, here)
        calls.append(Call(call["tool"], args))
    if not text and not calls:
        raise UsageError(f"{where}: has neither text nor call")
    wait_for = raw.get("wait_for")
    if wait_for is not None and not isinstance(wait_for, str):
        raise UsageError(f"{where}: wait_for must be a path (a string)")
    return Turn(text, tuple(calls), wait_for, _usage(raw.get("usage"), where))


def _usage(raw: Any, where: str) -> Mapping[str, int] | None:
    if raw is None:
        return None
    known = ", ".join(USAGE_KEYS)
    if not isinstance(raw, dict) or set(raw) - set(USAGE_KEYS):
        raise UsageError(f"{where}: usage must be a table of {known}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{where}: usage {key} must be a whole number >= 0, not {value!r}")
    return dict(raw)


def _check_templates(value: Any, where: str) -> None:
    if isinstance(value, str):
        _check_template(value, where)
    elif isinstance(value, dict):
        for item in value.values():
            _check_templates(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_templates(item, where)


def _check_template(text: str, where: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise UsageError(f"{where}: bad template {text!r}: {exc}") from None
    for name in fields:
        if not _FIELD.match(name):
            raise UsageError(
                f"{where}: unknown template field {{{name}}} "
                "(known: {prompt}, {last}, {result_N}, {turn}, {notified}, {attached})"
            )


class _Values(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return f"(no {key.replace('_', ' ')} yet)"


def _render(value: Any, values: _Values) -> Any:
    if isinstance(value, str):
        return value.format_map(values)
    if isinstance(value, dict):
        return {k: _render(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, values) for v in value]
    return value


def conversation_values(messages: list[ModelMessage]) -> tuple[int, _Values]:
    """(turns answered so far, template values) read from the history."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        ToolReturnPart,
        UserPromptPart,
    )

    values = _Values(prompt="", last="")
    answered = 0
    results = 0
    attached: list[str] = []  # the attachments since the latest response
    for message in messages:
        if isinstance(message, ModelResponse):
            answered += 1
            attached = []
            continue
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                content = part.content
                items = [content] if isinstance(content, str) else list(content)
                blocks = [i for i in items if isinstance(i, str) and is_attachment(i)]
                attached += blocks
                if blocks:  # (an attachment is not what the agent was asked)
                    items = [i for i in items if i not in blocks]
                    if not items:
                        continue
                    content = items[0] if len(items) == 1 and isinstance(items[0], str) else items
                values["prompt"] = content if isinstance(content, str) else str(content)
                found = _RESULT.findall(values["prompt"])
                if found:
                    values["notified"] = html.unescape(found[-1])
            elif isinstance(part, ToolReturnPart | RetryPromptPart):
                results += 1
                text = (
                    part.model_response_str()
                    if isinstance(part, ToolReturnPart)
                    else part.model_response()
                )
                values[f"result_{results}"] = values["last"] = text
    values["turn"] = str(answered + 1)
    values["attached"] = "\n".join(attached) if attached else "(nothing attached)"
    return answered, values


def first_prompt(messages: list[ModelMessage]) -> str:
    """The first user prompt of the conversation ("" when there is none)."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    return part.content if isinstance(part.content, str) else str(part.content)
    return ""


def waits_for(script: Script, messages: list[ModelMessage]) -> str | None:
    """The file the next numbered turn waits for (its `wait_for`), if any."""
    script = script.for_conversation(first_prompt(messages))
    answered, _values = conversation_values(messages)
    return script.turns[answered].wait_for if answered < len(script.turns) else None


def respond(script: Script, messages: list[ModelMessage]) -> ModelResponse:
    """The script's answer to the request that ends `messages`."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

    script = script.for_conversation(first_prompt(messages))
    answered, values = conversation_values(messages)
    tag = f"call_{answered + 1}"
    if answered < len(script.turns):
        turn = script.turns[answered]
    else:
        due = _due_after(script, messages)
        if due is None:
            return ModelResponse(parts=[TextPart(script.final.format_map(values))])
        index, turn = due
        tag = f"after_{index}"
    parts: list[Any] = []
    if turn.text:
        parts.append(TextPart(turn.text.format_map(values)))
    for i, call in enumerate(turn.calls, 1):
        args = _render(dict(call.args), values)
        parts.append(ToolCallPart(call.tool, args, tool_call_id=f"{tag}_{i}"))
    if turn.usage is None:
        return ModelResponse(parts=parts)
    return ModelResponse(parts=parts, usage=_request_usage(turn.usage))


def _request_usage(usage: Mapping[str, int]) -> Any:
    """A turn's `usage` as pydantic-ai's RequestUsage (whose input holds the cache's)."""
    from pydantic_ai.usage import RequestUsage

    cache_read, cache_write = usage.get("cache_read", 0), usage.get("cache_write", 0)
    return RequestUsage(
        input_tokens=usage.get("input", 0) + cache_read + cache_write,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        output_tokens=usage.get("output", 0),
    )


def _fixed_prefix(text: str) -> str:
    return text.split("{", 1)[0].strip()


def _due_after(script: Script, messages: list[ModelMessage]) -> tuple[int, Turn] | None:
    """The first `[[after]]` not played yet whose count of end notifications has come."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

    if not script.after:
        return None
    from shoal.workers.agent.progress import prompt_texts

    ends = sum(len(END_NOTIFICATION.findall(text)) for text in prompt_texts(messages))
    played: set[int] = set()
    texts: list[str] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            for rpart in message.parts:
                if isinstance(rpart, ToolCallPart) and (rpart.tool_call_id or "").startswith(
                    "after_"
                ):
                    played.add(int(rpart.tool_call_id.split("_")[1]))
                elif isinstance(rpart, TextPart):
                    texts.append(rpart.content)
    for index, (count, turn) in enumerate(script.after, 1):
        if index in played:
            continue
        if not turn.calls and any(t.startswith(_fixed_prefix(turn.text)) for t in texts):
            continue
        return (index, turn) if ends >= count else None
    return None


def scripted_model(script: Script) -> FunctionModel:
    """A pydantic-ai FunctionModel that answers from `script`."""
    from pydantic_ai.models.function import FunctionModel

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        gate = waits_for(script, messages)
        while gate is not None and not os.path.exists(gate):  # (a test's hold on a turn)
            await asyncio.sleep(0.05)
        return respond(script, messages)

    return FunctionModel(answer, model_name=f"scripted:{script.source}")
