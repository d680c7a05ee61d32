"""The output cap holds for a teammate's commands: `yes` into a teammate's output file is stopped
just past the cap (never more than OUTPUT_CAP_SLACK past it, on a loaded machine too: the
command runs under a file size limit), and its turn fails with a reason that names the cap.
Small caps keep the disk use of the tests small."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.shell.output_cap import OUTPUT_CAP_SLACK
from shoal.workers.teammate.brains import OutputCapExceeded, ScriptedBrain, TurnContext
from shoal.workers.teammate.commands import CommandRecord
from tests.conftest import Cli, group_gone
from tests.polling import wait_until
from tests.reliability.test_output_cap_hard import loaded
from tests.reliability.test_teammate_commands import kill_marked, marker_pids

CAP = 2 << 20  # 2 MiB
# A fast writer at a bounded pace (at most 50 MiB/s: 256 KiB every 5 ms); flat-out `yes` is
# the in-process test's writer.
PACED_WRITER = (
    'python3 -c "import os, time; '
    "[(os.write(1, b'y' * 262144), time.sleep(0.005)) for _ in iter(int, 1)]\""
)
TEAM = "capped"


@pytest.fixture
def marker() -> Iterator[str]:
    mark = f"marker-{uuid.uuid4().hex}"
    yield mark
    kill_marked(mark)


def _context(tmp_path: Path, command: str, tracked: list[CommandRecord]) -> TurnContext:
    async def nothing(*_args: object) -> None:
        return None

    async def approve(_plan: str) -> tuple[bool, str | None]:
        return True, None

    return TurnContext(
        name="w1",
        team="t",
        prompt="p",
        cwd=str(tmp_path),
        output_file=tmp_path / "w1.output",
        task={"id": 1, "subject": "flood", "metadata": {"run": command}},
        send=nothing,
        update_task=nothing,
        approve_plan=approve,
        activity=lambda _text: None,
        track=tracked.append,
        output_cap=CAP,
    )


def test_a_flooding_command_is_killed_just_past_the_cap(tmp_path: Path, marker: str) -> None:
    tracked: list[CommandRecord] = []
    ctx = _context(tmp_path, f"yes {marker}", tracked)
    with loaded(), pytest.raises(OutputCapExceeded) as err:  # (two busy loops on the CPUs)
        asyncio.run(ScriptedBrain().turn(ctx))
    size = ctx.output_file.stat().st_size
    assert f"over the output cap of {CAP} bytes" in str(err.value)
    assert str(ctx.output_file) in str(err.value)
    assert CAP < size <= CAP + OUTPUT_CAP_SLACK
    [record] = tracked
    assert record.task_id == 1 and record.output_offset == 0
    wait_until(lambda: group_gone(record.pgid), timeout=2, what="the flooding group to end")
    assert marker_pids(marker) == []
    # The file is over the cap: the next command is refused without running.
    again: list[CommandRecord] = []
    with pytest.raises(OutputCapExceeded, match="was not run"):
        asyncio.run(ScriptedBrain().turn(_context(tmp_path, "echo more", again)))
    assert again == [] and ctx.output_file.stat().st_size == size


def test_a_command_under_the_cap_is_not_disturbed(tmp_path: Path) -> None:
    """A command that writes a little and then waits a while (many looks at its file) ends with
    its own exit code and output."""
    ctx = _context(tmp_path, "head -c 100000 /dev/zero | tr '\\0' a; sleep 0.3; echo fine", [])
    result = asyncio.run(ScriptedBrain().turn(ctx))
    assert result.ok and result.result.endswith("fine")
    assert ctx.output_file.stat().st_size == 100000 + len("fine\n")


def test_a_process_teammate_gets_the_leaders_cap(cli: Cli, layout: Layout, marker: str) -> None:
    """Through the whole chain: the leader's cap ($SHOAL_OUTPUT_CAP) reaches a `process`
    teammate, whose `yes` task is killed and counted as failed, naming the cap."""
    env = {"SHOAL_OUTPUT_CAP": str(CAP)}
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=env)
    assert up.returncode == 0, up.stderr
    try:
        added = cli(
            "task", "add", "flood", "--team", TEAM, "--json",
            "--metadata", json.dumps({"run": f"{PACED_WRITER} {marker}"}),
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        task_id = int(json.loads(added.stdout)["id"])
        spawned = cli("spawn", "w1", "--backend", "process", "--team", TEAM, "--json")
        assert spawned.returncode == 0, spawned.stderr
        tasks = TaskList(Teams(layout), TEAM)
        item = wait_until(
            lambda: (t := tasks.get(task_id)).metadata.get("failures") and t,
            timeout=30,
            what="the flooding task to fail",
        )
        assert f"over the output cap of {CAP} bytes" in str(item.metadata["last_error"])
        wait_until(lambda: marker_pids(marker) == [], timeout=5, what="`yes` to be gone")
        output = Path(json.loads(spawned.stdout)["task_id"])
        outputs = list(layout.home.glob(f"sessions/*/tasks/{output.name}.output"))
        assert len(outputs) == 1
        assert CAP < outputs[0].stat().st_size <= CAP + OUTPUT_CAP_SLACK
        assert os.path.exists(f"/proc/{json.loads(spawned.stdout)['pid']}")  # it lives on
    finally:
        cli("down", "--team", TEAM)
