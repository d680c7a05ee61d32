"""`shoal run SPEC` end to end: real processes, real files, real signals."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import psutil
import pytest

from shoal.core.paths import Layout
from shoal.orchestrator.batch.report import JOBLOG_HEADER, read_joblog
from shoal.orchestrator.liveness import leader_alive
from shoal.workers.shell import process as shell
from tests.conftest import Cli, group_gone, in_ci
from tests.polling import wait_until

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}


def write_spec(directory: Path, text: str, name: str = "spec.toml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).replace("@D", str(directory)))
    return path


def run(
    cli: Cli, spec: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cli("run", str(spec), *args, env={**FAST, **(env or {})})


def report_of(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    report = json.loads(path.read_text())
    return report, {t["id"]: t for t in report["tasks"]}


def start_run(home: Path, spec: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST}
    return subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def our_processes(tmp_path: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions this test's directory (the run's tasks)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(tmp_path) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def attempt_pids(tasks: dict[str, dict[str, Any]]) -> list[int]:
    """The process group of every attempt that started (recorded by the shell wrapper)."""
    pids = []
    for task in tasks.values():
        for attempt in task["attempt_log"]:
            if attempt["output_file"] and attempt["started_at"]:
                pid = shell.recorded_pid(attempt["output_file"])
                assert pid is not None, attempt
                pids.append(pid)
    return pids


def test_pass_fail_dependencies_and_all_three_reports(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 3

        [[task]]
        id = "ok"
        run = "echo hello; echo err >&2"

        [[task]]
        id = "bad"
        run = '''echo "first line"; echo "the reason it broke"; exit 3'''

        [[task]]
        id = "after-bad"
        run = "touch @D/after-bad"
        after = ["bad"]

        [[task]]
        id = "after-after-bad"
        run = "touch @D/after-after-bad"
        after = "after-bad"

        [[task]]
        id = "after-ok"
        run = "touch @D/after-ok"
        after = ["ok"]

        [[task]]
        id = "argv"
        run = ["printf", "%s|", "a b", "c"]
        """,
        name="nightly.toml",
    )
    files = tmp_path / "junit.xml", tmp_path / "report.json", tmp_path / "jobs.log"
    out = run(
        cli, spec, "--junit", str(files[0]), "--report", str(files[1]), "--joblog", str(files[2])
    )
    assert out.returncode == 1, out.stderr
    assert "FAILED: 3 succeeded, 1 failed, 2 skipped of 6" in out.stdout
    # Piped, every task has its line (a heartbeat for CI logs), numbered once each.
    told = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    assert len(told) == 6 and sum("FAILED" in ln for ln in told) == 1
    assert sum(" ok " in ln for ln in told) == 3
    # ... and --quiet leaves only what did not succeed.
    quiet = run(cli, spec, "--quiet")
    told = [ln for ln in quiet.stdout.splitlines() if ln.startswith("[")]
    assert len(told) == 3 and sum("FAILED" in ln for ln in told) == 1
    # The run's own team, after the file name, is deleted at the end (its record stays).
    assert not (home / "teams" / "run-nightly").exists()

    report, tasks = report_of(files[1])
    assert report["status"] == "failed" and report["exit_code"] == 1
    assert report["team"] == "run-nightly"
    assert report["counts"] | {"pending": 0} == {
        "total": 6,
        "succeeded": 3,
        "failed": 1,
        "timed_out": 0,
        "killed": 0,
        "skipped": 2,
        "pending": 0,
        "running": 0,
        "resumed": 0,
        "flaky": 0,
    }
    assert {k: t["status"] for k, t in tasks.items()} == {
        "ok": "succeeded",
        "bad": "failed",
        "after-bad": "skipped",
        "after-after-bad": "skipped",
        "after-ok": "succeeded",
        "argv": "succeeded",
    }
    assert tasks["bad"]["exit_code"] == 3 and tasks["bad"]["attempts"] == 1
    assert tasks["after-bad"]["reason"] == 'dependency "bad" failed'
    assert tasks["after-after-bad"]["reason"] == 'dependency "after-bad" was skipped'
    assert tasks["after-bad"]["attempts"] == 0 and tasks["after-bad"]["output_file"] is None
    assert Path(tasks["ok"]["output_file"]).read_text() == "hello\nerr\n"
    assert Path(tasks["argv"]["output_file"]).read_text() == "a b|c|"
    for key in ("started_at", "ended_at"):
        assert tasks["ok"][key].endswith("Z")
    assert tasks["ok"]["duration_s"] >= 0
    assert (tmp_path / "after-ok").exists() and not (tmp_path / "after-bad").exists()

    suite = ET.parse(files[0]).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("6", "1", "2")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert len(cases) == 6
    failure = cases["bad"].find("failure")
    assert failure is not None and failure.get("message") == "exit code 3"
    assert "the reason it broke" in (failure.text or "")
    assert cases["after-bad"].find("skipped") is not None
    assert cases["ok"].find("failure") is None and cases["ok"].find("skipped") is None

    assert files[2].read_text().startswith(JOBLOG_HEADER)
    rows = {r["Seq"]: r for r in read_joblog(files[2])}
    assert sorted(rows) == ["1", "2", "5", "6"]  # tasks that ran, by position in the spec
    assert rows["2"]["Exitval"] == "3" and rows["1"]["Exitval"] == "0"
    assert rows["2"]["Command"] == 'echo "first line"; echo "the reason it broke"; exit 3'
    assert rows["6"]["Command"] == "printf '%s|' 'a b' c" and rows["1"]["Host"] == ":"
    assert float(rows["1"]["Starttime"]) > 1e9 and float(rows["1"]["JobRuntime"]) >= 0


