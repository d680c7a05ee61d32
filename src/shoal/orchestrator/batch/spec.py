"""The batch-run spec (`shoal run spec.toml`): TOML parsed, checked whole, errors with file:line.

Every problem in a spec is collected and reported at once, before anything starts. tomllib
gives no positions, so lines come from a small scan of the source text for table headers and
`key =` lines (`SpecLocator`): exact for ordinary TOML, approximate for exotic layouts (a key
inside an inline table is reported at its table's line).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
import shlex
import tomllib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from shoal.core.errors import InvalidNameError, UsageError
from shoal.core.names import MAX_NAME_LENGTH, validate_name
from shoal.teams.backends.base import BACKEND_NAMES
from shoal.teams.models import LEAD_NAME

BACKEND_CHOICES: Final = BACKEND_NAMES
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
    (N a count >= 1 or a percentage such as `10%`); ValueError otherwise."""
    text = value.strip().lower().replace(" ", "") if isinstance(value, str) else None
    if text in ("never", "0"):
        return HaltPolicy()
    match = _HALT_RE.fullmatch(text or "")
    if match is not None:
        when, on, number, pct = match.groups()
        count = float(number)
        if (pct and 0 < count <= 100) or (not pct and count >= 1 and count.is_integer()):
            return HaltPolicy(when=when, on=on, count=count, percent=bool(pct))  # type: ignore[arg-type]
    raise ValueError(
        f'bad halt value "{value}": use never, now,fail=N, soon,fail=N, now,success=N or '
        "soon,success=N (N a count such as 1, or a percentage such as 10%)"
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
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "."
    description: str | None = None
    line: int | None = None

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
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


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


# --------------------------------------------------------------------------- line locator


class SpecLocator:
    """Lines of table headers and keys in TOML source, found by scanning the text.

    `line(("task", 2), "after")` is the line of `after =` in the third `[[task]]`; a key not
    found falls back to its table's header line. Sub-tables such as `[task.env]` count as the
    key `env` of the enclosing array item.
    """

    _ARRAY = re.compile(r"^\[\[\s*([^\[\]]+?)\s*\]\]")
    _TABLE = re.compile(r"^\[\s*([^\[\]]+?)\s*\]")
    _KEY = re.compile(r"""^([A-Za-z0-9_-]+|"[^"]*"|'[^']*')\s*[.=]""")

    def __init__(self, text: str) -> None:
        self.headers: dict[tuple[str, int], int] = {}
        self.keys: dict[tuple[str, int, str], int] = {}
        counts: dict[str, int] = {}
        section: tuple[str, int] = ("", 0)
        open_quote: str | None = None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if open_quote is not None:
                if raw.count(open_quote) % 2 == 1:
                    open_quote = None
                continue
            if not line or line.startswith("#"):
                continue
            if match := self._ARRAY.match(line):
                name = _key_path(match.group(1))
                self.keys.setdefault(("", 0, name.split(".")[0]), number)
                index = counts.get(name, 0)
                counts[name] = index + 1
                section = (name, index)
                self.headers.setdefault(section, number)
                continue
            if match := self._TABLE.match(line):
                name = _key_path(match.group(1))
                parent, _, sub = name.partition(".")
                self.keys.setdefault(("", 0, parent), number)  # a table is a top-level key
                if sub and parent in counts:
                    section = (parent, counts[parent] - 1)
                    self.keys.setdefault((*section, sub.split(".")[0]), number)
                    section = (name, counts[parent] - 1)
                else:
                    section = (name, 0)
                    self.headers.setdefault(section, number)
                    if sub:
                        self.keys.setdefault((parent, 0, sub.split(".")[0]), number)
                continue
            if match := self._KEY.match(line):
                self.keys.setdefault((*section, match.group(1).strip("\"'")), number)
            for quote in ('"""', "'''"):
                if line.count(quote) % 2 == 1:
                    open_quote = quote
                    break

    def line(self, section: tuple[str, int], key: str | None = None) -> int | None:
        """The line of `key` in `section` (or of the section's header), if found."""
        if key is not None:
            found = self.keys.get((*section, key))
            if found is not None:
                return found
        return self.headers.get(section)


def _key_path(raw: str) -> str:
    return ".".join(p.strip().strip("\"'") for p in raw.split("."))


# --------------------------------------------------------------------------- the parser


_RUN_KEYS: Final = ("team", "jobs", "backend", "halt", "timeout", "retries", "env", "cwd")
_MEMBER_KEYS: Final = ("name", "agent", "command", "script", "prompt", "plan_mode", "worktree")
_TASK_KEYS: Final = (
    "id",
    "run",
    "prompt",
    "assign",
    "after",
    "timeout",
    "retries",
    "env",
    "cwd",
    "description",
)


def _kind(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "a table"})
    return names.get(type(value), type(value).__name__)


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


