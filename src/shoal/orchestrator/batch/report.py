"""What a batch run leaves behind: the JSON report, JUnit XML, GNU parallel's joblog, and the
run record that `--resume` reads.

Everything here works on the report dictionary (`BatchRun.report()`), so it needs no live run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

import orjson

from shoal.core.errors import UsageError
from shoal.core.jsonio import append_line, atomic_write, read_bytes_nofollow
from shoal.core.output import tail_lines
from shoal.core.paths import FILE_MODE, Layout
from shoal.orchestrator.batch.junit import (
    OUTPUT_TAGS,
    RESULT_TAGS,
    JunitProblem,
    has_failures,
    read_cases,
)
from shoal.orchestrator.batch.junit import counts as junit_counts
from shoal.orchestrator.batch.spec import Spec

REPORT_VERSION: Final = 1
JOBLOG_HEADER: Final = "Seq\tHost\tStarttime\tJobRuntime\tSend\tReceive\tExitval\tSignal\tCommand\n"
TAIL_LINES: Final = 50
TAIL_BYTES: Final = 8192
# XML 1.0 allows neither these control characters nor unpaired surrogates.
_XML_ILLEGAL: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC with milliseconds (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- JSON report


def write_json(path: Path, report: Mapping[str, Any]) -> None:
    """Write the report as indented JSON, atomically (readers see the old or the new one)."""
    data = orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    _write_user_file(path, data)


def _write_user_file(path: Path, data: bytes) -> None:
    """Atomic write of a file the user named (its directory must exist)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    atomic_write(path, data)


# --------------------------------------------------------------------------- JUnit XML


