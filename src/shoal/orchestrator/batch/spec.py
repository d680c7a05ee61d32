"""The batch-run spec (`shoal run spec.toml`) as checked, frozen data: tasks, members,
settings, the halt policy and durations; `parse.py` reads it from TOML."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import orjson

from shoal.core.errors import UsageError
from shoal.core.names import MAX_NAME_LENGTH
from shoal.teams.backends.base import BACKEND_NAMES

RAY_BACKEND: Final = "ray"
"""`--backend ray`: the spec's shell tasks run as Ray jobs (its members still run here)."""
BACKEND_CHOICES: Final = (*BACKEND_NAMES, RAY_BACKEND)
AGENT_KINDS: Final = ("scripted", "exec")
TASK_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"
_DURATION_RE: Final = re.compile(rf"^(?:{_DURATION_PART})+$")
_DURATION_PART_RE: Final = re.compile(_DURATION_PART)
_HALT_RE: Final = re.compile(r"^(now|soon),(fail|success)=(\d+(?:\.\d+)?)(%?)$")


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec, at a line when it is known."""

    line: int | None
    message: str

    def render(self, display: str) -> str:
        """`spec.toml:12: message` (or `spec.toml: message` without a line)."""
        where = f"{display}:{self.line}" if self.line else display
        return f"{where}: {self.message}"


class SpecError(UsageError):
    """A spec that cannot run; every problem found is listed, one per line (exit code 2)."""

    def __init__(self, display: str, issues: Sequence[SpecIssue]) -> None:
        self.display = display
        self.issues = sorted(issues, key=lambda i: i.line or 0)
        lines = [i.render(display) for i in self.issues]
        count = len(lines)
        head = (
            f"{display}: {count} error{'s' if count != 1 else ''} in the spec; nothing was started"
        )
        super().__init__("\n".join([head, *lines]))


# --------------------------------------------------------------------------- durations


def parse_duration(value: object) -> float:
    """Seconds from a number (seconds) or a string like "90", "1.5s", "500ms", "5m", "1h30m".

    Raises ValueError with the accepted forms when `value` is none of them, or not positive.
    """
    if isinstance(value, bool):
        raise ValueError('a timeout is a number of seconds or a duration like "5m", not a bool')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif _DURATION_RE.fullmatch(text):
            seconds = sum(
                float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART_RE.findall(text)
            )
        else:
            raise ValueError(
                f'bad duration "{value}": use seconds (30, 1.5) or a number with a unit '
                "(500ms, 30s, 5m, 2h, 1d; combined: 1h30m)"
            )
    else:
        raise ValueError(f'a duration is a number or a string like "5m", not {_kind(value)}')
    if not seconds > 0:
        raise ValueError(f'a duration must be more than zero, not "{value}"')
    return seconds


def parse_delay(value: object) -> float:
    """Seconds from a delay: as `parse_duration`, except that zero (no delay) is allowed."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and re.fullmatch(r"0+(?:\.0+)?(?:ms|s|m|h|d)?", value.strip()):
        return 0.0
    return parse_duration(value)


def format_duration(seconds: float) -> str:
    """A short human duration: 0.5 -> "500ms", 5 -> "5s", 90 -> "1m30s", 300 -> "5m"."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    parts: list[str] = []
    rest = seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            count = int(rest // size)
            parts.append(f"{count}{unit}")
            rest -= count * size
    if rest > 0.0005 or not parts:
        parts.append(f"{round(rest, 3):g}s")
    return "".join(parts)


# --------------------------------------------------------------------------- halt policy


@dataclass(frozen=True)
class HaltPolicy:
    """When to stop early, as GNU parallel's `--halt`: `never`, or `now|soon,fail|success=N[%]`.

    `soon`: start nothing more and let running tasks finish. `now`: also kill running tasks.
    A percentage counts against the number of tasks in the run.
    """

    when: Literal["never", "soon", "now"] = "never"
    on: Literal["fail", "success"] = "fail"
    count: float = 0.0
    percent: bool = False

    @property
    def text(self) -> str:
        """The policy as written on the command line."""
        if self.when == "never":
            return "never"
        return f"{self.when},{self.on}={self.count:g}{'%' if self.percent else ''}"

    def threshold(self, total: int) -> int:
        """How many failures (or successes) trigger the halt, out of `total` tasks."""
        if not self.percent:
            return max(1, int(self.count))
        return max(1, -(-int(self.count * total) // 100))  # ceil(count% of total)

    def triggered(self, failed: int, succeeded: int, total: int) -> bool:
        """True once the counts reach this policy's threshold."""
        if self.when == "never":
            return False
        seen = failed if self.on == "fail" else succeeded
        return seen >= self.threshold(total)


