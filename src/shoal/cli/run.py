"""`shoal run SPEC`: a spec's tasks, headless, to a verdict — with reports and exit codes."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, AnyStr, Final, Generic, TextIO

import click
import orjson

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import ShoalError, UsageError
from shoal.orchestrator.batch.ci import (
    ANNOTATION_CHOICES,
    CiKind,
    Row,
    detect,
    fold_end,
    fold_start,
    github_annotations,
    markdown_summary,
    text_table,
)
from shoal.orchestrator.batch.exitcodes import RunInfrastructureError
from shoal.orchestrator.batch.spec import BACKEND_CHOICES, format_duration
from shoal.ui.run_output import (
    DEFAULT_FAILURE_LINES,
    OUTPUT_MODES,
    TAG_SEP,
    Follower,
    OutputMode,
    failure_frame,
    iter_lines,
    verdict_label,
)
from shoal.ui.status import one_line as status_one_line

if TYPE_CHECKING:
    from shoal.ui.run_progress import RunBoard

# A reason longer than this is cut in a progress line (reports keep all of it).
REASON_WIDTH: Final = 200
# Off a terminal: seconds between two "still running" lines (SHOAL_RUN_HEARTBEAT_S sets it;
# 0: none), and how many running tasks such a line names.
HEARTBEAT_S: Final = 60.0
HEARTBEAT_ENV: Final = "SHOAL_RUN_HEARTBEAT_S"
HEARTBEAT_NAMES: Final = 8
COLOR_CHOICES: Final = ("auto", "always", "never")
# ANSI colours of the verdict labels on plain lines (with --color always, or FORCE_COLOR).
_COLORS: Final = {
    "succeeded": "32",
    "failed": "31",
    "timed_out": "31",
    "killed": "31",
    "skipped": "33",
}


class Droppable(Generic[AnyStr]):
    """A stream that goes quiet once nobody reads it (`shoal run ... | head -1`).

    The first failed write marks it gone and points its descriptor at /dev/null, so neither
    later writes nor the interpreter's final flush fail: the run goes on and its reports and
    record are written, only the progress is lost.
    """

    def __init__(self, stream: IO[AnyStr]) -> None:
        self.stream: IO[AnyStr] = stream
        self.gone = False

    def write(self, data: AnyStr) -> None:
        """Write (and flush) `data`, or drop it once the reader is gone."""
        if self.gone:
            return
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):
            self._drop()

    def flush(self) -> None:
        """Flush, or do nothing once the reader is gone."""
        if self.gone:
            return
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self._drop()

    def isatty(self) -> bool:
        """True for a terminal still there."""
        return not self.gone and self.stream.isatty()

    def _drop(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.stream.fileno())
            finally:
                os.close(null)


def one_line(text: str, width: int = REASON_WIDTH) -> str:
    """`text` on one progress line: its lines joined with " ⏎ ", cut to `width`."""
    return status_one_line(text, width, line_sep=" ⏎ ")


class StreamJson:
    """`--output-format stream-json`: every event as one JSON line on stdout (notes, such as
    the backend chosen for the members, also as one line on stderr)."""

    def __init__(self, out: Droppable[bytes] | IO[bytes], err: Droppable[str] | TextIO) -> None:
        self.out = out
        self.err = err

    def __call__(self, event: dict[str, Any]) -> None:
        self.out.write(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
        self.out.flush()
        if event.get("type") == "run" and event.get("subtype") == "note":
            self.err.write(f"note: {one_line(str(event.get('text')))}\n")
            self.err.flush()

    def close(self) -> None:
        """Nothing to finish: the last line was the `result` event."""


class TextProgress:
    """Human progress: only the noteworthy lines (failures with their output's last lines,
    skips, retries, timeouts) and a summary; on a terminal also a live display below them
    (a bar, counts, an ETA and the running tasks). With `output`, tasks' own output too."""

    def __init__(
        self,
        out: Droppable[str] | TextIO,
        err: Droppable[str] | TextIO,
        *,
        live: bool,
        output: OutputMode = "none",
        failure_lines: int = DEFAULT_FAILURE_LINES,
        no_color: bool = False,
        color: bool = False,
        quiet: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
        ci: CiKind = "none",
    ) -> None:
        self.out = out
        self.err = err
        self.output = output
        self.failure_lines = failure_lines
        self.color = color
        self.quiet = quiet
        self.ci = ci
        self.total = 0
        self.done = 0
        self.running: set[tuple[str, int]] = set()
        self.tally = {"succeeded": 0, "failed": 0, "timed_out": 0, "killed": 0, "skipped": 0}
        self._width = max(len(k) for k in self.tally)
        # One writer at a time: events come on the leader's thread, followed output on its own.
        self.lock = threading.RLock()
        self.board: RunBoard | None = None
        if live:
            from shoal.ui.run_progress import RunBoard  # (rich: only on a terminal)

            self.board = RunBoard(out, no_color=no_color)  # type: ignore[arg-type]
        self.follower = Follower(self._raw, self.lock) if output == "tag" else None
        self.paths: dict[str, str] = {}  # task id -> output file of its running attempt
        # After an interrupt or a halt: tasks never started, counted by reason, said once.
        self.stopping = False
        self._unstarted: dict[str, int] = {}
        # Off a terminal (no live display), a line every `heartbeat_s` while tasks run, so
        # that a CI step that kills silent jobs (CircleCI: 10 minutes) sees the run alive.
        self._started_at = time.monotonic()
        self._beats = threading.Event()
        self._beater: threading.Thread | None = None
        if self.board is None and not quiet and heartbeat_s > 0:
            self._beater = threading.Thread(
                target=self._beat, args=(heartbeat_s,), name="shoal-run-heartbeat", daemon=True
            )

    # -- output helpers -------------------------------------------------------------------------

    def _line(self, text: str, *, err: bool = False) -> None:
        """One progress line (a line break in `text` is shown as ⏎)."""
        with self.lock:
            self._write(text.replace("\r", " ").replace("\n", " ⏎ "), err=err)

    def _raw(self, text: str) -> None:
        """A line of a task's own output, as it is."""
        with self.lock:
            self._write(text)

    def _write(self, text: str, *, err: bool = False) -> None:
        if self.board is not None and not (err and not self.err.isatty()):
            self.board.line(text)  # above the display (stderr lines too, when on the terminal)
            return
        stream = self.err if err else self.out
        stream.write(text + "\n")
        stream.flush()

    def _say_unstarted(self) -> None:
        unstarted, self._unstarted = self._unstarted, {}
        for reason, count in unstarted.items():
            self.done += count
            self._write(f"[{self.done}/{self.total}] {count} task(s) {reason}")

    def _finished(self, task_id: str, status: str, detail: str) -> None:
        self.done += 1
        self.tally[status] = self.tally.get(status, 0) + 1
        label = "ok" if status == "succeeded" else status.replace("_", " ")
        if status in ("failed", "timed_out", "killed"):
            label = label.upper()
        if status == "succeeded" and (self.board is not None or self.quiet):
            return  # (the display on a terminal counts successes; --quiet: the summary)
        padded = self._paint(f"{label:<{self._width}}", status)
        self._line(f"[{self.done}/{self.total}] {padded} {task_id}  {detail}".rstrip())

    def _paint(self, text: str, status: str) -> str:
        """`text` in the colour of `status`, when colour is on (`--color`, FORCE_COLOR)."""
        code = _COLORS.get(status) if self.color else None
        return f"\x1b[{code}m{text}\x1b[0m" if code else text

    def _beat(self, interval: float) -> None:
        """The heartbeat thread: a line of counts and running tasks every `interval` s."""
        while not self._beats.wait(interval):
            with self.lock:
                names = sorted({task_id for task_id, _ in self.running})
                shown = ", ".join(names[:HEARTBEAT_NAMES])
                more = (
                    f" (+{len(names) - HEARTBEAT_NAMES} more)"
                    if len(names) > HEARTBEAT_NAMES
                    else ""
                )
                took = format_duration(round(time.monotonic() - self._started_at, 1))
                running = f"; running: {shown}{more}" if names else ""
                self._line(f"[{self.done}/{self.total}] still running after {took}{running}")

    def _stop_beating(self) -> None:
        self._beats.set()
        if self._beater is not None and self._beater is not threading.current_thread():
            if self._beater.is_alive():
                self._beater.join(timeout=5)
            self._beater = None

    # -- events -----------------------------------------------------------------------------

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        sub = event.get("subtype")
        if kind == "result":
            self._result(event)
            return
        if kind != "run":
            return
        if sub == "run_started":
            self._started(event)
        elif sub == "note":
            self._line(f"note: {one_line(str(event.get('text')))}", err=True)
        elif sub == "task_started":
            self._task_started(event)
        elif sub == "task_retrying":
            self._attempt_ended(event["id"], None, None)
            self._show_output(event["id"], self.paths.pop(event["id"], None), event)
            outcome = event["status"].replace("_", " ")
            delay = event.get("delay_s") or 0
            wait = f" in {format_duration(delay)}" if delay > 0 else ""
            self._line(
                f"retry {event['id']}: attempt {event['attempt']} {outcome} "
                f"({one_line(str(event.get('reason')))}); starting attempt "
                f"{event['next_attempt']} of {event['attempts_max']}{wait}"
            )
        elif sub == "task_timed_out":
            self._line(f"timeout {event['id']}: ran past {event['timeout']}; stopping it")
        elif sub == "task_stalled":
            self._line(f"waiting? {event['id']}: last output line: {event.get('prompt')}")
        elif sub == "task_finished":
            self._task_finished(event)
        elif sub == "task_skipped":
            self._attempt_ended(event["id"], "skipped", None)
            reason = event.get("reason") or ""
            if self.stopping and reason.startswith("not started"):
                # (counted when said, at the end: the kills still to come are numbered
                # before them, so no number is shown twice)
                self.tally["skipped"] += 1
                self._unstarted[reason] = self._unstarted.get(reason, 0) + 1
            else:
                self._finished(event["id"], "skipped", one_line(reason))
        elif sub == "halted":
            self.stopping = True
            killing = event.get("killing") or 0
            then = f"; killing {killing} running task(s)" if killing else ""
            self._line(f"halt: {event['reason']}; starting nothing more{then}")
        elif sub == "interrupted":
            self.stopping = True
            self._line(
                f"interrupted ({event['reason']}): stopping {event.get('running', 0)} "
                "running task(s)",
                err=True,
            )

    def _task_started(self, event: dict[str, Any]) -> None:
        self.running.add((event["id"], event["attempt"]))
        if self.board is not None:
            self.board.task_started(event["id"])
        path = event.get("output_file")
        if path:
            self.paths[event["id"]] = path
            if self.follower is not None:
                self.follower.follow(event["id"], path)

    def _attempt_ended(self, task_id: str, verdict: str | None, took: Any) -> None:
        self.running = {r for r in self.running if r[0] != task_id}
        if self.board is not None:
            self.board.task_ended(
                task_id, verdict, float(took) if isinstance(took, int | float) else None
            )

    def _task_finished(self, event: dict[str, Any]) -> None:
        task_id, status = event["id"], event["status"]
        self._attempt_ended(task_id, status, event.get("duration_s"))
        path = self.paths.pop(task_id, None) or event.get("output_file")
        self._show_output(task_id, path, event)
        self._finished(task_id, status, _detail(event))
        # A task killed by the run's own interrupt or halt did not fail on its own: no tail.
        failed = status in ("failed", "timed_out") or (status == "killed" and not self.stopping)
        if failed and self.output != "group":  # (group has just shown all of it)
            label = verdict_label(status, event.get("reason"))
            for line in failure_frame(task_id, label, path, self.failure_lines):
                self._raw(line)

    def _show_output(self, task_id: str, path: str | None, event: dict[str, Any]) -> None:
        """`--output tag|group`: the rest (tag) or the whole (group) of an attempt's output."""
        if self.follower is not None:
            if not self.follower.end(task_id) and path:  # (an agent task's: known only now)
                for line in iter_lines(path):
                    self._raw(f"{task_id}{TAG_SEP}{line}")
        elif self.output == "group" and path:
            label = verdict_label(event["status"], event.get("reason"))
            header = f"--- {task_id}: {label}: output of {path} ---"
            # (folded where the CI folds: GitHub's ::group::, GitLab's sections)
            start = fold_start(self.ci, task_id, f"{task_id}: {label}", time.time())
            self._raw(start if start is not None else header)
            if start is not None:
                self._raw(header)
            for line in iter_lines(path):
                self._raw(line)
            self._raw(f"--- end of {task_id} ---")
            end = fold_end(self.ci, task_id, time.time())
            if end is not None:
                self._raw(end)

    def _started(self, event: dict[str, Any]) -> None:
        self.total = event["total"]
        resumed = event.get("resumed") or 0
        self.done = resumed
        self.tally["succeeded"] = resumed
        self._line(
            f"shoal run {event['spec']}: {self.total} task(s), team {event['team']}, "
            f"jobs {event['jobs'] or 'unlimited'}, halt {event['halt']}"
        )
        if self.board is not None:
            self.board.total, self.board.jobs = self.total, event["jobs"] or 0
            self.board.done = self.board.ok = resumed
            self.board.start()
        if self._beater is not None and not self._beater.is_alive():
            self._started_at = time.monotonic()
            self._beater.start()
        if event.get("resume_requested"):
            if event.get("resumed_from"):
                self._line(
                    f"resuming run {event['resumed_from']}: {resumed} task(s) succeeded then "
                    "and are not run again"
                )
            else:
                self._line("no previous run of this spec for this team: running every task")

    def _result(self, event: dict[str, Any]) -> None:
        self._stop_beating()
        self._say_unstarted()
        if self.follower is not None:
            self.follower.close()
        if self.board is not None:
            self.board.stop()
            self.board = None  # (the summary is plain text, kept in the scrollback)
        rows = [Row(**row) for row in event.get("summary") or []]
        if rows and not self.quiet:
            for line in text_table(rows):
                self._raw(line)
        c = event["counts"]
        took = format_duration(event.get("duration_s") or 0.001)
        resumed = f" ({c['resumed']} from the previous run)" if c.get("resumed") else ""
        status = event["subtype"]
        flaky = c.get("flaky") or 0
        if status == "succeeded" and c["succeeded"] == c["total"]:
            shaky = f", {flaky} flaky (passed on a retry)," if flaky else ""
            line = f"ok: all {c['total']} task(s) succeeded{shaky}{resumed} in {took}"
        else:
            parts = [
                f"{c[k]} {k.replace('_', ' ')}"
                for k in ("succeeded", "flaky", "failed", "timed_out", "killed", "skipped")
                if c.get(k)
            ]
            word = {"succeeded": "ok", "interrupted": "interrupted"}.get(status, "FAILED")
            line = (
                f"{word}: {', '.join(parts)} of {c['total']} in {took} (exit {event['exit_code']})"
            )
        self._line(line)
        if event.get("halted"):
            self._line(f"halted: {event['halted']}")
        files = event.get("files") or {}
        for key in ("report", "junit", "joblog", "results"):
            if files.get(key):
                self._line(f"{key}: {files[key]}")
        if event["exit_code"] != 0:
            self._line(f"run record: {files.get('record')} (`shoal run --resume` re-runs the rest)")
        for error in event.get("errors") or []:
            self._line(f"shoal: error: {error}", err=True)

    def close(self) -> None:
        """Stop following and take the live display away (a run that ended without its
        result event, by an error, must not leave the terminal without a cursor)."""
        self._stop_beating()
        with self.lock:
            if self.follower is not None:
                self.follower.close()
                self.follower = None
            if self.board is not None:
                self.board.stop()
                self.board = None


