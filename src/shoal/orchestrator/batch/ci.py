"""What `shoal run` gives a CI system beside its exit code: the end-of-run table (stdout and
GitHub's step summary), GitHub's `::error` annotations from JUnit failures, and the folding
markers of GitHub (`::group::`) and GitLab (`section_start`).

Everything here works on the run's report (and the JUnit files its tasks wrote), so it needs
no live run; the CLI decides where the lines go.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from shoal.orchestrator.batch.junit import MAX_REPORT_BYTES, JunitProblem, counts, read_cases

CiKind = Literal["github", "gitlab", "none"]
ANNOTATION_CHOICES: Final = ("auto", "github", "gitlab", "none")
# GitHub shows at most 10 error annotations a step; a few more are printed for the log.
MAX_ANNOTATIONS: Final = 50
# Rows of the table on stdout before the succeeded tasks without tests are left out.
MAX_TABLE_ROWS: Final = 50
# A traceback's last `path.py:LINE:` names where a Python test failed (pytest's default
# JUnit flavour has no file or line attributes).
_LOCATION: Final = re.compile(r"^([^\s:][^:\n]*\.py):(\d+):", re.MULTILINE)


def detect(choice: str, environ: Mapping[str, str] | None = None) -> CiKind:
    """Which CI's markers to print: `--annotations` as given, or for `auto` the CI the
    environment says it runs in (GITHUB_ACTIONS=true, GITLAB_CI=true), else none."""
    env = os.environ if environ is None else environ
    if choice in ("github", "gitlab", "none"):
        return choice  # type: ignore[return-value]
    if env.get("GITHUB_ACTIONS") == "true":
        return "github"
    if env.get("GITLAB_CI") == "true":
        return "gitlab"
    return "none"


# --------------------------------------------------------------------------- summary table


@dataclass(frozen=True)
class Row:
    """One task in the end-of-run table; the test counts come from its JUnit report."""

    task: str
    status: str
    attempts: int
    duration_s: float | None
    passed: int | None = None
    failed: int | None = None
    skipped: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON object (the `summary` of the run's result event)."""
        return {
            "task": self.task,
            "status": self.status,
            "attempts": self.attempts,
            "duration_s": self.duration_s,
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
        }


def summary_rows(report: Mapping[str, Any]) -> list[Row]:
    """A row per task of the report, in the spec's order."""
    rows: list[Row] = []
    for task in report.get("tasks", []):
        passed = failed = skipped = None
        if task.get("junit") and task.get("status") in ("succeeded", "failed", "timed_out"):
            try:
                tests, failures, errors, skips = counts(read_cases(str(task["junit"])))
            except JunitProblem:
                pass
            else:
                failed, skipped = failures + errors, skips
                passed = tests - failed - skipped
        status = str(task.get("status"))
        if status == "succeeded" and (task.get("attempts") or 0) > 1 and not task.get("resumed"):
            status = "flaky"
        duration = task.get("duration_s")
        rows.append(
            Row(
                task=str(task["id"]),
                status=status,
                attempts=int(task.get("attempts") or 0),
                duration_s=float(duration) if isinstance(duration, int | float) else None,
                passed=passed,
                failed=failed,
                skipped=skipped,
            )
        )
    return rows


def _cells(row: Row) -> list[str]:
    took = f"{row.duration_s:.1f} s" if row.duration_s is not None else "-"

    def n(value: int | None) -> str:
        return "-" if value is None else str(value)

    return [
        row.task,
        row.status.replace("_", " "),
        str(row.attempts),
        took,
        n(row.passed),
        n(row.failed),
        n(row.skipped),
    ]


HEADER: Final = ("task", "status", "attempts", "duration", "passed", "failed", "skipped")


