"""A teammate's task record and team-file entry stay true to the member, and a teammate waiting
for a plan approval still shuts down when the lead goes: driven through the real CLI."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.tasks import TEAMMATE_MESSAGES_UI_CAP, InProcessTeammateTaskState, parse_task_state
from shoal.mailbox.router import send
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import JoinSpec, MemberState, Teams
from shoal.teams.tasklist import TaskList
from shoal.ui.details import teammate_detail
from tests.conftest import Cli
from tests.integration.test_leader import FAST, LeaderProc
from tests.integration.test_swarm import events, messages, spawn, states
from tests.polling import describe, wait_until

# Long enough that a teammate the lead had to kill cannot pass for one that left.
SHUTDOWN_TIMEOUT = "30"


@pytest.fixture
def leader(home: Path, cli: Cli, tmp_path: Path) -> Iterator[LeaderProc]:
    proc = LeaderProc(
        home,
        env={
            "SHOAL_SHUTDOWN_TIMEOUT": SHUTDOWN_TIMEOUT,
            "SHOAL_TMUX_SOCKET": f"shoal-test-{tmp_path.name}",
        },
    )
    yield proc
    cli("down", "--team", "t", env=FAST)
    proc.stop()


def record(cli: Cli, task_id: str) -> dict[str, Any]:
    out = cli("ps", "--all", "--json", "--team", "t")
    assert out.returncode == 0, out.stderr
    return next(r for r in json.loads(out.stdout) if r["id"] == task_id)


def record_until(
    cli: Cli, task_id: str, cond: Callable[[dict[str, Any]], object], timeout: float = 30
) -> dict[str, Any]:
    """The teammate's record as `shoal ps --json` shows it, once `cond` holds for it."""
    seen: list[dict[str, Any]] = []

    def matched() -> dict[str, Any] | None:
        seen[:] = [record(cli, task_id)]
        return seen[0] if cond(seen[0]) else None

    return wait_until(
        matched, timeout, interval=0.1, what=lambda: f"record to match {describe(cond)}: {seen}"
    )


def detail_text(rec: dict[str, Any]) -> str:
    """The teammate detail view of `shoal ui` for this record, as plain text."""
    task = parse_task_state(rec)
    assert isinstance(task, InProcessTeammateTaskState)
    fields, sections = teammate_detail(task)
    lines = [f"{k}: {v}" for k, v in fields if v is not None]
    lines += [s.plain for s in sections if s is not None]
    return "\n".join(lines)