def _detail(event: dict[str, Any]) -> str:
    took = event.get("duration_s")
    timing = f"{took:.2f}s" if isinstance(took, int | float) else ""
    attempts = event.get("attempts") or 0
    tries = f", {attempts} attempts" if attempts > 1 else ""
    if event["status"] == "succeeded":
        took_s = f"{took:.1f} s" if isinstance(took, int | float) else ""
        return f"{took_s}{tries}{' (flaky)' if attempts > 1 else ''}"
    out = f"; output: {event['output_file']}" if event.get("output_file") else ""
    return f"{one_line(event.get('reason') or event['status'])} ({timing}{tries}){out}"


@click.command("run")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
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
    "(N a count or a percentage like 10%).",
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
    spec_path: str,
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
    """Run the tasks of SPEC (a TOML file) to a verdict.

    Dependencies gate starts, a failed task skips its dependents, and the exit code is 0 when
    every task succeeded, 1 when any failed or was skipped, 2 for a bad spec or usage, 3 when
    the run itself could not do its job (a leader already runs for the team, a report could
    not be written), 124 when only timeouts kept it from green, 130 when interrupted
    (nothing is left running). The team is --team, else [run] team (both kept),
    else a team of the run's own, run-NAME after the spec's file name, deleted at the end
    unless --keep-team.
    """
    from shoal.orchestrator.batch import RunOptions, run_batch
    from shoal.orchestrator.batch.parse import parse_spec
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
    spec = parse_spec(spec_path)
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
