"""A teammate whose pane went away (its member pid, the pane's stub, died) does not count a
command killed meanwhile as its task's failure: whoever settles the dead member KILLs that
command, and the task goes back to the list. Real runners on a real team, in this process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import Script, ScriptedBrain
from shoal.workers.teammate.runner import RunnerConfig, TeammateRunner
from tests.polling import wait_until_async


def run_killed_command(layout: Layout, tmp_path: Path, *, pane_dies: bool) -> dict[str, object]:
    """One list task whose command is killed by SIGKILL (it kills its own wrapper once a gate
    opens), run by a teammate whose member pid is a stand-in for its pane's stub, which dies
    first when `pane_dies`; the task's metadata once that turn has ended."""
    teams = Teams(layout)
    teams.create("t")
    tasks = TaskList(teams, "t")
    log, gate = tmp_path / "log", tmp_path / "gate"
    command = f"echo ran >> {log}; while [ ! -f {gate} ]; do sleep 0.02; done; kill -9 $$"
    item = tasks.add("killed", metadata={"run": command})
    stub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    config = RunnerConfig(
        team="t",
        name="w",
        brain=ScriptedBrain(Script.parse({"step": []})),
        output_file=tmp_path / "w.output",
        cwd=str(tmp_path),
        member_pid=stub.pid,
    )
    runner = TeammateRunner(layout, config)

    async def main() -> None:
        task = asyncio.create_task(runner.run())
        await wait_until_async(lambda: log.exists())  # (a turn runs its command)
        if pane_dies:
            stub.kill()
            stub.wait()
        gate.touch()
        # The turn ended and its task was settled: it was claimed and run again (the pane's
        # teammate lives on until it is hung up), or its failure was counted.
        await wait_until_async(
            lambda: (
                log.read_text().count("ran") >= 2
                or tasks.get(item.id).metadata.get("failures") is not None
            )
        )
        runner.abort()
        await asyncio.wait_for(task, 30)

    try:
        asyncio.run(main())
    finally:
        stub.kill()
        stub.wait()
    return dict(tasks.get(item.id).metadata)


def test_a_command_killed_under_a_teammate_whose_pane_died_is_no_failure(
    layout: Layout, tmp_path: Path
) -> None:
    meta = run_killed_command(layout, tmp_path, pane_dies=True)
    assert meta.get("failures") is None, meta


def test_a_command_killed_under_a_live_teammate_is_a_failure(
    layout: Layout, tmp_path: Path
) -> None:
    meta = run_killed_command(layout, tmp_path, pane_dies=False)
    failures = meta.get("failures")
    assert isinstance(failures, int) and failures >= 1, meta
    assert "exit code -9" in str(meta.get("last_error")), meta
