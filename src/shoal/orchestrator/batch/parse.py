"""Reading a batch-run spec: TOML parsed, checked whole, errors with file:line.

Every problem in a spec is collected and reported at once, before anything starts. tomllib
gives no positions, so lines come from a small scan of the source text for table headers and
`key =` lines (`SpecLocator`): exact for ordinary TOML, approximate for exotic layouts (a key
inside an inline table is reported at its table's line).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from shoal.core.cmdsize import command_problem, environ_bytes
from shoal.core.errors import InvalidNameError, UsageError
from shoal.core.names import validate_name
from shoal.orchestrator.batch.spec import (
    AGENT_KINDS,
    BACKEND_CHOICES,
    TASK_ID_PATTERN,
    HaltPolicy,
    MemberSpec,
    RunSettings,
    Spec,
    SpecError,
    SpecIssue,
    TaskSpec,
    _kind,
    parse_delay,
    parse_duration,
    parse_halt,
)
from shoal.teams.models import LEAD_NAME

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


_RUN_KEYS: Final = (
    "team",
    "jobs",
    "backend",
    "halt",
    "timeout",
    "retries",
    "retry_delay",
    "env",
    "cwd",
)
_MEMBER_KEYS: Final = ("name", "agent", "command", "script", "prompt", "plan_mode", "worktree")
_TASK_KEYS: Final = (
    "id",
    "run",
    "prompt",
    "assign",
    "after",
    "timeout",
    "retries",
    "retry_delay",
    "env",
    "cwd",
    "description",
    "junit",
    "matrix",
    "always",
)
# A task's matrix: at most this many combinations (each one is a task of the run).
MAX_MATRIX_COMBINATIONS: Final = 1000
# Keys of a matrix that are rules, not axes; and the settings an include may give.
_MATRIX_RULES: Final = ("include", "exclude")
_COMBO_SETTINGS: Final = ("timeout", "retries")
_MATRIX_KEY: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# A matrix value becomes part of a task id (`unit[py=3.12]`): no spaces, brackets, braces,
# commas, equals signs, quotes or backslashes.
_MATRIX_VALUE: Final = re.compile(r"""^[^\s\[\]{},="'\\]{1,64}$""")
# `{{name}}` is a literal `{name}`; `${name}` is left to the shell; `{name}` is a placeholder.
_PLACEHOLDER: Final = re.compile(
    r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}"
)
# The fields of a matrix task in which placeholders are replaced.
_MATRIX_FIELDS: Final = ("run", "prompt", "assign", "description", "cwd", "env", "junit", "after")


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


