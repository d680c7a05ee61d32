"""A workflow's log after a kill -9 of its leader says what happened: a step still running is
taken back (not "started" a second time), a step whose attempt ended while no leader ran is
started again with its attempt's number, and the count of steps taken back is theirs."""

from __future__ import annotations

from pathlib import Path

import psutil

from tests.conftest import Cli
from tests.integration.test_workflow import FAST, _ended, _kill_leader, _start, _tasks
from tests.polling import wait_until


def _spec(tmp_path: Path) -> Path:
    """Steps b and c run side by side until `go`; c, told by `stop-c`, exits 3 at once."""
    go, stop_c = tmp_path / "go", tmp_path / "stop-c"
    wait_b = f"while [ ! -e {go} ]; do sleep 0.05; done"
    wait_c = f"while [ ! -e {go} ] && [ ! -e {stop_c} ]; do sleep 0.05; done"
    spec = tmp_path / "two.toml"
    spec.write_text(
        "[run]\njobs = 2\n"
        f'[[task]]\nid = "b"\nrun = "echo b-start >> marks; {wait_b}; echo b >> marks"\n'
        f'[[task]]\nid = "c"\nrun = "echo c-start >> marks; {wait_c}; '
        f'if [ -e {stop_c} ]; then rm {stop_c}; exit 3; fi; echo c >> marks"\n'
    )
    return spec


def _step_pids(cli: Cli, workflow: str) -> dict[str, int] | None:
    """Step id -> the pid of its running task, once state.json has every one."""
    pids = {
        t["description"][1:2]: t["pid"]
        for t in _tasks(cli).values()
        if t.get("workflow_id") == workflow and t["status"] == "running"
    }
    return pids if len(pids) == 2 and all(pids.values()) else None


def test_the_log_of_a_resumed_workflow_tells_taken_back_from_started_again(
    cli: Cli, tmp_path: Path
) -> None:
    assert cli("up", "-d", "-q", env=FAST).returncode == 0
    try:
        marks = tmp_path / "marks"
        task_id = _start(cli, _spec(tmp_path))
        wait_until(
            lambda: marks.exists() and sorted(marks.read_text().split()) == ["b-start", "c-start"],
            timeout=30,
            what="steps b and c to start",
        )
        c_pid = wait_until(lambda: _step_pids(cli, task_id), what="the steps' pids")["c"]
        _kill_leader(cli)
        (tmp_path / "stop-c").touch()  # c's attempt ends while no leader runs
        wait_until(lambda: not psutil.pid_exists(c_pid), timeout=30, what="step c to exit")
        again = cli("up", "-d", "-q", env=FAST)
        assert again.returncode == 0, again.stderr
        wait_until(
            lambda: marks.read_text().split().count("c-start") == 2,
            timeout=30,
            what="step c to start again",
        )
        (tmp_path / "go").touch()
        done = wait_until(lambda: _ended(cli, task_id), timeout=60, what="the workflow's end")
        assert done["status"] == "completed", done
        assert sorted(marks.read_text().split()) == ["b", "b-start", "c", "c-start", "c-start"]
        log = cli("logs", task_id)
        assert log.returncode == 0, log.stderr
        lines = [line.split(" ", 1)[1] for line in log.stdout.splitlines()]
        resumed = next(line for line in lines if "continued by a resumed leader" in line)
        assert resumed.endswith(", 1 running step(s) taken back"), lines
        b_lines = [line for line in lines if line.startswith("step b:")]
        c_lines = [line for line in lines if line.startswith("step c:")]
        assert len([line for line in b_lines if "started" in line]) == 1, lines
        assert any(line.startswith("step b: taken back") for line in b_lines), lines
        assert any(line.startswith("step c: started again") and "(attempt 2)" in line
                   for line in c_lines), lines  # fmt: skip
    finally:
        cli("down", timeout=60)
