"""Task-list item status as a state machine: one table, one checked move, used by every writer."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.core.errors import ConflictError
from shoal.core.paths import Layout
from shoal.teams import taskitems as taskitems_module
from shoal.teams.store import Teams
from shoal.teams.taskitems import (
    STATUSES,
    TRANSITIONS,
    ClaimRefused,
    IllegalStatusMove,
    TaskItem,
    TaskItemStatus,
    move_item,
)
from shoal.teams.tasklist import TaskList

TEAM = "alpha"
PENDING, IN_PROGRESS, COMPLETED = (
    TaskItemStatus.PENDING,
    TaskItemStatus.IN_PROGRESS,
    TaskItemStatus.COMPLETED,
)


@pytest.fixture
def tl(teams: Teams) -> TaskList:
    """Team alpha with members alice and bob, and its (empty) task list."""
    teams.create(TEAM)
    for name in ("alice", "bob"):
        teams.join(TEAM, name)
    return TaskList(teams, TEAM)


def files(directory: Path) -> dict[str, bytes]:
    """Every file of the list's directory (items, high-water mark, lock) with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_the_table() -> None:
    assert set(TRANSITIONS) == set(TaskItemStatus)
    assert STATUSES == ("pending", "in_progress", "completed")
    assert TRANSITIONS[PENDING] == {IN_PROGRESS, COMPLETED}
    assert TRANSITIONS[IN_PROGRESS] == {PENDING, COMPLETED}
    assert TRANSITIONS[COMPLETED] == {PENDING}  # reopen; never straight back in progress
    assert all(s not in nexts for s, nexts in TRANSITIONS.items())  # no-ops are not moves


def test_status_is_the_enum_and_still_a_plain_string_on_disk(tl: TaskList) -> None:
    item = tl.add("x")
    assert item.status is PENDING and item.status == "pending"
    assert tl.get(item.id).status is PENDING
    assert item.model_dump(mode="json")["status"] == "pending"
    assert b'"status": "pending"' in (tl.directory / "1.json").read_bytes()


def test_move_item_checks_the_table_and_same_status_is_a_no_op() -> None:
    item = TaskItem(id=3, subject="x", status=COMPLETED)
    assert move_item(item, "completed", owner="bob").owner == "bob"
    assert move_item(item, "pending").status is PENDING
    with pytest.raises(IllegalStatusMove) as err:
        move_item(item, "in_progress")
    assert isinstance(err.value, ConflictError)  # a refused check: exit 1 through the CLI
    assert (err.value.task_id, err.value.current, err.value.requested) == (
        3,
        COMPLETED,
        IN_PROGRESS,
    )
    message = str(err.value)
    assert message == (
        "task 3 is completed and cannot move to in_progress (from completed only to: pending); "
        "reopen it first with `shoal task update 3 --status pending`"
    )
    assert "\n" not in message


def test_an_illegal_update_writes_nothing(tl: TaskList) -> None:
    tl.add("a")
    tl.add("b")
    tl.update(1, status="completed")  # pending -> completed: allowed (closed unclaimed)
    before = files(tl.directory)
    with pytest.raises(IllegalStatusMove, match="task 1 is completed"):
        # Other changes in the same call are refused with the move, edges included.
        tl.update(1, status="in_progress", owner="alice", subject="new", add_blocks=[2])
    assert files(tl.directory) == before
    reopened = tl.update(1, status="pending")  # the explicit reopen
    assert reopened.status is PENDING
    assert tl.claim(1, "alice").status is IN_PROGRESS


def test_deleted_is_not_a_status_but_deletes_from_any(tl: TaskList) -> None:
    for status in STATUSES:
        item = tl.add(status)
        if status != "pending":
            tl.update(item.id, status=status)
        assert tl.update(item.id, status="deleted").id == item.id
    assert tl.list() == []


def test_claim_and_release_go_through_the_same_check(
    tl: TaskList, monkeypatch: pytest.MonkeyPatch
) -> None:
    tl.add("a")
    tl.add("b")
    tl.claim(2, "bob")
    # A table that forbids starting and releasing: every writer must now refuse.
    monkeypatch.setattr(
        taskitems_module.ITEM_MACHINE,
        "table",
        {
            PENDING: frozenset({COMPLETED}),
            IN_PROGRESS: frozenset({COMPLETED}),
            COMPLETED: frozenset(),
        },
    )
    before = files(tl.directory)
    with pytest.raises(IllegalStatusMove, match="task 1 is pending and cannot move to in_progress"):
        tl.claim(1, "alice")
    with pytest.raises(IllegalStatusMove, match="task 1 is pending"):
        tl.claim_next("alice")
    with pytest.raises(IllegalStatusMove, match="task 2 is in_progress and cannot move to pending"):
        tl.release_member("bob")
    with pytest.raises(IllegalStatusMove):
        tl.update(2, status="pending")
    assert files(tl.directory) == before


# -- property: random moves through every writer ---------------------------------------------

MOVES = st.one_of(
    st.tuples(st.just("update"), st.sampled_from(STATUSES)),
    st.tuples(st.just("claim"), st.sampled_from(["alice", "bob"])),
    st.tuples(st.just("release"), st.sampled_from(["alice", "bob"])),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(MOVES, min_size=1, max_size=15))
def test_every_accepted_move_is_in_the_table_and_refusals_change_nothing(
    moves: list[tuple[str, str]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        teams = Teams(Layout(tmp))
        teams.create(TEAM)
        for name in ("alice", "bob"):
            teams.join(TEAM, name)
        tl = TaskList(teams, TEAM)
        tl.add("the task")
        for op, arg in moves:
            old = tl.get(1)
            before = files(tl.directory)
            try:
                if op == "update":
                    tl.update(1, status=arg)
                elif op == "claim":
                    tl.claim(1, arg, check_busy=False)
                else:
                    tl.release_member(arg)
            except IllegalStatusMove as exc:
                assert (exc.current, exc.requested) == (old.status, TaskItemStatus(arg))
                assert exc.requested not in TRANSITIONS[old.status]
                assert exc.requested != old.status
                assert files(tl.directory) == before
                continue
            except ClaimRefused:  # claim rules (completed, another owner) come first
                assert files(tl.directory) == before
                continue
            new = tl.get(1)
            assert new.status == old.status or new.status in TRANSITIONS[old.status]
            if op == "update":
                assert new.status == arg
            if new.status == old.status and new.owner == old.owner:
                assert files(tl.directory) == before  # a no-op writes nothing