def parse_halt(value: object) -> HaltPolicy:
    """A HaltPolicy from `never`, `now,fail=N`, `soon,fail=N`, `now,success=N`, `soon,success=N`
    (N a count >= 1 or a percentage such as `10%`), or GNU parallel's short forms: 0 (never),
    1 (soon,fail=1), 2 (now,fail=1); ValueError otherwise."""
    text = value.strip().lower().replace(" ", "") if isinstance(value, str) else None
    if text in ("never", "0"):
        return HaltPolicy()
    text = {"1": "soon,fail=1", "2": "now,fail=1"}.get(text or "", text)
    match = _HALT_RE.fullmatch(text or "")
    if match is not None:
        when, on, number, pct = match.groups()
        count = float(number)
        if (pct and 0 < count <= 100) or (not pct and count >= 1 and count.is_integer()):
            return HaltPolicy(when=when, on=on, count=count, percent=bool(pct))  # type: ignore[arg-type]
    raise ValueError(
        f'bad halt value "{value}": use never, now,fail=N, soon,fail=N, now,success=N or '
        "soon,success=N (N a count such as 1, or a percentage such as 10%), or 0, 1 or 2"
    )


# --------------------------------------------------------------------------- the spec model


@dataclass(frozen=True)
class MemberSpec:
    """A `[[member]]`: a teammate that agent tasks can be assigned to."""

    name: str
    agent: Literal["scripted", "exec"] = "scripted"
    command: tuple[str, ...] | None = None
    """The exec agent's argv template, e.g. ("claude", "-p", "{prompt}")."""
    script: str | None = None
    """The scripted agent's script file (absolute)."""
    prompt: str | None = None
    plan_mode: bool = False
    worktree: bool = False
    line: int | None = None


