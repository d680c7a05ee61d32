"""`exec` presets for real CLI agents: a teammate whose turns are runs of Claude Code
(`--agent claude`) or Codex (`--agent codex`), their JSON event streams parsed into progress,
usage and the result.

    claude -p --output-format stream-json --verbose [--resume SESSION_ID] -- PROMPT
    codex exec --json --skip-git-repo-check [resume THREAD_ID] -- PROMPT

The first turn's stream names the session (claude's `system/init`, codex's `thread.started`);
every later turn resumes it, so the teammate keeps one conversation. The raw stream is kept
beside the output file (`{output}.claude.jsonl`, `{output}.codex.jsonl`); the output file gets
its readable text: what the model said, the tools it called, the final result and what it
cost. `--cmd` replaces the command itself (e.g. `'claude --allowedTools Bash,Read'`, or a path
to the binary).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from shoal.core.errors import UsageError
from shoal.core.paths import FILE_MODE
from shoal.workers.teammate.brains import TurnContext, TurnResult, render, run_command

PRESETS: Final = ("claude", "codex")
PUMP_INTERVAL_S: Final = 0.2


class EventStream(Protocol):
    """What one run of a CLI agent said, fed event by event. Its tokens are the
    conversation's, counted as the seed counts them: the latest request's input plus every
    output (earlier runs' too: a run resumes the conversation)."""

    session_id: str | None
    tool_uses: int
    result: str | None
    is_error: bool

    def feed(self, event: dict[str, Any]) -> list[str]: ...

    @property
    def latest_input_tokens(self) -> int: ...

    @property
    def cumulative_output_tokens(self) -> int: ...

    @property
    def total_tokens(self) -> int: ...


# Claude's input keys of one request: the input the API reports leaves out the cache.
CLAUDE_INPUT_KEYS: Final = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


@dataclass
class ClaudeStream:
    """What a Claude Code `stream-json` run said, event by event.

    Each `assistant` event carries its request's usage: the input (whole) but the output only
    as the stream began (its final count never reaches these events); the `result` event's
    usage sums the run's requests, so its output is this run's output and its input is not
    one request's. `prior_output` is the conversation's output before this run."""

    prior_output: int = 0
    session_id: str | None = None
    tool_uses: int = 0
    latest_input_tokens: int = 0
    run_output_tokens: int = 0
    result: str | None = None
    is_error: bool = False
    usage: dict[str, Any] = field(default_factory=dict)
    num_turns: int | None = None
    cost_usd: float | None = None
    texts: list[str] = field(default_factory=list)
    _outputs: dict[str, int] = field(default_factory=dict)  # by message id, until the result

    def feed(self, event: dict[str, Any]) -> list[str]:
        """Take one event; returns the readable lines it adds (and notes activities)."""
        kind = event.get("type")
        lines: list[str] = []
        if kind == "system" and event.get("subtype") == "init":
            self.session_id = event.get("session_id") or self.session_id
            lines.append(f"[claude {event.get('claude_code_version', '')} on {event.get('model')}]")
        elif kind == "assistant":
            message = event.get("message") or {}
            for part in message.get("content") or ():
                if part.get("type") == "text" and str(part.get("text", "")).strip():
                    lines.append(str(part["text"]).strip())
                elif part.get("type") == "tool_use":
                    self.tool_uses += 1
                    lines.append(f"● {describe_tool(part.get('name', '?'), part.get('input'))}")
            self._request(str(message.get("id") or len(self._outputs)), message.get("usage"))
        elif kind == "result":
            self.session_id = event.get("session_id") or self.session_id
            self.result = event.get("result") if isinstance(event.get("result"), str) else None
            self.is_error = bool(event.get("is_error")) or event.get("subtype") != "success"
            self.usage = event.get("usage") or {}
            if "output_tokens" in self.usage:
                self.run_output_tokens = int(self.usage.get("output_tokens") or 0)
            self.num_turns = event.get("num_turns")
            self.cost_usd = event.get("total_cost_usd")
            cost = f", ${self.cost_usd:.4f}" if isinstance(self.cost_usd, int | float) else ""
            lines.append(
                f"[claude: {self.num_turns} turn(s), {self.total_tokens} tokens "
                f"({self.latest_input_tokens} in the latest request, "
                f"{self.cumulative_output_tokens} out){cost}]"
            )
        return lines

    def _request(self, message_id: str, usage: Any) -> None:
        """One request's usage (an assistant event; several events may share a message)."""
        if not isinstance(usage, dict):
            return
        if any(key in usage for key in CLAUDE_INPUT_KEYS):
            self.latest_input_tokens = sum(int(usage.get(k) or 0) for k in CLAUDE_INPUT_KEYS)
        seen = self._outputs.get(message_id, 0)
        self._outputs[message_id] = max(seen, int(usage.get("output_tokens") or 0))
        self.run_output_tokens = sum(self._outputs.values())

    @property
    def cumulative_output_tokens(self) -> int:
        return self.prior_output + self.run_output_tokens

    @property
    def total_tokens(self) -> int:
        return self.latest_input_tokens + self.cumulative_output_tokens


def describe_tool(name: str, args: Any) -> str:
    """`Bash(ls -la)`: a tool call in one short line."""
    if isinstance(args, dict):
        for key in ("description", "command", "file_path", "pattern", "prompt"):
            if isinstance(args.get(key), str):
                return f"{name}({args[key][:80]})"
    return f"{name}()"


# Codex items that are the agent acting (a tool use each), by their `type`.
CODEX_TOOL_ITEMS: Final = frozenset(
    {"command_execution", "file_change", "mcp_tool_call", "web_search", "collab_tool_call"}
)
OUTPUT_TAIL_LINES: Final = 20


@dataclass
class CodexStream:
    """What a `codex exec --json` run said, event by event.

    Its `turn.completed` usage is the thread's running total (a resumed run's includes the
    earlier runs'), never one request's: the latest input shoal counts for Codex is this
    run's input (the thread's, less `prior_input`, its input when the run started), which
    holds the latest request's and is more when the run made several; the output is the
    thread's."""

    prior_input: int = 0
    session_id: str | None = None
    tool_uses: int = 0
    result: str | None = None
    is_error: bool = False
    ended: bool = False  # turn.completed or turn.failed was seen
    thread_input: int | None = None
    latest_input_tokens: int = 0
    cumulative_output_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    _counted: set[str] = field(default_factory=set)

    def feed(self, event: dict[str, Any]) -> list[str]:
        """Take one event; returns the readable lines it adds."""
        kind = event.get("type")
        lines: list[str] = []
        if kind == "thread.started":
            self.session_id = event.get("thread_id") or self.session_id
        elif kind in ("item.started", "item.completed"):
            item = event.get("item") or {}
            lines += self._item(item, done=kind == "item.completed")
        elif kind == "turn.completed":
            self.ended = True
            usage = event.get("usage") or {}
            self.thread_input = int(usage.get("input_tokens") or 0)  # (cached included)
            self.latest_input_tokens = max(0, self.thread_input - self.prior_input)
            self.cumulative_output_tokens = int(usage.get("output_tokens") or 0)
            lines.append(f"[codex: {self.tool_uses} tool use(s), {self.total_tokens} tokens]")
        elif kind == "turn.failed":
            self.ended = True
            self.is_error = True
            message = str((event.get("error") or {}).get("message") or "turn failed")
            self.result = message
            lines.append(f"[codex: turn failed: {message[:500]}]")
        elif kind == "error":
            self.errors.append(str(event.get("message") or ""))
            lines.append(f"[codex: error: {str(event.get('message'))[:500]}]")
        return lines

    def _item(self, item: dict[str, Any], done: bool) -> list[str]:
        kind = item.get("type")
        if kind in CODEX_TOOL_ITEMS and done and str(item.get("id")) not in self._counted:
            self._counted.add(str(item.get("id")))
            self.tool_uses += 1
        if kind == "agent_message" and done:
            text = str(item.get("text") or "").strip()
            self.result = text or self.result
            return [text] if text else []
        if kind == "command_execution":
            if not done:
                return [f"● Bash({str(item.get('command', ''))[:80]})"]
            tail = str(item.get("aggregated_output") or "").rstrip("\n").splitlines()
            shown = [f"  {line}" for line in tail[-OUTPUT_TAIL_LINES:]]
            return [*shown, f"  (exit {item.get('exit_code')})"]
        if kind == "file_change" and done:
            changes = item.get("changes") or []
            return [f"● Edit({c.get('path')}: {c.get('kind')})" for c in changes]
        if kind == "mcp_tool_call" and done:
            return [f"● {item.get('server')}.{item.get('tool')}()"]
        if kind == "web_search" and done:
            return [f"● WebSearch({str(item.get('query', ''))[:80]})"]
        if kind == "todo_list" and done:
            todo = item.get("items") or []
            return [f"  [{'x' if t.get('completed') else ' '}] {t.get('text')}" for t in todo]
        if kind == "error" and done:
            return [f"[codex: {str(item.get('message', ''))[:500]}]"]
        return []

    @property
    def total_tokens(self) -> int:
        return self.latest_input_tokens + self.cumulative_output_tokens


class CliAgentBrain:
    """A teammate whose turns are runs of a CLI agent (`claude` or `codex`), each resuming
    the session the first one started."""

    def __init__(self, preset: str, cmd: str | None = None) -> None:
        if preset not in PRESETS:
            raise UsageError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
        self.preset = preset
        try:
            self.base = shlex.split(cmd) if cmd else [preset]
        except ValueError as exc:
            raise UsageError(f"--cmd {cmd!r} cannot be parsed: {exc}") from None
        if not self.base:
            raise UsageError("--cmd is empty")
        self.session_id: str | None = None
        # The conversation's counts, as the seed's: they go on over the turns (one session).
        self.latest_input_tokens = 0
        self.cumulative_output_tokens = 0
        self.thread_input = 0  # codex: the thread's input so far (its counts are running totals)

    def argv(self, prompt: str) -> list[str]:
        """The command of one turn: its options, then `--`, then the prompt as one argument
        (both CLIs' parsers, commander's and clap's, end options at `--`), so a prompt that
        starts with `-` is never read as a flag."""
        if self.preset == "codex":
            resume = ["resume", self.session_id] if self.session_id else []
            return [*self.base, "exec", "--json", "--skip-git-repo-check", *resume, "--", prompt]
        argv = [*self.base, "-p", "--output-format", "stream-json", "--verbose"]
        if self.session_id:
            argv += ["--resume", self.session_id]
        return [*argv, "--", prompt]

    def stream(self) -> EventStream:
        if self.preset == "codex":
            return CodexStream(
                prior_input=self.thread_input,
                latest_input_tokens=self.latest_input_tokens,
                cumulative_output_tokens=self.cumulative_output_tokens,
            )
        return ClaudeStream(
            prior_output=self.cumulative_output_tokens,
            latest_input_tokens=self.latest_input_tokens,
        )

    async def turn(self, ctx: TurnContext) -> TurnResult:
        prompt = render("{prompt}", ctx)
        task = ctx.task or {}
        if task:
            prompt += f"\n\nTask #{task.get('id')}: {task.get('subject', '')}"
            if task.get("description"):
                prompt += f"\n{task['description']}"
        argv = self.argv(prompt)
        if ctx.plan_mode:
            ok, feedback = await ctx.approve_plan(f"- run: {shlex.join(argv[:3])} …")
            if not ok:
                return TurnResult(False, f"plan rejected: {feedback or 'no reason given'}", 0)
        raw = ctx.output_file.with_name(f"{ctx.output_file.name}.{self.preset}.jsonl")
        stream = self.stream()
        pump = _Pump(raw, stream, ctx)
        ctx.activity(f"running {self.base[0]}")
        # (the raw stream is not shown: the pump shows its readable text)
        raw_ctx = dataclasses.replace(ctx, output_file=raw)
        run = asyncio.ensure_future(run_command(argv, raw_ctx, echo=False))
        try:
            while not run.done():
                await asyncio.wait({run}, timeout=PUMP_INTERVAL_S)
                pump.read()
        finally:
            if not run.done():
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run
        code, tail = run.result()
        pump.read()
        if stream.session_id:
            self.session_id = stream.session_id
        self.latest_input_tokens = stream.latest_input_tokens
        self.cumulative_output_tokens = stream.cumulative_output_tokens
        if isinstance(stream, CodexStream):
            if stream.thread_input is not None:
                self.thread_input = stream.thread_input
            if not stream.ended:
                why = f"codex exited with code {code} without turn.completed"
                last = stream.errors[-1] if stream.errors else tail.strip()
                return TurnResult(
                    False, f"{why}: {last[-500:]}", stream.tool_uses, code, stream.total_tokens
                )
        elif stream.result is None:
            why = f"{self.preset} exited with code {code} without a result event"
            return TurnResult(
                False, f"{why}: {tail.strip()[-500:]}", stream.tool_uses, code, stream.total_tokens
            )
        ok = code == 0 and not stream.is_error
        result = stream.result if stream.result is not None else "(no message)"
        return TurnResult(ok, result, stream.tool_uses, code, tokens=stream.total_tokens)


class _Pump:
    """Reads new complete lines of the raw stream into the parser and the readable output."""

    def __init__(self, raw: Path, stream: EventStream, ctx: TurnContext) -> None:
        self.raw = raw
        self.stream = stream
        self.ctx = ctx
        self.offset = raw.stat().st_size if raw.exists() else 0
        self.partial = b""

    def read(self) -> None:
        try:
            with open(self.raw, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        readable: list[str] = []
        for line in lines:
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                if line.strip():
                    readable.append(line.decode("utf-8", "replace"))
                continue
            if isinstance(event, dict):
                added = self.stream.feed(event)
                for text in added:
                    if text.startswith("● "):
                        self.ctx.activity(text[2:])
                readable += added
        if readable:
            self.ctx.console.transcript("\n".join(readable))
            fd = os.open(
                self.ctx.output_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                FILE_MODE,
            )  # fmt: skip
            try:
                os.write(fd, ("\n".join(readable) + "\n").encode())
            finally:
                os.close(fd)