class _Checker:
    """Collects issues while reading one spec."""

    def __init__(self, locator: SpecLocator) -> None:
        self.locator = locator
        self.issues: list[SpecIssue] = []

    def add(self, section: tuple[str, int], key: str | None, message: str) -> None:
        self.issues.append(SpecIssue(self.locator.line(section, key), message))

    def unknown_keys(
        self, table: Mapping[str, Any], allowed: Sequence[str], section: tuple[str, int], where: str
    ) -> None:
        for key in table:
            if key not in allowed:
                self.add(
                    section,
                    key,
                    f'{where}: unknown key "{key}"{_suggest(key, allowed)}; '
                    f"allowed: {', '.join(allowed)}",
                )

    def string(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> str | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            shown = "an empty string" if isinstance(value, str) else _kind(value)
            self.add(section, key, f"{where}: {key} must be a non-empty string, not {shown}")
            return None
        return value

    def boolean(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> bool:
        value = table.get(key, False)
        if not isinstance(value, bool):
            self.add(section, key, f"{where}: {key} must be true or false, not {_kind(value)}")
            return False
        return value

    def count(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str, default: int
    ) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(section, key, f"{where}: {key} must be a whole number >= 0, not {value!r}")
            return default
        return value

    def duration(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> tuple[float | None, str | None]:
        if key not in table:
            return None, None
        value = table[key]
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.add(section, key, f"{where}: {key}: {exc}")
            return None, None
        return seconds, value if isinstance(value, str) else None

    def env(self, table: Mapping[str, Any], section: tuple[str, int], where: str) -> dict[str, str]:
        value = table.get("env", {})
        if not isinstance(value, dict):
            self.add(section, "env", f'{where}: env must be a table of NAME = "value"')
            return {}
        out: dict[str, str] = {}
        for name, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                self.add(section, "env", f'{where}: env: "{name}" is not a variable name')
            elif isinstance(item, bool) or not isinstance(item, str | int | float):
                self.add(
                    section,
                    "env",
                    f"{where}: env: {name} must be a string or a number, not {_kind(item)}",
                )
            else:
                out[name] = str(item)
        return out

    def path(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str, base: Path
    ) -> str | None:
        value = self.string(table, key, section, where)
        if value is None:
            return None
        return os.path.normpath(base / os.path.expanduser(value))


def parse_spec(path: str | os.PathLike[str], *, display: str | None = None) -> Spec:
    """Read and check a spec file; raises SpecError listing every problem (with lines)."""
    given = os.fspath(path)
    shown = display or given
    absolute = Path(os.path.abspath(given))
    try:
        text = absolute.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(shown, [SpecIssue(None, "no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SpecError(shown, [SpecIssue(None, f"cannot read the spec: {reason}")]) from None
    return parse_spec_text(text, absolute, display=shown)


def parse_spec_text(text: str, path: Path, *, display: str | None = None) -> Spec:
    """Check spec source `text` as if read from `path` (relative paths resolve against its
    directory); raises SpecError listing every problem."""
    shown = display or str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(match.group(1)) if match else None
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", message)
        raise SpecError(shown, [SpecIssue(line, f"not valid TOML: {message}")]) from None
    checker = _Checker(SpecLocator(text))
    base = path.parent
    top = ("", 0)
    checker.unknown_keys(data, ("run", "member", "task"), top, "spec")
    settings = _parse_run(checker, data.get("run", {}), base)
    members = _parse_members(checker, data.get("member", []), base)
    tasks = _parse_tasks(checker, data.get("task", []), settings, base)
    names = {m.name for m in members}
    for task in tasks:
        if task.assign is not None and task.assign not in names:
            known = ", ".join(sorted(names)) or "none are declared"
            checker.add(
                ("task", task.seq - 1),
                "assign",
                f'task "{task.id}": assign names unknown member "{task.assign}" (members: {known})',
            )
    _check_graph(checker, tasks)
    if checker.issues:
        raise SpecError(shown, checker.issues)
    return Spec(path, shown, settings, tuple(members), tuple(tasks))


def _parse_run(checker: _Checker, table: object, base: Path) -> RunSettings:
    section = ("run", 0)
    if not isinstance(table, dict):
        checker.add(("", 0), "run", "[run] must be a table (one [run] section)")
        return RunSettings()
    checker.unknown_keys(table, _RUN_KEYS, section, "[run]")
    team = checker.string(table, "team", section, "[run]")
    if team is not None:
        try:
            validate_name(team, "team name")
        except InvalidNameError as exc:
            checker.add(section, "team", f"[run]: {exc}")
            team = None
    jobs = checker.count(table, "jobs", section, "[run]", RunSettings().jobs)
    backend = table.get("backend", "auto")
    if backend not in BACKEND_CHOICES:
        checker.add(
            section,
            "backend",
            f'[run]: unknown backend "{backend}"; use one of {", ".join(BACKEND_CHOICES)}',
        )
        backend = "auto"
    halt = HaltPolicy()
    if "halt" in table:
        try:
            halt = parse_halt(table["halt"])
        except ValueError as exc:
            checker.add(section, "halt", f"[run]: {exc}")
    timeout, timeout_text = checker.duration(table, "timeout", section, "[run]")
    return RunSettings(
        team=team,
        jobs=jobs,
        backend=str(backend),
        halt=halt,
        timeout=timeout,
        timeout_text=timeout_text,
        retries=checker.count(table, "retries", section, "[run]", 0),
        env=checker.env(table, section, "[run]"),
        cwd=checker.path(table, "cwd", section, "[run]", base),
    )


def _argv(
    checker: _Checker, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
) -> str | tuple[str, ...] | None:
    """A command: one non-empty string (a shell command line) or a non-empty array of strings."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip():
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(a, str) for a in value)
        and value[0].strip()
    ):
        return tuple(value)
    checker.add(
        section,
        key,
        f"{where}: {key} must be a command line (a string) or an argv (an array of strings)",
    )
    return None


def _parse_members(checker: _Checker, items: object, base: Path) -> list[MemberSpec]:
    if not isinstance(items, list):
        checker.add(("", 0), "member", "members are declared as [[member]] tables")
        return []
    members: list[MemberSpec] = []
    seen: dict[str, int | None] = {}
    for index, table in enumerate(items):
        section = ("member", index)
        if not isinstance(table, dict):
            checker.add(section, None, f"member #{index + 1} must be a table")
            continue
        where = f"member #{index + 1}"
        name = checker.string(table, "name", section, where)
        if "name" not in table:
            checker.add(section, None, f"{where}: needs a name")
        if name is not None:
            where = f'member "{name}"'
            try:
                validate_name(name, "member name")
            except InvalidNameError as exc:
                checker.add(section, "name", f"{where}: {exc}")
                name = None
        if name == LEAD_NAME:
            checker.add(section, "name", f'{where}: "{LEAD_NAME}" is the run\'s own lead')
            name = None
        if name is not None and name in seen:
            first = seen[name]
            at = f" (first at line {first})" if first else ""
            checker.add(section, "name", f'member "{name}" is declared twice{at}')
        checker.unknown_keys(table, _MEMBER_KEYS, section, where)
        agent = table.get("agent", "scripted")
        if agent not in AGENT_KINDS:
            checker.add(
                section,
                "agent",
                f'{where}: unknown agent "{agent}"; use one of {", ".join(AGENT_KINDS)}',
            )
        command = _argv(checker, table, "command", section, where)
        if agent == "exec" and "command" not in table:
            checker.add(
                section, None, f'{where}: an exec agent needs command (e.g. "claude -p {{prompt}}")'
            )
        if agent == "scripted" and "command" in table:
            checker.add(section, "command", f"{where}: command is for exec agents, not scripted")
        script = checker.path(table, "script", section, where, base)
        if script is not None:
            if agent != "scripted":
                checker.add(section, "script", f"{where}: script is for scripted agents")
            elif not os.path.isfile(script):
                checker.add(section, "script", f"{where}: script file {script} does not exist")
            else:
                _check_script(checker, script, section, where)
        if name is None:
            continue
        seen.setdefault(name, checker.locator.line(section, "name"))
        argv = (command,) if isinstance(command, str) else command
        members.append(
            MemberSpec(
                name=name,
                agent="exec" if agent == "exec" else "scripted",
                command=tuple(shlex.split(argv[0])) if argv and len(argv) == 1 else argv,
                script=script,
                prompt=checker.string(table, "prompt", section, where),
                plan_mode=checker.boolean(table, "plan_mode", section, where),
                worktree=checker.boolean(table, "worktree", section, where),
                line=checker.locator.line(section),
            )
        )
    return members


def _check_script(checker: _Checker, script: str, section: tuple[str, int], where: str) -> None:
    """Load a member's script as its teammate will, so a broken one is a spec error (at the
    `script =` line) instead of a member that fails to start after the run began."""
    from shoal.workers.brains import Script

    try:
        Script.load(Path(script))
    except UsageError as exc:
        checker.add(section, "script", f"{where}: {exc}")


def _parse_tasks(
    checker: _Checker, items: object, settings: RunSettings, base: Path
) -> list[TaskSpec]:
    if not isinstance(items, list):
        checker.add(("", 0), "task", "tasks are declared as [[task]] tables")
        return []
    if not items:
        checker.issues.append(SpecIssue(None, "no [[task]] in the spec: nothing to run"))
    tasks: list[TaskSpec] = []
    seen: dict[str, int | None] = {}
    default_cwd = settings.cwd or str(base)
    for index, table in enumerate(items):
        section = ("task", index)
        if not isinstance(table, dict):
            checker.add(section, None, f"task #{index + 1} must be a table")
            continue
        where = f"task #{index + 1}"
        task_id = table.get("id")
        if task_id is None:
            checker.add(section, None, f"{where}: needs an id")
        elif not isinstance(task_id, str) or not TASK_ID_PATTERN.fullmatch(task_id):
            checker.add(
                section,
                "id",
                f"{where}: bad id {task_id!r}: letters, digits, '.', '_' and '-', "
                "starting with a letter or digit, at most 64",
            )
            task_id = None
        else:
            where = f'task "{task_id}"'
            if task_id in seen:
                first = seen[task_id]
                at = f" (first at line {first})" if first else ""
                checker.add(section, "id", f'task id "{task_id}" is used twice{at}')
                task_id = None
            else:
                seen[task_id] = checker.locator.line(section, "id")
        checker.unknown_keys(table, _TASK_KEYS, section, where)
        run = _argv(checker, table, "run", section, where)
        prompt = checker.string(table, "prompt", section, where)
        assign = checker.string(table, "assign", section, where)
        has_run, has_prompt = "run" in table, "prompt" in table
        if has_run and has_prompt:
            checker.add(
                section, "prompt", f"{where}: give run (a shell command) or prompt, not both"
            )
        elif not has_run and not has_prompt:
            checker.add(
                section,
                None,
                f"{where}: needs run (a shell command) or prompt with assign (an agent task)",
            )
        if has_prompt and "assign" not in table:
            checker.add(section, "prompt", f'{where}: a prompt needs assign = "MEMBER"')
        if "assign" in table and not has_prompt:
            checker.add(section, "assign", f"{where}: assign goes with prompt (an agent task)")
        after = _after(checker, table, section, where)
        timeout, timeout_text = checker.duration(table, "timeout", section, where)
        if timeout is None and "timeout" not in table:
            timeout, timeout_text = settings.timeout, settings.timeout_text
        env = {**settings.env, **checker.env(table, section, where)}
        cwd = checker.path(table, "cwd", section, where, base) or default_cwd
        description = checker.string(table, "description", section, where)
        retries = checker.count(table, "retries", section, where, settings.retries)
        if task_id is None:
            continue
        tasks.append(
            TaskSpec(
                id=task_id,
                seq=index + 1,
                run=run,
                prompt=prompt,
                assign=assign,
                after=after,
                timeout=timeout,
                timeout_text=timeout_text,
                retries=retries,
                env=env,
                cwd=cwd,
                description=description,
                line=checker.locator.line(section),
            )
        )
    return tasks


def _after(
    checker: _Checker, table: Mapping[str, Any], section: tuple[str, int], where: str
) -> tuple[str, ...]:
    value = table.get("after", [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        checker.add(section, "after", f"{where}: after must be a task id or an array of task ids")
        return ()
    return tuple(dict.fromkeys(value))


def _check_graph(checker: _Checker, tasks: list[TaskSpec]) -> None:
    """Unknown `after` ids and dependency cycles (each cycle reported once)."""
    by_id = {t.id: t for t in tasks}
    for task in tasks:
        for dep in task.after:
            if dep == task.id:
                checker.add(
                    ("task", task.seq - 1), "after", f'task "{task.id}": lists itself in after'
                )
            elif dep not in by_id:
                checker.add(
                    ("task", task.seq - 1),
                    "after",
                    f'task "{task.id}": after names unknown task "{dep}"'
                    f"{_suggest(dep, list(by_id))}",
                )
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(by_id, white)
    reported: set[frozenset[str]] = set()

    def edges(task_id: str) -> list[str]:
        return [d for d in by_id[task_id].after if d in by_id and d != task_id]

    for root in by_id:
        if color[root] != white:
            continue
        # Iterative DFS; the path is the current chain of tasks, to name the cycle.
        path: list[str] = [root]
        stack: list[tuple[str, int]] = [(root, 0)]
        color[root] = grey
        while stack:
            node, i = stack[-1]
            deps = edges(node)
            if i == len(deps):
                color[node] = black
                stack.pop()
                path.pop()
                continue
            stack[-1] = (node, i + 1)
            dep = deps[i]
            if color[dep] == white:
                color[dep] = grey
                stack.append((dep, 0))
                path.append(dep)
            elif color[dep] == grey:
                cycle = [*path[path.index(dep) :], dep]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    first = by_id[cycle[0]]
                    chain = " -> ".join(cycle)
                    checker.add(
                        ("task", first.seq - 1),
                        "after",
                        f'task "{first.id}": dependency cycle {chain} (each waits for the next)',
                    )
