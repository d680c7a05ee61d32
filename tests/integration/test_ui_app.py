"""`shoal ui` driven headless with textual's pilot, on real files and a real leader."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable, Log, Static

from shoal.core.paths import Layout
from shoal.core.tasks import TaskStatus
from shoal.core.taskupdates import update_task
from shoal.mailbox.store import Maildir
from shoal.orchestrator.leader import Leader
from shoal.teams.store import Teams
from shoal.ui.app import MemberDetail, OutputScreen, Overview, Selection, SwarmApp, TaskDetail
from shoal.ui.source import FileSource
from tests.conftest import group_gone
from tests.polling import wait_until_async
from tests.unit.test_ui_fixtures import (
    TASK_IDS,
    add_history,
    add_plan_request,
    build_swarm,
    evict,
)

SIZE = (140, 45)


def run_app(app: SwarmApp, body: Callable[[Pilot[None]], Awaitable[None]]) -> None:
    """Run `app` headless and drive it with `body`."""

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await body(pilot)

    asyncio.run(go())


async def until(pilot: Pilot[None], cond: Callable[[], object], timeout: float = 15.0) -> None:
    """Let the app run until `cond()` holds."""
    await wait_until_async(cond, timeout, interval=0.05, sleep=pilot.pause)


def shown(app: SwarmApp) -> str:
    """The text of the current screen's detail widget."""
    console = Console(record=True, width=120, color_system=None)
    console.print(app.screen.query_one("#detail", Static).content)
    return console.export_text()


async def select(pilot: Pilot[None], table_id: str, key: str) -> None:
    """Focus a table of the overview and put its cursor on the row `key`."""
    app = pilot.app
    assert isinstance(app.screen, Overview)
    table = app.screen.query_one(f"#{table_id}", DataTable)
    table.focus()
    table.move_cursor(row=table.get_row_index(key))
    await pilot.pause()


def inbox(layout: Layout, member: str) -> list[dict[str, Any]]:
    """Messages waiting in `member`'s inbox, oldest first."""
    box = Maildir(layout.inbox_dir("demo", member))
    return [orjson.loads(box.read("new", name)) for name in box.pending()]


@pytest.fixture
def fixture_app(layout: Layout) -> SwarmApp:
    build_swarm(layout)
    return SwarmApp(FileSource(layout, "demo"), watch=False)


def test_overview_lists_tasks_and_members(fixture_app: SwarmApp) -> None:
    async def body(pilot: Pilot[None]) -> None:
        screen = pilot.app.screen
        assert isinstance(screen, Overview)
        tasks = screen.query_one("#tasks", DataTable)
        members = screen.query_one("#members", DataTable)
        assert [r.value for r in tasks.rows] == list(TASK_IDS.values())
        assert [r.value for r in members.rows] == ["team-lead", "alice", "bob", "carol", "dave"]
        assert str(members.get_row("bob")[3]) == "awaiting approval"
        assert str(tasks.get_row(TASK_IDS["failed"])[3]) == "failed(2)"

    run_app(fixture_app, body)


def test_overview_lists_the_shared_task_list(layout: Layout) -> None:
    """The team's task list is a table of the overview: status, owner, what blocks an item."""
    from shoal.teams.tasklist import TaskList

    build_swarm(layout)
    tl = TaskList(Teams(layout), "demo")
    tl.add("build")
    tl.add("test", blocked_by=[1])
    app = SwarmApp(FileSource(layout, "demo"), watch=False)

    async def body(pilot: Pilot[None]) -> None:
        screen = pilot.app.screen
        assert isinstance(screen, Overview)
        items = screen.query_one("#items", DataTable)
        assert [r.value for r in items.rows] == ["1", "2"]
        assert str(items.get_row("2")[4]) == "test  (blocked by 1)"

    run_app(app, body)


def test_overview_lists_finished_tasks_and_follows_changes(layout: Layout) -> None:
    """Tasks evicted into history stay listed; a refresh rewrites changed rows, appends new ones."""
    session = build_swarm(layout)
    old = add_history(session, 40)
    evict(session, TASK_IDS["failed"])
    app = SwarmApp(FileSource(layout, "demo"), watch=False)

    async def body(pilot: Pilot[None]) -> None:
        screen = pilot.app.screen
        assert isinstance(screen, Overview)
        tasks = screen.query_one("#tasks", DataTable)
        assert [r.value for r in tasks.rows] == [*TASK_IDS.values(), *old]
        assert str(tasks.get_row(TASK_IDS["failed"])[3]) == "failed(2)"
        await select(pilot, "tasks", old[5])

        state = session.read_state()
        shell = state.tasks[TASK_IDS["shell"]]
        done = update_task(shell, status=TaskStatus.COMPLETED, end_time=shell.start_time + 5)
        session.write_state(state.model_copy(update={"tasks": {**state.tasks, shell.id: done}}))
        new = add_history(session, 2, first=40)
        app.refresh_data()
        await pilot.pause()
        assert [r.value for r in tasks.rows] == [*TASK_IDS.values(), *old, *new]
        assert str(tasks.get_row(TASK_IDS["shell"])[3]) == "completed"
        assert str(tasks.get_row(TASK_IDS["shell"])[0]) == "✔"
        assert screen.selection() == Selection("task", old[5])  # the cursor stayed

        Teams(layout).update("demo", lambda t: t.model_copy(update={"lead_session_id": None}))
        app.refresh_data()
        await pilot.pause()
        assert tasks.row_count == 0

    run_app(app, body)


