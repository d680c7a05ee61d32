"""Agent brains: what a teammate does in one turn.

`scripted` (the embedded default) runs deterministic steps from a small TOML or JSON script —
run a command, write a file, send or reply a message, update a task — with no network.
`exec` runs a command-line agent once per turn from an argv template such as
`claude -p {prompt}`. Both write what their commands print into the teammate's output file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from shoal.core.errors import UsageError
from shoal.core.paths import FILE_MODE

RESULT_TAIL_BYTES = 4000
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
    env: dict[str, str] = field(default_factory=dict)

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


# How a failed command reads in a turn's result (`command_failed` writes it, `exit_code_of`
# reads it back): readers that only get the text still learn the real exit code.
_EXIT_CODE_RE: Final = re.compile(
    r"^(?:command failed with exit code|[^:\s][^:\n]* exited with code) (-?\d+)(?::|$)"
)


def command_failed(command: str | None, code: int, tail: str) -> str:
    """The result text of a turn ended by a failed command (its name, when known, first)."""
    head = (
        f"{command} exited with code {code}" if command else f"command failed with exit code {code}"
    )
    return f"{head}: {tail}" if tail else head


def exit_code_of(result: str) -> int | None:
    """The exit code a failed turn's result text reports (see `command_failed`), if any."""
    match = _EXIT_CODE_RE.match(result)
    return int(match.group(1)) if match else None


class Brain(Protocol):
    """One turn of a teammate."""

    async def turn(self, ctx: TurnContext) -> TurnResult: ...


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        raise UsageError(f"script uses {{{key}}}, which is not known in this turn")


def render(template: str, ctx: TurnContext) -> str:
    """Fill `{name}`-style fields from the turn (unknown fields are an error, not blanks)."""
    return template.format_map(_Missing(ctx.values()))


async def run_command(argv: list[str], ctx: TurnContext, *, shell: bool = False) -> tuple[int, str]:
    """Run a command in the teammate's cwd with output appended to its output file.

    Returns (exit code, the tail of what it printed). Cancelling the turn kills the command's
    process group.
    """
    fd = os.open(ctx.output_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
    start = os.fstat(fd).st_size
    try:
        env = {**os.environ, **ctx.env}
        if shell:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                argv[0],
                cwd=ctx.cwd,
                stdout=fd,
                stderr=fd,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        else:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=ctx.cwd,
                stdout=fd,
                stderr=fd,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
    except OSError as exc:
        os.write(fd, f"shoal: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os.close(fd)
        return 127, f"cannot run {argv[0]!r}: {exc.strerror}"
    os.close(fd)
    try:
        code = await proc.wait()
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return code, _tail_since(ctx.output_file, start)


def _tail_since(path: Path, start: int) -> str:
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(start, size - RESULT_TAIL_BYTES))
        return fh.read().decode("utf-8", "replace").strip()


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
        for step in steps:
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
                code, tail = await run_command([render(step.args["run"], ctx)], ctx, shell=True)
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


def make_brain(agent: str, *, script: Path | None = None, cmd: str | None = None) -> Brain:
    """The brain for `--agent` (scripted | exec) with its script or command template."""
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
    raise UsageError(f"unknown agent {agent!r} (scripted or exec)")
