"""`shoal run` output and checks end to end: a closed stdout, member scripts checked with the
spec, the backend chosen for members, and agent tasks' real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.orchestrator.batch import RunOptions, run_batch
from shoal.orchestrator.batch.parse import parse_spec
from shoal.orchestrator.batch.report import read_joblog
from shoal.orchestrator.liveness import leader_alive
from tests.conftest import Cli, group_gone
from tests.integration.test_run import FAST, attempt_pids, our_processes, report_of, write_spec

# Members are started by `auto`, whatever terminal the tests run in: not inside tmux/iTerm2.
PLAIN_TERMINAL = {"TMUX": "", "TERM_PROGRAM": "", "ITERM_SESSION_ID": ""}

SEQUENTIAL = """\
[run]
jobs = 1

[[task]]
id = "one"
run = "sleep 0.2; echo one"

[[task]]
id = "two"
run = "sleep 0.2; echo two"
after = "one"

[[task]]
id = "three"
run = "sleep 0.2; exit 4"
after = "two"

[[task]]
id = "four"
run = "touch @D/four"
after = "three"

[[task]]
id = "five"
run = "sleep 0.2; echo five"
"""


@pytest.mark.parametrize(
    ("output_format", "merge_stderr"),
    [("text", False), ("text", True), ("stream-json", False)],
)
def test_a_closed_stdout_loses_nothing(
    home: Path, tmp_path: Path, output_format: str, merge_stderr: bool
) -> None:
    spec = write_spec(tmp_path, SEQUENTIAL, name="bp.toml")
    report, junit = tmp_path / "bp.json", tmp_path / "bp.xml"
    args = ["--report", str(report), "--junit", str(junit), "--output-format", output_format]
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        env={**os.environ, "SHOAL_HOME": str(home), **FAST},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # as `| head -1` does: one line, then the pipe is closed
    proc.stdout.close()
    try:
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errors = proc.stderr.read().decode() if proc.stderr is not None else ""
    if proc.stderr is not None:
        proc.stderr.close()
    assert first
    assert code == 1, errors  # the run's verdict: "three" failed, "four" was skipped
    for bad in ("internal error", "Traceback", "Exception ignored", "BrokenPipe"):
        assert bad not in errors
    summary, tasks = report_of(report)
    assert summary["status"] == "failed" and summary["exit_code"] == 1
    assert {k: t["status"] for k, t in tasks.items()} == {
        "one": "succeeded",
        "two": "succeeded",
        "three": "failed",
        "four": "skipped",
        "five": "succeeded",
    }
    assert len(list(ET.parse(junit).getroot().iter("testcase"))) == 5
    (record,) = (home / "runs" / "run-bp").glob("*.json")
    saved = json.loads(record.read_text())
    assert saved["status"] == "failed" and saved["run_id"] == summary["run_id"]
    assert not leader_alive(Layout(home), "run-bp")
    for pid in attempt_pids(tasks):
        assert group_gone(pid)
    assert our_processes(tmp_path) == []


def test_a_sink_whose_output_is_gone_is_dropped_and_the_run_goes_on(
    home: Path, tmp_path: Path
) -> None:
    spec = parse_spec(write_spec(tmp_path, SEQUENTIAL))
    seen: list[dict[str, Any]] = []

    def sink(event: dict[str, Any]) -> None:
        if seen:
            raise BrokenPipeError(32, "Broken pipe")
        seen.append(event)

    outcome = run_batch(spec, Layout(home), RunOptions(report=tmp_path / "r.json"), sink)
    assert len(seen) == 1
    assert outcome.exit_code == 1 and outcome.report["status"] == "failed"
    assert json.loads(outcome.record_path.read_text())["status"] == "failed"
    assert report_of(tmp_path / "r.json")[0]["counts"]["skipped"] == 1


def test_a_bad_member_script_is_a_spec_error_before_anything_starts(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    (tmp_path / "bad.toml").write_text('[[step]\nrun = "true"\n')
    (tmp_path / "odd.steps").write_text("[[step]]\nrun = 'true'\nfrob = 1\n")
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 1

        [[member]]
        name = "rev"
        script = "bad.toml"

        [[member]]
        name = "odd"
        prompt = "checks"
        script = "odd.steps"

        [[task]]
        id = "a"
        prompt = "review"
        assign = "rev"
        after = "ghost"
        """,
    )
    joblog = tmp_path / "jobs.log"
    joblog.write_text("the last run's joblog\n")
    out = cli("run", str(spec), "--joblog", str(joblog), env=FAST)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == f"shoal: error: {spec}: 3 errors in the spec; nothing was started"
    assert lines[1] == (
        f'{spec}:6: member "rev": script {tmp_path}/bad.toml is not valid TOML: '
        "Expected ']]' at the end of an array declaration (at line 1, column 7)"
    )
    assert lines[2].startswith(
        f'{spec}:11: member "odd": script {tmp_path}/odd.steps: step 1 (run) has unknown key(s) '
        "frob"
    )
    assert lines[3].startswith(f'{spec}:17: task "a": after names unknown task "ghost"')
    assert joblog.read_text() == "the last run's joblog\n"  # not truncated
    assert os.listdir(home) == []  # no team, no session, no run record