def output_tail(path: str | None, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last lines of a task's output, safe to put in XML ("" when there is none)."""
    if not path:
        return ""
    try:
        text = "\n".join(tail_lines(path, n=lines, max_bytes=max_bytes))
    except OSError:
        return ""
    return _XML_ILLEGAL.sub("\ufffd", text)


def _clean(text: object) -> str:
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def junit_xml(report: Mapping[str, Any]) -> bytes:
    """JUnit XML of a run report, valid against the Jenkins xunit plugin's junit-10.xsd.

    One `<testsuite>` named after the team holds a testcase per task: failed and timed-out
    tasks carry a <failure> with the output tail, killed ones an <error>, skipped ones
    <skipped>. A task with a `junit` file has a `<testsuite>` of its own instead, holding the
    file's testcases (see `_junit_suite`). Every count is that of the testcases written.
    """
    tasks: list[Mapping[str, Any]] = report.get("tasks", [])
    team = str(report.get("team", "shoal"))
    total_time = _seconds(report.get("duration_s"))
    root = ET.Element(
        "testsuites",
        name=f"shoal run {Path(report.get('spec') or 'spec').name}",
        tests="0",
        failures="0",
        errors="0",
        time=total_time,
    )
    main = _suite(root, team, total_time, report.get("started_at"))
    props = ET.SubElement(main, "properties")
    for key in ("spec", "team", "session_id", "run_id", "jobs", "backend", "halt", "status"):
        ET.SubElement(props, "property", name=key, value=_clean(report.get(key, "")))
    classname = f"shoal.{report.get('team', 'run')}"
    for task in tasks:
        if task.get("junit"):
            _junit_suite(root, task, classname)
        else:
            _task_case(main, task, classname)
    totals = [0, 0, 0]
    for suite in root:
        tests, failures, errors, skipped = junit_counts(suite.iter("testcase"))
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
        totals = [totals[0] + tests, totals[1] + failures, totals[2] + errors]
    root.set("tests", str(totals[0]))
    root.set("failures", str(totals[1]))
    root.set("errors", str(totals[2]))
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def _seconds(value: object) -> str:
    """A time attribute as the schema's SUREFIRE_TIME wants it: digits, a point, digits."""
    return f"{value if isinstance(value, int | float) and value > 0 else 0.0:.3f}"


def _suite(root: ET.Element, name: str, time: str, started_at: object) -> ET.Element:
    """An empty `<testsuite>` (its counts are set once its testcases are in)."""
    return ET.SubElement(
        root,
        "testsuite",
        name=_clean(name),
        tests="0",
        failures="0",
        errors="0",
        skipped="0",
        time=time,
        timestamp=str(started_at or "").rstrip("Z"),
        hostname=socket.gethostname(),
    )


def _task_case(
    parent: ET.Element, task: Mapping[str, Any], classname: str, *, problem: str | None = None
) -> None:
    """The testcase of one task: its verdict, and the output tail when it did not succeed.
    With `problem` (its JUnit report could not be used), an <error> saying so."""
    case = ET.SubElement(
        parent,
        "testcase",
        name=_clean(task["id"]),
        classname=classname,
        time=_seconds(task.get("duration_s")),
    )
    status = task.get("status")
    tail = output_tail(task.get("output_file")) if status != "succeeded" else ""
    if problem is not None:
        reason = task.get("reason")
        if status != "succeeded" and reason and reason != problem:
            problem += f" (the task {str(status).replace('_', ' ')}: {reason})"
        error = ET.SubElement(case, "error", message=_clean(problem), type="junit_report")
        tail = tail or output_tail(task.get("output_file"))
        error.text = tail
    elif status == "failed":
        code = task.get("exit_code")
        message = f"exit code {code}" if code is not None else (task.get("reason") or "failed")
        if (task.get("attempts") or 0) > 1:
            message += f" (after {task['attempts']} attempts)"
        failure = ET.SubElement(case, "failure", message=_clean(message), type="failed")
        failure.text = tail
    elif status == "timed_out":
        failure = ET.SubElement(
            case, "failure", message=_clean(task.get("reason") or "timed out"), type="timed_out"
        )
        failure.text = tail
    elif status == "killed":
        error = ET.SubElement(
            case, "error", message=_clean(task.get("reason") or "killed"), type="killed"
        )
        error.text = tail
    elif status == "skipped":
        ET.SubElement(case, "skipped", message=_clean(task.get("reason") or "skipped"))
    elif status == "succeeded":
        # Passed on a retry: each attempt that did not, as Surefire shows a flaky test.
        for attempt in (task.get("attempt_log") or [])[:-1]:
            if attempt.get("status") not in ("failed", "timed_out"):
                continue
            why = attempt.get("error") or (
                f"exit code {attempt.get('exit_code')}" if attempt.get("exit_code") else "failed"
            )
            ET.SubElement(
                case,
                "flakyFailure",
                type=str(attempt.get("status")),
                message=_clean(f"attempt {attempt.get('attempt')}: {why}"),
            )
    elif status != "succeeded":
        # A run record written mid-run (pending or running tasks) is not a verdict.
        ET.SubElement(case, "skipped", message=f"not finished ({status})")
    if tail:
        ET.SubElement(case, "system-out").text = tail


def _junit_suite(root: ET.Element, task: Mapping[str, Any], classname: str) -> None:
    """The `<testsuite>` of a task with a `junit` file, named after the task: the file's
    testcases, plus the task's own testcase when they do not tell its verdict (it timed out
    or failed with no failing testcase). A task that never ran has only its own testcase; a
    report that cannot be used is one <error> testcase naming the file and the problem."""
    suite = _suite(root, str(task["id"]), _seconds(task.get("duration_s")), task.get("started_at"))
    props = ET.SubElement(suite, "properties")
    for key in ("id", "command", "status", "junit"):
        ET.SubElement(props, "property", name=f"task.{key}", value=_clean(task.get(key) or ""))
    status = task.get("status")
    if status not in ("succeeded", "failed", "timed_out", "killed"):
        _task_case(suite, task, classname)  # never ran: no report to read
        return
    problem = task.get("junit_error")
    cases: list[ET.Element] = []
    if problem is None:
        try:
            cases = read_cases(str(task["junit"]))
        except JunitProblem as exc:
            problem = str(exc)
    if problem is not None:
        if status in ("timed_out", "killed"):
            # Stopped before it could write its report: the stop is the verdict to show
            # (a <failure type="timed_out">, as for a task without a report), not the report.
            _task_case(suite, task, classname)
        else:
            _task_case(suite, task, classname, problem=problem)
        return
    suite.extend(cases)
    _mark_reruns(cases, task)
    if status != "succeeded" and not has_failures(cases):
        _task_case(suite, task, classname)


def _mark_reruns(cases: list[ET.Element], task: Mapping[str, Any]) -> None:
    """Surefire's rerun elements from the task's earlier attempts: a testcase that failed in
    one and passed in the last gets a <flakyFailure> (or <flakyError>) per failed run, one
    that failed every time a <rerunFailure> (or <rerunError>) per earlier run. Jenkins and
    GitLab show a flaky test so, instead of the last attempt's report hiding it."""
    earlier: dict[tuple[str, str], list[Mapping[str, str]]] = {}
    for attempt in (task.get("attempt_log") or [])[:-1]:
        for failure in attempt.get("junit_failures") or []:
            key = (failure.get("classname", ""), failure.get("name", ""))
            earlier.setdefault(key, []).append(failure)
    if not earlier:
        return
    for case in cases:
        found = earlier.get((case.get("classname") or "", case.get("name") or ""))
        if not found:
            continue
        passed = not any(child.tag in RESULT_TAGS for child in case)
        for failure in found:
            kind = "Error" if failure.get("kind") == "error" else "Failure"
            rerun = ET.Element(
                f"{'flaky' if passed else 'rerun'}{kind}",
                type=_clean(failure.get("type") or kind.lower()),
                message=_clean(failure.get("message") or ""),
            )
            ET.SubElement(rerun, "stackTrace").text = _clean(failure.get("trace") or "")
            # (before the case's output: Surefire's order, which readers expect)
            outputs = [i for i, child in enumerate(case) if child.tag in OUTPUT_TAGS]
            case.insert(outputs[0] if outputs else len(case), rerun)


def write_junit(path: Path, report: Mapping[str, Any]) -> None:
    """Write the JUnit XML of `report` to `path`, atomically."""
    _write_user_file(path, junit_xml(report))


# --------------------------------------------------------------------------- joblog


class JoblogWriter:
    """GNU parallel's `--joblog` format, one line per finished attempt, written as they end.

    Columns: Seq (the task's position in the spec), Host (`:` = local), Starttime (epoch),
    JobRuntime (s), Send, Receive (0), Exitval, Signal (for a killed task: 15 when its exit code
    says TERM, else 9), Command (tabs and newlines as spaces, so one attempt stays one line).
    """

    def __init__(self, path: Path, *, append: bool = False) -> None:
        self.path = path
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise UsageError(f"cannot write joblog {path}: directory {parent} does not exist")
        fresh = not append or not path.exists() or path.stat().st_size == 0
        self.logged: set[tuple[int, str]] = set() if fresh else _logged(path)
        """(Seq, Starttime) of the lines already there: an attempt is logged once."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if fresh else os.O_APPEND)
        self._fh: IO[str] = os.fdopen(os.open(path, flags, FILE_MODE), "a", buffering=1)
        if fresh:
            self._fh.write(JOBLOG_HEADER)

    def write(
        self,
        *,
        seq: int,
        started_at: float | None,
        ended_at: float | None,
        exit_code: int | None,
        killed: bool,
        command: str,
        host: str | None = None,
    ) -> None:
        """Append one finished attempt (`host`: where it ran, `:` for here)."""
        start = started_at or ended_at or 0.0
        runtime = max(0.0, (ended_at or start) - start)
        signal = 0
        if killed:
            signal = exit_code - 128 if exit_code is not None and 128 < exit_code < 160 else 9
        exitval = -1 if exit_code is None else exit_code
        flat = re.sub(r"[\t\r\n]+", " ", command)
        key = (seq, f"{start:.3f}")
        if key in self.logged:
            return
        self.logged.add(key)
        self._fh.write(
            f"{seq}\t{host or ':'}\t{start:10.3f}\t{runtime:10.3f}\t0\t0\t{exitval}\t{signal}"
            f"\t{flat}\n"
        )

    def close(self) -> None:
        """Flush and close the file."""
        with contextlib.suppress(OSError):
            self._fh.close()


def _logged(path: Path) -> set[tuple[int, str]]:
    """(Seq, Starttime) of every line of an existing joblog (unreadable lines are skipped)."""
    out: set[tuple[int, str]] = set()
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in path.read_text().splitlines()[1:]:
            cols = line.split("\t")
            with contextlib.suppress(ValueError, IndexError):
                out.add((int(cols[0]), f"{float(cols[2]):.3f}"))
    return out


def read_joblog(path: Path) -> list[dict[str, str]]:
    """The rows of a joblog as dicts keyed by its header (for tests and tools)."""
    lines = path.read_text().splitlines()
    if not lines:
        return []
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t", len(header) - 1), strict=True)) for line in lines[1:]]


# --------------------------------------------------------------------------- run records


class RunRecords:
    """The last run of each (team, spec) pair: `runs/{team}/{spec-key}.json` under SHOAL_HOME.

    The key is a hash of the spec's absolute path, so the same spec file run for the same team
    finds its previous run, and a spec of the same name elsewhere does not.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        # (worked out once per spec: a run journals a verdict many times a second, and the
        # spec's real path costs a lookup per component of it)
        self._paths: dict[tuple[str, Path], Path] = {}

    def path(self, team: str, spec_path: Path) -> Path:
        """Where the record of `spec_path` run for `team` lives."""
        found = self._paths.get((team, spec_path))
        if found is None:
            key = hashlib.sha256(os.fsencode(os.path.realpath(spec_path))).hexdigest()[:16]
            found = self.layout.home / "runs" / team / f"{spec_path.stem[:40]}-{key}.json"
            self._paths[(team, spec_path)] = found
        return found

    def ends_path(self, team: str, spec_path: Path) -> Path:
        """The record's journal of verdicts given since it was last written (`.ends.jsonl`
        beside it): one line `{"run_id", "task"}` per task, so that a verdict is on disk at
        once without rewriting the whole record for each."""
        return self.path(team, spec_path).with_suffix(".ends.jsonl")

    def load(self, team: str, spec_path: Path) -> dict[str, Any] | None:
        """The previous run's record, or None when there is none or it is unreadable; the
        verdicts its journal holds for the same run replace the record's entries."""
        path = self.path(team, spec_path)
        try:
            data = orjson.loads(read_bytes_nofollow(path))
        except (FileNotFoundError, orjson.JSONDecodeError, OSError):
            return None
        if not isinstance(data, dict) or data.get("v") != REPORT_VERSION:
            return None
        ends = self._read_ends(self.ends_path(team, spec_path), data.get("run_id"))
        if ends and isinstance(data.get("tasks"), list):
            data["tasks"] = [
                ends.get(str(t.get("id")), t) if isinstance(t, dict) else t for t in data["tasks"]
            ]
        return data

    @staticmethod
    def _read_ends(path: Path, run_id: Any) -> dict[str, dict[str, Any]]:
        """Task id -> its last journaled entry of run `run_id` (a torn last line, written when
        the run died, is skipped)."""
        try:
            raw = read_bytes_nofollow(path)
        except OSError:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for line in raw.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                item = orjson.loads(line)
                task = item.get("task") if isinstance(item, dict) else None
                if isinstance(task, dict) and "id" in task and item.get("run_id") == run_id:
                    out[str(task["id"])] = task
        return out

    def save(self, team: str, spec_path: Path, report: Mapping[str, Any]) -> Path:
        """Replace the record atomically (its journal is then void); returns its path."""
        path = self.path(team, spec_path)
        self.layout.ensure(path.parent)
        atomic_write(path, orjson.dumps(report))
        # (a crash before the unlink leaves lines the record already has: reading them again
        # changes nothing)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ends_path(team, spec_path))
        return path

    def note_ends(
        self, team: str, spec_path: Path, run_id: str, tasks: list[Mapping[str, Any]]
    ) -> None:
        """Append the verdicts `tasks` (report entries) of run `run_id` to the record's
        journal: a verdict is on disk at once, whatever the size of the record."""
        path = self.ends_path(team, spec_path)
        lines = b"".join(
            orjson.dumps({"run_id": run_id, "task": t}, option=orjson.OPT_APPEND_NEWLINE)
            for t in tasks
        )
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, FILE_MODE)
        except FileNotFoundError:  # (no record written yet: its directory is made first)
            self.layout.ensure(path.parent)
            fd = os.open(path, flags, FILE_MODE)
        try:
            append_line(fd, lines, path)
        finally:
            os.close(fd)