DETAILS = [
    ("shell", ["make test", "cwd", "/src", "Output (last lines)", "line 3"]),
    ("failed", ["ruff check", "exit code", "failed(2)"]),
    ("monitor", ["tail -f app.log", "monitor"]),
    ("agent", ["Find flaky tests", "tool uses", "Recent activities", "Grep flaky", "retries"]),
    ("teammate", ["erin@demo", "Editing docs/ui.md", "Write the docs"]),
    ("remote", ["ultraplan", "needs_input", "Plan the migration", "Todo list", "read schema"]),
    ("dream", ["updating", "sessions reviewing", "notes/memory.md", "merged two notes"]),
    ("workflow", ["release", "2/5", "build"]),
    ("mcp", ["github", "org/repo", "12"]),
]


@pytest.mark.parametrize(("kind", "expected"), DETAILS, ids=[k for k, _ in DETAILS])
def test_detail_view_of_each_kind(fixture_app: SwarmApp, kind: str, expected: list[str]) -> None:
    task_id = TASK_IDS[kind]

    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "tasks", task_id)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, TaskDetail))
        assert isinstance(pilot.app.screen, TaskDetail) and pilot.app.screen.task_id == task_id
        text = shown(fixture_app)
        assert task_id in text.splitlines()[0]
        for part in expected:
            assert part in text, f"{part!r} not in the {kind} view:\n{text}"
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, Overview)

    run_app(fixture_app, body)


def test_member_detail(fixture_app: SwarmApp) -> None:
    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "members", "alice")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, MemberDetail))
        text = shown(fixture_app)
        for part in ("alice", "busy", "Reading src/auth.py", "Map the auth module", "1200"):
            assert part in text
        assert "look at the login flow" in text

    run_app(fixture_app, body)


def test_send_a_message(layout: Layout, fixture_app: SwarmApp) -> None:
    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "members", "alice")
        await pilot.press("m")
        await pilot.press(*"hello alice")
        await pilot.press("enter")
        await until(pilot, lambda: inbox(layout, "alice"))

    run_app(fixture_app, body)
    [msg] = inbox(layout, "alice")
    assert (msg["from"], msg["kind"], msg["text"]) == ("team-lead", "text", "hello alice")


def test_message_to_a_teammate_task_goes_to_its_member(layout: Layout) -> None:
    build_swarm(layout)
    layout.ensure(layout.inbox_dir("demo", "erin"))
    from shoal.teams.store import Teams

    Teams(layout).join("demo", "erin")
    app = SwarmApp(FileSource(layout, "demo"), watch=False)

    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "tasks", TASK_IDS["teammate"])
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, TaskDetail))
        await pilot.press("m", *"docs too", "enter")
        await until(pilot, lambda: inbox(layout, "erin"))

    run_app(app, body)
    assert inbox(layout, "erin")[0]["text"] == "docs too"


def test_approve_and_reject_a_plan(layout: Layout) -> None:
    session = build_swarm(layout)
    add_plan_request(session, "bob", "req-1", "1. rewrite the parser")
    app = SwarmApp(FileSource(layout, "demo"), watch=False)

    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "members", "bob")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, MemberDetail))
        assert "1. rewrite the parser" in shown(app)
        await pilot.press("a")
        await until(pilot, lambda: len(inbox(layout, "bob")) == 1)
        add_plan_request(session, "bob", "req-2", "2. rewrite it again")
        await pilot.press("r", *"too risky", "enter")
        await until(pilot, lambda: len(inbox(layout, "bob")) == 2)

    run_app(app, body)
    approve, reject = inbox(layout, "bob")
    assert approve["kind"] == reject["kind"] == "plan_approval_response"
    assert approve["data"] == {"request_id": "req-1", "approve": True, "feedback": None}
    assert reject["data"] == {"request_id": "req-2", "approve": False, "feedback": "too risky"}


