"""The shared task list on real files: ids, dependencies, claims, release, notices, bad input."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.core.errors import (
    ConflictError,
    CorruptFileError,
    InvalidNameError,
    NotFoundError,
    UnsafePathError,
    UsageError,
)
from shoal.core.paths import Layout
from shoal.mailbox.schema import decode
from shoal.teams.store import Teams
from shoal.teams.taskitems import ClaimRefused, TaskItem
from shoal.teams.tasklist import TaskList

TEAM = "alpha"


@pytest.fixture
def tl(teams: Teams) -> TaskList:
    """A team with members alice, bob and carol, and its (empty) task list."""
    teams.create(TEAM)
    for name in ("alice", "bob", "carol"):
        teams.join(TEAM, name)
    return TaskList(teams, TEAM)


def tdir(tl: TaskList) -> Path:
    return tl.layout.tasklist_dir(TEAM)


def on_disk(tl: TaskList, task_id: int) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((tdir(tl) / f"{task_id}.json").read_bytes())
    return data


def inbox_messages(tl: TaskList, name: str) -> list[dict[str, Any]]:
    new = tl.layout.inbox_dir(TEAM, name) / "new"
    return [orjson.loads((new / f).read_bytes()) for f in sorted(os.listdir(new))]


def snapshot_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# -- the disk format and ids -----------------------------------------------------------------


def test_add_writes_the_documented_disk_format(tl: TaskList) -> None:
    item = tl.add("write docs", description="the README", active_form="Writing docs")
    assert item.id == 1
    data = on_disk(tl, 1)
    assert data == {
        "v": 1,
        "id": 1,
        "subject": "write docs",
        "description": "the README",
        "active_form": "Writing docs",
        "owner": None,
        "status": "pending",
        "blocks": [],
        "blocked_by": [],
        "metadata": {},
        "created_at": item.created_at,
        "updated_at": item.updated_at,
    }
    assert TaskItem.model_validate(data) == item == tl.get(1)
    path = tdir(tl) / "1.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(tdir(tl).stat().st_mode) == 0o700
    assert (tdir(tl) / ".highwatermark").read_text().strip() == "1"
    assert (tdir(tl) / ".lock").exists()
    with pytest.raises(Exception, match="frozen"):
        item.subject = "x"  # type: ignore[misc]


def test_ids_are_never_reused_after_delete(tl: TaskList) -> None:
    assert [tl.add(f"t{i}").id for i in range(3)] == [1, 2, 3]
    tl.delete(3)  # the highest id
    assert tl.add("t4").id == 4
    tl.delete(2)
    tl.delete(4)
    assert tl.add("t5").id == 5
    assert [t.id for t in tl.list()] == [1, 5]
    for task_id in (1, 5):
        tl.delete(task_id)
    assert tl.list() == []
    assert tl.add("t6").id == 6


def test_next_id_is_max_of_files_and_highwatermark(tl: TaskList) -> None:
    tl.add("first")
    # Another tool wrote item 10 without touching the high-water mark.
    (tdir(tl) / "10.json").write_bytes(orjson.dumps({"v": 1, "id": 10, "subject": "ext"}))
    assert tl.add("next").id == 11
    (tdir(tl) / ".highwatermark").write_text("40\n")
    assert tl.add("after").id == 41
    # Deleting a file nobody recorded in the mark still retires its id.
    (tdir(tl) / ".highwatermark").write_text("41\n")
    (tdir(tl) / "60.json").write_bytes(orjson.dumps({"v": 1, "id": 60, "subject": "ext"}))
    tl.delete(60)
    assert (tdir(tl) / ".highwatermark").read_text().strip() == "60"
    assert tl.add("later").id == 61


def test_corrupt_highwatermark_refuses_to_issue_ids(tl: TaskList) -> None:
    tl.add("one")
    mark = tdir(tl) / ".highwatermark"
    mark.write_text("lots\n")
    with pytest.raises(CorruptFileError) as err:
        tl.add("two")
    assert ".highwatermark" in str(err.value)
    assert mark.read_text() == "lots\n"
    assert [t.id for t in tl.list()] == [1]


@settings(max_examples=25)
@given(st.lists(st.one_of(st.just("add"), st.integers(min_value=0, max_value=20)), max_size=30))
def test_issued_ids_strictly_increase_whatever_is_deleted(ops: list[str | int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        teams = Teams(Layout(tmp))
        teams.create(TEAM)
        tl = TaskList(teams, TEAM)
        issued: list[int] = []
        alive: list[int] = []
        for op in ops:
            if op == "add" or not alive:
                issued.append(tl.add("t").id)
                alive.append(issued[-1])
            else:
                victim = alive.pop(int(op) % len(alive))
                tl.delete(victim)
        assert issued == sorted(set(issued))
        assert issued == list(range(1, len(issued) + 1))
        assert [t.id for t in tl.list()] == sorted(alive)


def test_tasklist_dir_is_created_safely_when_missing(tl: TaskList) -> None:
    shutil.rmtree(tdir(tl))
    assert tl.list() == []
    assert stat.S_IMODE(tdir(tl).stat().st_mode) == 0o700
    assert tl.add("again").id == 1


def test_unknown_team(teams: Teams) -> None:
    with pytest.raises(NotFoundError, match="no team 'nope'"):
        TaskList(teams, "nope").add("x")
    assert not teams.layout.team_dir("nope").exists()
    with pytest.raises(InvalidNameError):
        TaskList(teams, "Bad Team")


# -- bad input -------------------------------------------------------------------------------


def test_unknown_task_id(tl: TaskList) -> None:
    tl.add("one")
    for call in (
        lambda: tl.get(7),
        lambda: tl.update(7, status="completed"),
        lambda: tl.claim(7, "alice"),
        lambda: tl.delete(7),
    ):
        with pytest.raises(NotFoundError) as err:
            call()
        assert "7" in str(err.value) and "'alpha'" in str(err.value)
    for bad in (0, -1, True):
        with pytest.raises(UsageError):
            tl.get(bad)


def test_invalid_status_and_subject(tl: TaskList) -> None:
    tl.add("one")
    before = snapshot_files(tdir(tl))
    with pytest.raises(UsageError, match="invalid status 'done'"):
        tl.update(1, status="done")
    with pytest.raises(UsageError, match="subject"):
        tl.add("   ")
    with pytest.raises(UsageError, match="subject"):
        tl.update(1, subject="")
    with pytest.raises(UsageError, match="JSON"):
        tl.add("x", metadata={"bad": {1, 2}})
    assert snapshot_files(tdir(tl)) == before


def test_owner_must_be_a_current_member(tl: TaskList, teams: Teams) -> None:
    tl.add("one")
    before = snapshot_files(tdir(tl))
    with pytest.raises(NotFoundError, match="no member 'zed'") as err:
        tl.update(1, owner="zed")
    assert "shoal team join" in str(err.value)
    with pytest.raises(InvalidNameError):
        tl.update(1, owner="Not A Name")
    with pytest.raises(NotFoundError):
        tl.add("two", owner="zed")
    with pytest.raises(NotFoundError):
        tl.claim(1, "zed")
    teams.leave(TEAM, "carol")
    with pytest.raises(ConflictError, match="has left"):
        tl.update(1, owner="carol")
    assert snapshot_files(tdir(tl)) == before


def test_blocked_by_unknown_id_itself_or_a_cycle(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two", blocked_by=[1])
    tl.add("three", blocked_by=[2])
    before = snapshot_files(tdir(tl))
    with pytest.raises(NotFoundError, match="no task 9"):
        tl.add("four", blocked_by=[9])
    with pytest.raises(ConflictError, match="blocked by itself"):
        tl.update(2, add_blocked_by=[2])
    with pytest.raises(ConflictError, match=r"cycle \(1 -> 3 -> 2 -> 1"):
        tl.update(1, add_blocked_by=[3])
    with pytest.raises(ConflictError, match="cycle"):
        tl.update(3, add_blocks=[1])
    assert snapshot_files(tdir(tl)) == before
    assert tl.add("four").id == 4  # the refused add used no id


def test_corrupt_task_file_is_reported_and_never_overwritten(tl: TaskList) -> None:
    for subject in ("one", "two", "three"):
        tl.add(subject)
    bad = tdir(tl) / "2.json"
    bad.write_bytes(b'{"v": 1, "id": 2, "subject": ')
    with pytest.raises(CorruptFileError) as err:
        tl.get(2)
    assert str(bad) in str(err.value) and "not valid JSON" in str(err.value)
    items, errors = tl.list_with_errors()
    assert [t.id for t in items] == [1, 3]
    assert [e.path for e in errors] == [bad]
    assert [t.id for t in tl.list()] == [1, 3]
    for call in (
        lambda: tl.update(2, status="completed"),
        lambda: tl.claim(2, "alice"),
        lambda: tl.delete(2),
        lambda: tl.add("four", blocked_by=[2]),
    ):
        with pytest.raises(CorruptFileError):
            call()
    assert bad.read_bytes() == b'{"v": 1, "id": 2, "subject": '
    # The rest of the list keeps working, and the broken file's id stays taken.
    assert tl.claim(1, "alice").owner == "alice"
    tl.delete(3)
    assert tl.add("five").id == 4


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ({"v": 1, "id": 1, "subject": "x", "colour": "red"}, "colour"),
        ({"v": 1, "id": 1, "subject": "x", "status": "done"}, "status"),
        ({"v": 2, "id": 1, "subject": "x"}, "v"),
        ({"v": 1, "id": "1", "subject": "x"}, "id"),
        ({"v": 1, "id": 1, "subject": "x", "owner": "../x"}, "owner"),
        ({"v": 1, "id": 1, "subject": "x", "blocks": [0]}, "blocks"),
        ({"v": 1, "id": 5, "subject": "x"}, "holds id 5"),
        ([1, 2], "(root)"),
    ],
)
def test_invalid_item_files(tl: TaskList, content: object, reason: str) -> None:
    path = tdir(tl) / "1.json"
    path.write_bytes(orjson.dumps(content))
    with pytest.raises(CorruptFileError) as err:
        tl.get(1)
    assert reason in str(err.value) and str(path) in str(err.value)


def test_metadata_is_free_form(tl: TaskList) -> None:
    item = tl.add("x", metadata={"nested": {"a": [1, 2]}, "n": 3})
    assert tl.get(item.id).metadata == {"nested": {"a": [1, 2]}, "n": 3}
    tl.update(item.id, metadata={"n": None, "new": True})
    assert tl.get(item.id).metadata == {"nested": {"a": [1, 2]}, "new": True}


def test_symlinked_task_file_is_refused_and_its_target_untouched(
    tl: TaskList, tmp_path: Path
) -> None:
    tl.add("one")
    target = tmp_path / "outside.json"
    target.write_bytes(orjson.dumps({"v": 1, "id": 2, "subject": "planted"}))
    planted = tdir(tl) / "2.json"
    planted.symlink_to(target)
    with pytest.raises(CorruptFileError, match="symlink"):
        tl.get(2)
    items, errors = tl.list_with_errors()
    assert [t.id for t in items] == [1]
    assert [e.path for e in errors] == [planted]
    with pytest.raises(CorruptFileError):
        tl.update(2, status="completed")
    assert tl.add("three").id == 3
    assert planted.is_symlink()
    assert orjson.loads(target.read_bytes())["subject"] == "planted"


def test_fifo_or_directory_in_place_of_a_task_file_is_reported(tl: TaskList) -> None:
    tl.add("one")
    os.mkfifo(tdir(tl) / "2.json")  # opening it to read would block forever
    (tdir(tl) / "3.json").mkdir()
    items, errors = tl.list_with_errors()
    assert [t.id for t in items] == [1]
    assert [(e.path.name, e.reason) for e in errors] == [
        ("2.json", "is not a regular file"),
        ("3.json", "is not a regular file"),
    ]
    assert tl.add("four").id == 4


def test_symlinked_lock_highwatermark_or_dir_is_refused(tl: TaskList, tmp_path: Path) -> None:
    tl.add("one")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock = tdir(tl) / ".lock"
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symlink"):
        tl.add("two")
    lock.unlink()
    mark = tdir(tl) / ".highwatermark"
    mark.unlink()
    mark.symlink_to(victim)
    with pytest.raises(CorruptFileError, match="symlink"):
        tl.add("two")
    mark.unlink()
    assert victim.read_text() == "precious"
    # The whole list directory replaced by a link elsewhere.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(tdir(tl))
    tdir(tl).symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="symlink"):
        tl.list()
    with pytest.raises(UnsafePathError):
        tl.add("three")
    assert list(elsewhere.iterdir()) == []


# -- dependencies ----------------------------------------------------------------------------


def test_blocks_and_blocked_by_are_kept_on_both_sides(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two")
    three = tl.add("three", blocked_by=[1, 2, 1])
    assert three.blocked_by == (1, 2)
    assert tl.get(1).blocks == (3,) and tl.get(2).blocks == (3,)
    tl.add("four")
    tl.update(4, add_blocked_by=[3])
    tl.update(1, add_blocks=[4])
    assert tl.get(4).blocked_by == (3, 1)
    assert tl.get(3).blocks == (4,)
    assert tl.get(1).blocks == (3, 4)
    tl.update(4, add_blocked_by=[3])  # already there: no duplicate
    assert tl.get(4).blocked_by == (3, 1)
    assert tl.is_blocked(tl.get(3)) and tl.open_blockers(tl.get(4)) == [3, 1]
    tl.update(1, status="completed")
    assert tl.open_blockers(tl.get(3)) == [2]
    tl.update(2, status="completed")
    assert not tl.is_blocked(tl.get(3))


def test_delete_removes_the_file_and_every_reference(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two", blocked_by=[1])
    tl.add("three", blocked_by=[2])
    gone = tl.update(2, status="deleted")
    assert gone.id == 2 and gone.subject == "two"
    assert not (tdir(tl) / "2.json").exists()
    assert tl.get(1).blocks == ()
    assert tl.get(3).blocked_by == ()
    assert not tl.is_blocked(tl.get(3))
    with pytest.raises(NotFoundError):
        tl.get(2)
    with pytest.raises(NotFoundError):
        tl.update(2, status="deleted")


def test_a_missing_blocker_is_gone_but_a_corrupt_one_still_blocks(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two", blocked_by=[1])
    (tdir(tl) / "1.json").write_text("garbage")
    assert tl.is_blocked(tl.get(2))
    with pytest.raises(ClaimRefused) as err:
        tl.claim(2, "alice")
    assert err.value.reason == "blocked" and err.value.detail == [1]
    (tdir(tl) / "1.json").unlink()  # removed by hand, not through delete
    assert not tl.is_blocked(tl.get(2))
    assert tl.claim(2, "alice").status == "in_progress"


# -- claiming --------------------------------------------------------------------------------


def test_claim_sets_owner_and_status_and_is_idempotent(tl: TaskList) -> None:
    tl.add("one")
    item = tl.claim(1, "alice")
    assert (item.owner, item.status) == ("alice", "in_progress")
    assert on_disk(tl, 1)["owner"] == "alice"
    again = tl.claim(1, "alice")
    assert again == item  # unchanged, not rewritten
    assert inbox_messages(tl, "alice") == []  # a claim sends no assignment


def test_claim_refusals(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two", blocked_by=[1])
    tl.add("three")
    tl.add("four")
    tl.claim(1, "alice")
    before = snapshot_files(tdir(tl))

    with pytest.raises(ClaimRefused) as err:
        tl.claim(1, "bob")
    refused = err.value
    assert (refused.reason, refused.task_id, refused.detail) == ("already_claimed", 1, "alice")
    assert isinstance(err.value, ConflictError)
    assert "already_claimed" in str(err.value)

    with pytest.raises(ClaimRefused) as err:
        tl.claim(2, "bob")
    assert (err.value.reason, err.value.detail) == ("blocked", [1])
    assert str(err.value) == "cannot claim task 2: blocked (open blockers: 1)"

    with pytest.raises(ClaimRefused) as err:
        tl.claim(3, "alice")
    assert (err.value.reason, err.value.detail) == ("agent_busy", [1])
    assert err.value.to_json() == {
        "ok": False,
        "reason": "agent_busy",
        "task_id": 3,
        "detail": [1],
    }
    assert snapshot_files(tdir(tl)) == before

    tl.update(4, status="completed")
    with pytest.raises(ClaimRefused) as err:
        tl.claim(4, "bob")
    assert err.value.reason == "already_resolved"
    # A completed task is resolved even for its own owner.
    tl.update(1, status="completed")
    with pytest.raises(ClaimRefused) as err:
        tl.claim(1, "alice")
    assert err.value.reason == "already_resolved"
    # Its blocker is done now, so two is claimable.
    assert tl.claim(2, "bob").owner == "bob"


def test_agent_busy_can_be_skipped_and_assignment_is_claimable(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two", owner="alice")
    tl.claim(1, "alice")
    with pytest.raises(ClaimRefused):
        tl.claim(2, "alice")
    assert tl.claim(2, "alice", check_busy=False).status == "in_progress"
    with pytest.raises(ClaimRefused) as err:
        tl.claim(2, "bob")  # assigned to alice
    assert err.value.reason == "already_claimed"


def test_next_claimable_and_claim_next_order(tl: TaskList) -> None:
    tl.add("one")  # 1: will be owned by bob
    tl.add("two", blocked_by=[1])  # 2: blocked
    tl.add("three")  # 3: completed
    tl.add("four", owner="alice")  # 4: assigned to alice
    tl.add("five")  # 5: free
    tl.claim(1, "bob")
    tl.update(3, status="completed")
    assert tl.next_claimable("alice") == tl.get(4)
    assert tl.next_claimable("carol") == tl.get(5)
    first = tl.claim_next("alice")
    assert first is not None
    assert (first.id, first.owner, first.status) == (4, "alice", "in_progress")
    assert tl.claim_next("alice") is None  # busy with 4
    got = tl.claim_next("carol")
    assert got is not None and got.id == 5
    assert tl.claim_next("bob") is None  # busy with 1
    tl.update(1, status="completed")
    got = tl.claim_next("bob")
    assert got is not None and got.id == 2  # unblocked now
    tl.update(4, status="completed")
    assert tl.claim_next("alice") is None  # nothing left
    assert tl.next_claimable("alice") is None


def test_claim_next_passes_over_a_task_that_failed_too_often(tl: TaskList) -> None:
    tl.add("flaky")
    tl.add("fine")
    for _ in range(3):
        assert tl.claim(1, "alice").id == 1
        tl.settle_claim(1, "alice", completed=False, error="boom")
    assert tl.get(1).metadata["failures"] == 3
    assert tl.next_claimable("alice") == tl.get(1)  # (no limit given: the list's order)
    got = tl.claim_next("alice", max_failures=3)
    assert got is not None and got.id == 2  # not held up behind the failed one
    assert tl.get(1).status == "pending" and tl.get(1).owner is None
    assert tl.claim_next("bob", max_failures=3) is None  # (1 waits for an assignment)
    tl.update(1, owner="bob")  # an assignment
    got = tl.claim_next("bob", max_failures=3)
    assert got is not None and got.id == 1


# -- release ---------------------------------------------------------------------------------


def test_release_member_returns_unfinished_tasks_to_pending(tl: TaskList) -> None:
    tl.add("one")
    tl.add("two", owner="alice")
    tl.add("three")
    tl.add("four")
    tl.claim(1, "alice")
    tl.claim(3, "alice", check_busy=False)
    tl.update(3, status="completed")
    tl.claim(4, "bob")
    released = tl.release_member("alice")
    assert [t.id for t in released] == [1, 2]
    assert all(t.owner is None and t.status == "pending" for t in released)
    assert [(t.owner, t.status) for t in tl.list()] == [
        (None, "pending"),
        (None, "pending"),
        ("alice", "completed"),
        ("bob", "in_progress"),
    ]
    assert tl.release_member("alice") == []


def _release_orphaned(tl: TaskList, skip: tuple[str, ...] = ()) -> list[TaskItem]:
    return [t for name in tl.orphaned_owners(skip) for t in tl.release_member(name)]


def test_orphaned_owners_are_departed_and_dead_owners(tl: TaskList, teams: Teams) -> None:
    # dave's recorded process start time does not match this pid's: a dead (reused-pid) member.
    teams.join(TEAM, "dave", pid=os.getpid(), pid_started_at=1.0)
    for name in ("alice", "bob", "carol", "dave"):
        tl.claim(tl.add(f"for {name}").id, name)
    teams.leave(TEAM, "bob")
    released = _release_orphaned(tl)
    assert sorted((t.id, t.owner) for t in released) == [(2, None), (4, None)]
    # alice and carol never recorded a process: not known to be dead, so they keep theirs.
    assert tl.get(1).owner == "alice" and tl.get(3).owner == "carol"
    assert _release_orphaned(tl) == []


def test_orphaned_owners_leaves_out_the_members_it_is_told_to_skip(
    tl: TaskList, teams: Teams
) -> None:
    """A leader skips the teammates it runs: their ends are settled where it notices them."""
    teams.join(TEAM, "dave", pid=os.getpid(), pid_started_at=1.0)  # dead (a reused pid)
    for name in ("bob", "dave"):
        tl.claim(tl.add(f"for {name}").id, name)
    teams.leave(TEAM, "bob")
    assert tl.orphaned_owners() == ["bob", "dave"]
    assert tl.orphaned_owners(skip={"dave"}) == ["bob"]
    assert [t.id for t in _release_orphaned(tl, skip=("bob",))] == [2]
    assert tl.get(1).owner == "bob" and tl.get(1).status == "in_progress"


# -- owner notices ---------------------------------------------------------------------------


def test_owner_change_delivers_a_task_assignment(tl: TaskList) -> None:
    tl.add("write docs", description="the README")
    item = tl.update(1, owner="bob")
    assert item.owner == "bob" and tl.last_notify_error is None
    [msg] = inbox_messages(tl, "bob")
    assert msg["kind"] == "task_assignment" and msg["from"] == "team-lead" and msg["to"] == "bob"
    assert msg["data"] == {
        "task_id": 1,
        "subject": "write docs",
        "description": "the README",
        "assigned_by": "team-lead",
    }
    decode(orjson.dumps(msg))  # a valid message file
    tl.update(1, owner="bob", status="in_progress")  # same owner: no second notice
    tl.update(1, owner="alice", assigned_by="carol")
    [msg] = inbox_messages(tl, "alice")
    assert msg["from"] == "carol" and msg["data"]["assigned_by"] == "carol"
    tl.update(1, owner=None)
    tl.update(1, owner="carol", assigned_by="carol")  # assigning oneself: no message
    assert len(inbox_messages(tl, "bob")) == 1
    assert inbox_messages(tl, "carol") == []
    tl.add("review", owner="bob")
    assert [m["data"]["task_id"] for m in inbox_messages(tl, "bob")] == [1, 2]


def test_failed_delivery_does_not_undo_the_update(tl: TaskList) -> None:
    tl.add("one")
    shutil.rmtree(tl.layout.inbox_dir(TEAM, "bob"))
    item = tl.update(1, owner="bob")
    assert item.owner == "bob" and tl.get(1).owner == "bob"
    assert isinstance(tl.last_notify_error, NotFoundError)
    assert "inbox" in str(tl.last_notify_error)
    tl.update(1, status="in_progress")
    assert tl.last_notify_error is None


def test_custom_notify_is_called_after_the_write(teams: Teams) -> None:
    teams.create(TEAM)
    teams.join(TEAM, "alice")
    seen: list[tuple[str | None, str, str | None]] = []

    def notify(task: TaskItem, assigned_by: str | None) -> None:
        on_file = orjson.loads((teams.layout.tasklist_dir(TEAM) / f"{task.id}.json").read_bytes())
        seen.append((task.owner, on_file["owner"], assigned_by))
        raise RuntimeError("pager down")

    tl = TaskList(teams, TEAM, notify=notify)
    tl.add("one", owner="alice", assigned_by="team-lead")
    assert seen == [("alice", "alice", "team-lead")]
    assert isinstance(tl.last_notify_error, RuntimeError)
    assert tl.get(1).owner == "alice"
