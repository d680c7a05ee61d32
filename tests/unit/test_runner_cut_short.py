"""A turn cut short after its task's command had already finished: the task takes the outcome
the command's recorded exit code says, as when the leader settles a dead teammate. Before, it
went back to the list and ran a second time. Real runners on a real team, in this process.

The order is made certain here, not left to chance: the test holds the runner's event loop
while the command finishes and its exit code is recorded, and aborts the teammate before the
loop can learn of the exit. The runner then sees only a cancelled turn.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from shoal.teams.taskitems import TaskItem
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import Script, ScriptedBrain
from shoal.workers.teammate.commands import records_of
from shoal.workers.teammate.runner import RunnerConfig, TeammateRunner
from tests.polling import wait_until_async


def cut_short_after_its_command(
    layout: Layout, tmp_path: Path, *, code: int, then: list[dict[str, object]] | None = None
) -> tuple[TaskItem, str]:
    """One list task whose command waits for a gate, then logs `done` and exits `code`; the
    teammate is aborted once that exit is recorded, before its loop sees it. The command is
    the task's own (`metadata.run`), or with `then` the first step of a script that goes on
    with those steps. The task after, and the log."""
    teams = Teams(layout)
    teams.create("t")
    tasks = TaskList(teams, "t")
    log, gate = tmp_path / "log", tmp_path / "gate"
    command = (
        f"echo ran >> {log}; while [ ! -f {gate} ]; do sleep 0.02; done; "
        f"echo done >> {log}; exit {code}"
    )
    if then is None:
        item = tasks.add("once", metadata={"run": command})
        script = Script.parse({"step": []})
    else:
        item = tasks.add("once")
        script = Script.parse({"step": [{"run": command, "allow_fail": code != 0}, *then]})
    runner = TeammateRunner(
        layout,
        RunnerConfig(
            team="t",
            name="w",
            brain=ScriptedBrain(script),
            output_file=tmp_path / "w.output",
            cwd=str(tmp_path),
        ),
    )

    async def main() -> None:
        run = asyncio.create_task(runner.run())
        await wait_until_async(lambda: log.exists())  # (its command runs, at the gate)
        [record] = records_of(teams.read_status("t", "w"))
        gate.touch()
        # Blocking on purpose: the runner's loop must not see the command end before the abort.
        deadline = time.monotonic() + 30
        while record.recorded_exit() is None:
            assert time.monotonic() < deadline, "the command's exit was never recorded"
            time.sleep(0.01)
        runner.abort()
        await asyncio.wait_for(run, 30)

    asyncio.run(main())
    return tasks.get(item.id), log.read_text()


def test_a_task_whose_command_had_finished_is_completed_not_sent_back(
    layout: Layout, tmp_path: Path
) -> None:
    item, log = cut_short_after_its_command(layout, tmp_path, code=0)
    assert (item.status, item.owner) == ("completed", "w"), item
    assert item.metadata.get("failures") is None
    assert log == "ran\ndone\n"


def test_a_task_whose_command_had_failed_counts_that_failure(
    layout: Layout, tmp_path: Path
) -> None:
    item, _ = cut_short_after_its_command(layout, tmp_path, code=3)
    assert (item.status, item.owner) == ("pending", None), item
    assert item.metadata["failures"] == 1
    assert str(item.metadata["last_error"]).startswith("command failed with exit code 3")


@pytest.mark.parametrize("code", [0, 3])
def test_a_task_whose_turn_had_more_to_do_goes_back_with_no_failure(
    layout: Layout, tmp_path: Path, code: int
) -> None:
    """The command was not its turn's last step (a failure of it allowed, for 3): the task is
    not finished, so it goes back to the list, and no failure is counted."""
    item, log = cut_short_after_its_command(layout, tmp_path, code=code, then=[{"result": "after"}])
    assert (item.status, item.owner) == ("pending", None), item
    assert item.metadata.get("failures") is None
    assert log == "ran\ndone\n"