def test_all_succeeded_is_exit_zero_with_env_and_cwd(cli: Cli, home: Path, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    spec = write_spec(
        tmp_path,
        """\
        [run]
        team = "crew"
        env = { GREETING = "hi" }

        [[task]]
        id = "where"
        cwd = "work"
        run = '''pwd > here.txt
        echo "$GREETING $NAME $SHOAL_RUN_TASK $SHOAL_RUN_ATTEMPT" >> here.txt'''
        env = { NAME = 42 }

        [[task]]
        id = "default-cwd"
        run = "pwd > @D/default.txt"
        """,
    )
    out = run(cli, spec)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok: all 2 task(s) succeeded" in out.stdout
    lines = (tmp_path / "work" / "here.txt").read_text().splitlines()
    assert lines == [str(tmp_path / "work"), "hi 42 where 1"]
    assert (tmp_path / "default.txt").read_text().strip() == str(tmp_path)
    assert (home / "teams" / "crew").is_dir()


def test_a_flaky_task_is_retried_and_succeeds(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "flaky"
        retries = 2
        run = '''n=$(cat @D/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > @D/count
        echo "attempt $n of $SHOAL_RUN_ATTEMPT"; [ "$n" -ge 2 ]'''

        [[task]]
        id = "then"
        run = "touch @D/then"
        after = ["flaky"]
        """,
    )
    log = tmp_path / "jobs.log"
    out = run(cli, spec, "--report", str(tmp_path / "r.json"), "--joblog", str(log))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "retry flaky: attempt 1 failed (exit code 1); starting attempt 2 of 3" in out.stdout
    _, tasks = report_of(tmp_path / "r.json")
    flaky = tasks["flaky"]
    assert flaky["status"] == "succeeded" and flaky["attempts"] == 2
    assert [a["status"] for a in flaky["attempt_log"]] == ["failed", "succeeded"]
    assert flaky["attempt_log"][0]["exit_code"] == 1
    first, second = (Path(a["output_file"]) for a in flaky["attempt_log"])
    assert first != second and second.read_text() == "attempt 2 of 2\n"
    assert (tmp_path / "count").read_text().strip() == "2" and (tmp_path / "then").exists()
    assert [(r["Seq"], r["Exitval"]) for r in read_joblog(log)] == [
        ("1", "1"),
        ("1", "0"),
        ("2", "0"),
    ]


def test_timeouts_as_duration_strings_and_numbers(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 3

        [[task]]
        id = "string"
        run = "sleep 300 & echo started; wait"
        timeout = "1s"

        [[task]]
        id = "number"
        run = "sleep 300"
        timeout = 0.5

        [[task]]
        id = "fast"
        run = "true"
        timeout = "1m"

        [[task]]
        id = "downstream"
        run = "touch @D/downstream"
        after = ["string"]
        """,
    )
    junit, report = tmp_path / "j.xml", tmp_path / "r.json"
    out = run(cli, spec, "--junit", str(junit), "--report", str(report))
    assert out.returncode == 124, out.stdout + out.stderr
    _, tasks = report_of(report)
    assert tasks["string"]["status"] == "timed_out"
    assert tasks["string"]["reason"] == "timed out after 1s"
    assert tasks["number"]["status"] == "timed_out"
    assert tasks["number"]["reason"] == "timed out after 500ms"
    assert tasks["fast"]["status"] == "succeeded"
    assert tasks["downstream"]["reason"] == 'dependency "string" timed out'
    assert tasks["string"]["duration_s"] >= 1.0
    for pid in attempt_pids(tasks):
        assert group_gone(pid)
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    failure = cases["string"].find("failure")
    assert failure is not None and failure.get("message") == "timed out after 1s"
    assert "started" in (failure.text or "")


def test_halt_now_kills_running_tasks_and_starts_nothing_more(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 3
        halt = "now,fail=1"

        [[task]]
        id = "long1"
        run = "touch @D/started1; sleep 300"

        [[task]]
        id = "long2"
        run = "touch @D/started2; sleep 300"

        [[task]]
        id = "bad"
        run = '''while [ ! -f @D/started1 ] || [ ! -f @D/started2 ]; do sleep 0.02; done; exit 4'''

        [[task]]
        id = "later"
        run = "touch @D/later"
        """,
    )
    report = tmp_path / "r.json"
    out = run(cli, spec, "--report", str(report))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "halt: halt now,fail=1: 1 task failed; starting nothing more" in out.stdout
    summary, tasks = report_of(report)
    assert {k: t["status"] for k, t in tasks.items()} == {
        "long1": "killed",
        "long2": "killed",
        "bad": "failed",
        "later": "skipped",
    }
    assert summary["halted"] == "halt now,fail=1: 1 task failed"
    assert tasks["later"]["reason"] == "not started: halt now,fail=1: 1 task failed"
    assert tasks["long1"]["reason"] == "killed: halt now,fail=1: 1 task failed"
    assert not (tmp_path / "later").exists()
    for pid in attempt_pids(tasks):
        assert group_gone(pid)


def read_events_until(
    proc: subprocess.Popen[str], subtype: str, timeout: float = 15
) -> tuple[list[Any], bytes]:
    """Read stream-json lines from a running `shoal run` until an event of `subtype`; returns
    the events and the bytes read past that line. Reads the raw pipe (a text wrapper's
    buffer would hide lines from select)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    events: list[Any] = []
    pending = b""

    def got_it() -> bool:
        nonlocal pending
        ready, _, _ = select.select([fd], [], [], 0.1)  # paces the polling
        if not ready:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"no {subtype} event; got {subtypes()} (end of output)")
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            events.append(json.loads(line))
            if events[-1].get("subtype") == subtype:
                return True
        return False

    def subtypes() -> list[str | None]:
        return [e.get("subtype") for e in events]

    wait_until(got_it, timeout, interval=0, what=lambda: f"a {subtype} event; got {subtypes()}")
    return events, pending


def test_halt_soon_lets_running_tasks_finish_streaming_json(
    home: Path, tmp_path: Path, stopper: list[subprocess.Popen[str]]
) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 2
        halt = "soon,fail=1"

        [[task]]
        id = "long"
        run = '''touch @D/started; while [ ! -f @D/gate ]; do sleep 0.02; done; echo finished'''

        [[task]]
        id = "bad"
        run = '''while [ ! -f @D/started ]; do sleep 0.02; done; exit 2'''

        [[task]]
        id = "later"
        run = "touch @D/later"
        """,
    )
    proc = start_run(home, spec, "--output-format", "stream-json")
    stopper.append(proc)
    events, pending = read_events_until(proc, "halted")
    (tmp_path / "gate").touch()
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    rest = pending + b"".join(iter(lambda: os.read(fd, 65536), b""))
    assert proc.wait(30) == 1, proc.stderr.read() if proc.stderr else ""
    events += [json.loads(line) for line in rest.splitlines()]
    assert events[-1]["type"] == "result" and events[-1]["exit_code"] == 1
    kinds = {(e["type"], e.get("subtype")) for e in events}
    assert {("system", "task_started"), ("system", "task_terminated")} <= kinds
    assert {("run", "run_started"), ("run", "task_finished"), ("run", "task_skipped")} <= kinds
    verdicts = {e["id"]: e for e in events if e.get("subtype") in ("task_finished", "task_skipped")}
    assert verdicts["long"]["status"] == "succeeded"  # running when the halt came: let finish
    assert verdicts["bad"]["status"] == "failed"
    assert verdicts["later"]["reason"] == "not started: halt soon,fail=1: 1 task failed"
    assert not (tmp_path / "later").exists()


def test_sigint_stops_everything_and_resume_runs_only_the_rest(
    cli: Cli, home: Path, tmp_path: Path, stopper: list[subprocess.Popen[str]]
) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        jobs = 2

        [[task]]
        id = "quick"
        run = "touch @D/ran-quick"

        [[task]]
        id = "gate"
        run = '''touch @D/ran-gate; (while [ ! -f @D/gate ]; do sleep 0.02; done) & wait'''

        [[task]]
        id = "after-gate"
        run = "touch @D/ran-after-gate"
        after = ["gate"]

        [[task]]
        id = "after-quick"
        run = "touch @D/ran-after-quick"
        after = ["quick"]
        """,
    )
    report, log = tmp_path / "r.json", tmp_path / "jobs.log"
    proc = start_run(home, spec, "--report", str(report), "--joblog", str(log))
    stopper.append(proc)
    wait_until(lambda: (tmp_path / "ran-gate").exists() and (tmp_path / "ran-after-quick").exists())
    # (and until both quick tasks have ended, not only begun: the joblog is in order of ends)
    wait_until(lambda: log.exists() and len(read_joblog(log)) >= 2, what="two joblog rows")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert "interrupted" in out
    summary, tasks = report_of(report)
    assert summary["status"] == "interrupted" and summary["interrupted"] == "SIGINT"
    assert {k: t["status"] for k, t in tasks.items()} == {
        "quick": "succeeded",
        "gate": "killed",
        "after-gate": "skipped",
        "after-quick": "succeeded",
    }
    assert tasks["gate"]["reason"] == "killed: interrupted (SIGINT)"
    pids = attempt_pids(tasks)
    assert len(pids) == 3
    for pid in pids:
        assert group_gone(pid)
    assert our_processes(tmp_path) == []
    assert leader_alive(Layout(home), "run-spec") is None

    for marker in tmp_path.glob("ran-*"):
        marker.unlink()
    (tmp_path / "gate").touch()
    again = run(cli, spec, "--resume", "--report", str(report), "--joblog", str(log))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 task(s) succeeded then and are not run again" in again.stdout
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-after-gate", "ran-gate"]
    summary2, tasks2 = report_of(report)
    assert summary2["resumed_from"] == summary["run_id"] and summary2["counts"]["resumed"] == 2
    assert (
        tasks2["quick"]["resumed"]
        and tasks2["quick"]["output_file"] == (tasks["quick"]["output_file"])
    )
    assert tasks2["gate"]["status"] == "succeeded" and not tasks2["gate"]["resumed"]
    rows = read_joblog(log)  # appended: the first run's three attempts, then two more
    assert [r["Seq"] for r in rows] == ["1", "4", "2", "2", "3"]
    assert log.read_text().count("Seq\tHost") == 1


