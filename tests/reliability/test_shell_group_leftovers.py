"""A shell task's children never outlive it: a wrapper killed while no leader runs leaves its
child behind, and the next leader (or `shoal down`) kills the task's whole process group."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from shoal.core.paths import Layout
from shoal.orchestrator.liveness import leader_alive
from shoal.teams.session import current_session
from shoal.workers.shell import process as shell
from tests.conftest import Cli, pid_gone
from tests.polling import wait_until

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}


def marked(marker: str) -> list[psutil.Process]:
    """Live processes whose command line carries `marker`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in (proc.info["cmdline"] or []) and proc.info["status"] != "zombie":
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[str]:
    """A word unique to this test, on the command line of the task's child; whatever still
    carries it at the end is killed (so a failing test leaves nothing behind)."""
    word = f"shoal-leftover-{tmp_path.name}-{os.getpid()}"
    yield word
    for proc in marked(word):
        proc.kill()


def up(cli: Cli) -> int:
    out = cli("up", "--detach", "--team", "t", env=FAST)
    assert out.returncode == 0, out.stderr
    found = leader_alive(Layout(cli.home), "t")
    assert found is not None
    return found[0]


def task_record(cli: Cli, task_id: str) -> dict[str, Any]:
    rows = json.loads(cli("ps", "--all", "--json", "--team", "t").stdout)
    return next(r for r in rows if r["id"] == task_id)


def orphan_a_child(cli: Cli, marker: str) -> tuple[str, int]:
    """Start a task whose child carries `marker`, then kill -9 the leader and the task's
    wrapper: (task id, the child's pid), the child still running with no one to end it."""
    leader = up(cli)
    line = f"{sys.executable} -c 'import time; time.sleep(300)' {marker} & wait"
    out = cli("sh", "--team", "t", "--", line)
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    (child,) = wait_until(lambda: marked(marker), what="the task's child")
    output_file = task_record(cli, task_id)["output_file"]
    wrapper = wait_until(lambda: shell.recorded_pid(output_file), what="the wrapper's pid")
    assert os.getpgid(child.pid) == wrapper
    os.kill(leader, signal.SIGKILL)
    wait_until(lambda: pid_gone(leader), what="the leader gone")
    os.kill(wrapper, signal.SIGKILL)
    wait_until(lambda: pid_gone(wrapper), what="the wrapper gone")
    assert child.is_running()  # the wrapper's end alone does not end its child
    return task_id, child.pid


def test_the_next_leader_kills_the_group_of_a_wrapper_that_died(
    cli: Cli, home: Path, marker: str
) -> None:
    task_id, child = orphan_a_child(cli, marker)
    up(cli)
    try:
        wait_until(lambda: pid_gone(child), what="the orphaned child killed")
        assert marked(marker) == []
        rec = wait_until(
            lambda: (r := task_record(cli, task_id))["status"] != "running" and r, what="its end"
        )
        assert rec["status"] == "failed", rec
        assert "no leader was running" in rec["error"] and "were killed" in rec["error"]
        session = current_session(Layout(home), "t")
        assert session is not None
        wait_until(
            lambda: any(
                e.get("subtype") == "task_notification" and e["task_id"] == task_id
                for e in session.events()
            ),
            what="its notification",
        )
        notes = [e for e in session.events() if e.get("subtype") == "task_notification"]
        assert [n["task_id"] for n in notes] == [task_id]
    finally:
        assert cli("down", "--team", "t").returncode == 0


def test_down_kills_the_group_of_a_wrapper_that_died(cli: Cli, marker: str) -> None:
    task_id, child = orphan_a_child(cli, marker)
    out = cli("down", "--team", "t", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["killed_orphans"] == [task_id]
    wait_until(lambda: pid_gone(child), what="the orphaned child killed")
    assert marked(marker) == []
    assert task_record(cli, task_id)["status"] == "killed"
