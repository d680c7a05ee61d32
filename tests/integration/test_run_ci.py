"""`shoal run` as a CI job sees it: reports that name a timeout as a timeout, an interrupt
message that counts what runs, progress numbers shown once, and artifacts the umask governs."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.test_run_junit_matrix import junit_schema
from tests.polling import wait_until

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}


def write_spec(directory: Path, text: str, name: str = "spec.toml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).replace("@D", str(directory)))
    return path


def popen(home: Path, *args: str, umask: int = -1) -> subprocess.Popen[str]:
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST}
    return subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        umask=umask,
    )


STALE = """<?xml version="1.0"?>
<testsuite name="old"><testcase classname="old" name="from_an_earlier_run"/></testsuite>
"""


@pytest.mark.parametrize("left", [False, True], ids=["no-report", "stale-report"])
def test_timed_out_task_with_junit_is_a_timeout_in_the_report(
    cli: Cli, tmp_path: Path, left: bool
) -> None:
    if left:
        (tmp_path / "slow.xml").write_text(STALE)  # a report left by an earlier run
    spec = write_spec(
        tmp_path,
        """
        [[task]]
        id = "slow"
        run = "sleep 60"
        timeout = "1s"
        junit = "slow.xml"
        """,
    )
    merged = tmp_path / "merged.xml"
    out = cli("run", str(spec), "--junit", str(merged), env=FAST)
    assert out.returncode != 0
    suite = next(s for s in ET.parse(merged).getroot() if s.get("name") == "slow")
    cases = list(suite.iter("testcase"))
    assert [c.get("name") for c in cases] == ["slow"]  # not the stale report's testcase
    (failure,) = cases[0].findall("failure")
    assert failure.get("type") == "timed_out"
    assert "timed out after 1s" in (failure.get("message") or "")
    assert cases[0].find("error") is None


def test_interrupt_counts_only_running_tasks(home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """
        [run]
        jobs = 2
        """
        + "".join(
            f'[[task]]\nid = "t{i}"\nrun = "touch @D/started.t{i}; sleep 60"\n' for i in range(4)
        ),
    )
    proc = popen(home, str(spec))
    try:
        wait_until(
            lambda: len(list(tmp_path.glob("started.*"))) == 2, timeout=60, what="two starts"
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "interrupted (SIGTERM): stopping 2 running task(s)" in err, err
    numbers = re.findall(r"^\[(\d+)/4\]", out, re.MULTILINE)
    assert len(numbers) == len(set(numbers)), out


def test_progress_numbers_are_shown_once_after_a_halt(cli: Cli, tmp_path: Path) -> None:
    # `a` runs, `b` fails: the halt kills `a` and never starts `c` and `d`.
    spec = write_spec(
        tmp_path,
        """
        [run]
        jobs = 2
        halt = "now,fail=1"

        [[task]]
        id = "a"
        run = "touch @D/a.started; sleep 60"

        [[task]]
        id = "b"
        run = "while [ ! -e @D/a.started ]; do sleep 0.02; done; exit 1"

        [[task]]
        id = "c"
        run = "true"

        [[task]]
        id = "d"
        run = "true"
        """,
    )
    out = cli("run", str(spec), env=FAST)
    assert out.returncode == 1, out.stdout + out.stderr
    numbers = re.findall(r"^\[(\d+)/4\]", out.stdout, re.MULTILINE)
    assert numbers == ["1", "2", "4"], out.stdout  # b failed, a killed, then c and d at once
    assert re.search(r"^\[4/4\] 2 task\(s\) not started", out.stdout, re.MULTILINE)


def test_results_files_follow_the_umask(home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """
        [[task]]
        id = "hello"
        run = "echo hi"
        """,
    )
    results = tmp_path / "artifacts"
    proc = popen(home, str(spec), "--results", str(results), umask=0o022)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    copy = results / "hello.out"
    assert copy.read_text() == "hi\n"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o644


# ------------------------------------------------------------------ exit codes


def test_exit_codes_tell_timeouts_and_infrastructure_apart(cli: Cli, tmp_path: Path) -> None:
    slow = write_spec(
        tmp_path, '[[task]]\nid = "slow"\nrun = "sleep 60"\ntimeout = "1s"\n', name="slow.toml"
    )
    out = cli("run", str(slow), env=FAST)
    assert out.returncode == 124, out.stdout + out.stderr
    assert "(exit 124)" in out.stdout

    # The report's directory goes away while the run goes on: the tasks did their part.
    gone = tmp_path / "reports"
    gone.mkdir()
    rm = write_spec(tmp_path, f'[[task]]\nid = "rm"\nrun = "rmdir {gone}"\n', name="rm.toml")
    out = cli("run", str(rm), "--junit", str(gone / "junit.xml"), env=FAST)
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"could not write {gone / 'junit.xml'}" in out.stderr

    ok = write_spec(tmp_path, '[[task]]\nid = "ok"\nrun = "true"\n', name="ok.toml")

    up = cli("up", "--team", "busy", "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        out = cli("run", str(ok), "--team", "busy", env=FAST)
        assert out.returncode == 3, out.stdout + out.stderr
        assert "a leader already runs for team 'busy'" in out.stderr
    finally:
        cli("down", "--team", "busy")


def test_an_always_task_reports_on_a_red_run(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """
        [[task]]
        id = "tests"
        run = "exit 1"

        [[task]]
        id = "deploy"
        run = "touch @D/deployed"
        after = ["tests"]

        [[task]]
        id = "report"
        run = "touch @D/reported"
        after = ["tests"]
        always = true
        """,
    )
    out = cli("run", str(spec), "--report", str(tmp_path / "r.json"), env=FAST)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (tmp_path / "reported").exists() and not (tmp_path / "deployed").exists()


# ------------------------------------------------------------------ flaky tests


def validate(path: Path) -> None:
    """Fail unless the file is valid against Jenkins' junit-10.xsd (see test_run_junit_matrix
    for where it is looked for)."""
    junit_schema().validate(str(path))


FIRST = """<?xml version="1.0"?>
<testsuite name="t"><testcase classname="m" name="steady"/>
<testcase classname="m" name="shaky">
<failure message="boom" type="AssertionError">m.py:3: boom</failure></testcase>
</testsuite>
"""
SECOND = """<?xml version="1.0"?>
<testsuite name="t"><testcase classname="m" name="steady"/><testcase classname="m" name="shaky"/>
</testsuite>
"""


def test_a_test_that_passes_on_a_retry_is_shown_flaky(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "attempt1.xml").write_text(FIRST)
    (tmp_path / "attempt2.xml").write_text(SECOND)
    spec = write_spec(
        tmp_path,
        """
        [[task]]
        id = "tests"
        retries = 1
        junit = "out.xml"
        run = "cp @D/attempt$SHOAL_RUN_ATTEMPT.xml @D/out.xml; [ $SHOAL_RUN_ATTEMPT = 2 ]"

        [[task]]
        id = "build"
        retries = 1
        run = "[ $SHOAL_RUN_ATTEMPT = 2 ]"

        [[task]]
        id = "lint"
        run = "true"
        """,
    )
    merged = tmp_path / "merged.xml"
    out = cli("run", str(spec), "--junit", str(merged), env=FAST)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok: all 3 task(s) succeeded, 2 flaky (passed on a retry)," in out.stdout
    validate(merged)
    root = ET.parse(merged).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    (flaky,) = cases["shaky"].findall("flakyFailure")
    assert flaky.get("type") == "AssertionError" and flaky.get("message") == "boom"
    assert flaky.findtext("stackTrace") == "m.py:3: boom"
    assert cases["steady"].find("flakyFailure") is None
    (task_flaky,) = cases["build"].findall("flakyFailure")
    assert task_flaky.get("message") == "attempt 1: exit code 1"
    assert root.get("failures") == "0" and root.get("errors") == "0"


# ------------------------------------------------------------------ a log that stays alive


def test_a_heartbeat_line_while_a_long_task_runs(home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """
        [[task]]
        id = "quick"
        run = "true"

        [[task]]
        id = "long"
        run = "while [ ! -e @D/go ]; do sleep 0.02; done"
        """,
    )
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST, "SHOAL_RUN_HEARTBEAT_S": "0.05"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # (the task ends only once a heartbeat was seen)
            lines.append(line.rstrip("\n"))
            if "still running after" in line:
                (tmp_path / "go").touch()
        proc.wait(60)
    finally:
        (tmp_path / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, lines
    beats = [ln for ln in lines if "still running after" in ln]
    assert beats and beats[0].startswith("[1/2] ") and beats[0].endswith("; running: long")
    assert re.match(r"^\[1/2\] ok +quick  \d+\.\d s$", next(ln for ln in lines if "quick" in ln))
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("task "))) :]
    assert re.match(r"^long +succeeded +1 +\d+\.\d s +- +- +-$", table[2]), table


def test_quiet_prints_no_heartbeat_and_no_successes(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "t"\nrun = "sleep 0.3"\n')
    out = cli("run", str(spec), "--quiet", env={**FAST, "SHOAL_RUN_HEARTBEAT_S": "0.01"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()  # (the header, then the verdict: nothing between)
    assert len(lines) == 2 and lines[1].startswith("ok: all 1 task(s) succeeded in "), lines


def test_colour_is_forced_or_refused(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "t"\nrun = "exit 1"\n')
    forced = cli("run", str(spec), env={**FAST, "FORCE_COLOR": "1"})
    assert "\x1b[31mFAILED" in forced.stdout
    never = cli("run", str(spec), "--color", "never", env={**FAST, "FORCE_COLOR": "1"})
    assert "\x1b[" not in never.stdout and "FAILED" in never.stdout
    always = cli("run", str(spec), "--color", "always", env={**FAST, "NO_COLOR": "1"})
    assert "\x1b[31mFAILED" in always.stdout
    plain = cli("run", str(spec), env=FAST)
    assert "\x1b[" not in plain.stdout


def test_gitlab_folds_each_tasks_output_in_a_section(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "build"\nrun = "echo compiling"\n')
    out = cli("run", str(spec), "--output", "group", env={**FAST, "GITLAB_CI": "true"})
    assert out.returncode == 0, out.stderr
    text = out.stdout  # (captured as text: GitLab's \r reads as a line break here)
    start = re.search(
        r"\x1b\[0Ksection_start:\d+:build\[collapsed=true\]\n\x1b\[0Kbuild: ok\n", text
    )
    end = re.search(r"\x1b\[0Ksection_end:\d+:build\n\x1b\[0K\n", text)
    assert start and end and start.end() < text.index("compiling") < end.start(), repr(text)
    none = cli(
        "run",
        str(spec),
        "--output",
        "group",
        "--annotations",
        "none",
        env={**FAST, "GITLAB_CI": "true"},
    )
    assert "section_start" not in none.stdout and "compiling" in none.stdout


# ------------------------------------------------------------------ session retention


def sessions_of(home: Path, team: str) -> set[str]:
    out = set()
    for path in (home / "sessions").iterdir():
        state = json.loads((path / "state.json").read_text())
        if state["team"] == team:
            out.add(path.name)
    return out


def test_keep_sessions_removes_the_oldest_finished_ones(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "t"\nrun = "true"\n')
    other = write_spec(tmp_path, '[[task]]\nid = "o"\nrun = "true"\n', name="other.toml")
    for _ in range(3):
        assert cli("run", str(spec), env=FAST).returncode == 0
    assert len(sessions_of(home, "run-spec")) == 3  # (kept, by default)
    assert cli("run", str(other), env=FAST).returncode == 0

    out = cli("run", str(spec), "--keep-sessions", "2", env=FAST)
    assert out.returncode == 0, out.stderr
    assert "removed 2 old session(s) of team run-spec (keeping 2)" in out.stderr
    left = sessions_of(home, "run-spec")
    record = json.loads(next((home / "runs" / "run-spec").glob("*.json")).read_text())
    assert len(left) == 2 and record["session_id"] in left
    assert len(sessions_of(home, "run-other")) == 1  # (another team's are not touched)

    # The default of SHOAL_HOME/config.toml.
    (home / "config.toml").write_text("[run]\nkeep_sessions = 1\n")
    assert cli("run", str(spec), env=FAST).returncode == 0
    assert len(sessions_of(home, "run-spec")) == 1
    (home / "config.toml").write_text('[run]\nkeep_sessions = "all"\n')
    bad = cli("run", str(spec), env=FAST)
    assert bad.returncode == 2 and "keep_sessions must be a whole number >= 1" in bad.stderr