def test_approve_the_plan_a_status_file_names(layout: Layout) -> None:
    """A teammate's runner puts {request_id, plan} in its status file; that request is answered."""
    from shoal.teams.store import Teams

    session = build_swarm(layout)
    add_plan_request(session, "bob", "req-old", "an older plan")
    plan = {"request_id": "req-9", "plan": "3. ship it"}
    Teams(layout).write_status("demo", "bob", {"state": "idle", "awaiting_approval": plan})
    app = SwarmApp(FileSource(layout, "demo"), watch=False)

    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "members", "bob")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, MemberDetail))
        assert "3. ship it" in shown(app)
        await pilot.press("a")
        await until(pilot, lambda: inbox(layout, "bob"))

    run_app(app, body)
    assert inbox(layout, "bob")[0]["data"]["request_id"] == "req-9"


def test_approving_without_a_request_says_so(layout: Layout, fixture_app: SwarmApp) -> None:
    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "members", "alice")
        await pilot.press("a")
        await until(pilot, lambda: pilot.app._notifications)
        [note] = list(pilot.app._notifications)
        assert note.severity == "error"
        assert "alice has not asked for plan approval" in note.message

    run_app(fixture_app, body)
    assert inbox(layout, "alice") == []


def test_follow_output(layout: Layout) -> None:
    build_swarm(layout)
    app = SwarmApp(FileSource(layout, "demo"), watch=True, fallback=0.1)
    output = Path(layout.session_dir("01fixturesession") / "tasks" / f"{TASK_IDS['shell']}.output")

    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "tasks", TASK_IDS["shell"])
        await pilot.press("f")
        await until(pilot, lambda: isinstance(pilot.app.screen, OutputScreen))
        log = pilot.app.screen.query_one("#output", Log)
        await until(pilot, lambda: list(log.lines)[:3] == ["compiling", "line 2", "line 3"])
        with open(output, "a") as fh:
            fh.write("line 4\n")
        await until(pilot, lambda: "line 4" in log.lines)

    run_app(app, body)


def test_follow_a_long_output_starts_near_its_end(layout: Layout) -> None:
    build_swarm(layout)
    output = layout.session_dir("01fixturesession") / "tasks" / f"{TASK_IDS['shell']}.output"
    output.write_text("".join(f"line {i:06d} ünïcode\n" for i in range(10_000)))
    app = SwarmApp(FileSource(layout, "demo"), watch=False)

    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "tasks", TASK_IDS["shell"])
        await pilot.press("f")
        await until(pilot, lambda: isinstance(pilot.app.screen, OutputScreen))
        lines = list(pilot.app.screen.query_one("#output", Log).lines)
        assert lines[-1] == "line 009999 ünïcode"
        assert 2000 < len(lines) < 4000  # about the last 64 KiB, not all 10 000 lines
        assert lines[0].startswith("line 00") and lines[0].endswith("ünïcode")

    run_app(app, body)


@pytest.fixture
def leader(layout: Layout) -> Iterator[Leader]:
    """A real leader for team demo, running in this process."""
    lead = Leader(layout, "demo").start()
    stop = threading.Event()
    thread = threading.Thread(target=lead.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield lead
    finally:
        stop.set()
        lead.wake()
        thread.join(timeout=30)
        lead.shutdown()


def test_stop_a_task(layout: Layout, leader: Leader) -> None:
    task = leader.submit_shell(["sleep 300"])
    running = leader.registry.get(task.id)
    assert running is not None and running.status == TaskStatus.RUNNING
    pid = getattr(running, "pid", None)
    assert pid is not None
    app = SwarmApp(FileSource(layout, "demo"))

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshot.task(task.id) is not None)
        app.refresh_data()
        await select(pilot, "tasks", task.id)
        await pilot.press("s")

        def killed() -> bool:
            row = app.snapshot.task(task.id)
            return row is not None and row.status == "killed"

        await until(pilot, killed, timeout=30)
        assert isinstance(app.screen, Overview)
        table = app.screen.query_one("#tasks", DataTable)
        assert str(table.get_row(task.id)[3]) == "killed"

    run_app(app, body)
    final = leader.registry.get(task.id) or leader.session.history()[task.id]
    status = final.status if not isinstance(final, dict) else final["status"]
    assert status == TaskStatus.KILLED
    assert group_gone(pid)


def test_stop_from_the_detail_view_without_a_leader(layout: Layout, fixture_app: SwarmApp) -> None:
    async def body(pilot: Pilot[None]) -> None:
        await select(pilot, "tasks", TASK_IDS["shell"])
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, TaskDetail))
        await pilot.press("s")
        await until(pilot, lambda: any(n.severity == "error" for n in pilot.app._notifications))
        errors = [n.message for n in pilot.app._notifications if n.severity == "error"]
        assert "stop failed" in errors[0]

    # The fixture's lead is this test process, but no leader loop answers: stop the lead first.
    from shoal.teams.store import Teams

    Teams(layout).update_member("demo", "team-lead", pid=None, pid_started_at=None)
    run_app(fixture_app, body)