@pytest.mark.parametrize(
    "backend", ["process", "in-process", pytest.param("tmux", marks=pytest.mark.tmux)]
)
def test_a_teammate_waiting_for_plan_approval_shuts_down(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path, backend: str
) -> None:
    script = tmp_path / "plan.toml"
    script.write_text(f'[[step]]\nrun = "touch {tmp_path / "ran"}"\n')
    info = spawn(cli, "pq", "--backend", backend, "--plan-mode", "--script", str(script))
    assert cli("task", "add", "--team", "t", "x", "--owner", "pq").returncode == 0
    teams = Teams(Layout(home))
    wait_until(lambda: (teams.read_status("t", "pq") or {}).get("awaiting_approval"))
    down = cli("down", "--team", "t")
    assert down.returncode == 0, down.stderr
    assert leader.proc.wait(60) == 0
    notes = [e.get("text", "") for e in events(home) if e.get("subtype") == "note"]
    assert not any("did not shut down" in n for n in notes), notes
    answers = messages(home, "shutdown_response")
    assert [m["from"] for m in answers] == ["pq"] and answers[0]["data"]["approve"] is True
    assert states(home)["pq"] is MemberState.LEFT
    assert not (tmp_path / "ran").exists()
    (item,) = TaskList(teams, "t").list()
    assert item.status == "pending" and item.owner is None
    assert "failures" not in (item.metadata or {})
    ended = [
        e
        for e in events(home)
        if e.get("subtype") == "task_terminated" and e["task_id"] == info["task_id"]
    ]
    assert [e["status"] for e in ended] == ["completed"]
    if backend != "in-process":
        wait_until(lambda: not is_alive(info["pid"], None))


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_the_teammate_record_follows_the_member(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path, backend: str
) -> None:
    log = tmp_path / "log"
    script = tmp_path / "bob.toml"
    script.write_text(
        f'[[step]]\nrun = "echo {{prompt}} >> {log}"\n[[step]]\nreply = "bob did {{prompt}}"\n'
    )
    info = spawn(
        cli, "bob", "--backend", backend, "--plan-mode", "--script", str(script), "--prompt", "one"
    )
    task_id = info["task_id"]
    pending = record_until(cli, task_id, lambda r: r["awaiting_plan_approval"])
    assert pending["prompt"] == "one" and not pending["is_idle"]
    assert "awaiting approval" in detail_text(pending)
    assert cli("approve", "--team", "t", "bob").returncode == 0
    done = record_until(
        cli,
        task_id,
        lambda r: (
            not r["awaiting_plan_approval"]
            and r["is_idle"]
            and (r["progress"] or {}).get("tool_use_count") == 2
            and "task_notification" in {m["kind"] for m in r["messages"]}
        ),
    )
    assert log.read_text() == "one\n"
    progress = done["progress"]
    assert [a["description"] for a in progress["recent_activities"]] == [
        f"run: echo one >> {log}",
        "reply",
    ]
    assert progress["summary"] == 'bob: "one" completed'
    kinds = [(m["from"], m["kind"]) for m in done["messages"]]
    # What bob received (its status file lists it) and what it sent the lead, in order.
    for expected in [
        (LEAD_NAME, "text"),
        ("bob", "plan_approval_request"),
        (LEAD_NAME, "plan_approval_response"),
        ("bob", "text"),
        ("bob", "task_notification"),
    ]:
        assert expected in kinds, (expected, kinds)
    assert kinds.index((LEAD_NAME, "text")) < kinds.index(("bob", "plan_approval_request"))
    assert kinds.index(("bob", "plan_approval_request")) < kinds.index(("bob", "text"))
    sent_at = [m["sent_at"] for m in done["messages"]]
    assert sent_at == sorted(sent_at)
    note = next(m for m in done["messages"] if m["kind"] == "task_notification")
    assert note["text"] == 'bob: "one" completed'  # the summary, not the XML
    view = detail_text(done)
    assert "Recent activities" in view and "run: echo one" in view
    assert "Messages" in view and "bob did one" in view

    # A rejected plan clears the flag too.
    assert cli("send", "--team", "t", "bob", "two").returncode == 0
    record_until(cli, task_id, lambda r: r["awaiting_plan_approval"])
    assert cli("reject", "--team", "t", "bob", "--feedback", "not now").returncode == 0
    rejected = record_until(
        cli,
        task_id,
        lambda r: not r["awaiting_plan_approval"] and r["is_idle"] and "two" in str(r["progress"]),
    )
    assert rejected["progress"]["tool_use_count"] == 2
    assert log.read_text() == "one\n"

    # The messages kept are the last TEAMMATE_MESSAGES_UI_CAP.
    directory = Teams(Layout(home)).directory("t")
    for i in range(TEAMMATE_MESSAGES_UI_CAP + 10):
        send(directory, to="bob", sender=LEAD_NAME, kind="progress", data={"activity": str(i)})
    capped = record_until(
        cli,
        task_id,
        lambda r: (
            len(r["messages"]) == TEAMMATE_MESSAGES_UI_CAP
            and all(m["kind"] == "progress" for m in r["messages"])
        ),
    )
    assert len(capped["messages"]) == TEAMMATE_MESSAGES_UI_CAP


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_spawn_saves_the_prompt_in_the_team_file(
    cli: Cli, leader: LeaderProc, home: Path, backend: str
) -> None:
    spawn(cli, "ex", "--backend", backend, "--prompt", "review src/")
    teams = Teams(Layout(home))
    wait_until(lambda: messages(home, "task_notification"), timeout=30)
    member = teams.read("t").member("ex")
    assert member is not None and member.prompt == "review src/"
    assert json.loads(teams.layout.team_file("t").read_text())["members"][1]["prompt"] == (
        "review src/"
    )
    plain = spawn(cli, "ey", "--backend", backend)
    assert plain["name"] == "ey"
    assert teams.read("t").member("ey").prompt is None  # type: ignore[union-attr]


def test_a_joining_worker_keeps_the_prompt_its_spawner_saved(teams: Teams, sleeper: Any) -> None:
    teams.create("t")
    teams.join_many("t", [JoinSpec(name="ex", prompt="review src/")])
    proc = sleeper()
    assert teams.join("t", "ex", pid=proc.pid).prompt == "review src/"
    assert teams.join("t", "ex", pid=proc.pid, prompt="other").prompt == "other"
    teams.leave("t", "ex")
    # Someone joining under a departed member's name does not inherit its prompt.
    assert teams.join("t", "ex", pid=proc.pid).prompt is None