def test_members_say_their_backend_and_agent_tasks_report_real_exit_codes(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    # The README's own example: a TOML script named `review.steps`.
    (tmp_path / "review.steps").write_text('[[step]]\nwhen = "task"\nrun = "echo reviewed"\n')
    spec = write_spec(
        tmp_path,
        """\
        [[member]]
        name = "reviewer"
        script = "review.steps"

        [[member]]
        name = "failer"
        agent = "exec"
        command = ["sh", "-c", "echo line1; echo oops; exit 7"]

        [[task]]
        id = "review"
        prompt = "Review it."
        assign = "reviewer"

        [[task]]
        id = "fail"
        prompt = "Fail."
        assign = "failer"
        """,
    )
    files = tmp_path / "r.json", tmp_path / "j.xml", tmp_path / "jobs.log"
    out = cli(
        "run",
        str(spec),
        "--report",
        str(files[0]),
        "--junit",
        str(files[1]),
        "--joblog",
        str(files[2]),
        env={**FAST, **PLAIN_TERMINAL},
    )
    assert out.returncode == 1, out.stderr
    chosen = [line for line in out.stderr.splitlines() if "members run as" in line]
    assert chosen == [
        "note: members run as process: not inside tmux or iTerm2: teammates run as background "
        "processes"
    ]
    summary, tasks = report_of(files[0])
    assert summary["backend"] == "process"
    assert tasks["review"]["status"] == "succeeded" and tasks["review"]["exit_code"] == 0
    fail = tasks["fail"]
    assert fail["status"] == "failed" and fail["exit_code"] == 7
    assert fail["attempt_log"][0]["exit_code"] == 7
    assert fail["reason"] == "sh exited with code 7: line1\noops"  # in full in the report
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("[") and " fail " in x]
    assert "FAILED" in line and "sh exited with code 7: line1 ⏎ oops (" in line
    # The failed agent task's output follows, framed, its header on one line.
    header = "--- fail: FAILED (sh exited with code 7: line1 ⏎ oops): last "
    assert any(x.startswith(header) for x in out.stdout.splitlines()), out.stdout
    cases = {c.get("name"): c for c in ET.parse(files[1]).getroot().iter("testcase")}
    failure = cases["fail"].find("failure")
    assert failure is not None and failure.get("message") == "exit code 7"
    props = {p.get("name"): p.get("value") for p in ET.parse(files[1]).getroot().iter("property")}
    assert props["backend"] == "process"
    exitvals = {r["Command"]: r["Exitval"] for r in read_joblog(files[2])}
    assert exitvals == {"[failer] Fail.": "7", "[reviewer] Review it.": "0"}


def test_an_explicit_backend_is_named_too(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        backend = "in-process"

        [[member]]
        name = "helper"

        [[task]]
        id = "hi"
        prompt = "say hi"
        assign = "helper"
        """,
    )
    out = cli("run", str(spec), "--output-format", "stream-json", env=FAST)
    assert out.returncode == 0, out.stderr
    assert "note: members run as in-process: set by [run] backend in the spec\n" in out.stderr
    events = [json.loads(x) for x in out.stdout.splitlines()]
    notes = [e for e in events if (e["type"], e.get("subtype")) == ("run", "note")]
    assert [(n["backend"], n["why"]) for n in notes] == [
        ("in-process", "set by [run] backend in the spec")
    ]


def test_a_retry_cancelled_by_a_halt_is_said_and_its_output_shown_once(
    home: Path, tmp_path: Path
) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 2

        [[task]]
        id = "flaky"
        run = "echo flaky-out; exit 1"
        retries = 2
        retry_delay = "60s"

        [[task]]
        id = "bad"
        run = "until [ -e @D/gate ]; do sleep 0.05; done; echo bad-out; exit 1"
        """,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal",
            "run",
            str(spec),
            "--output",
            "tag",
            "--halt",
            "now,fail=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(home), **FAST},
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not (lines and lines[-1].startswith("retry flaky: attempt 1 failed")):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        (tmp_path / "gate").touch()  # (bad fails only once flaky's retry waits)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 1, out + err
    assert out.count("flaky\tflaky-out\n") == 1, out
    (verdict,) = [line for line in out.splitlines() if "FAILED    flaky" in line]
    assert "its retry was cancelled by the halt" in verdict, verdict
