"""Agent brains: what a teammate does in one turn.

`scripted` (the embedded default) runs deterministic steps from a small TOML or JSON script —
run a command, write a file, send or reply a message, update a task — with no network.
`exec` runs a command-line agent once per turn from an argv template such as
`claude -p {prompt}`. Both write what their commands print into the teammate's output file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shlex
import signal
import string
import time
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from shoal.core.errors import ShoalError, UsageError
from shoal.core.paths import FILE_MODE
from shoal.core.procs import process_start_time
from shoal.core.sandbox import Policy, prepare
from shoal.workers.shell import output_cap, process
from shoal.workers.teammate.commands import RESULT_TAIL_BYTES as RESULT_TAIL_BYTES
from shoal.workers.teammate.commands import CommandRecord, side_file, tail_since
from shoal.workers.teammate.commands import command_failed as command_failed
from shoal.workers.teammate.commands import exit_code_of as exit_code_of
from shoal.workers.teammate.console import Console, OutputFollower

# Step kinds that change the world: in plan mode they wait for an approved plan.
WRITE_STEPS = frozenset({"run", "write", "update_task"})
STEP_KINDS = frozenset({"run", "write", "send", "reply", "result", "update_task", "sleep"})


class TurnAborted(Exception):
    """The current turn was aborted (by the lead, or by a rejected plan)."""


@dataclass
class TurnContext:
    """Everything a brain may use in one turn; callbacks are provided by the runner."""

    name: str
    team: str
    prompt: str
    cwd: str
    output_file: Path
    task: dict[str, Any] | None
    send: Callable[[str, str], Awaitable[None]]
    update_task: Callable[[int, str], Awaitable[None]]
    approve_plan: Callable[[str], Awaitable[tuple[bool, str | None]]]
    activity: Callable[[str], None]
    plan_mode: bool = False
    sandbox: Policy | None = None  # its commands run confined to it (`--sandbox`)
    env: dict[str, str] = field(default_factory=dict)
    # Called with each command as it starts, before it may run (the runner lists it in its
    # status file, so that whoever sees the teammate die can kill it and read its exit code).
    track: Callable[[CommandRecord], None] | None = None
    # The teammate's output file may not grow past this (bytes); None: no cap.
    output_cap: int | None = None
    # Where the turn's steps, commands and their output are shown as they happen (the pane);
    # off for in-process teammates.
    console: Console = field(default_factory=Console.off)

    def values(self) -> dict[str, Any]:
        """Template values: {prompt} {name} {team} {cwd} {task_id} {subject} {description}
        and {meta_KEY} for each task metadata key."""
        task = self.task or {}
        values: dict[str, Any] = {
            "prompt": self.prompt,
            "name": self.name,
            "team": self.team,
            "cwd": self.cwd,
            "task_id": task.get("id", ""),
            "subject": task.get("subject", ""),
            "description": task.get("description", ""),
        }
        for key, value in (task.get("metadata") or {}).items():
            values[f"meta_{key}"] = value
        return values


@dataclass
class TurnResult:
    """How a turn ended: `ok`, the result text, how many steps (tool uses) it took, and the
    exit code of the command that decided it, when one did."""

    ok: bool
    result: str
    steps: int = 0
    exit_code: int | None = None
    # The brain's conversation's tokens after the turn, as the seed counts them (the latest
    # request's input plus every output, earlier turns' too), when the brain knows them.
    tokens: int = 0


class Brain(Protocol):
    """One turn of a teammate."""

    async def turn(self, ctx: TurnContext) -> TurnResult: ...


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        raise UsageError(f"script uses {{{key}}}, which is not known in this turn")


def render(template: str, ctx: TurnContext) -> str:
    """Fill `{name}`-style fields from the turn (unknown fields are an error, not blanks)."""
    return template.format_map(_Missing(ctx.values()))


# A `run` step's `{meta_run}` is the task's own command: shell code by definition (and set only
# by those whose permission mode may run commands). Every other value is data.
TASK_COMMAND_FIELD = "meta_run"
# How a `run` step's values reach its shell: in these variables, never in its text.
VALUE_VAR = "SHOAL_VALUE_"


def render_command(template: str, ctx: TurnContext) -> tuple[str, dict[str, str]]:
    """A `run` step's command line and the environment it needs: each `{field}` becomes a
    reference to a variable that holds its value, quoted for where it stands (bare, inside
    "double" or 'single' quotes), so no value is ever read as shell code: a task subject of
    `$(touch x)` or `'; touch x; '` is text the command is given, as it would be given
    `fix the bug`."""
    values = _Missing(ctx.values())
    out: list[str] = []
    env: dict[str, str] = {}
    quote = ""  # the quote open at this point of the command line: "", "'" or '"'
    for literal, field_name, spec, conversion in string.Formatter().parse(template):
        out.append(literal)
        quote = _quote_after(literal, quote)
        if field_name is None:
            continue
        if not field_name or "." in field_name or "[" in field_name:
            raise UsageError(f"script uses {{{field_name}}}: name a field, e.g. {{subject}}")
        value = values[field_name]
        if conversion:
            value = string.Formatter().convert_field(value, conversion)
        text = format(value, spec or "")
        if field_name == TASK_COMMAND_FIELD:
            out.append(text)
            quote = _quote_after(text, quote)
            continue
        name = f"{VALUE_VAR}{len(env) + 1}"
        env[name] = text
        ref = "${" + name + "}"
        out.append({"": f'"{ref}"', '"': ref, "'": f"'\"{ref}\"'"}[quote])
    return "".join(out), env


def _quote_after(text: str, quote: str) -> str:
    """Which quote is open after `text`, given the one open before it (a backslash escapes
    the next character outside single quotes)."""
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote == "" and ch in "'\"":
            quote = ch
        elif ch == quote:
            quote = ""
    return quote


class OutputCapExceeded(ShoalError):
    """A command's output took the teammate's output file past its cap; it was killed."""


# How often a command's output file is looked at: at most this far apart; sooner while it grows
# fast (see `OutputWatch`), never closer than CAP_CHECK_FLOOR_S.
CAP_CHECK_MAX_S = 1.0
# A file that has not been seen growing is assumed able to grow this fast (bytes/s), so that a
# quiet command that starts writing flat out is looked at before it could write half the slack.
CAP_ASSUMED_BURST = 256 << 20


class OutputWatch:
    """Watches a command's output file against the cap, checking sooner the faster it grows:
    the next look comes before the file could write half the cap's slack at the rate seen.
    (The command runs under a file size limit of the cap + OUTPUT_CAP_SLACK, which stops a
    writer faster than the looks.)"""

    def __init__(self, path: Path, cap: int, size: int) -> None:
        self.path = path
        self.cap = cap
        self.slack = output_cap.cap_slack(cap)
        self.size = size
        self.seen = time.monotonic()
        self.rate = 0.0  # bytes/s over the last interval
        self.looked = False

    def interval(self) -> float:
        """Seconds until the next look (the first one at once: a command may write flat out
        from its first instant)."""
        if not self.looked:
            return output_cap.CAP_CHECK_FLOOR_S
        rate = max(self.rate, CAP_ASSUMED_BURST)
        return max(output_cap.CAP_CHECK_FLOOR_S, min(CAP_CHECK_MAX_S, self.slack / (2 * rate)))

    def over(self) -> int | None:
        """Look now: the file's size if it is past the cap, else None (and the rate updated)."""
        now = time.monotonic()
        self.looked = True
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return None
        if now > self.seen:
            self.rate = max(0, size - self.size) / (now - self.seen)
        self.size, self.seen = size, now
        return size if size > self.cap else None

    def at_limit(self) -> bool:
        """Look now: whether the file reached the file size limit its command ran under
        (its writes were refused there: the kernel stopped it before a look did)."""
        self.over()
        return self.size >= output_cap.output_limit(self.cap)

    def reason(self, size: int, *, by_limit: bool = False) -> str:
        how = "stopped by the file size limit" if by_limit else "killed"
        return (
            f"output file {self.path} reached {size} bytes, over the output cap of "
            f"{self.cap} bytes; the command was {how}"
        )


