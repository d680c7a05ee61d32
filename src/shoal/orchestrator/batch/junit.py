"""A task's own JUnit XML report (`junit = "..."` in a spec): checked when the task ends, and
its testcases made fit to merge into the run's JUnit report.

The run's report follows the Jenkins xunit plugin's `junit-10.xsd`, so what is merged is cut
to what that schema allows: a testcase keeps `name`, `classname`, `time` and `group`, and the
children `failure`, `error`, `skipped` (`type`, `message` and text), the rerun and flaky
elements, `system-out` and `system-err`; everything else (pytest's `file` and `line`,
per-case `properties`) is left out.
"""

from __future__ import annotations

import os
import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

# A task's report larger than this is refused rather than read into memory.
MAX_REPORT_BYTES: Final = 64 * 1024 * 1024
CASE_ATTRIBUTES: Final = ("name", "classname", "time", "group")
RESULT_TAGS: Final = ("failure", "error", "skipped")
RERUN_TAGS: Final = ("rerunFailure", "rerunError", "flakyFailure", "flakyError")
OUTPUT_TAGS: Final = ("system-out", "system-err")
RERUN_CHILDREN: Final = ("stackTrace", "system-out", "system-err")
# What is kept of an attempt's failing testcases for the merged report's flaky and rerun
# elements (they are kept in the run record: bounded).
MAX_KEPT_FAILURES: Final = 200
MAX_KEPT_TRACE: Final = 4000


class JunitProblem(Exception):
    """A task's JUnit report that is missing, stale, unreadable or not JUnit XML; the message
    names the file and what is wrong."""


@dataclass(frozen=True)
class FileStamp:
    """What identifies one version of a file: a file rewritten since has another stamp."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def stamp(path: str) -> FileStamp | None:
    """The file's stamp now, None when there is no file there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return FileStamp(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def check_written(path: str, before: FileStamp | None) -> str | None:
    """Why the report a task just wrote at `path` cannot be used (None: it can). `before` is
    the file's stamp from before the attempt started: a file that has not changed since is
    a previous run's, not this attempt's."""
    if before is not None and stamp(path) == before:
        return (
            f"JUnit report {path} was not written by this attempt "
            "(it is unchanged since before the attempt started)"
        )
    try:
        read_cases(path)
    except JunitProblem as exc:
        return str(exc)
    return None


def read_cases(path: str) -> list[ET.Element]:
    """The testcases of the JUnit XML file at `path`, cut to the schema (see the module
    docstring), in file order; JunitProblem when the file cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise JunitProblem(f"no JUnit report at {path}: the task did not write it") from None
    except OSError as exc:
        raise JunitProblem(f"cannot read JUnit report {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise JunitProblem(f"JUnit report {path} is not a regular file")
        if info.st_size > MAX_REPORT_BYTES:
            raise JunitProblem(
                f"JUnit report {path} has {info.st_size} bytes; at most {MAX_REPORT_BYTES}"
            )
        data = fh.read(MAX_REPORT_BYTES + 1)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise JunitProblem(f"JUnit report {path} is not valid XML: {exc}") from None
    if _tag(root) not in ("testsuites", "testsuite"):
        raise JunitProblem(
            f"JUnit report {path} is not JUnit XML: its root element is <{_tag(root)}>, "
            "not <testsuites> or <testsuite>"
        )
    return [_case(element) for element in root.iter() if _tag(element) == "testcase"]


def counts(cases: Iterable[ET.Element]) -> tuple[int, int, int, int]:
    """(tests, failures, errors, skipped) of a suite's testcases: a case with a failure (or an
    error) counts as one; skipped counts the cases that have nothing worse."""
    tests = failures = errors = skipped = 0
    for case in cases:
        tests += 1
        tags = {child.tag for child in case}
        failures += "failure" in tags
        errors += "error" in tags
        skipped += "skipped" in tags and not tags & {"failure", "error"}
    return tests, failures, errors, skipped


def has_failures(cases: Sequence[ET.Element]) -> bool:
    """True when a testcase failed or had an error."""
    _, failures, errors, _ = counts(cases)
    return failures + errors > 0


def _tag(element: ET.Element) -> str:
    """The element's name without its namespace."""
    return str(element.tag).rpartition("}")[2]


def _text(element: ET.Element) -> str:
    return "".join(element.itertext())


def _case(source: ET.Element) -> ET.Element:
    case = ET.Element("testcase")
    case.set("name", source.get("name") or "(unnamed)")
    for key in CASE_ATTRIBUTES[1:]:
        value = source.get(key)
        if value is not None:
            case.set(key, value)
    for child in source:
        tag = _tag(child)
        if tag in RESULT_TAGS:
            out = ET.SubElement(case, tag)
            for key in ("type", "message"):
                if (value := child.get(key)) is not None:
                    out.set(key, value)
            out.text = _text(child) or None
        elif tag in RERUN_TAGS:
            out = ET.SubElement(case, tag, type=child.get("type") or tag)
            if (message := child.get("message")) is not None:
                out.set("message", message)
            out.text = child.text
            parts = {_tag(part): part for part in child}
            for name in RERUN_CHILDREN:  # (the schema wants them in this order)
                if name in parts:
                    ET.SubElement(out, name).text = _text(parts[name])
        elif tag in OUTPUT_TAGS:
            ET.SubElement(case, tag).text = _text(child)
    return case


def failed_cases(path: str) -> list[dict[str, str]]:
    """The failing testcases of a report (at most MAX_KEPT_FAILURES, traces cut to
    MAX_KEPT_TRACE): classname, name, kind (failure or error), type, message, trace. An
    attempt that is retried keeps these, so the merged report can show a test that failed
    before it passed ([]: the report cannot be read)."""
    try:
        cases = read_cases(path)
    except JunitProblem:
        return []
    out: list[dict[str, str]] = []
    for case in cases:
        bad = next((c for c in case if c.tag in ("failure", "error")), None)
        if bad is None:
            continue
        out.append(
            {
                "classname": case.get("classname") or "",
                "name": case.get("name") or "",
                "kind": bad.tag,
                "type": bad.get("type") or bad.tag,
                "message": bad.get("message") or "",
                "trace": (bad.text or "")[-MAX_KEPT_TRACE:],
            }
        )
        if len(out) >= MAX_KEPT_FAILURES:
            break
    return out
