"""`exec` presets for real CLI agents: a teammate whose turns are runs of Claude Code
(`--agent claude`), its JSON event stream parsed into progress, usage and the result.

    claude -p PROMPT --output-format stream-json --verbose [--resume SESSION_ID]

The first turn's `system/init` event names the session; every later turn resumes it, so the
teammate keeps one conversation. The raw stream is kept beside the output file
(`{output}.claude.jsonl`); the output file gets its readable text: what the model said, the
tools it called, the final result and what it cost. `--cmd` replaces the `claude` command
itself (e.g. `'claude --allowedTools Bash,Read'` or a path to the binary).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from shoal.core.errors import UsageError
from shoal.core.paths import FILE_MODE
from shoal.workers.brains import TurnContext, TurnResult, render, run_command

PRESETS: Final = ("claude",)
PUMP_INTERVAL_S: Final = 0.2


@dataclass
class ClaudeStream:
    """What a Claude Code `stream-json` run said, event by event."""

    session_id: str | None = None
    tool_uses: int = 0
    output_tokens: int = 0
    result: str | None = None
    is_error: bool = False
    usage: dict[str, Any] = field(default_factory=dict)
    num_turns: int | None = None
    cost_usd: float | None = None
    texts: list[str] = field(default_factory=list)

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
            usage = message.get("usage") or {}
            self.output_tokens += int(usage.get("output_tokens") or 0)
        elif kind == "result":
            self.session_id = event.get("session_id") or self.session_id
            self.result = event.get("result") if isinstance(event.get("result"), str) else None
            self.is_error = bool(event.get("is_error")) or event.get("subtype") != "success"
            self.usage = event.get("usage") or {}
            self.num_turns = event.get("num_turns")
            self.cost_usd = event.get("total_cost_usd")
            cost = f", ${self.cost_usd:.4f}" if isinstance(self.cost_usd, int | float) else ""
            lines.append(f"[claude: {self.num_turns} turn(s), {self.total_tokens} tokens{cost}]")
        return lines

    @property
    def total_tokens(self) -> int:
        if self.usage:
            keys = ("input_tokens", "output_tokens", "cache_read_input_tokens",
                    "cache_creation_input_tokens")  # fmt: skip
            return sum(int(self.usage.get(k) or 0) for k in keys)
        return self.output_tokens


def describe_tool(name: str, args: Any) -> str:
    """`Bash(ls -la)`: a tool call in one short line."""
    if isinstance(args, dict):
        for key in ("description", "command", "file_path", "pattern", "prompt"):
            if isinstance(args.get(key), str):
                return f"{name}({args[key][:80]})"
    return f"{name}()"


class ClaudeBrain:
    """A teammate whose turns are Claude Code runs, resumed by session id."""

    def __init__(self, cmd: str | None = None) -> None:
        try:
            self.base = shlex.split(cmd) if cmd else ["claude"]
        except ValueError as exc:
            raise UsageError(f"--cmd {cmd!r} cannot be parsed: {exc}") from None
        if not self.base:
            raise UsageError("--cmd is empty")
        self.session_id: str | None = None

    def argv(self, prompt: str) -> list[str]:
        argv = [*self.base, "-p", prompt, "--output-format", "stream-json", "--verbose"]
        if self.session_id:
            argv += ["--resume", self.session_id]
        return argv

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
        raw = ctx.output_file.with_name(ctx.output_file.name + ".claude.jsonl")
        stream = ClaudeStream()
        pump = _Pump(raw, stream, ctx)
        ctx.activity(f"running {self.base[0]}")
        run = asyncio.ensure_future(run_command(argv, dataclasses.replace(ctx, output_file=raw)))
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
        if stream.result is None:
            why = f"claude exited with code {code} without a result event"
            return TurnResult(False, f"{why}: {tail.strip()[-500:]}", stream.tool_uses, code)
        ok = code == 0 and not stream.is_error
        return TurnResult(ok, stream.result, stream.tool_uses, code, tokens=stream.total_tokens)


class _Pump:
    """Reads new complete lines of the raw stream into the parser and the readable output."""

    def __init__(self, raw: Path, stream: ClaudeStream, ctx: TurnContext) -> None:
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
            fd = os.open(
                self.ctx.output_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                FILE_MODE,
            )  # fmt: skip
            try:
                os.write(fd, ("\n".join(readable) + "\n").encode())
            finally:
                os.close(fd)
