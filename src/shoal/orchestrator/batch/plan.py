"""`shoal run --dry-run`: what a run of a spec would do, without doing any of it.

The plan is the checked spec after matrix expansion, in the order the run can start its tasks
(a task comes after everything it waits for), each task with the stage it can start in (1: at
once; N: once its dependencies of stage N-1 have succeeded). Nothing is started and nothing is
written: no leader, team, session or run record. With `resume`, the previous run's record is
read (not changed) to say which tasks would be carried over.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, Final

from shoal.core.names import validate_name
from shoal.core.paths import Layout
from shoal.orchestrator.batch.options import default_run_team
from shoal.orchestrator.batch.report import RunRecords, plan_resume
from shoal.orchestrator.batch.spec import HaltPolicy, Spec, TaskSpec, format_duration

PLAN_VERSION: Final = 1


def build_plan(
    spec: Spec,
    layout: Layout,
    *,
    team: str | None = None,
    jobs: int | None = None,
    backend: str | None = None,
    halt: HaltPolicy | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """The plan of a run of `spec` with these command-line choices (None: as the spec says),
    as JSON-ready data (what `--dry-run --json` prints)."""
    settings = spec.settings
    # The team the run would work in, chosen as the run chooses it.
    team_name = validate_name(team or settings.team or default_run_team(spec.path), "team name")
    carried: Mapping[str, Any] = {}
    previous_run = None
    if resume:
        previous = RunRecords(layout).load(team_name, spec.path)
        if previous is not None:
            carried = plan_resume(spec, previous)
            previous_run = previous.get("run_id")
    stages = _stages(spec)
    return {
        "v": PLAN_VERSION,
        "dry_run": True,
        "spec": str(spec.path),
        "team": team_name,
        "jobs": settings.jobs if jobs is None else jobs,
        "backend": backend or settings.backend,
        "halt": (halt or settings.halt).text,
        "resume": {"requested": resume, "from_run": previous_run, "carried": sorted(carried)},
        "members": [
            {"name": m.name, "agent": m.agent, "command": list(m.command or []) or None}
            for m in spec.members
        ],
        "counts": {
            "total": len(spec.tasks),
            "stages": max(stages.values(), default=0),
            "carried": len(carried),
        },
        "tasks": [_task(t, stages[t.id], t.id in carried) for t in spec.topological()],
    }


def _stages(spec: Spec) -> dict[str, int]:
    """Task id -> 1 + the length of the longest chain of dependencies before it."""
    stage: dict[str, int] = {}
    for task in spec.topological():
        stage[task.id] = 1 + max((stage[d] for d in task.after), default=0)
    return stage


def _task(task: TaskSpec, stage: int, carried: bool) -> dict[str, Any]:
    return {
        "id": task.id,
        "seq": task.seq,
        "line": task.line,
        "stage": stage,
        "kind": "agent" if task.is_agent else "shell",
        "command": task.command_line,
        "argv": None if task.run is None or isinstance(task.run, str) else list(task.run),
        "prompt": task.prompt,
        "assign": task.assign,
        "after": list(task.after),
        "always": task.always,
        "base": task.base,
        "matrix": dict(task.matrix) or None,
        "cwd": task.cwd,
        "env": dict(task.env),
        "timeout_s": task.timeout,
        "retries": task.retries,
        "retry_delays_s": [task.delay_before(n) for n in range(2, task.retries + 2)],
        "junit": task.junit,
        "description": task.description,
        "carried": carried,
    }


def render_plan(plan: Mapping[str, Any]) -> str:
    """The plan for people: a heading, then each task in start order with what it waits
    for, its command and the settings that differ from none."""
    counts = plan["counts"]
    jobs = plan["jobs"] or "unlimited"
    lines = [
        f"dry run of {plan['spec']}: {counts['total']} task(s) in {counts['stages']} stage(s), "
        f"team {plan['team']}, jobs {jobs}, halt {plan['halt']}; nothing is started"
    ]
    resume = plan["resume"]
    if resume["requested"]:
        if resume["from_run"]:
            lines.append(
                f"resuming run {resume['from_run']}: {counts['carried']} task(s) succeeded "
                "then and would not run again"
            )
        else:
            lines.append("no previous run of this spec for this team: every task would run")
    for member in plan["members"]:
        command = f": {shlex.join(member['command'])}" if member["command"] else ""
        lines.append(f"member {member['name']} ({member['agent']}){command}")
    width = len(str(counts["total"]))
    for number, task in enumerate(plan["tasks"], 1):
        head = f"{number:>{width}}. [stage {task['stage']}] {task['id']}"
        if task["carried"]:
            head += "  (succeeded before: not run again)"
        lines.append(head)
        pad = " " * (width + 2)
        if task["after"]:
            ended = " (whatever their verdict: always)" if task.get("always") else ""
            lines.append(f"{pad}after: {', '.join(task['after'])}{ended}")
        if task["kind"] == "agent":
            lines.append(f"{pad}prompt to {task['assign']}: {task['prompt']}")
        else:
            lines.append(f"{pad}run: {task['command']}")
        details = [f"cwd {task['cwd']}"]
        if task["timeout_s"] is not None:
            details.append(f"timeout {format_duration(task['timeout_s'])}")
        if task["retries"]:
            delays = [d for d in task["retry_delays_s"] if d > 0]
            waits = f" after {', '.join(format_duration(d) for d in delays)}" if delays else ""
            details.append(f"retries {task['retries']}{waits}")
        if task["junit"]:
            details.append(f"junit {task['junit']}")
        lines.append(f"{pad}{'; '.join(details)}")
    return "\n".join(lines)