class RecordSaver:
    """Keeps one run's record on disk as the run goes on: rewritten whole at most every
    `interval` seconds, and each verdict given in between journaled at once (one short line
    instead of the whole record per task, which made a long run's saves quadratic)."""

    def __init__(
        self, records: RunRecords, key: str, spec_path: Path, run_id: str, interval: float
    ) -> None:
        self.records, self.key, self.spec_path = records, key, spec_path
        self.run_id, self.interval = run_id, interval
        self.version = -1
        self.saved_at = 0.0
        self.journaled = 0
        """How many of the run's verdicts (`settled`) are on disk."""

    def sync(
        self,
        version: int,
        settled: list[str],
        report: Callable[[], dict[str, Any]],
        entry: Callable[[str], Mapping[str, Any]],
        *,
        ended: bool = False,
        full: bool = False,
    ) -> bool:
        """Save what changed since the last call: the whole `report()` when `full` or when
        `interval` has passed, else (when an attempt `ended`) the new verdicts' `entry(id)`s.
        True when something was written."""
        now = time.monotonic()
        if version == self.version and not full:
            return False
        if full or now - self.saved_at >= self.interval:
            self.records.save(self.key, self.spec_path, report())
            self.version, self.saved_at, self.journaled = version, now, len(settled)
            return True
        if not ended or self.journaled == len(settled):
            return False
        fresh = settled[self.journaled :]
        self.records.note_ends(self.key, self.spec_path, self.run_id, [entry(i) for i in fresh])
        self.journaled = len(settled)
        return True