@dataclass(frozen=True)
class TaskSpec:
    """A `[[task]]`: a shell command (`run`) or an agent prompt (`prompt` + `assign`)."""

    id: str
    seq: int
    """1-based position in the spec (the joblog's Seq)."""
    run: str | tuple[str, ...] | None = None
    prompt: str | None = None
    assign: str | None = None
    after: tuple[str, ...] = ()
    timeout: float | None = None
    timeout_text: str | None = None
    retries: int = 0
    retry_delay: float = 0.0
    """Seconds before the first retry; each later retry waits twice as long as the one before."""
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "."
    description: str | None = None
    junit: str | None = None
    """The JUnit XML file the task writes (absolute), merged into the run's JUnit report."""
    base: str | None = None
    """For a task expanded from a `matrix`: the id written in the spec (`unit` of `unit[py=3]`)."""
    matrix: Mapping[str, str] = field(default_factory=dict)
    """For a task expanded from a `matrix`: this combination's values, in the matrix's order."""
    always: bool = False
    """Run once every `after` task has ended, whatever its verdict (a report, a cleanup);
    it also runs after a halt, not after an interrupt."""
    num_cpus: float | None = None
    """CPUs the task's Ray job holds (`--backend ray`; Ray's default when None)."""
    num_gpus: float | None = None
    """GPUs the task's Ray job holds (`--backend ray`)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources the task's job holds, NAME -> amount (`--backend ray`)."""
    line: int | None = None

    def delay_before(self, attempt: int) -> float:
        """Seconds to wait before starting attempt number `attempt` (2, 3, ...): `retry_delay`,
        then twice that, four times that, ... (0 for the first attempt)."""
        if attempt <= 1 or self.retry_delay <= 0:
            return 0.0
        return float(self.retry_delay * 2 ** (attempt - 2))

    @property
    def is_agent(self) -> bool:
        """True for an agent task (a prompt assigned to a member)."""
        return self.prompt is not None

    @property
    def command_line(self) -> str:
        """The command as one display string (argv lists are shell-quoted)."""
        if self.run is None:
            return f"[{self.assign}] {self.prompt}"
        return self.run if isinstance(self.run, str) else shlex.join(self.run)

    @property
    def argv(self) -> list[str]:
        """The leader's command form: one string is a shell command line, several an argv."""
        if self.run is None:
            raise ValueError(f'task "{self.id}" is an agent task; it has no command')
        return [self.run] if isinstance(self.run, str) else list(self.run)

    @property
    def timeout_label(self) -> str:
        """How the timeout reads in messages, e.g. "5m" (as written in the spec if it was)."""
        if self.timeout is None:
            return "never"
        return self.timeout_text or format_duration(self.timeout)

    @functools.cached_property
    def fingerprint(self) -> str:
        """A hash of what the task does (command, prompt, env, cwd): a change re-runs it on
        --resume even if it succeeded before."""
        what = {
            "run": self.run,
            "prompt": self.prompt,
            "assign": self.assign,
            "env": dict(sorted(self.env.items())),
            "cwd": self.cwd,
        }
        return hashlib.sha256(orjson.dumps(what, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


@dataclass(frozen=True)
class RunSettings:
    """The `[run]` table, with defaults applied."""

    team: str | None = None
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    backend: str = "auto"
    halt: HaltPolicy = field(default_factory=HaltPolicy)
    timeout: float | None = None
    timeout_text: str | None = None
    retries: int = 0
    retry_delay: float = 0.0
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    """A checked spec: settings, members and tasks in declaration order."""

    path: Path
    """Absolute path of the spec file."""
    display: str
    """The path as the user gave it (for messages)."""
    settings: RunSettings
    members: tuple[MemberSpec, ...]
    tasks: tuple[TaskSpec, ...]

    @property
    def agent_tasks(self) -> list[TaskSpec]:
        """The tasks that need a teammate."""
        return [t for t in self.tasks if t.is_agent]

    def task(self, task_id: str) -> TaskSpec:
        """The task with id `task_id` (KeyError when there is none)."""
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)

    def member(self, name: str) -> MemberSpec:
        """The member called `name` (KeyError when there is none)."""
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(name)

    def dependents(self) -> dict[str, list[str]]:
        """Task id -> ids of the tasks that list it in `after`, in declaration order."""
        out: dict[str, list[str]] = {t.id: [] for t in self.tasks}
        for task in self.tasks:
            for dep in task.after:
                out[dep].append(task.id)
        return out

    def topological(self) -> list[TaskSpec]:
        """The tasks ordered so that each comes after everything in its `after` (ties keep
        declaration order)."""
        waiting = {t.id: len(t.after) for t in self.tasks}
        dependents = self.dependents()
        ready = deque(t.id for t in self.tasks if not t.after)
        by_id = {t.id: t for t in self.tasks}
        order: list[TaskSpec] = []
        while ready:
            task_id = ready.popleft()
            order.append(by_id[task_id])
            for child in dependents[task_id]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        return order

    def team_name(self) -> str:
        """`[run] team`, else a name derived from the spec's file name."""
        return self.settings.team or team_from_path(self.path)


def team_from_path(path: Path) -> str:
    """A valid team name from a spec file name: `CI Build.toml` -> `ci-build`."""
    stem = re.sub(r"[^a-z0-9_-]+", "-", path.stem.lower()).strip("-_")
    if not stem or not stem[0].isalpha():
        stem = f"run-{stem}".rstrip("-")
    return stem[:MAX_NAME_LENGTH].rstrip("-_")


def _kind(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "a table"})
    return names.get(type(value), type(value).__name__)
