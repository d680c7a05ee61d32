"""`shoal task ...` as real processes: output shapes, exit codes and bad input."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from tests.conftest import Cli

TEAM = "alpha"


@pytest.fixture
def team(teams: Teams, monkeypatch: pytest.MonkeyPatch) -> TaskList:
    """Team alpha ($SHOAL_TEAM, so no --team is needed) with members alice and bob."""
    monkeypatch.setenv("SHOAL_TEAM", TEAM)
    teams.create(TEAM)
    teams.join(TEAM, "alice")
    teams.join(TEAM, "bob")
    return TaskList(teams, TEAM)


def inbox(layout: Layout, name: str) -> list[dict[str, object]]:
    new = layout.inbox_dir(TEAM, name) / "new"
    return [json.loads((new / f).read_bytes()) for f in sorted(os.listdir(new))]


def error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_add_list_get_shapes(cli: Cli, team: TaskList) -> None:
    first = cli("task", "add", "write docs", "--description", "the README")
    assert (first.returncode, first.stdout) == (0, "1\n"), first.stderr
    second = cli(
        "task", "add", "review", "--blocked-by", "1", "--active-form", "Reviewing", "--json"
    )
    assert second.returncode == 0, second.stderr
    item = json.loads(second.stdout)
    assert item["id"] == 2 and item["blocked_by"] == [1] and item["active_form"] == "Reviewing"
    assert item["v"] == 1 and item["status"] == "pending" and item["owner"] is None

    table = cli("task", "list", "--team", TEAM)
    assert table.returncode == 0 and table.stderr == ""
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "OWNER", "BLOCKED", "BY", "SUBJECT"]
    assert lines[1].split() == ["1", "pending", "-", "-", "write", "docs"]
    assert lines[2].split() == ["2", "pending", "-", "1", "review"]

    listed = json.loads(cli("task", "list", "--json").stdout)
    assert [t["id"] for t in listed] == [1, 2]
    assert listed[0]["blocks"] == [2]
    assert listed == [t.model_dump(mode="json") for t in team.list()]

    got = cli("task", "get", "2", "--json")
    assert json.loads(got.stdout) == listed[1]
    text = cli("task", "get", "2")
    assert text.returncode == 0
    assert text.stdout.splitlines()[0] == "task 2: review"
    assert "blocked by:  1 (open: 1)" in text.stdout


def test_list_filters_and_empty_list(cli: Cli, team: TaskList) -> None:
    empty = cli("task", "list")
    assert empty.returncode == 0 and "no tasks" in empty.stdout
    assert json.loads(cli("task", "list", "--json").stdout) == []
    team.add("one")
    team.add("two")
    team.claim(2, "alice")
    mine = json.loads(cli("task", "list", "--owner", "alice", "--json").stdout)
    assert [t["id"] for t in mine] == [2]
    pending = json.loads(cli("task", "list", "--status", "pending", "--json").stdout)
    assert [t["id"] for t in pending] == [1]


def test_update_owner_sends_a_task_assignment(cli: Cli, team: TaskList, layout: Layout) -> None:
    team.add("write docs", description="the README")
    out = cli("task", "update", "1", "--owner", "bob", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["owner"] == "bob"
    [msg] = inbox(layout, "bob")
    assert msg["kind"] == "task_assignment"
    assert msg["data"] == {
        "task_id": 1,
        "subject": "write docs",
        "description": "the README",
        "assigned_by": "team-lead",
    }
    cleared = cli("task", "update", "1", "--no-owner", "--status", "completed")
    assert cleared.returncode == 0
    assert cleared.stdout == "updated task 1: completed, owner -\n"
    assert team.get(1).owner is None and team.get(1).status == "completed"


def test_update_delete_and_references(cli: Cli, team: TaskList) -> None:
    team.add("one")
    team.add("two", blocked_by=[1])
    out = cli("task", "update", "1", "--status", "deleted", "--json")
    assert (out.returncode, json.loads(out.stdout)) == (0, {"deleted": 1})
    assert team.get(2).blocked_by == ()
    assert cli("task", "get", "1").returncode == 1
    assert cli("task", "add", "three").stdout == "3\n"  # id 1 is never reused


def test_claim_success_and_each_refusal(cli: Cli, team: TaskList) -> None:
    team.add("one")
    team.add("two", blocked_by=[1])
    team.add("three")
    team.add("four")
    ok = cli("task", "claim", "1", "--as", "alice")
    assert (ok.returncode, ok.stdout) == (0, "claimed task 1 as alice: one\n"), ok.stderr
    ok_json = cli("task", "claim", "1", "--as", "alice", "--json")  # idempotent
    assert ok_json.returncode == 0
    assert json.loads(ok_json.stdout)["owner"] == "alice"

    blocked = cli("task", "claim", "2", "--as", "bob")
    assert blocked.returncode == 1 and blocked.stdout == ""
    assert error_line(blocked.stderr) == (
        "shoal: error: cannot claim task 2: blocked (open blockers: 1)"
    )
    claimed = cli("task", "claim", "1", "--as", "bob")
    assert claimed.returncode == 1 and "already_claimed" in error_line(claimed.stderr)
    busy = cli("task", "claim", "3", "--as", "alice", "--json")
    assert busy.returncode == 1
    assert json.loads(busy.stdout) == {
        "ok": False,
        "reason": "agent_busy",
        "task_id": 3,
        "detail": [1],
    }
    team.update(4, status="completed")
    resolved = cli("task", "claim", "4", "--as", "bob", "--json")
    assert resolved.returncode == 1
    assert json.loads(resolved.stdout)["reason"] == "already_resolved"
    resolved_text = cli("task", "claim", "4", "--as", "bob")
    assert "already_resolved" in error_line(resolved_text.stderr)


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("task", "get", "9"), 1, "no task 9 in team 'alpha'"),
        (("task", "claim", "9", "--as", "alice"), 1, "no task 9"),
        (("task", "update", "9", "--status", "completed"), 1, "no task 9"),
        (("task", "get", "x"), 2, "'x'"),
        (("task", "get", "0"), 2, "0"),
        (("task", "update", "1", "--status", "done"), 2, "'done'"),
        (("task", "list", "--status", "deleted"), 2, "'deleted'"),
        (("task", "update", "1", "--owner", "zed"), 1, "no member 'zed'"),
        (("task", "update", "1", "--owner", "Bad Name"), 2, "invalid member name"),
        (("task", "claim", "1", "--as", "zed"), 1, "no member 'zed'"),
        (("task", "claim", "1"), 2, "--as"),
        (("task", "add", "x", "--blocked-by", "9"), 1, "no task 9"),
        (("task", "add", "x", "--blocked-by", "one"), 2, "'one'"),
        (("task", "add", "x", "--owner", "zed"), 1, "no member 'zed'"),
        (("task", "add", " "), 2, "subject"),
        (("task", "add", "x", "--metadata", "[1]"), 2, "JSON object"),
        (("task", "update", "1", "--blocked-by", "1"), 1, "blocked by itself"),
        (("task", "update", "1", "--blocked-by", "2"), 1, "cycle (1 -> 2 -> 1"),
        (("task", "update", "1"), 2, "nothing to change"),
        (("task", "update", "1", "--owner", "bob", "--no-owner"), 2, "not both"),
        (("task", "list", "--team", "nope"), 1, "no team 'nope'"),
    ],
)
def test_bad_input(cli: Cli, team: TaskList, args: tuple[str, ...], code: int, needle: str) -> None:
    team.add("one")
    team.add("two", blocked_by=[1])
    before = {p.name: p.read_bytes() for p in team.directory.iterdir()}
    out = cli(*args)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert {p.name: p.read_bytes() for p in team.directory.iterdir()} == before


def test_corrupt_file_is_named_and_the_rest_still_listed(cli: Cli, team: TaskList) -> None:
    for subject in ("one", "two", "three"):
        team.add(subject)
    bad = team.directory / "2.json"
    bad.write_text("{not json")
    listed = cli("task", "list", "--json")
    assert listed.returncode == 1
    assert [t["id"] for t in json.loads(listed.stdout)] == [1, 3]
    line = error_line(listed.stderr)
    assert line.startswith("shoal: error: ") and str(bad) in line
    table = cli("task", "list")
    assert table.returncode == 1 and len(table.stdout.splitlines()) == 3
    got = cli("task", "get", "2")
    assert got.returncode == 1 and str(bad) in error_line(got.stderr)
    upd = cli("task", "update", "2", "--status", "completed")
    assert upd.returncode == 1
    assert bad.read_text() == "{not json"
    assert cli("task", "add", "four").stdout == "4\n"


def test_planted_symlink_is_reported_not_followed(cli: Cli, team: TaskList, tmp_path: Path) -> None:
    team.add("one")
    target = tmp_path / "elsewhere.json"
    target.write_text('{"v": 1, "id": 2, "subject": "planted"}')
    (team.directory / "2.json").symlink_to(target)
    listed = cli("task", "list", "--json")
    assert listed.returncode == 1
    assert [t["id"] for t in json.loads(listed.stdout)] == [1]
    assert "symlink" in error_line(listed.stderr)
    claim = cli("task", "claim", "2", "--as", "alice")
    assert claim.returncode == 1 and "symlink" in claim.stderr
    assert target.read_text() == '{"v": 1, "id": 2, "subject": "planted"}'


def test_undelivered_assignment_is_a_warning_not_a_rollback(
    cli: Cli, team: TaskList, layout: Layout
) -> None:
    team.add("one")
    shutil.rmtree(layout.inbox_dir(TEAM, "bob"))
    out = cli("task", "update", "1", "--owner", "bob")
    assert out.returncode == 0
    assert "shoal: warning:" in out.stderr and "not delivered" in out.stderr
    assert team.get(1).owner == "bob"


def test_an_illegal_status_move_is_one_error_line_and_exit_1(cli: Cli, team: TaskList) -> None:
    team.add("one")
    assert cli("task", "update", "1", "--status", "completed").returncode == 0
    before = (team.directory / "1.json").read_bytes()
    refused = cli("task", "update", "1", "--status", "in_progress", "--json")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert error_line(refused.stderr) == (
        "shoal: error: task 1 is completed and cannot move to in_progress (from completed only "
        "to: pending); reopen it first with `shoal task update 1 --status pending`"
    )
    assert (team.directory / "1.json").read_bytes() == before
    same = cli("task", "update", "1", "--status", "completed")  # same status: a no-op
    assert same.returncode == 0 and (team.directory / "1.json").read_bytes() == before
    reopened = cli("task", "update", "1", "--status", "pending", "--json")
    assert reopened.returncode == 0 and json.loads(reopened.stdout)["status"] == "pending"
    assert cli("task", "update", "1", "--status", "in_progress").returncode == 0
    assert team.get(1).status == "in_progress"


def test_add_run_is_the_command_a_scripted_teammate_runs(cli: Cli, team: TaskList) -> None:
    out = cli("task", "add", "build", "--run", "make -j2", "--metadata", '{"area": "core"}')
    assert out.returncode == 0, out.stderr
    item = team.get(int(out.stdout))
    assert item.metadata == {"area": "core", "run": "make -j2"}
    assert "--run CMD" in cli("task", "add", "--help").stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--run", "  "], "--run needs a command"),
        (["--run", "make", "--metadata", '{"run": "other"}'], "give the command once"),
    ],
)
def test_add_run_refuses_an_empty_or_doubled_command(
    cli: Cli, team: TaskList, args: list[str], said: str
) -> None:
    out = cli("task", "add", "build", *args)
    assert out.returncode == 2 and said in error_line(out.stderr)
    assert team.snapshot().sorted() == []  # nothing was added
