"""Reading a batch-run spec: TOML parsed, checked whole, errors with file:line.

Every problem in a spec is collected and reported at once, before anything starts. tomllib
gives no positions, so lines come from a small scan of the source text for table headers and
`key =` lines (`SpecLocator`): exact for ordinary TOML, approximate for exotic layouts (a key
inside an inline table is reported at its table's line).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from shoal.core.cmdsize import command_problem, environ_bytes
from shoal.core.errors import InvalidNameError, UsageError
from shoal.core.names import validate_name
from shoal.orchestrator.batch.checker import SpecChecker, SpecLocator, suggest
from shoal.orchestrator.batch.matrix import (
    MATRIX_RULES,
    check_placeholders,
    expand,
    matrix_combinations,
    matrix_id,
)
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
    parse_halt,
)
from shoal.teams.models import LEAD_NAME

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
    "num_cpus",
    "num_gpus",
    "resources",
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
    "num_cpus",
    "num_gpus",
    "resources",
)


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
    checker = SpecChecker(SpecLocator(text))
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


def _parse_run(checker: SpecChecker, table: object, base: Path) -> RunSettings:
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
        num_cpus=checker.amount(table, "num_cpus", section, "[run]"),
        num_gpus=checker.amount(table, "num_gpus", section, "[run]"),
        resources=checker.resources(table, section, "[run]"),
    )


def _argv(
    checker: SpecChecker, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
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


def _parse_members(checker: SpecChecker, items: object, base: Path) -> list[MemberSpec]:
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


def _check_script(checker: SpecChecker, script: str, section: tuple[str, int], where: str) -> None:
    """Load a member's script as its teammate will, so a broken one is a spec error (at the
    `script =` line) instead of a member that fails to start after the run began."""
    from shoal.workers.teammate.brains import Script

    try:
        Script.load(Path(script))
    except UsageError as exc:
        checker.add(section, "script", f"{where}: {exc}")


def _parse_tasks(
    checker: SpecChecker, items: object, settings: RunSettings, base: Path
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
        combos = matrix_combinations(checker, table, section, where)
        # Without a matrix, or with a bad one, the task is checked as written (a bad matrix
        # is reported, and the task keeps its id for the checks of the tasks after it).
        variants: list[tuple[dict[str, Any], dict[str, str]]] = [(table, {})]
        if combos is not None:
            if isinstance(table["matrix"], dict) and table["matrix"]:
                axes = [k for k in table["matrix"] if k not in MATRIX_RULES]
                check_placeholders(checker, table, axes, section, where)
            if combos:
                # (a combination's own timeout and retries, from an include, replace the task's)
                variants = [({**expand(table, combo), **extra}, combo) for combo, extra in combos]
        for variant, combo in variants:
            task = _parse_task(checker, variant, section, where, context)
            if task_id is None:
                continue
            expanded = matrix_id(task_id, combo) if combo else task_id
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
    checker: SpecChecker,
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
    num_cpus = checker.amount(table, "num_cpus", section, where)
    num_gpus = checker.amount(table, "num_gpus", section, where)
    resources = {**settings.resources, **checker.resources(table, section, where)}
    if has_prompt:  # (a member runs here, not on the cluster)
        for key in ("num_cpus", "num_gpus", "resources"):
            if key in table:
                checker.add(section, key, f"{where}: {key} is for run tasks (a Ray job's)")
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
        num_cpus=settings.num_cpus if num_cpus is None else num_cpus,
        num_gpus=settings.num_gpus if num_gpus is None else num_gpus,
        resources=resources,
        line=checker.locator.line(section),
    )


def _resolve_after(
    checker: SpecChecker, tasks: list[TaskSpec], tables: Mapping[str, int]
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


def _check_junit_paths(
    checker: SpecChecker, tasks: list[TaskSpec], tables: Mapping[str, int]
) -> None:
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
    checker: SpecChecker, table: Mapping[str, Any], section: tuple[str, int], where: str
) -> tuple[str, ...]:
    value = table.get("after", [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        checker.add(section, "after", f"{where}: after must be a task id or an array of task ids")
        return ()
    return tuple(dict.fromkeys(value))


def _check_graph(checker: SpecChecker, tasks: list[TaskSpec], tables: Mapping[str, int]) -> None:
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
                    f"{suggest(dep, names + list(by_id))}",
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
