"""A teammate that approves a shutdown leaves at once, whatever it was doing: waiting for a plan
approval, in the middle of a step, or idle. Real runners on a real team, in this process."""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.mailbox.router import send
from shoal.mailbox.schema import AnyMessage, decode
from shoal.mailbox.store import Maildir
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import MemberState, Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import Script, ScriptedBrain
from shoal.workers.teammate.runner import RunnerConfig, TeammateRunner
from tests.polling import wait_until_async

# Far below the lead's shutdown timeout, far above what leaving takes.
PROMPT_S = 5.0


@pytest.fixture
def teams(layout: Layout) -> Teams:
    t = Teams(layout)
    t.create("t")
    return t


def lead_messages(layout: Layout, kind: str) -> list[AnyMessage]:
    box = Maildir.open(layout.inbox_dir("t", LEAD_NAME))
    found = [decode(box.read("new", name)) for name in box.pending()]
    return [m for m in found if m.kind == kind]


def make_runner(
    layout: Layout, tmp_path: Path, name: str, steps: list[dict[str, Any]], *, plan_mode: bool
) -> TeammateRunner:
    config = RunnerConfig(
        team="t",
        name=name,
        brain=ScriptedBrain(Script.parse({"step": steps})),
        output_file=tmp_path / f"{name}.output",
        cwd=str(tmp_path),
        plan_mode=plan_mode,
    )
    return TeammateRunner(layout, config)


def awaiting_approval(teams: Teams, name: str) -> bool:
    """Member `name` of team `t` says in its status that it waits for a plan approval."""
    return bool((teams.read_status("t", name) or {}).get("awaiting_approval"))


def ask_to_shut_down(teams: Teams, name: str) -> None:
    send(
        teams.directory("t"),
        to=name,
        sender=LEAD_NAME,
        kind="shutdown_request",
        data={"request_id": secrets.token_hex(8), "reason": "test"},
    )


async def leaves_promptly(runner: TeammateRunner, task: asyncio.Task[int]) -> float:
    """Seconds until the runner's task ended; fails (and aborts it) past PROMPT_S."""
    started = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=PROMPT_S)
    if not done:
        runner.abort()
        await asyncio.wait({task}, timeout=PROMPT_S)
        pytest.fail(f"{runner.name} did not leave within {PROMPT_S}s of approving a shutdown")
    return time.monotonic() - started


def test_leaves_while_waiting_for_plan_approval(
    layout: Layout, teams: Teams, tmp_path: Path
) -> None:
    """Whichever of its loops reads the request (the turn's or the runner's), it leaves."""
    tasks = TaskList(teams, "t")
    marker = tmp_path / "ran"

    async def main() -> None:
        for round_ in range(6):
            name = f"pq{round_}"
            runner = make_runner(
                layout, tmp_path, name, [{"run": f"touch {marker}"}], plan_mode=True
            )
            if round_ % 2:  # claimed from the list
                item = tasks.add(f"job {round_}")
                task = asyncio.create_task(runner.run())
            else:  # assigned to it (a task_assignment message)
                task = asyncio.create_task(runner.run())
                await asyncio.wait_for(runner.ready.wait(), 15)
                item = tasks.add(f"job {round_}", owner=name)
            await wait_until_async(functools.partial(awaiting_approval, teams, name))
            ask_to_shut_down(teams, name)
            await leaves_promptly(runner, task)
            assert task.result() == 0 and runner.shutdown_approved
            status = teams.read_status("t", name) or {}
            assert status["state"] == "stopped" and not status.get("awaiting_approval")
            assert teams.read("t").member(name).is_active is False  # type: ignore[union-attr]
            # Cut short by the shutdown: back on the list, not counted as a failure.
            for left in tasks.list():
                assert left.status == "pending" and left.owner is None
                assert "failures" not in (left.metadata or {})
            assert tasks.get(item.id).status == "pending"
        assert not marker.exists()  # no plan was approved: nothing ran
        answers = lead_messages(layout, "shutdown_response")
        assert len(answers) == 6 and all(m.data.approve for m in answers)  # type: ignore[attr-defined]
        notes = lead_messages(layout, "task_notification")
        assert notes and all(m.data.status == "killed" for m in notes)  # type: ignore[attr-defined]

    asyncio.run(main())


def test_leaves_in_the_middle_of_a_step(layout: Layout, teams: Teams, tmp_path: Path) -> None:
    tasks = TaskList(teams, "t")
    item = tasks.add("slow")

    async def main() -> None:
        runner = make_runner(
            layout, tmp_path, "slo", [{"run": "sleep 300"}, {"run": "touch after"}], plan_mode=False
        )
        task = asyncio.create_task(runner.run())
        await wait_until_async(lambda: (teams.read_status("t", "slo") or {}).get("state") == "busy")
        await wait_until_async(
            lambda: "sleep" in str((teams.read_status("t", "slo") or {}).get("activity"))
        )
        ask_to_shut_down(teams, "slo")
        await leaves_promptly(runner, task)
        assert task.result() == 0 and runner.shutdown_approved

    asyncio.run(main())
    assert not (tmp_path / "after").exists()
    assert tasks.get(item.id).status == "pending" and tasks.get(item.id).owner is None
    states = {v.member.name: v.state for v in teams.members("t")}
    assert states["slo"] is MemberState.LEFT


def test_leaves_when_idle(layout: Layout, teams: Teams, tmp_path: Path) -> None:
    async def main() -> None:
        runner = make_runner(layout, tmp_path, "idl", [], plan_mode=False)
        task = asyncio.create_task(runner.run())
        await asyncio.wait_for(runner.ready.wait(), 15)
        ask_to_shut_down(teams, "idl")
        await leaves_promptly(runner, task)
        assert task.result() == 0 and runner.shutdown_approved

    asyncio.run(main())


def test_abort_while_waiting_for_plan_approval(
    layout: Layout, teams: Teams, tmp_path: Path
) -> None:
    """Aborting the whole teammate (SIGTERM in a worker process) also ends a plan wait."""
    tasks = TaskList(teams, "t")
    item = tasks.add("write")

    async def main() -> None:
        runner = make_runner(layout, tmp_path, "abo", [{"run": "touch x"}], plan_mode=True)
        task = asyncio.create_task(runner.run())
        await wait_until_async(functools.partial(awaiting_approval, teams, "abo"))
        runner.abort()
        await leaves_promptly(runner, task)
        assert not runner.shutdown_approved  # aborted, not departed

    asyncio.run(main())
    assert tasks.get(item.id).status == "pending" and tasks.get(item.id).owner is None
    assert not (tmp_path / "x").exists()