def plan_resume(
    spec: Spec, previous: Mapping[str, Any], why: dict[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """The tasks a `--resume` need not run again, with their previous records.

    A task is carried over when it succeeded in the previous run, what it does is unchanged
    (same fingerprint), its JUnit report (if it names one) is still there and readable, and
    every task it depends on is carried over too; everything else — and everything that
    depends on it — runs again. `why`, when given, receives the reason of each succeeded
    task that is run again because its report is gone (a green verdict on tests nobody can
    see again would be false).
    """
    before: dict[str, dict[str, Any]] = {
        t["id"]: t for t in previous.get("tasks", []) if isinstance(t, dict) and "id" in t
    }
    keep: set[str] = set()
    for task in spec.topological():
        old = before.get(task.id)
        if (
            old is None
            or old.get("status") != "succeeded"
            or old.get("fingerprint") != task.fingerprint
            or not all(dep in keep for dep in task.after)
        ):
            continue
        if task.junit is not None:
            try:
                read_cases(task.junit)
            except JunitProblem as exc:
                if why is not None:
                    gone = not os.path.lexists(task.junit)
                    why[task.id] = f"its JUnit report {task.junit} is gone" if gone else str(exc)
                continue
        keep.add(task.id)
    return {t.id: before[t.id] for t in spec.tasks if t.id in keep}
