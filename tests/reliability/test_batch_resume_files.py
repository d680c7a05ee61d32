"""What a `--resume` leaves behind tells the truth: after kill -9 of the run, the joblog has a
line for every attempt (also those that ended while no leader watched them), and a task whose
JUnit report is gone since it succeeded is run again, never carried over green."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil

from shoal.orchestrator.batch.report import read_joblog
from tests.conftest import Cli
from tests.polling import wait_until

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}


def alive(marker: str) -> bool:
    """Whether a process whose command line names `marker` still runs."""
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and proc.info["status"] != "zombie":
                return True
        except psutil.Error:
            continue
    return False


def test_joblog_has_every_attempt_after_kill9_and_resume(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    # `a` runs until the test opens its gate; `b` waits for `a`. The run is killed -9 while
    # `a` runs, `a` then ends with no leader to see it, and the resume runs only `b`.
    spec = tmp_path / "spec.toml"
    spec.write_text(
        textwrap.dedent(f"""
        [run]
        jobs = 2

        [[task]]
        id = "a"
        run = "touch {tmp_path}/a.started; while [ ! -e {tmp_path}/go ]; do sleep 0.02; done"

        [[task]]
        id = "b"
        run = "true"
        after = ["a"]
        """)
    )
    joblog = tmp_path / "joblog.tsv"
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST}
    run = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec), "--joblog", str(joblog)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until((tmp_path / "a.started").exists, timeout=60, what="a to start")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(10)
    (tmp_path / "go").touch()
    wait_until(lambda: not alive(f"{tmp_path}/go"), timeout=30, what="a to end unwatched")

    again = cli("run", str(spec), "--resume", "--joblog", str(joblog), env=FAST)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = read_joblog(joblog)
    assert sorted(r["Seq"] for r in rows) == ["1", "2"], rows
    assert {r["Seq"]: r["Exitval"] for r in rows} == {"1": "0", "2": "0"}
    # GNU parallel's --resume would now skip both: nothing is run a second time.
    third = cli("run", str(spec), "--resume", "--joblog", str(joblog), env=FAST)
    assert third.returncode == 0, third.stdout + third.stderr
    assert sorted(r["Seq"] for r in read_joblog(joblog)) == ["1", "2"]


JUNIT = """<?xml version="1.0"?>
<testsuite name="s" tests="2">
<testcase classname="m" name="one"/><testcase classname="m" name="two"/>
</testsuite>
"""


def test_resume_runs_again_a_task_whose_junit_report_is_gone(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    (tmp_path / "report.xml.src").write_text(JUNIT)
    runs = tmp_path / "runs.txt"
    spec = tmp_path / "spec.toml"
    spec.write_text(
        textwrap.dedent(f"""
        [[task]]
        id = "tests"
        run = "echo ran >> {runs}; cp {tmp_path}/report.xml.src {tmp_path}/report.xml"
        junit = "report.xml"
        """)
    )
    merged = tmp_path / "merged.xml"
    first = cli("run", str(spec), "--junit", str(merged), env=FAST)
    assert first.returncode == 0, first.stdout + first.stderr
    (tmp_path / "report.xml").unlink()  # e.g. a CI cache that did not keep it

    again = cli("run", str(spec), "--resume", "--junit", str(merged), env=FAST)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "task tests succeeded in run" in again.stdout + again.stderr
    assert "is gone: it runs again" in again.stdout + again.stderr
    assert runs.read_text().splitlines() == ["ran", "ran"]
    root = ET.parse(merged).getroot()
    suite = next(s for s in root.iter("testsuite") if s.get("name") == "tests")
    assert [c.get("name") for c in suite.iter("testcase")] == ["one", "two"]
    assert suite.get("errors") == "0" and suite.get("failures") == "0"