def text_table(rows: Sequence[Row], limit: int = MAX_TABLE_ROWS) -> list[str]:
    """The table as plain lines for a log: columns padded, numbers right-aligned. Past
    `limit` rows, succeeded tasks without tests are left out and counted."""
    shown = list(rows)
    left_out = 0
    if len(shown) > limit:
        keep = [r for r in shown if r.status != "succeeded" or r.passed is not None]
        left_out = len(shown) - len(keep)
        shown = keep
    table = [list(HEADER), *(_cells(r) for r in shown)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = []
    for line in table:
        cells = [
            cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(line)
        ]
        lines.append("  ".join(cells).rstrip())
    if left_out:
        lines.append(f"(and {left_out} more task(s) that succeeded, without tests)")
    return lines


_STATUS_MARK: Final = {
    "succeeded": "✅",
    "flaky": "⚠️",
    "failed": "❌",
    "timed_out": "⏱️",
    "killed": "🛑",
    "skipped": "⏭️",
}


def _md(text: str) -> str:
    """A table cell's text: pipes escaped, one line."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_summary(report: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """The run as GitHub's step summary shows it: a heading with the verdict and a table."""
    c = report.get("counts") or {}
    spec = os.path.basename(str(report.get("spec") or "spec"))
    verdict = report.get("status")
    lines = [
        f"### shoal run {_md(spec)}: {verdict} (exit {report.get('exit_code')})",
        "",
        ", ".join(
            f"{c[k]} {k.replace('_', ' ')}"
            for k in ("succeeded", "flaky", "failed", "timed_out", "killed", "skipped")
            if c.get(k)
        )
        + f" of {c.get('total', len(rows))} task(s)",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = _cells(row)
        mark = _STATUS_MARK.get(row.status, "")
        cells[1] = f"{mark} {cells[1]}".strip()
        lines.append("| " + " | ".join(_md(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n\n"


# --------------------------------------------------------------------------- annotations


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_command(command: str, message: str, **properties: str | int | None) -> str:
    """One GitHub workflow command line, `::error file=F,line=N,title=T::message`, escaped
    as the runner wants it."""
    props = ",".join(
        f"{key}={_escape_property(str(value))}"
        for key, value in properties.items()
        if value not in (None, "")
    )
    return f"::{command}{' ' + props if props else ''}::{_escape_data(message)}"


def _raw_failures(path: str) -> list[tuple[ET.Element, ET.Element]]:
    """(testcase, failure-or-error) pairs of a JUnit file as written (file and line kept)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_REPORT_BYTES + 1)
        if len(data) > MAX_REPORT_BYTES:
            return []
        root = ET.fromstring(data)
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        bad = next((c for c in case if c.tag in ("failure", "error")), None)
        if bad is not None:
            out.append((case, bad))
    return out


def _location(
    case: ET.Element, failure: ET.Element, task_cwd: str, base: str
) -> tuple[str | None, int | None]:
    """Where a testcase failed, relative to `base` (the repository's root, where GitHub
    looks files up): the testcase's own file/line when it has them, else the last
    `path.py:N:` of the trace; a relative path is the task's, from its cwd."""
    file, line = case.get("file"), case.get("line")
    if file is None:
        found = _LOCATION.findall("".join(failure.itertext()))
        if found:
            file, line = found[-1]
    if file is None:
        return None, None
    full = os.path.normpath(os.path.join(task_cwd, file))
    rel = os.path.relpath(full, base)
    file = rel if not rel.startswith("..") else full
    try:
        number = int(line) if line is not None else None
    except ValueError:
        number = None
    return file, number


def github_annotations(
    report: Mapping[str, Any], cwds: Mapping[str, str], base: str | None = None
) -> list[str]:
    """GitHub `::error` lines for the run: one per failing testcase of the tasks' JUnit
    reports (with file and line where they can be told; `cwds`: each task's working
    directory, `base`: the repository root, $GITHUB_WORKSPACE else the current directory),
    one per failed task with no failing testcase to show; at most MAX_ANNOTATIONS."""
    root = base or os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
    lines: list[str] = []
    for task in report.get("tasks", []):
        status = task.get("status")
        if status in ("succeeded", "skipped"):
            continue
        shown = 0
        if task.get("junit"):
            for case, failure in _raw_failures(str(task["junit"])):
                file, line = _location(case, failure, cwds.get(str(task["id"]), root), root)
                name = ".".join(p for p in (case.get("classname"), case.get("name")) if p)
                message = failure.get("message") or "".join(failure.itertext()).strip()
                lines.append(
                    github_command(
                        "error",
                        message.strip() or failure.tag,
                        file=file,
                        line=line,
                        title=f"{task['id']}: {name}",
                    )
                )
                shown += 1
        if not shown:
            reason = task.get("reason") or str(status).replace("_", " ")
            lines.append(
                github_command("error", str(reason), title=f"shoal run: task {task['id']}")
            )
    if len(lines) > MAX_ANNOTATIONS:
        more = len(lines) - MAX_ANNOTATIONS
        lines = lines[:MAX_ANNOTATIONS]
        lines.append(github_command("warning", f"{more} more failure(s): see the JUnit report"))
    return lines


# --------------------------------------------------------------------------- folding


_SECTION_NAME: Final = re.compile(r"[^A-Za-z0-9_.-]+")


def fold_start(kind: CiKind, name: str, header: str, now: float) -> str | None:
    """The line that opens a folded section of a task's output (None: no folding here)."""
    if kind == "github":
        return f"::group::{header}"
    if kind == "gitlab":
        key = _SECTION_NAME.sub("_", name).strip("_") or "task"
        return f"\x1b[0Ksection_start:{int(now)}:{key}[collapsed=true]\r\x1b[0K{header}"
    return None


def fold_end(kind: CiKind, name: str, now: float) -> str | None:
    """The line that closes the section `fold_start` opened."""
    if kind == "github":
        return "::endgroup::"
    if kind == "gitlab":
        key = _SECTION_NAME.sub("_", name).strip("_") or "task"
        return f"\x1b[0Ksection_end:{int(now)}:{key}\r\x1b[0K"
    return None