def test_spec_errors_are_all_reported_and_nothing_is_created(cli: Cli, home: Path) -> None:
    spec = write_spec(
        home.parent,
        """\
        [run]
        jobs = 2
        halt = "whenever"
        colour = "blue"

        [[member]]
        name = "alice"

        [[member]]
        name = "alice"

        [[task]]
        id = "a"
        run = "true"
        after = ["c"]

        [[task]]
        id = "b"
        after = ["nope"]
        timeout = "ten minutes"

        [[task]]
        id = "c"
        run = "true"
        after = ["a"]
        """,
    )
    out = run(cli, spec)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == f"shoal: error: {spec}: 7 errors in the spec; nothing was started"
    got = [
        line.split(": ", 1)[0].rsplit(":", 1)[1] + " " + line.split(": ", 1)[1]
        for line in lines[1:]
    ]
    for want in (
        '3 [run]: bad halt value "whenever"',
        '4 [run]: unknown key "colour"',
        '10 member "alice" is declared twice (first at line 7)',
        '15 task "a": dependency cycle a -> c -> a',
        '17 task "b": needs run (a shell command) or prompt',
        '19 task "b": after names unknown task "nope"',
        '20 task "b": timeout: bad duration "ten minutes"',
    ):
        assert any(g.startswith(want) for g in got), (want, got)
    assert "Traceback" not in out.stderr
    assert sorted(os.listdir(home)) == []  # no team, no session, no run record


