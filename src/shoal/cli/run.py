"""`shoal run SPEC`: a spec's tasks, headless, to a verdict — with reports and exit codes."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO, Any, AnyStr, Final, Generic, TextIO

import click
import orjson

from shoal.cli.common import common_options, get_env
from shoal.core.errors import UsageError
from shoal.orchestrator.batch.spec import BACKEND_CHOICES, format_duration
from shoal.ui.status import one_line as status_one_line

# A reason longer than this is cut in a progress line (reports keep all of it).
REASON_WIDTH: Final = 200


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
    """Human progress: only the noteworthy lines (failures, skips, retries, timeouts) and a
    summary; on a terminal also a live status line below them."""

    def __init__(
        self, out: Droppable[str] | TextIO, err: Droppable[str] | TextIO, *, live: bool
    ) -> None:
        self.out = out
        self.err = err
        self.live = live
        self.total = 0
        self.done = 0
        self.running: set[tuple[str, int]] = set()
        self.tally = {"succeeded": 0, "failed": 0, "timed_out": 0, "killed": 0, "skipped": 0}
        self._shown = ""
        self._width = max(len(k) for k in self.tally)

    # -- output helpers -------------------------------------------------------------------------

    def _line(self, text: str, *, err: bool = False) -> None:
        stream = self.err if err else self.out
        if self.live and self._shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self._shown = ""
        stream.write(text.replace("\r", " ").replace("\n", " ⏎ ") + "\n")  # one line each
        stream.flush()

    def _status(self) -> str:
        t = self.tally
        failed = t["failed"] + t["timed_out"] + t["killed"]
        return (
            f"[{self.done}/{self.total}] {len(self.running)} running, {t['succeeded']} ok, "
            f"{failed} failed, {t['skipped']} skipped"
        )

    def _redraw(self) -> None:
        """Rewrite the status line when it changed (events only come on changes)."""
        if not self.live:
            return
        text = self._status()
        if text == self._shown:
            return
        self.out.write("\r\x1b[K" + text)
        self.out.flush()
        self._shown = text

    def _finished(self, task_id: str, status: str, detail: str) -> None:
        self.done += 1
        self.tally[status] = self.tally.get(status, 0) + 1
        label = "ok" if status == "succeeded" else status.replace("_", " ")
        if status in ("failed", "timed_out", "killed"):
            label = label.upper()
        if status == "succeeded":
            return  # quiet: the status line (on a terminal) and the summary count successes
        self._line(
            f"[{self.done}/{self.total}] {label:<{self._width}} {task_id}  {detail}".rstrip()
        )

    # -- events -----------------------------------------------------------------------------

    def __call__(self, event: dict[str, Any]) -> None:
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
            self.running.add((event["id"], event["attempt"]))
        elif sub == "task_retrying":
            self.running.discard((event["id"], event["attempt"]))
            outcome = event["status"].replace("_", " ")
            self._line(
                f"retry {event['id']}: attempt {event['attempt']} {outcome} "
                f"({one_line(str(event.get('reason')))}); starting attempt "
                f"{event['next_attempt']} of {event['attempts_max']}"
            )
        elif sub == "task_timed_out":
            self._line(f"timeout {event['id']}: ran past {event['timeout']}; stopping it")
        elif sub == "task_stalled":
            self._line(f"waiting? {event['id']}: last output line: {event.get('prompt')}")
        elif sub == "task_finished":
            self.running = {r for r in self.running if r[0] != event["id"]}
            self._finished(event["id"], event["status"], _detail(event))
        elif sub == "task_skipped":
            self._finished(event["id"], "skipped", one_line(event.get("reason") or ""))
        elif sub == "halted":
            killing = event.get("killing") or 0
            then = f"; killing {killing} running task(s)" if killing else ""
            self._line(f"halt: {event['reason']}; starting nothing more{then}")
        elif sub == "interrupted":
            self._line(
                f"interrupted ({event['reason']}): stopping {event.get('running', 0)} task(s)",
                err=True,
            )
        self._redraw()

    def _started(self, event: dict[str, Any]) -> None:
        self.total = event["total"]
        resumed = event.get("resumed") or 0
        self.done = resumed
        self.tally["succeeded"] = resumed
        self._line(
            f"shoal run {event['spec']}: {self.total} task(s), team {event['team']}, "
            f"jobs {event['jobs'] or 'unlimited'}, halt {event['halt']}"
        )
        if event.get("resume_requested"):
            if event.get("resumed_from"):
                self._line(
                    f"resuming run {event['resumed_from']}: {resumed} task(s) succeeded then "
                    "and are not run again"
                )
            else:
                self._line("no previous run of this spec for this team: running every task")

    def _result(self, event: dict[str, Any]) -> None:
        if self.live and self._shown:
            self.out.write("\r\x1b[K")
            self._shown = ""
        c = event["counts"]
        took = format_duration(event.get("duration_s") or 0.001)
        resumed = f" ({c['resumed']} from the previous run)" if c.get("resumed") else ""
        status = event["subtype"]
        if status == "succeeded" and c["succeeded"] == c["total"]:
            line = f"ok: all {c['total']} task(s) succeeded{resumed} in {took}"
        else:
            parts = [
                f"{c[k]} {k.replace('_', ' ')}"
                for k in ("succeeded", "failed", "timed_out", "killed", "skipped")
                if c[k]
            ]
            word = {"succeeded": "ok", "interrupted": "interrupted"}.get(status, "FAILED")
            line = (
                f"{word}: {', '.join(parts)} of {c['total']} in {took} (exit {event['exit_code']})"
            )
        self._line(line)
        if event.get("halted"):
            self._line(f"halted: {event['halted']}")
        files = event.get("files") or {}
        for key in ("report", "junit", "joblog"):
            if files.get(key):
                self._line(f"{key}: {files[key]}")
        if event["exit_code"] != 0:
            self._line(f"run record: {files.get('record')} (`shoal run --resume` re-runs the rest)")
        for error in event.get("errors") or []:
            self._line(f"shoal: error: {error}", err=True)

    def close(self) -> None:
        """Leave the terminal on a fresh line."""
        if self.live and self._shown:
            self.out.write("\n")
            self.out.flush()


def _detail(event: dict[str, Any]) -> str:
    took = event.get("duration_s")
    timing = f"{took:.2f}s" if isinstance(took, int | float) else ""
    attempts = event.get("attempts") or 0
    tries = f", {attempts} attempts" if attempts > 1 else ""
    if event["status"] == "succeeded":
        return f"{timing}{tries}"
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
    help="Where teammates run (default: [run] backend, else auto); shell tasks ignore it.",
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
    "--output-format",
    type=click.Choice(["text", "stream-json"]),
    default="text",
    show_default=True,
    help="text: progress for people; stream-json: one JSON event per line.",
)
@common_options
def run(
    spec_path: str,
    jobs: int | None,
    backend: str | None,
    halt: str | None,
    junit: str | None,
    report: str | None,
    joblog: str | None,
    resume: bool,
    output_format: str,
) -> None:
    """Run the tasks of SPEC (a TOML file) to a verdict.

    Dependencies gate starts, a failed task skips its dependents, and the exit code is 0 when
    every task succeeded, 1 when any failed or was skipped, 2 for a bad spec, 130 when
    interrupted (nothing is left running). The team is --team, else [run] team, else the
    spec's file name.
    """
    from shoal.orchestrator.batch import RunOptions, run_batch
    from shoal.orchestrator.batch.parse import parse_spec
    from shoal.orchestrator.batch.spec import parse_halt

    env = get_env(click.get_current_context())
    try:
        policy = parse_halt(halt) if halt is not None else None
    except ValueError as exc:
        raise UsageError(f"--halt: {exc}") from None
    spec = parse_spec(spec_path)
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
    )
    # Output that nobody reads any more (a closed pipe) is dropped; the run goes on.
    err = Droppable(sys.stderr)
    sink: StreamJson | TextProgress
    if output_format == "stream-json":
        sink = StreamJson(Droppable(sys.stdout.buffer), err)
    else:
        out = Droppable(sys.stdout)
        sink = TextProgress(out, err, live=out.isatty())
    outcome = run_batch(spec, env.layout, options, sink)
    sink.close()
    sys.exit(outcome.exit_code)