async def run_command(
    argv: list[str],
    ctx: TurnContext,
    *,
    shell: bool = False,
    final: bool = True,
    allow_fail: bool = False,
    echo: bool = True,
) -> tuple[int, str]:
    """Run a command in the teammate's cwd with output appended to its output file.

    It runs in a process group of its own under the shell wrapper (which records its pid and
    exit code in side files), and only once `ctx.track` has been told of it. Returns (exit code,
    the tail of what it printed). Cancelling the turn kills the command's process group; so
    does output past `ctx.output_cap` (OutputCapExceeded). `final`: it is the last step of its
    turn; `allow_fail`: its failure does not fail the turn (both say what its exit code means
    for the task if the teammate dies before settling it). `echo`: what it prints is shown
    on the teammate's console as it is written (not for a raw stream the caller shows itself).
    """
    fd = os.open(ctx.output_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
    ready = None
    try:
        start = os.fstat(fd).st_size
        cap = ctx.output_cap
        if cap is not None and start > cap:
            raise OutputCapExceeded(
                f"output file {ctx.output_file} is at {start} bytes, over the output cap of "
                f"{cap} bytes; the command was not run"
            )
        exit_file = side_file(ctx.output_file, secrets.token_hex(6))
        wrapped = process.wrapped_argv(
            ["-c", argv[0]] if shell else argv,
            exit_file,
            ctx.cwd,
            gated=True,
            file_limit=output_cap.output_limit(cap) if cap is not None else None,
        )
        try:
            if ctx.sandbox is not None:  # (the wrapper writes its side files: made here, empty)
                side = (os.fspath(exit_file), os.fspath(process.pid_file_for(exit_file)))
                for path in side:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                     FILE_MODE))  # fmt: skip
                ready = prepare(ctx.sandbox.widened(files=side))
            proc = await asyncio.create_subprocess_exec(
                *wrapped,
                cwd=ctx.cwd,
                stdout=fd,
                stderr=fd,
                stdin=asyncio.subprocess.PIPE,
                env={**os.environ, **ctx.env},
                start_new_session=True,
                preexec_fn=ready.preexec if ready is not None else None,
            )
        except OSError as exc:
            os.write(fd, f"shoal: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
            ctx.console.line("failed", f"cannot run {argv[0]!r}: {exc.strerror}")
            return 127, f"cannot run {argv[0]!r}: {exc.strerror}"
    finally:
        os.close(fd)
        if ready is not None:
            ready.close()
    wait = asyncio.ensure_future(proc.wait())
    follower: OutputFollower | None = None
    try:
        record = CommandRecord(
            pid=proc.pid,
            pgid=proc.pid,  # (its own session: the wrapper leads the group)
            started_at=process_start_time(proc.pid),
            task_id=_task_id(ctx.task),
            exit_file=str(exit_file),
            output_file=str(ctx.output_file),
            output_offset=start,
            final=final,
            allow_fail=allow_fail,
        )
        if ctx.track is not None:
            ctx.track(record)
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # (killed already)
            proc.stdin.write(b"go\n")  # the gate: it may run now that it is on record
            await proc.stdin.drain()
        proc.stdin.close()
        if echo and ctx.console.enabled:
            follower = ctx.console.follow(ctx.output_file, start)
            follower.start()
        watch = OutputWatch(ctx.output_file, cap, start) if cap is not None else None
        while not wait.done():
            await asyncio.wait({wait}, timeout=watch.interval() if watch else None)
            if watch is None or wait.done():
                continue
            size = watch.over()
            if size is not None:
                # KILL at once: a writer past its cap must not write on through a grace period.
                _kill_group(proc.pid)
                await asyncio.shield(wait)
                raise OutputCapExceeded(watch.reason(size))
        code = wait.result()
        if watch is not None and watch.at_limit():
            _kill_group(proc.pid)  # (what it left in its group)
            raise OutputCapExceeded(watch.reason(watch.size, by_limit=True))
    except BaseException:
        # Cancelled (the turn was aborted), or the record could not be written: it must not
        # run on (a gated one that never got its line exits when its stdin closes).
        _kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.shield(wait)
        if follower is not None:
            follower.stop()
        ctx.console.line("killed", "the command was stopped")
        raise
    if follower is not None:
        follower.stop()
    ctx.console.exited(code)
    return code, tail_since(ctx.output_file, start)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _task_id(task: dict[str, Any] | None) -> int | None:
    """The list task id of a turn's task, if it has one."""
    raw = (task or {}).get("id")
    if isinstance(raw, str) and raw.isdigit():
        return int(raw)
    return raw if isinstance(raw, int) else None


# -- scripted -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One scripted step: `kind` is one of STEP_KINDS, `args` its fields."""

    kind: str
    args: dict[str, Any]

    def describe(self) -> str:
        if self.kind == "run":
            return f"run: {self.args['run']}"
        if self.kind == "write":
            return f"write {self.args['path']}"
        if self.kind == "update_task":
            return f"set task {self.args.get('task', '{task_id}')} to {self.args['status']}"
        return self.kind


@dataclass(frozen=True)
class Script:
    """A scripted brain's program: steps run in order on every turn, and shutdown policy."""

    steps: tuple[Step, ...]
    on_shutdown: str = "approve"  # approve | reject | ignore
    shutdown_reason: str | None = None

    @classmethod
    def load(cls, path: Path) -> Script:
        """Read a script file: TOML for `.toml`, JSON for `.json`, otherwise whichever of the
        two parses (TOML first). Every error names the file."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read script {path}: {exc.strerror}") from None
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise UsageError(f"script {path} is not UTF-8 text") from None
        return cls.parse(_decode_script(path, text), f"script {path}")

    @classmethod
    def parse(cls, data: Any, where: str = "script") -> Script:
        """Validate a script given as data: `{"step": [{...}, ...], "on_shutdown": ...}`."""
        if not isinstance(data, dict):
            raise UsageError(f"{where}: a script is a table with a `step` list")
        unknown = set(data) - {"step", "on_shutdown", "shutdown_reason"}
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        steps = []
        for i, raw in enumerate(data.get("step", []), start=1):
            if not isinstance(raw, dict):
                raise UsageError(f"{where}: step {i} is not a table")
            kinds = [k for k in raw if k in STEP_KINDS]
            if len(kinds) != 1:
                raise UsageError(
                    f"{where}: step {i} needs exactly one of "
                    f"{', '.join(sorted(STEP_KINDS))} (got {sorted(raw)})"
                )
            kind = kinds[0]
            allowed = {
                "run": {"run", "allow_fail"},
                "write": {"write", "path", "text"},
                "send": {"send", "text"},
                "reply": {"reply"},
                "result": {"result"},
                "update_task": {"update_task", "task", "status"},
                "sleep": {"sleep"},
            }[kind] | {"when"}
            if raw.get("when", "always") not in ("always", "task", "message"):
                raise UsageError(f"{where}: step {i}: when must be always, task or message")
            extra = set(raw) - allowed
            if extra:
                raise UsageError(
                    f"{where}: step {i} ({kind}) has unknown key(s) {', '.join(sorted(extra))}"
                )
            if kind == "write":
                raw = {"path": raw.get("path", raw["write"]), "text": raw.get("text", ""), **raw}
            if kind == "update_task":
                raw = {"status": raw.get("status", raw["update_task"]), **raw}
            steps.append(Step(kind, dict(raw)))
        policy = data.get("on_shutdown", "approve")
        if policy not in ("approve", "reject", "ignore"):
            raise UsageError(f"{where}: on_shutdown must be approve, reject or ignore")
        return cls(tuple(steps), policy, data.get("shutdown_reason"))


def _decode_script(path: Path, text: str) -> Any:
    """The data of a script's text, in the format its extension names (else TOML, then JSON)."""
    suffix = path.suffix.lower()
    formats = ["TOML"] if suffix == ".toml" else ["JSON"] if suffix == ".json" else ["TOML", "JSON"]
    failures: list[str] = []
    for fmt in formats:
        try:
            return tomllib.loads(text) if fmt == "TOML" else orjson.loads(text)
        except (tomllib.TOMLDecodeError, orjson.JSONDecodeError) as exc:
            failures.append(str(exc))
    if len(failures) == 1:
        raise UsageError(f"script {path} is not valid {formats[0]}: {failures[0]}")
    raise UsageError(
        f"script {path} is neither TOML nor JSON (as TOML: {failures[0]}; as JSON: {failures[1]}); "
        "name it .toml or .json to choose"
    )


DEFAULT_SCRIPT = Script(steps=())


class ScriptedBrain:
    """Runs a Script's steps each turn. With no steps: a task's `metadata.run` command is run
    (or a prompt is acknowledged), so the default brain still does real work."""

    def __init__(self, script: Script = DEFAULT_SCRIPT) -> None:
        self.script = script

    def _steps_for(self, ctx: TurnContext) -> tuple[Step, ...]:
        if self.script.steps:
            turn = "task" if ctx.task is not None else "message"
            return tuple(
                s for s in self.script.steps if s.args.get("when", "always") in ("always", turn)
            )
        command = ((ctx.task or {}).get("metadata") or {}).get("run")
        if command:
            return (Step("run", {"run": str(command)}),)
        return (Step("result", {"result": "done: {prompt}"}),)

    async def turn(self, ctx: TurnContext) -> TurnResult:
        steps = self._steps_for(ctx)
        result = ""
        count = 0
        approved = not ctx.plan_mode
        for index, step in enumerate(steps):
            if step.kind in WRITE_STEPS and not approved:
                plan = "\n".join(
                    f"- {render(s.describe(), ctx)}" for s in steps if s.kind in WRITE_STEPS
                )
                ok, feedback = await ctx.approve_plan(plan)
                if not ok:
                    return TurnResult(
                        False, f"plan rejected: {feedback or 'no reason given'}", count
                    )
                approved = True
            count += 1
            ctx.activity(render(step.describe(), ctx))
            if step.kind == "run":
                command, values = render_command(step.args["run"], ctx)
                code, tail = await run_command(
                    [command],
                    dataclasses.replace(ctx, env={**ctx.env, **values}),
                    shell=True,
                    final=index == len(steps) - 1,
                    allow_fail=bool(step.args.get("allow_fail")),
                )
                result = tail
                if code != 0 and not step.args.get("allow_fail"):
                    return TurnResult(False, command_failed(None, code, tail), count, code)
            elif step.kind == "write":
                base = Path(ctx.cwd).resolve()
                target = (base / render(step.args["path"], ctx)).resolve()
                if not target.is_relative_to(base):
                    return TurnResult(False, f"refused to write {target}: outside {base}", count)
                target.write_text(render(step.args["text"], ctx))
                result = f"wrote {target}"
            elif step.kind == "send":
                await ctx.send(render(step.args["send"], ctx), render(step.args["text"], ctx))
            elif step.kind == "reply":
                await ctx.send("team-lead", render(step.args["reply"], ctx))
            elif step.kind == "result":
                result = render(step.args["result"], ctx)
            elif step.kind == "update_task":
                task_ref = render(str(step.args.get("task", "{task_id}")), ctx)
                if not task_ref.isdigit():
                    raise UsageError(f"update_task needs a task id, got {task_ref!r}")
                await ctx.update_task(int(task_ref), render(step.args["status"], ctx))
            elif step.kind == "sleep":
                await asyncio.sleep(float(step.args["sleep"]))
        return TurnResult(True, result, count)


# -- exec ------------------------------------------------------------------------------------------


class ExecBrain:
    """Runs a CLI agent per turn from an argv template, e.g. `claude -p {prompt}`."""

    def __init__(self, template: str) -> None:
        try:
            self.argv = shlex.split(template)
        except ValueError as exc:
            raise UsageError(f"--cmd template {template!r} cannot be parsed: {exc}") from None
        if not self.argv:
            raise UsageError("--cmd template is empty")

    async def turn(self, ctx: TurnContext) -> TurnResult:
        argv = [render(a, ctx) for a in self.argv]
        if ctx.plan_mode:
            ok, feedback = await ctx.approve_plan(f"- run: {shlex.join(argv)}")
            if not ok:
                return TurnResult(False, f"plan rejected: {feedback or 'no reason given'}", 0)
        ctx.activity(f"running {argv[0]}")
        code, tail = await run_command(argv, ctx)
        if code != 0:
            return TurnResult(False, command_failed(argv[0], code, tail), 1, code)
        return TurnResult(True, tail, 1, code)


def make_brain(
    agent: str, *, script: Path | None = None, cmd: str | None = None, model: str | None = None
) -> Brain:
    """The brain for `--agent` (scripted | exec) with its script or command template (the
    llm brain is made by `workers/worker.py`, from workers/agent/llm_brain.py)."""
    if model:
        raise UsageError("--model goes with --agent llm")
    if agent == "scripted":
        if cmd:
            raise UsageError("--cmd goes with --agent exec, not scripted")
        return ScriptedBrain(Script.load(script) if script else DEFAULT_SCRIPT)
    if agent == "exec":
        if not cmd:
            raise UsageError("--agent exec needs --cmd TEMPLATE (e.g. 'claude -p {prompt}')")
        if script:
            raise UsageError("--script goes with --agent scripted, not exec")
        return ExecBrain(cmd)
    raise UsageError(f"unknown agent {agent!r} (scripted, exec or llm)")