@pytest.mark.parametrize("backend", ["process", pytest.param("tmux", marks=pytest.mark.tmux)])
def test_a_mixed_spec_with_scripted_members(
    cli: Cli, home: Path, tmp_path: Path, backend: str
) -> None:
    (tmp_path / "review.toml").write_text(
        '[[step]]\nwhen = "task"\nrun = "cat built.txt && echo {name} > reviewed.txt"\n'
    )
    spec = write_spec(
        tmp_path,
        """\
        [[member]]
        name = "reviewer"
        agent = "scripted"
        script = "review.toml"

        [[task]]
        id = "build"
        run = "echo built > built.txt"

        [[task]]
        id = "review"
        prompt = "Review the build."
        assign = "reviewer"
        after = ["build"]

        [[task]]
        id = "ship"
        run = "test -f reviewed.txt"
        after = ["review"]
        """,
    )
    report = tmp_path / "report.json"
    junit = tmp_path / "junit.xml"
    out = run(
        cli,
        spec,
        "--backend",
        backend,
        "--report",
        str(report),
        "--junit",
        str(junit),
        env={"SHOAL_TMUX_SOCKET": f"shoal-run-{tmp_path.name}"},
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "reviewed.txt").read_text() == "reviewer\n"
    tasks = {t["id"]: t for t in json.loads(report.read_text())["tasks"]}
    assert [tasks[i]["status"] for i in ("build", "review", "ship")] == ["succeeded"] * 3
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert len(cases) == 3 and not any(c.find("failure") is not None for c in cases)
    leftover = subprocess.run(["pgrep", "-f", f"--home {home} worker"], capture_output=True)
    assert leftover.stdout == b""