class _Checker:
    """Collects issues while reading one spec."""

    def __init__(self, locator: SpecLocator) -> None:
        self.locator = locator
        self.issues: list[SpecIssue] = []

    def add(self, section: tuple[str, int], key: str | None, message: str) -> None:
        """Record a problem (once: a matrix task is checked once per combination)."""
        issue = SpecIssue(self.locator.line(section, key), message)
        if issue not in self.issues:
            self.issues.append(issue)

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

    def delay(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> float | None:
        """A delay in seconds (zero allowed), None when absent or bad (bad is reported)."""
        if key not in table:
            return None
        try:
            return parse_delay(table[key])
        except ValueError as exc:
            self.add(section, key, f"{where}: {key}: {exc}")
            return None

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
    tasks, tables = _parse_tasks(checker, data.get("task", []), settings, base)
    names = {m.name for m in members}
    for task in tasks:
        if task.assign is not None and task.assign not in names:
            known = ", ".join(sorted(names)) or "none are declared"
            checker.add(
                ("task", tables[task.id]),
                "assign",
                f'task "{task.id}": assign names unknown member "{task.assign}" (members: {known})',
            )
    tasks = _resolve_after(checker, tasks, tables)
    _check_junit_paths(checker, tasks, tables)
    _check_graph(checker, tasks, tables)
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
        retry_delay=checker.delay(table, "retry_delay", section, "[run]") or 0.0,
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
    from shoal.workers.teammate.brains import Script

    try:
        Script.load(Path(script))
    except UsageError as exc:
        checker.add(section, "script", f"{where}: {exc}")


def _parse_tasks(
    checker: _Checker, items: object, settings: RunSettings, base: Path
) -> tuple[list[TaskSpec], dict[str, int]]:
    """The tasks, a matrix task expanded into one task per combination, and for each task id
    the index of the `[[task]]` table it came from (for line numbers)."""
    tables: dict[str, int] = {}
    if not isinstance(items, list):
        checker.add(("", 0), "task", "tasks are declared as [[task]] tables")
        return [], tables
    if not items:
        checker.issues.append(SpecIssue(None, "no [[task]] in the spec: nothing to run"))
    tasks: list[TaskSpec] = []
    seen: dict[str, int | None] = {}
    context = _TaskContext(settings, base)
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
        combos = _matrix(checker, table, section, where)
        # Without a matrix, or with a bad one, the task is checked as written (a bad matrix
        # is reported, and the task keeps its id for the checks of the tasks after it).
        variants: list[tuple[dict[str, Any], dict[str, str]]] = [(table, {})]
        if combos is not None:
            if isinstance(table["matrix"], dict) and table["matrix"]:
                axes = [k for k in table["matrix"] if k not in _MATRIX_RULES]
                _check_placeholders(checker, table, axes, section, where)
            if combos:
                # (a combination's own timeout and retries, from an include, replace the task's)
                variants = [({**_expand(table, combo), **extra}, combo) for combo, extra in combos]
        for variant, combo in variants:
            task = _parse_task(checker, variant, section, where, context)
            if task_id is None:
                continue
            expanded = _matrix_id(task_id, combo) if combo else task_id
            tables[expanded] = index
            tasks.append(
                dataclasses.replace(
                    task,
                    id=expanded,
                    seq=len(tasks) + 1,
                    base=task_id if combo else None,
                    matrix=combo,
                )
            )
    return tasks, tables


@dataclasses.dataclass(frozen=True)
class _TaskContext:
    """What every task of a spec inherits: the `[run]` defaults and the spec's directory."""

    settings: RunSettings
    base: Path
    base_env: int = dataclasses.field(default_factory=lambda: environ_bytes(os.environ))

    @property
    def cwd(self) -> str:
        return self.settings.cwd or str(self.base)


def _parse_task(
    checker: _Checker,
    table: Mapping[str, Any],
    section: tuple[str, int],
    where: str,
    context: _TaskContext,
) -> TaskSpec:
    """One task's fields (its id and position are set by the caller); problems are reported,
    and the task is kept so that the tasks after it are checked against it."""
    settings = context.settings
    run = _argv(checker, table, "run", section, where)
    prompt = checker.string(table, "prompt", section, where)
    assign = checker.string(table, "assign", section, where)
    has_run, has_prompt = "run" in table, "prompt" in table
    if has_run and has_prompt:
        checker.add(section, "prompt", f"{where}: give run (a shell command) or prompt, not both")
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
    if run is not None:  # (tasks inherit this process's environment: it counts too)
        command = [run] if isinstance(run, str) else list(run)
        problem = command_problem(command, env=env, base_env_bytes=context.base_env)
        if problem is not None:
            checker.add(section, "run", f"{where}: {problem}")
    cwd = checker.path(table, "cwd", section, where, context.base) or context.cwd
    description = checker.string(table, "description", section, where)
    retries = checker.count(table, "retries", section, where, settings.retries)
    retry_delay = checker.delay(table, "retry_delay", section, where)
    # A task's JUnit file is where its command writes it: relative to the task's cwd.
    junit = checker.path(table, "junit", section, where, Path(cwd))
    if junit is not None and has_prompt:
        checker.add(section, "junit", f"{where}: junit is for run tasks (a command's report)")
    return TaskSpec(
        id="",
        seq=0,
        run=run,
        prompt=prompt,
        assign=assign,
        after=after,
        timeout=timeout,
        timeout_text=timeout_text,
        retries=retries,
        retry_delay=settings.retry_delay if retry_delay is None else retry_delay,
        env=env,
        cwd=cwd,
        description=description,
        junit=junit,
        always=checker.boolean(table, "always", section, where),
        line=checker.locator.line(section),
    )


# --------------------------------------------------------------------------- matrix


def _matrix(
    checker: _Checker, table: Mapping[str, Any], section: tuple[str, int], where: str
) -> list[tuple[dict[str, str], dict[str, Any]]] | None:
    """The combinations of a task's `matrix` (in the order its keys and values are written,
    less those `exclude` removes, then those `include` adds), each with the settings an
    `include` gives it (timeout, retries); None when the task has none, [] when the matrix
    is bad (the problems are reported)."""
    if "matrix" not in table:
        return None
    value = table["matrix"]
    example = 'e.g. matrix = { py = ["3.11", "3.12"], shard = [1, 2] }'
    if not isinstance(value, dict) or not [k for k in value if k not in _MATRIX_RULES]:
        shown = "an empty table" if isinstance(value, dict) else _kind(value)
        checker.add(
            section,
            "matrix",
            f"{where}: matrix must be a table of KEY = [values], {example}; not {shown}",
        )
        return []
    axes: list[tuple[str, list[str]]] = []
    ok = True
    for key, items in value.items():
        if key in _MATRIX_RULES:
            continue
        if not _MATRIX_KEY.fullmatch(key):
            checker.add(
                section,
                "matrix",
                f'{where}: matrix key "{key}" is not a name (letters, digits and _, '
                "not starting with a digit, at most 32)",
            )
            ok = False
            continue
        if not isinstance(items, list) or not items:
            shown = "an empty array" if isinstance(items, list) else _kind(items)
            checker.add(
                section,
                "matrix",
                f"{where}: matrix key {key} must be a non-empty array of values, not {shown}",
            )
            ok = False
            continue
        values: list[str] = []
        for item in items:
            text = _matrix_value(checker, item, key, section, where)
            if text is None:
                ok = False
            elif text in values:
                checker.add(section, "matrix", f'{where}: matrix key {key} lists "{text}" twice')
                ok = False
            else:
                values.append(text)
        axes.append((key, values))
    if not ok:
        return []
    count = math.prod(len(values) for _, values in axes)
    if count > MAX_MATRIX_COMBINATIONS:
        checker.add(
            section,
            "matrix",
            f"{where}: matrix has {count} combinations; at most {MAX_MATRIX_COMBINATIONS}",
        )
        return []
    keys = [key for key, _ in axes]
    product = itertools.product(*(values for _, values in axes))
    combos: list[tuple[dict[str, str], dict[str, Any]]] = [
        (dict(zip(keys, combo, strict=True)), {}) for combo in product
    ]
    combos = _matrix_rules(checker, value, dict(axes), combos, section, where)
    if len(combos) > MAX_MATRIX_COMBINATIONS:
        checker.add(
            section,
            "matrix",
            f"{where}: matrix has {len(combos)} combinations; at most {MAX_MATRIX_COMBINATIONS}",
        )
        return []
    return combos


def _matrix_rules(
    checker: _Checker,
    matrix: Mapping[str, Any],
    axes: Mapping[str, list[str]],
    combos: list[tuple[dict[str, str], dict[str, Any]]],
    section: tuple[str, int],
    where: str,
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """A matrix's `exclude` (tables of KEY = value: every combination they match goes) and
    `include` (a table naming every key adds that combination, or gives an existing one its
    settings; one naming some keys gives the settings to every combination it matches).
    The settings an include may give: timeout and retries. A rule that matches nothing, or
    names an unknown key, is an error: a typo must not pass as a rule that never applies."""
    for rule in ("exclude", "include"):
        items = matrix.get(rule, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            checker.add(
                section,
                "matrix",
                f"{where}: matrix.{rule} must be an array of tables, e.g. "
                f'{rule} = [{{ py = "3.11", shard = 2 }}]',
            )
            return []
    for entry in matrix.get("exclude", []):
        wanted = _rule_values(checker, entry, axes, (), "exclude", section, where)
        if wanted is None:
            continue
        kept = [c for c in combos if any(c[0][k] != v for k, v in wanted.items())]
        if len(kept) == len(combos):
            checker.add(
                section, "matrix", f"{where}: matrix.exclude {_shown(entry)} matches no combination"
            )
        combos = kept
    for entry in matrix.get("include", []):
        wanted = _rule_values(checker, entry, axes, _COMBO_SETTINGS, "include", section, where)
        if wanted is None:
            continue
        extra: dict[str, Any] = {k: entry[k] for k in _COMBO_SETTINGS if k in entry}
        matched = [c for c in combos if all(c[0][k] == v for k, v in wanted.items())]
        for _, settings in matched:
            settings.update(extra)
        if matched:
            continue
        if set(wanted) == set(axes):
            combos.append(({k: wanted[k] for k in axes}, dict(extra)))
        else:
            checker.add(
                section,
                "matrix",
                f"{where}: matrix.include {_shown(entry)} matches no combination (to add one, "
                f"give every key: {', '.join(axes)})",
            )
    return combos


def _rule_values(
    checker: _Checker,
    entry: Mapping[str, Any],
    axes: Mapping[str, list[str]],
    settings: Sequence[str],
    rule: str,
    section: tuple[str, int],
    where: str,
) -> dict[str, str] | None:
    """The KEY = value pairs of one include or exclude entry, checked (None: it is bad)."""
    wanted: dict[str, str] = {}
    ok = True
    for key, item in entry.items():
        if key in settings:
            continue
        if key not in axes:
            allowed = [*axes, *settings]
            checker.add(
                section,
                "matrix",
                f'{where}: matrix.{rule}: unknown key "{key}"{_suggest(key, allowed)}; '
                f"allowed: {', '.join(allowed)}",
            )
            ok = False
            continue
        text = _matrix_value(checker, item, key, section, where)
        if text is None:
            ok = False
        elif rule == "exclude" and text not in axes[key]:
            checker.add(
                section,
                "matrix",
                f'{where}: matrix.exclude: {key} = "{text}" is not one of its values '
                f"({', '.join(axes[key])})",
            )
            ok = False
        else:
            wanted[key] = text
    if ok and not wanted:
        checker.add(section, "matrix", f"{where}: matrix.{rule} entry names no matrix key")
        ok = False
    return wanted if ok else None


def _shown(entry: Mapping[str, Any]) -> str:
    """An include or exclude entry as it reads in a spec: `{ py = "3.11", shard = 2 }`."""
    return "{ " + ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in entry.items()) + " }"


def _matrix_value(
    checker: _Checker, item: object, key: str, section: tuple[str, int], where: str
) -> str | None:
    """A matrix value as text: a string or an integer (a float would lose digits: 3.10 is 3.1)."""
    if isinstance(item, float):
        checker.add(
            section,
            "matrix",
            f"{where}: matrix key {key}: {item!r} is a number with a fraction; write such "
            'values as strings ("3.10", not 3.10, which TOML reads as the number 3.1)',
        )
        return None
    if isinstance(item, bool) or not isinstance(item, str | int):
        checker.add(
            section,
            "matrix",
            f"{where}: matrix key {key}: values are strings or integers, not {_kind(item)}",
        )
        return None
    text = str(item)
    if not _MATRIX_VALUE.fullmatch(text):
        checker.add(
            section,
            "matrix",
            f"{where}: matrix key {key}: bad value {text!r}: at most 64 characters, without "
            "spaces, brackets, braces, commas, equals signs, quotes or backslashes",
        )
        return None
    return text


def _matrix_id(base: str, combo: Mapping[str, str]) -> str:
    """`unit[py=3.12,shard=1]`: the id of one combination of task `unit`."""
    return f"{base}[{','.join(f'{k}={v}' for k, v in combo.items())}]"


def _strings(value: object) -> list[str]:
    """Every string in a field's value (a string, an array of strings, a table's values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, str)]
    return []


def _check_placeholders(
    checker: _Checker,
    table: Mapping[str, Any],
    keys: Sequence[str],
    section: tuple[str, int],
    where: str,
) -> None:
    """Every `{name}` in a matrix task's fields must be a key of its matrix."""
    for field in _MATRIX_FIELDS:
        for text in _strings(table.get(field)):
            for match in _PLACEHOLDER.finditer(text):
                name = match.group(2)
                if name is None or name in keys:
                    continue
                checker.add(
                    section,
                    field,
                    f'{where}: {field}: unknown placeholder "{{{name}}}"'
                    f"{_suggest(name, keys)}; the matrix keys are {', '.join(keys) or 'none'} "
                    f'(write {{{{{name}}}}} for a literal "{{{name}}}")',
                )


def _substitute(text: str, combo: Mapping[str, str]) -> str:
    """`text` with each `{key}` of `combo` replaced by its value, and `{{name}}` by `{name}`."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return "{" + match.group(1) + "}"
        return combo.get(match.group(2), match.group(0))

    return _PLACEHOLDER.sub(one, text)


def _expand(table: Mapping[str, Any], combo: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a matrix task's table for one combination, its placeholders replaced."""
    out = dict(table)
    for field in _MATRIX_FIELDS:
        value = out.get(field)
        if isinstance(value, str):
            out[field] = _substitute(value, combo)
        elif isinstance(value, list):
            out[field] = [_substitute(v, combo) if isinstance(v, str) else v for v in value]
        elif isinstance(value, dict):
            out[field] = {
                k: _substitute(v, combo) if isinstance(v, str) else v for k, v in value.items()
            }
    return out


def _resolve_after(
    checker: _Checker, tasks: list[TaskSpec], tables: Mapping[str, int]
) -> list[TaskSpec]:
    """`after` naming a matrix task's base id waits for every one of its combinations."""
    bases: dict[str, list[str]] = {}
    for task in tasks:
        if task.base is not None:
            bases.setdefault(task.base, []).append(task.id)
    if not bases:
        return tasks
    out: list[TaskSpec] = []
    for task in tasks:
        after: list[str] = []
        for dep in task.after:
            if dep not in bases:
                after.append(dep)
            elif dep == task.base:
                checker.add(
                    ("task", tables[task.id]), "after", f'task "{dep}": lists itself in after'
                )
            else:
                after.extend(bases[dep])
        out.append(dataclasses.replace(task, after=tuple(dict.fromkeys(after))))
    return out


def _check_junit_paths(checker: _Checker, tasks: list[TaskSpec], tables: Mapping[str, int]) -> None:
    """Two tasks writing one JUnit file would merge one report twice and lose the other."""
    owner: dict[str, str] = {}
    reported: set[int] = set()
    for task in tasks:
        if task.junit is None:
            continue
        other = owner.setdefault(task.junit, task.id)
        index = tables[task.id]
        if other != task.id and index not in reported:
            reported.add(index)
            hint = " (use a matrix placeholder in junit)" if task.base is not None else ""
            checker.add(
                ("task", index),
                "junit",
                f'task "{task.id}": junit file {task.junit} is also the report of task '
                f'"{other}"{hint}',
            )


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


def _check_graph(checker: _Checker, tasks: list[TaskSpec], tables: Mapping[str, int]) -> None:
    """Unknown `after` ids and dependency cycles (each cycle reported once)."""
    by_id = {t.id: t for t in tasks}
    names = list(dict.fromkeys(t.base or t.id for t in tasks))
    for task in tasks:
        for dep in task.after:
            if dep == task.id:
                checker.add(
                    ("task", tables[task.id]), "after", f'task "{task.id}": lists itself in after'
                )
            elif dep not in by_id:
                checker.add(
                    ("task", tables[task.id]),
                    "after",
                    f'task "{task.base or task.id}": after names unknown task "{dep}"'
                    f"{_suggest(dep, names + list(by_id))}",
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
                        ("task", tables[first.id]),
                        "after",
                        f'task "{first.id}": dependency cycle {chain} (each waits for the next)',
                    )
