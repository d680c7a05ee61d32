"""`FileSource` of the fixture team: finished tasks from history, the plan a member waits on."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shoal.core.errors import NotFoundError
from shoal.core.paths import Layout
from shoal.core.tasks import parse_task_state
from shoal.mailbox.store import Maildir
from shoal.teams.session import Session, SessionState
from shoal.teams.store import Teams
from shoal.ui import source as source_module
from shoal.ui.source import FileSource
from tests.unit.test_ui_fixtures import T0, TASK_IDS, add_history, add_plan_request, build_swarm


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Ids of the task records `FileSource` validates from now on, in order."""
    seen: list[str] = []

    def counting(data: dict[str, Any]) -> Any:
        seen.append(str(data.get("id")))
        return parse_task_state(data)

    monkeypatch.setattr(source_module, "parse_task_state", counting)
    return seen


def test_history_records_are_validated_once(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = build_swarm(layout)
    old = add_history(session, 3)
    source = FileSource(layout, "demo")
    first = source.snapshot()
    parsed = count_parses(monkeypatch)
    second = source.snapshot()
    assert sorted(parsed) == sorted(TASK_IDS.values())  # state.json only, not the history
    assert all(first.task(i) is second.task(i) for i in old)  # the same cached rows
    parsed.clear()
    new = add_history(session, 2, first=3)
    third = source.snapshot()
    assert sorted(set(parsed) - set(TASK_IDS.values())) == new  # only the appended records
    assert [t.id for t in third.tasks][-5:] == old + new
    assert all(third.task(i) is second.task(i) for i in old)


def test_history_starts_over_with_a_new_session(layout: Layout) -> None:
    session = build_swarm(layout)
    add_history(session, 3)
    source = FileSource(layout, "demo")
    assert len(source.snapshot().tasks) == 9 + 3
    Session(layout, "02nextsession").ensure().write_state(
        SessionState(session_id="02nextsession", team="demo", created_at=T0, updated_at=T0)
    )
    teams = Teams(layout)
    teams.update("demo", lambda t: t.model_copy(update={"lead_session_id": "02nextsession"}))
    assert source.snapshot().tasks == ()


def test_an_invalid_history_record_is_named(layout: Layout) -> None:
    session = build_swarm(layout)
    with open(session.history_file, "ab") as fh:
        fh.write(orjson.dumps({"id": "bbroken01", "type": "local_bash", "status": "failed"}))
        fh.write(b"\n{torn")  # a line still being written is not read yet
    snapshot = FileSource(layout, "demo").snapshot()
    broken = snapshot.task("bbroken01")
    assert broken is not None and broken.state is None and broken.error
    assert [e for e in snapshot.errors if e.startswith("task bbroken01: ")]


def bob_inbox(layout: Layout) -> list[dict[str, Any]]:
    box = Maildir(layout.inbox_dir("demo", "bob"))
    return [orjson.loads(box.read("new", name)) for name in box.pending()]


def test_an_answered_request_is_not_answered_again(layout: Layout) -> None:
    """Bob's status says it waits without naming the request: the lead's events name it, until
    an answer to it is sent."""
    session = build_swarm(layout)
    add_plan_request(session, "bob", "req-1", "1. rewrite the parser")
    source = FileSource(layout, "demo")
    assert source.pending_plan("bob") == {"request_id": "req-1", "plan": "1. rewrite the parser"}
    assert source.answer_plan("bob", True) == "req-1"
    assert source.pending_plan("bob") is None
    bob = source.snapshot().member("bob")
    assert bob is not None and bob.pending_plan is None
    with pytest.raises(NotFoundError, match=r"^bob is not waiting .*req-1 was answered"):
        source.answer_plan("bob", False, "no")
    assert [m["data"]["request_id"] for m in bob_inbox(layout)] == ["req-1"]
    add_plan_request(session, "bob", "req-2", "2. rewrite it again")  # a new request is answered
    assert source.answer_plan("bob", False, "too risky") == "req-2"


def test_a_status_file_that_stopped_waiting_wins_over_the_events(layout: Layout) -> None:
    """Once the teammate has read the answer it clears `awaiting_approval`, as `shoal approve`
    checks: the request in the lead's events is answered."""
    session = build_swarm(layout)
    add_plan_request(session, "bob", "req-1", "1. rewrite the parser")
    Teams(layout).write_status("demo", "bob", {"state": "idle", "awaiting_approval": None})
    source = FileSource(layout, "demo")
    assert source.pending_plan("bob") is None
    bob = source.snapshot().member("bob")
    assert bob is not None and bob.pending_plan is None
    with pytest.raises(NotFoundError, match=r"^bob is not waiting"):
        source.answer_plan("bob", True)
    assert bob_inbox(layout) == []


def test_without_a_status_file_the_events_say(layout: Layout) -> None:
    session = build_swarm(layout)
    add_plan_request(session, "bob", "req-1", "1. rewrite the parser")
    (layout.status_dir("demo") / "bob.json").unlink()
    source = FileSource(layout, "demo")
    assert source.pending_plan("bob") == {"request_id": "req-1", "plan": "1. rewrite the parser"}
    with pytest.raises(NotFoundError, match=r"^carol has not asked for plan approval"):
        source.answer_plan("carol", True)


def test_the_shared_task_list_is_read_and_shown_on_the_board(layout: Layout) -> None:
    from shoal.teams.tasklist import TaskList
    from shoal.ui.board import board_lines

    build_swarm(layout)
    tl = TaskList(Teams(layout), "demo")
    build = tl.add("build", metadata={"run": "make"})
    tl.add("test", blocked_by=[build.id], metadata={"failures": 2})
    tl.update(build.id, status="in_progress", owner="alice")
    source = FileSource(layout, "demo")
    assert layout.tasklist_dir("demo") in source.watch_paths()  # a change redraws the board
    snap = source.snapshot()
    assert [(i.id, i.status, i.owner, i.open_blockers) for i in snap.items] == [
        (1, "in_progress", "alice", ()),
        (2, "pending", None, (1,)),
    ]
    lines = board_lines(snap, ages=False)
    listing = lines[lines.index("TASK LIST") + 1 :]
    assert listing[0].split() == ["▶", "1", "in_progress", "alice", "build"]
    assert listing[1].endswith("test  (blocked by 1; failed 2x)")


def test_a_corrupt_list_item_is_named_and_the_rest_shown(layout: Layout) -> None:
    from shoal.teams.tasklist import TaskList

    build_swarm(layout)
    tl = TaskList(Teams(layout), "demo")
    tl.add("build")
    (layout.tasklist_dir("demo") / "2.json").write_text("{not json")
    snap = FileSource(layout, "demo").snapshot()
    assert [i.subject for i in snap.items] == ["build"]
    assert any(e.startswith("task list item 2:") for e in snap.errors), snap.errors
