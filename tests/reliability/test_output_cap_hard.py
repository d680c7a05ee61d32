"""The output cap is hard: a flat-out writer on a loaded machine never takes its task's output
file past the cap plus OUTPUT_CAP_SLACK (the kernel's file size limit stops it), and its task
ends killed with the cap's reason, whether the leader's look or the limit stopped it first."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.workers.shell.output_cap import OUTPUT_CAP_SLACK, output_limit
from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, script
from tests.integration.test_leader import LeaderProc, sh, task_record
from tests.polling import wait_until

CAP = 2_000_000
ENV = {"SHOAL_OUTPUT_CAP": str(CAP)}
WRITERS = {
    "yes": "yes",
    "burst": "head -c 50000000 /dev/zero",
    "python": 'python3 -c "import os\nwhile True: os.write(1, bytes(1 << 20))"',
}


@contextlib.contextmanager
def loaded() -> Iterator[None]:
    """Two busy loops while it lasts: the leader shares the CPUs with them."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def ended(cli: Cli, task_id: str) -> dict[str, Any] | None:
    """The task's record once it is no longer running."""
    rec = task_record(cli, task_id)
    return rec if rec["status"] != "running" else None


def assert_capped(rec: dict[str, Any]) -> int:
    """The task ended killed at the cap, its file within the slack; the file's size."""
    assert rec["status"] == "killed", rec
    assert f"over the cap of {CAP} bytes" in rec["kill_reason"], rec
    size = os.path.getsize(rec["output_file"])
    assert CAP < size <= CAP + OUTPUT_CAP_SLACK, size
    return size


def test_flat_out_writers_stop_within_the_slack_under_load(cli: Cli, home: Path) -> None:
    leader = LeaderProc(home, env=ENV)
    try:
        with loaded():
            tasks = {name: sh(cli, "--", command) for name, command in WRITERS.items()}
            for name, task_id in tasks.items():
                size = assert_capped(wait_until(functools.partial(ended, cli, task_id), timeout=30))
                print(f"{name}: {size} bytes for a {CAP} byte cap")
    finally:
        cli("down", "--team", "t")
        leader.stop()


BACKGROUND_FLOOD = """
final = "done"

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "yes", run_in_background = true }

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "until [ -e go ]; do sleep 0.05; done" }
"""


def test_an_agents_background_bash_is_capped_too(cli: Cli, home: Path, tmp_path: Path) -> None:
    leader = LeaderProc(home, env=ENV)
    try:
        out = cli("agent", "--team", "t", *BYPASS, "--model", script(tmp_path, BACKGROUND_FLOOD),
                  "--cwd", str(tmp_path), "--backend", "in-process", "--json", "flood")  # fmt: skip
        assert out.returncode == 0, out.stderr
        agent = json.loads(out.stdout)["id"]

        def shell() -> dict[str, Any] | None:
            listed = json.loads(cli("ps", "--all", "--json", "--team", "t").stdout)
            rows = [r for r in listed if r["type"] == "local_bash" and r.get("agent_id") == agent]
            return rows[0] if rows and rows[0]["status"] != "running" else None

        with loaded():  # (from the agent's start: its `yes` starts in the first round)
            assert_capped(wait_until(shell, timeout=30, what="the background `yes` to end"))
        (tmp_path / "go").touch()
        wait_until(lambda: task_record(cli, agent)["status"] == "completed", timeout=30)
    finally:
        cli("down", "--team", "t")
        leader.stop()


def test_the_limit_is_the_cap_plus_the_slack_within_the_hard_limit() -> None:
    assert output_limit(CAP) == (CAP + OUTPUT_CAP_SLACK) // 512 * 512
    assert output_limit(CAP) > CAP
    script_ = (
        "import resource, sys\n"
        "from shoal.workers.shell.output_cap import output_limit\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
        "print(output_limit(5 << 30))\n"
    )
    got = subprocess.run([sys.executable, "-c", script_], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert int(got.stdout) == 1 << 20  # (a child cannot be given more than the leader has)
