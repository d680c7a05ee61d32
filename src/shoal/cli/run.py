"""`shoal run SPEC`: a spec's tasks, headless, to a verdict — with reports and exit codes."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from shoal.cli.common import DURATION, common_options, get_env, json_option, print_json
from shoal.cli.run_sinks import (
    COLOR_CHOICES,
    HEARTBEAT_ENV,
    HEARTBEAT_S,
    Droppable,
    StreamJson,
    TextProgress,
)
from shoal.core.errors import ShoalError, UsageError
from shoal.orchestrator.batch.ci import (
    ANNOTATION_CHOICES,
    Row,
    detect,
    github_annotations,
    markdown_summary,
)
from shoal.orchestrator.batch.exitcodes import RunInfrastructureError
from shoal.orchestrator.batch.spec import BACKEND_CHOICES, Spec
from shoal.ui.run_output import (
    DEFAULT_FAILURE_LINES,
    OUTPUT_MODES,
    OutputMode,
)


@click.command("run")
@click.argument("spec_args", metavar="SPEC | -- COMMAND ::: ARGS...", nargs=-1, required=True)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=0),
    default=None,
    help="Tasks at once (default: [run] jobs, else the number of CPUs; 0: no limit).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKEND_CHOICES),
    default=None,
    help="Where teammates run (default: [run] backend, else auto); `ray`: every shell task "
    "is a Ray job on the cluster at --ray (teammates then run here).",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="With --backend ray: the cluster's dashboard (default: $SHOAL_RAY_ADDRESS).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="With --backend ray: send $SHOAL_RAY_TOKEN over plain http to a cluster off this machine.",
)
@click.option(
    "--keep-workdirs",
    is_flag=True,
    help="With --backend ray: keep each task's private working copy on its node (for debugging).",
)
@click.option(
    "--halt",
    default=None,
    metavar="POLICY",
    help="Stop early: never, now,fail=N, soon,fail=N, now,success=N, soon,success=N "
    "(N a count or a percentage like 10%); or GNU parallel's 0, 1 (soon,fail=1), 2 "
    "(now,fail=1).",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="A plain commands file's or ::: run's: kill each command after DURATION.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=None,
    help="A plain commands file's or ::: run's: run a failed command again, up to N times.",
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write JUnit XML here.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write the JSON report here.",
)
@click.option(
    "--joblog",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write a GNU parallel style joblog here.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Run only what did not succeed in this spec's last run (for this team).",
)
@click.option(
    "--output",
    "output",
    type=click.Choice(OUTPUT_MODES),
    default="none",
    show_default=True,
    help="Tasks' own output: none; tag (every line as it comes, prefixed with the task's "
    "name and a tab); group (each task's output whole when it ends).",
)
@click.option(
    "--failure-lines",
    type=click.IntRange(min=0),
    default=DEFAULT_FAILURE_LINES,
    show_default=True,
    metavar="N",
    help="Show the last N lines of a failed task's output (0: none).",
)
@click.option(
    "--results",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Copy every task's output into DIR (created) as it ends, one file per task.",
)
@click.option(
    "--keep-team",
    is_flag=True,
    help="Keep the run's own team (run-NAME) at the end instead of deleting it.",
)
@click.option(
    "--output-format",
    type=click.Choice(["text", "stream-json"]),
    default="text",
    show_default=True,
    help="text: progress for people; stream-json: one JSON event per line.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (tasks in start order, after matrix expansion) and start nothing.",
)
@click.option(
    "--keep-sessions",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="At the end, remove the team's oldest finished session directories past N "
    "(default: [run] keep_sessions in SHOAL_HOME/config.toml for the run's own team, "
    "else all are kept); sessions a run record still uses are kept.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Off a terminal, no line per task that succeeded, no heartbeat and no table "
    "(failures and the verdict are still shown).",
)
@click.option(
    "--annotations",
    type=click.Choice(ANNOTATION_CHOICES),
    default="auto",
    show_default=True,
    help="CI markers: github (::error lines from JUnit failures, ::group:: for --output "
    "group), gitlab (collapsed sections for --output group), none; auto: GITHUB_ACTIONS=true "
    "or GITLAB_CI=true says which.",
)
@click.option(
    "--color",
    "color",
    type=click.Choice(COLOR_CHOICES),
    default="auto",
    show_default=True,
    help="Colour: always, never, or auto (a terminal, unless NO_COLOR is set; FORCE_COLOR "
    "turns it on off a terminal, as CI logs that show colours want).",
)
@json_option
@common_options
def run(
    spec_args: tuple[str, ...],
    timeout: float | None,
    retries: int | None,
    jobs: int | None,
    backend: str | None,
    ray_address: str | None,
    insecure: bool,
    keep_workdirs: bool,
    halt: str | None,
    junit: str | None,
    report: str | None,
    joblog: str | None,
    resume: bool,
    output: OutputMode,
    failure_lines: int,
    results: str | None,
    keep_team: bool,
    output_format: str,
    dry_run: bool,
    keep_sessions: int | None,
    quiet: bool,
    annotations: str,
    color: str,
    as_json: bool,
) -> None:
    """Run the tasks of SPEC (a TOML spec, or a file of commands) to a verdict.

    SPEC is a TOML spec when its name ends in .toml; else a plain commands file, one command
    per line (as `parallel < FILE`; blank and # lines skipped). `shoal run -- COMMAND :::
    A B C` runs COMMAND once per argument, as GNU parallel does (`{}` is the argument, `{1}`
    `{2}` those of several `:::` sources, combined every way; with neither, it is appended).
    Their tasks are numbered from 1; --timeout and --retries apply to each.

    Dependencies gate starts, a failed task skips its dependents, and the exit code is 0 when
    every task succeeded, 1 when any failed or was skipped, 2 for a bad spec or usage, 3 when
    the run itself could not do its job (a leader already runs for the team, a report could
    not be written), 124 when only timeouts kept it from green, 130 when interrupted
    (nothing is left running). The team is --team, else [run] team (both kept),
    else a team of the run's own, run-NAME after the spec's file name, deleted at the end
    unless --keep-team.
    """
    from shoal.orchestrator.batch import RunOptions, run_batch
    from shoal.orchestrator.batch.spec import parse_halt
    from shoal.orchestrator.batch.workflow_kind import install as install_workflows

    env = get_env(click.get_current_context())
    if output != "none" and output_format == "stream-json":
        raise UsageError(
            f"--output {output} prints tasks' output as text; it cannot go with "
            "--output-format stream-json (whose stdout is JSON lines)"
        )
    try:
        policy = parse_halt(halt) if halt is not None else None
    except ValueError as exc:
        raise UsageError(f"--halt: {exc}") from None
    if as_json and not dry_run:
        raise UsageError("--json goes with --dry-run (a run's events: --output-format stream-json)")
    spec = _spec_of(list(spec_args), timeout, retries)
    if dry_run:
        from shoal.orchestrator.batch import agent_dispatcher_factory, check_agents
        from shoal.orchestrator.batch.plan import build_plan, render_plan

        check_agents(spec, agent_dispatcher_factory())
        plan = build_plan(
            spec,
            env.layout,
            team=env.team_arg,
            jobs=jobs,
            backend=backend,
            halt=policy,
            resume=resume,
        )
        if as_json:
            print_json(plan)
        else:
            click.echo(render_plan(plan))
        return
    options = RunOptions(
        team=env.team_arg,
        jobs=jobs,
        backend=backend,
        halt=policy,
        junit=Path(junit) if junit else None,
        report=Path(report) if report else None,
        joblog=Path(joblog) if joblog else None,
        resume=resume,
        forward_leader_events=output_format == "stream-json",
        keep_team=keep_team,
        results=Path(results) if results else None,
        ray=ray_address,
        ray_insecure=insecure,
        keep_workdirs=keep_workdirs,
        keep_sessions=keep_sessions,
    )
    # Output that nobody reads any more (a closed pipe) is dropped; the run goes on.
    err = Droppable(sys.stderr)
    ci = detect(annotations)
    sink: StreamJson | TextProgress
    if output_format == "stream-json":
        sink = StreamJson(Droppable(sys.stdout.buffer), err)
    else:
        out = Droppable(sys.stdout)
        tty = out.isatty() and os.environ.get("TERM") != "dumb"
        colored = use_color(color, tty)
        sink = TextProgress(
            out,
            err,
            live=tty,
            output=output,
            failure_lines=failure_lines,
            no_color=not colored,
            color=colored,
            quiet=quiet,
            heartbeat_s=heartbeat_interval(),
            ci=ci,
        )
    try:
        outcome = run_batch(spec, env.layout, options, sink, leader_setup=install_workflows)
    except UsageError:
        raise
    except ShoalError as exc:  # (not the spec's fault, nor a task's: exit 3)
        raise RunInfrastructureError(str(exc)) from None
    finally:
        sink.close()
    # GitHub reads workflow commands from stdout (not from JSON lines, unless asked for).
    if ci == "github" and (output_format == "text" or annotations == "github"):
        for line in github_annotations(outcome.report, {t.id: t.cwd for t in spec.tasks}):
            click.echo(line)
    step_summary(outcome.report, list(outcome.summary))
    sys.exit(outcome.exit_code)


def _spec_of(args: list[str], timeout: float | None, retries: int | None) -> Spec:
    """The spec to run: a TOML spec (a file ending in .toml), a plain commands file (one
    command per line, as `parallel < FILE`), or `COMMAND ::: ARGS` (as parallel takes it)."""
    from shoal.orchestrator.batch.commands import (
        ARGS_SEPARATOR,
        commands_of_args,
        commands_of_file,
        spec_of_commands,
    )
    from shoal.orchestrator.batch.parse import parse_spec

    if ARGS_SEPARATOR in args:
        where = Path(os.getcwd()) / "parallel"  # (its record and team: run-parallel)
        commands = commands_of_args(args)
        return spec_of_commands(
            commands, where, display="the ::: commands", timeout=timeout, retries=retries
        )
    if len(args) != 1:
        raise UsageError(
            "run takes one SPEC (a .toml spec or a file of commands), or -- COMMAND ::: ARGS"
        )
    (given,) = args
    if given.endswith(".toml"):
        if timeout is not None or retries is not None:
            raise UsageError(
                "--timeout and --retries are for a commands file or ::: (a TOML spec sets "
                "them in [run] or per task)"
            )
        return parse_spec(given)
    path = Path(os.path.abspath(given))
    commands = commands_of_file(path, given)
    return spec_of_commands(commands, path, display=given, timeout=timeout, retries=retries)


def use_color(choice: str, tty: bool) -> bool:
    """Whether to colour: --color always|never, else NO_COLOR (off), FORCE_COLOR (on, also
    off a terminal: CI logs show ANSI colours), else whether stdout is a terminal."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR", "") != "":
        return False
    force = os.environ.get("FORCE_COLOR")
    if force is not None and force not in ("0", "false"):
        return True
    return tty


def heartbeat_interval() -> float:
    """Seconds between heartbeat lines: $SHOAL_RUN_HEARTBEAT_S, else HEARTBEAT_S."""
    raw = os.environ.get(HEARTBEAT_ENV)
    if raw is None:
        return HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{HEARTBEAT_ENV}={raw!r}: give seconds, such as 60 (0: none)") from None
    return max(0.0, value)


def step_summary(report: dict[str, Any], rows: list[Row]) -> None:
    """Append the run's table to $GITHUB_STEP_SUMMARY, when it is set (a failed write is
    said on stderr: the run's verdict stands)."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(markdown_summary(report, rows))
    except OSError as exc:
        click.echo(
            f"shoal: warning: could not append to GITHUB_STEP_SUMMARY {path}: {exc}", err=True
        )
