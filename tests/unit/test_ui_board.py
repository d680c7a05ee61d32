"""The status board of a fixture team, rendered to strings; its redraw loop and data source."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest
from rich.console import Console

from shoal.core.paths import Layout
from shoal.core.tasks import TaskStatus
from shoal.core.taskupdates import update_task
from shoal.ui.board import (
    FINISHED_SHOWN,
    Board,
    board_text,
    member_line,
    render_board,
    run_board,
    wants_plain,
)
from shoal.ui.source import FileSource, Snapshot
from tests.polling import wait_until
from tests.unit.test_ui_fixtures import (
    NOW,
    SESSION,
    T0,
    TASK_IDS,
    add_history,
    add_plan_request,
    build_swarm,
    evict,
)


@pytest.fixture
def snapshot(layout: Layout) -> Snapshot:
    build_swarm(layout)
    return FileSource(layout, "demo").snapshot()


def test_snapshot_reads_every_file(snapshot: Snapshot) -> None:
    assert snapshot.errors == ()
    assert snapshot.session_id == SESSION
    assert snapshot.leader_pid == os.getpid()
    assert [m.name for m in snapshot.members] == ["team-lead", "alice", "bob", "carol", "dave"]
    assert [m.state for m in snapshot.members] == ["active", "busy", "idle", "dead", "left"]
    assert [t.id for t in snapshot.tasks] == list(TASK_IDS.values())  # by start time
    assert all(t.state is not None for t in snapshot.tasks)
    assert snapshot.pill == "7 background tasks"


def test_plain_board(snapshot: Snapshot) -> None:
    assert board_text(snapshot, now=NOW) == (
        f"team demo  session {SESSION}  leader pid {os.getpid()}  [7 background tasks]\n"
        "MEMBERS\n"
        "  ▶ team-lead  active  leading\n"
        "  ▶ alice      busy    Reading src/auth.py  (task 3, 7 tools, 1200 tokens)\n"
        "  ? bob        idle    awaiting approval\n"
        "  ✘ carol      dead\n"
        "  ✔ dave       left\n"
        "TASKS\n"
        "  ▶ bshell001  shell     running       1.5m  make test\n"
        "  ✘ bfailed01  shell     failed(2)     4.0s  lint\n"
        "  ▶ bmonitor1  monitor   running       1.5m  tail the log\n"
        "  ▶ aagent001  agent     running       1.4m  find flaky tests\n"
        "  ▶ rremote01  remote    running       1.4m  plan the migration\n"
        "  ▶ tteammat1  teammate  running       1.4m  erin: write docs · Editing docs/ui.md\n"
        "  ▶ ddream001  dream     running       1.4m  consolidating memory\n"
        "  ▶ wworkflo1  workflow  running       1.4m  release · 2/5 steps (running: build)\n"
        "  ▶ mmcpmon01  mcp       running       1.4m  watch PRs\n"
    )


def test_rich_board(snapshot: Snapshot) -> None:
    console = Console(record=True, width=120, color_system=None)
    console.print(render_board(snapshot, now=NOW))
    lines = [ln.rstrip() for ln in console.export_text().splitlines()]
    assert lines[0].startswith(f"team demo  session {SESSION}  leader pid {os.getpid()}")
    assert lines[0].endswith("7 background tasks")
    member_rows = [ln for ln in lines if "●" in ln]
    assert [ln.split()[2] for ln in member_rows] == ["team-lead", "alice", "bob", "carol", "dave"]
    assert member_rows[1].split()[:5] == ["▶", "●", "alice", "busy", "Reading"]
    assert member_rows[2].split()[:6] == ["?", "●", "bob", "idle", "awaiting", "approval"]
    task_rows = [
        ln.split() for ln in lines if ln[3:4] in "bartdwm" and ln[3:12] in TASK_IDS.values()
    ]
    assert [r[1] for r in task_rows] == list(TASK_IDS.values())
    assert task_rows[0][:6] == ["▶", "bshell001", "shell", "running", "1.5m", "make"]
    assert task_rows[1][:5] == ["✘", "bfailed01", "shell", "failed(2)", "4.0s"]


def test_board_shows_a_task_evicted_into_history(layout: Layout) -> None:
    """The leader moves a finished task from state.json to history.jsonl; it stays listed."""
    session = build_swarm(layout)
    source = FileSource(layout, "demo")
    before = board_text(source.snapshot(), now=NOW)
    evict(session, TASK_IDS["failed"])
    assert TASK_IDS["failed"] not in session.read_state().tasks
    snapshot = source.snapshot()
    assert snapshot.errors == ()
    assert [t.id for t in snapshot.tasks] == list(TASK_IDS.values())  # still by start time
    assert board_text(snapshot, now=NOW) == before
    assert "  ✘ bfailed01  shell     failed(2)     4.0s  lint\n" in before
    assert snapshot.pill == "7 background tasks"  # finished tasks never count


def test_board_lists_only_the_latest_finished_tasks(layout: Layout) -> None:
    session = build_swarm(layout)
    ids = add_history(session, 25)  # bhist0000..24 end at T0 + 21 ... T0 + 45
    state = session.read_state()  # the oldest ends last, so it is among the latest by end
    first = state.tasks[TASK_IDS["shell"]]
    early = first.model_copy(update={"id": "bearly001", "start_time": first.start_time - 5})
    done = update_task(early, status=TaskStatus.COMPLETED, end_time=T0 + 99)
    session.write_state(state.model_copy(update={"tasks": {**state.tasks, done.id: done}}))
    snapshot = FileSource(layout, "demo").snapshot()
    assert len(snapshot.tasks) == 9 + 25 + 1
    assert snapshot.pill == "7 background tasks"

    text = board_text(snapshot, now=NOW)
    task_part = text.split("TASKS\n")[1].splitlines()
    listed = [ln.split()[1] for ln in task_part if ln[2:3] in "▶✘✔"]
    running = [t for t in TASK_IDS.values() if t != TASK_IDS["failed"]]
    latest = ["bearly001", *ids[-(FINISHED_SHOWN - 1) :]]
    assert sorted(listed) == sorted(running + latest)
    assert listed[0] == "bearly001"  # in start-time order, as always
    left_out = 25 + 1 + 1 - FINISHED_SHOWN
    assert text.endswith(f"\n  + {left_out} earlier finished tasks (shoal ps --all)\n")

    console = Console(record=True, width=120, color_system=None)
    console.print(render_board(snapshot, now=NOW))
    rendered = console.export_text()
    assert f"+ {left_out} earlier finished tasks (shoal ps --all)" in rendered
    assert "bhist0024" in rendered and "bhist0015" not in rendered


def test_board_leaves_no_line_when_every_finished_task_fits(layout: Layout) -> None:
    session = build_swarm(layout)
    add_history(session, FINISHED_SHOWN - 1)  # with the fixture's failed task: exactly enough
    text = board_text(FileSource(layout, "demo").snapshot(), now=NOW)
    assert "earlier finished" not in text
    assert "bfailed01" in text and "bhist0000" in text


def test_colours(snapshot: Snapshot) -> None:
    alice = member_line(snapshot.member("alice"))  # type: ignore[arg-type]
    assert (alice.color, alice.icon_style) == ("red", "bright_blue")
    bob = member_line(snapshot.member("bob"))  # type: ignore[arg-type]
    assert bob.icon_style == "yellow"
    carol = member_line(snapshot.member("carol"))  # type: ignore[arg-type]
    assert carol.icon_style == "red"
    console = Console(record=True, width=120, force_terminal=True, color_system="standard")
    console.print(render_board(snapshot, now=NOW))
    styled = console.export_text(styles=True)
    assert "\x1b[31m● \x1b[0m\x1b[31malice\x1b[0m" in styled  # alice's dot and name in red


def test_recent_events_and_errors(layout: Layout) -> None:
    session = build_swarm(layout)
    add_plan_request(session, "bob", "req-1", "1. rewrite the parser")
    (layout.team_dir("demo") / "status" / "alice.json").write_text("{broken")
    snapshot = FileSource(layout, "demo").snapshot()
    bob = snapshot.member("bob")
    assert bob is not None
    assert bob.pending_plan == {"request_id": "req-1", "plan": "1. rewrite the parser"}
    text = board_text(snapshot, now=NOW, events=5)
    assert "message  bob [plan_approval_request] 1. rewrite the parser" in text
    assert "  ▶ alice      active  working\n" in text  # unreadable status: alive, no detail


def test_corrupt_state_is_shown_not_raised(layout: Layout) -> None:
    session = build_swarm(layout)
    session.state_file.write_bytes(b"{oops")
    snapshot = FileSource(layout, "demo").snapshot()
    assert snapshot.tasks == ()
    assert "cannot read" in snapshot.errors[0] and "state.json" in snapshot.errors[0]
    assert "error: cannot read" in board_text(snapshot)


def test_missing_team(layout: Layout) -> None:
    snapshot = FileSource(layout, "nope").snapshot()
    assert snapshot.errors == ("no team 'nope' (start its leader with `shoal up --team nope`)",)
    assert board_text(snapshot).endswith(
        "error: no team 'nope' (start its leader with `shoal up --team nope`)\n"
    )


def test_plain_when_not_a_terminal_or_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert wants_plain(Console(file=io.StringIO()))
    assert not wants_plain(Console(file=io.StringIO(), force_terminal=True))
    monkeypatch.setenv("NO_COLOR", "1")
    assert wants_plain(Console(file=io.StringIO(), force_terminal=True))


def test_board_redraws_when_files_change(layout: Layout) -> None:
    """A change on disk brings a new block, although the fallback tick is far away."""
    session = build_swarm(layout)
    out = io.StringIO()
    board = Board(FileSource(layout, "demo"), out=out, fallback=60.0).start()
    try:
        wait_until(lambda: "TASKS" in out.getvalue(), timeout=10)
        assert out.getvalue().count("TASKS") == 1
        state = session.read_state()
        shell = state.tasks[TASK_IDS["shell"]]
        done = update_task(shell, status=TaskStatus.COMPLETED, end_time=shell.start_time + 5)
        tasks = {**state.tasks, shell.id: done}
        session.write_state(state.model_copy(update={"tasks": tasks}))
        wait_until(lambda: out.getvalue().count("TASKS") == 2, timeout=10)
        assert "  ✔ bshell001  shell     completed" in out.getvalue().split("\n\n")[-1]
    finally:
        board.stop()
        board.join(timeout=10)
    assert board.thread is not None and not board.thread.is_alive()


def test_unchanged_files_print_nothing_new(layout: Layout, tmp_path: Path) -> None:
    """Ages move on every tick, but a plain board prints a new block only on real changes."""
    build_swarm(layout)
    out = io.StringIO()
    stop = threading.Event()
    thread = threading.Thread(
        target=run_board,
        args=(FileSource(layout, "demo"),),
        kwargs={"out": out, "stop": stop, "fallback": 0.05},
    )
    thread.start()
    try:
        wait_until(lambda: "TASKS" in out.getvalue(), timeout=10)
        stop.wait(0.5)  # about ten fallback ticks
        assert out.getvalue().count("TASKS") == 1
    finally:
        stop.set()
        thread.join(timeout=10)


def test_an_agent_line_shows_the_lease_it_waits_for_its_budget_and_violations() -> None:
    from shoal.ui.board import task_line
    from shoal.ui.source import TaskRow

    record = {
        "id": "a1b2c3d4e", "type": "local_agent", "status": "pending", "description": "fix",
        "start_time": NOW, "agent_type": "general-purpose",
        "waiting_for": {"lease": "a9a9a9a9a", "write_set": ["src/*.py"]},
        "budget": {"tokens": 20000, "tool_uses": 40}, "progress": {"token_count": 1200,
                                                              "tool_use_count": 3},
        "violations": [{"command": "touch x", "paths": ["x"]}],
    }  # fmt: skip
    line = task_line(TaskRow(record=record), NOW)
    assert "[waiting for the lease of a9a9a9a9a]" in line.description
    assert "[budget: 1,200/20,000 tokens, 3/40 tool uses]" in line.description
    assert "[1 lease violation(s)]" in line.description