def test_a_failing_agent_task_is_retried_and_reported(cli: Cli, home: Path, tmp_path: Path) -> None:
    (tmp_path / "flaky.toml").write_text(
        '[[step]]\nwhen = "task"\nrun = "echo x >> tries; test $(wc -l < tries) -ge 2"\n'
    )
    spec = write_spec(
        tmp_path,
        """\
        [[member]]
        name = "flaky"
        script = "flaky.toml"

        [[task]]
        id = "try"
        prompt = "try it"
        assign = "flaky"
        retries = 1
        """,
    )
    report = tmp_path / "report.json"
    out = run(cli, spec, "--backend", "in-process", "--report", str(report))
    assert out.returncode == 0, out.stderr
    (task,) = json.loads(report.read_text())["tasks"]
    assert task["status"] == "succeeded" and task["attempts"] == 2


def test_bad_options_are_usage_errors(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "a"\nrun = "true"\n')
    out = run(cli, spec, "--halt", "now,fail=many")
    assert out.returncode == 2 and "--halt: bad halt value" in out.stderr
    out = run(cli, spec, "--report", str(tmp_path / "no" / "such" / "dir.json"))
    assert out.returncode == 2 and "does not exist" in out.stderr
    out = run(cli, tmp_path / "missing.toml")
    assert out.returncode == 2 and "no such file" in out.stderr
    assert os.listdir(home) == []


def test_a_team_with_a_running_leader_is_refused(cli: Cli, home: Path, tmp_path: Path) -> None:
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST}
    leader = subprocess.Popen(
        [sys.executable, "-m", "shoal", "up", "--team", "busy", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until(lambda: (leader_alive(Layout(home), "busy") or (0,))[0] == leader.pid)
        spec = write_spec(tmp_path, '[[task]]\nid = "a"\nrun = "touch @D/ran"\n')
        out = run(cli, spec, "--team", "busy")
        assert out.returncode == 3  # (infrastructure: not a task failure)
        assert "a leader already runs for team 'busy'" in out.stderr
        assert not (tmp_path / "ran").exists()
    finally:
        leader.terminate()
        leader.wait(20)


def test_shoal_down_stops_a_run_like_an_interrupt(
    cli: Cli, home: Path, tmp_path: Path, stopper: list[subprocess.Popen[str]]
) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        team = "nightly"

        [[task]]
        id = "long"
        run = "touch @D/started; sleep 300"
        """,
    )
    report = tmp_path / "r.json"
    proc = start_run(home, spec, "--report", str(report))
    stopper.append(proc)
    wait_until(lambda: (tmp_path / "started").exists())
    down = cli("down", "--team", "nightly", env=FAST)
    assert down.returncode == 0, down.stderr
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    summary, tasks = report_of(report)
    assert summary["interrupted"] == "its leader was stopped (shoal down)"
    assert tasks["long"]["status"] == "killed"
    for pid in attempt_pids(tasks):
        assert group_gone(pid)


def test_gnu_parallel_resumes_from_shoals_joblog(cli: Cli, home: Path, tmp_path: Path) -> None:
    """GNU parallel itself reads shoal's joblog back: `--resume` skips the jobs it lists,
    `--resume-failed` runs again the one that failed (and those never run)."""
    parallel = shutil.which("parallel")
    if parallel is None:
        if in_ci():
            pytest.fail("GNU parallel is not installed (.ci/run installs it)", pytrace=False)
        pytest.skip("GNU parallel is not installed (.ci/run installs it)")
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "a"
        run = "true"

        [[task]]
        id = "b"
        run = "exit 3"

        [[task]]
        id = "c"
        run = "true"
        """,
    )
    log = tmp_path / "jobs.log"
    out = run(cli, spec, "--joblog", str(log))
    assert out.returncode == 1, out.stdout + out.stderr
    argv = [parallel, "--will-cite", "-j1", "--joblog", str(log)]
    args = [":::", "x1", "x2", "x3", "x4"]
    resumed = subprocess.run([*argv, "--resume", "echo", *args], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert resumed.stdout.split() == ["x4"], resumed.stdout + resumed.stderr
    again = subprocess.run([*argv, "--resume-failed", "echo", *args], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert again.stdout.split() == ["x2"], again.stdout + again.stderr
