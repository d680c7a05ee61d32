"""Team files on disk: create, list, delete, members, liveness, and refusing bad input."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from filelock import FileLock

from shoal.core.errors import (
    ConflictError,
    CorruptFileError,
    InvalidNameError,
    NotFoundError,
    UnsafePathError,
    UsageError,
)
from shoal.core.paths import Layout
from shoal.teams.colors import PALETTE
from shoal.teams.models import LEAD_NAME, TeamFile
from shoal.teams.store import JoinSpec, MemberState, Teams

Sleeper = Callable[[], subprocess.Popen[bytes]]


def test_create_writes_a_valid_team_file_with_the_lead(teams: Teams, layout: Layout) -> None:
    tf = teams.create("alpha", "first team")
    path = layout.team_file("alpha")
    on_disk = orjson.loads(path.read_bytes())
    assert on_disk["v"] == 1
    assert on_disk["name"] == "alpha"
    assert on_disk["lead_agent_id"] == "team-lead@alpha"
    assert [m["agent_id"] for m in on_disk["members"]] == ["team-lead@alpha"]
    assert TeamFile.model_validate(on_disk) == tf
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for d in (layout.team_dir("alpha"), layout.inbox_dir("alpha", LEAD_NAME) / "new"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert Path(f"{path}.lock").exists()


def test_taken_name_is_refused_with_a_suggestion(teams: Teams) -> None:
    teams.create("alpha")
    with pytest.raises(ConflictError) as err:
        teams.create("alpha")
    assert "--unique" in str(err.value)
    other = teams.create("alpha", unique=True)
    assert other.name.startswith("alpha-") and other.name != "alpha"
    assert sorted(teams.names()) == sorted(["alpha", other.name])


@pytest.mark.parametrize("bad", ["../x", "Team", "a b", "", "a" * 49])
def test_invalid_team_names_create_nothing(teams: Teams, home: Path, bad: str) -> None:
    with pytest.raises(InvalidNameError):
        teams.create(bad)
    assert not any(home.rglob("*"))


@pytest.mark.parametrize("bad", ["../x", "Bob", "a b", "", "b" * 49])
def test_invalid_member_names_join_nothing(teams: Teams, layout: Layout, bad: str) -> None:
    teams.create("alpha")
    before = layout.team_file("alpha").read_bytes()
    with pytest.raises(InvalidNameError):
        teams.join("alpha", bad, pid=os.getpid())
    assert layout.team_file("alpha").read_bytes() == before
    assert sorted(os.listdir(layout.inboxes_dir("alpha"))) == [LEAD_NAME]


def test_join_leave_and_liveness(teams: Teams, sleeper: Sleeper) -> None:
    teams.create("alpha")
    proc = sleeper()
    bob = teams.join("alpha", "bob", pid=proc.pid)
    assert bob.agent_id == "bob@alpha"
    assert bob.pid_started_at is not None
    states = {v.member.name: v.state for v in teams.members("alpha")}
    assert states["bob"] is MemberState.ACTIVE
    proc.kill()
    proc.wait()
    states = {v.member.name: v.state for v in teams.members("alpha")}
    assert states["bob"] is MemberState.DEAD
    teams.leave("alpha", "bob")
    states = {v.member.name: v.state for v in teams.members("alpha")}
    assert states["bob"] is MemberState.LEFT


def test_reused_pid_does_not_look_alive(teams: Teams) -> None:
    teams.create("alpha")
    teams.join("alpha", "bob", pid=os.getpid())
    # Same pid, different start time: a pid reused by another process.
    bob = teams.read("alpha").member("bob")
    assert bob is not None and bob.pid_started_at is not None
    teams.update_member("alpha", "bob", pid_started_at=bob.pid_started_at - 100)
    states = {v.member.name: v.state for v in teams.members("alpha")}
    assert states["bob"] is MemberState.DEAD


def test_status_file_refines_the_state(teams: Teams) -> None:
    teams.create("alpha")
    teams.join("alpha", "bob", pid=os.getpid())
    teams.write_status("alpha", "bob", {"state": "busy", "activity": "running tests"})
    assert {v.member.name: v.state for v in teams.members("alpha")}["bob"] is MemberState.BUSY


def test_a_live_name_cannot_be_taken_twice_but_a_dead_one_rejoins(
    teams: Teams, sleeper: Sleeper
) -> None:
    teams.create("alpha")
    first = sleeper()
    teams.join("alpha", "bob", pid=first.pid)
    with pytest.raises(ConflictError):
        teams.join("alpha", "bob", pid=sleeper().pid)
    color = teams.read("alpha").member("bob").color  # type: ignore[union-attr]
    first.kill()
    first.wait()
    second = sleeper()
    again = teams.join("alpha", "bob", pid=second.pid)
    assert again.pid == second.pid
    assert again.color == color
    assert [m.name for m in teams.read("alpha").members].count("bob") == 1


def test_colours_are_unique_within_a_team(teams: Teams) -> None:
    teams.create("alpha")
    for i in range(len(PALETTE) - 1):
        teams.join("alpha", f"m{i}", pid=os.getpid())
    colors = [m.color for m in teams.read("alpha").members]
    assert len(colors) == len(PALETTE)
    assert len(set(colors)) == len(colors)


def test_delete_refused_while_members_are_active(
    teams: Teams, layout: Layout, sleeper: Sleeper
) -> None:
    teams.create("alpha")
    proc = sleeper()
    teams.join("alpha", "bob", pid=proc.pid)
    with pytest.raises(ConflictError) as err:
        teams.delete("alpha")
    assert "bob" in str(err.value)
    assert layout.team_file("alpha").exists()
    teams.delete("alpha", force=True)
    proc.wait(timeout=10)  # terminated (psutil may have reaped it already)
    assert proc.returncode is not None
    assert not layout.team_dir("alpha").exists()
    assert teams.names() == []


def test_delete_of_unknown_team(teams: Teams) -> None:
    with pytest.raises(NotFoundError):
        teams.delete("ghost")


def test_corrupt_team_file_is_reported_and_not_overwritten(teams: Teams, layout: Layout) -> None:
    teams.create("alpha")
    path = layout.team_file("alpha")
    for garbage in (b"{ not json", orjson.dumps({"v": 1, "name": "alpha"})):
        path.write_bytes(garbage)
        with pytest.raises(CorruptFileError) as err:
            teams.read("alpha")
        assert str(path) in str(err.value)
        with pytest.raises(CorruptFileError):
            teams.join("alpha", "bob", pid=os.getpid())
        with pytest.raises(CorruptFileError):
            teams.update_member("alpha", LEAD_NAME, model="x")
        assert path.read_bytes() == garbage
    listed = teams.all()
    assert isinstance(listed[0], CorruptFileError)


def test_symlinked_team_dir_is_refused(teams: Teams, layout: Layout, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    layout.ensure(layout.teams_dir)
    os.symlink(elsewhere, layout.teams_dir / "alpha")
    with pytest.raises(UnsafePathError):
        teams.create("alpha")
    assert list(elsewhere.iterdir()) == []


def test_allowed_paths(teams: Teams, tmp_path: Path) -> None:
    teams.create("alpha")
    teams.add_allowed_path("alpha", str(tmp_path), added_by=LEAD_NAME)
    teams.add_allowed_path("alpha", str(tmp_path), added_by=LEAD_NAME)
    paths = teams.read("alpha").team_allowed_paths
    assert [p.path for p in paths] == [str(tmp_path)]


def test_updates_wait_for_the_lock(teams: Teams, layout: Layout) -> None:
    teams.create("alpha")
    lock = FileLock(f"{layout.team_file('alpha')}.lock")
    done = threading.Event()

    def update() -> None:
        teams.update("alpha", lambda tf: tf.model_copy(update={"description": "changed"}))
        done.set()

    with lock:
        worker = threading.Thread(target=update)
        worker.start()
        # While we hold the lock the update cannot land, however long we look.
        assert not done.wait(0.3)
        assert teams.read("alpha").description == ""
    worker.join(10)
    assert done.is_set()
    assert teams.read("alpha").description == "changed"


def test_delete_removes_member_worktrees_from_their_repository(
    teams: Teams, layout: Layout, tmp_path: Path
) -> None:
    from shoal.core.git import worktree_add

    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    git("init", "-q")
    (repo / "f").write_text("x\n")
    git("add", "f")
    git("commit", "-q", "-m", "one")
    teams.create("alpha")
    tree = layout.ensure(layout.worktrees_dir("alpha")) / "bob"
    worktree_add(repo, tree)
    teams.join("alpha", "bob", worktree_path=str(tree))
    teams.join("alpha", "carol", worktree_path=str(tmp_path / "never-made"))  # ignored
    teams.delete("alpha")
    assert not tree.exists()
    assert str(tree.resolve()) not in git("worktree", "list", "--porcelain")


def test_join_and_join_many_refuse_the_same_live_duplicate(
    teams: Teams, layout: Layout, sleeper: Sleeper
) -> None:
    teams.create("alpha")
    live = sleeper()
    teams.join("alpha", "bob", pid=live.pid)
    teams.join_many("alpha", [JoinSpec(name="eve", pid=live.pid)])
    before = layout.team_file("alpha").read_bytes()
    other = sleeper().pid
    for name in ("bob", "eve"):  # each listed by one path, refused by both
        expected = f"member {name!r} is already active in team 'alpha' (pid {live.pid}); "
        with pytest.raises(ConflictError) as by_join:
            teams.join("alpha", name, pid=other)
        with pytest.raises(ConflictError) as by_many:
            # A batch with one refused member writes nobody (carol is not listed either).
            teams.join_many("alpha", [JoinSpec(name="carol"), JoinSpec(name=name, pid=other)])
        assert str(by_join.value) == str(by_many.value) == expected + "pick another name"
        assert layout.team_file("alpha").read_bytes() == before


def test_dead_or_departed_members_are_replaced_by_both_paths_keeping_their_colour(
    teams: Teams, sleeper: Sleeper
) -> None:
    teams.create("alpha")
    first = sleeper()
    teams.join("alpha", "bob", pid=first.pid)
    teams.join_many("alpha", [JoinSpec(name="eve", pid=first.pid)])
    teams.join("alpha", "ann")
    colours = {m.name: m.color for m in teams.read("alpha").members}
    first.kill()
    first.wait()
    teams.leave("alpha", "ann")
    # Dead bob re-spawned by the batch path, dead eve re-joined alone, departed ann by both.
    second = sleeper()
    teams.join_many("alpha", [JoinSpec(name="bob"), JoinSpec(name="ann", pid=second.pid)])
    teams.join("alpha", "eve", pid=second.pid)
    tf = teams.read("alpha")
    assert [m.name for m in tf.members] == [LEAD_NAME, "bob", "eve", "ann"]
    assert {m.name: m.color for m in tf.members} == colours
    assert all(m.is_active for m in tf.members)


def test_a_listed_member_is_joined_by_its_own_worker_and_by_its_own_pid_again(
    teams: Teams, sleeper: Sleeper
) -> None:
    teams.create("alpha")
    # The swarm lists a process teammate with no pid (dead until its worker joins) ...
    listed = teams.join_many("alpha", [JoinSpec(name="bob", prompt="write the docs")])[0]
    worker = sleeper()
    # ... and the worker joins it with its own pid (`shoal worker` gives no prompt).
    joined = teams.join("alpha", "bob", pid=worker.pid, backend="process")
    assert joined.pid == worker.pid and joined.color == listed.color
    assert joined.prompt == "write the docs"
    # The same process joining again (identical pid and start time) is not a duplicate.
    assert teams.join("alpha", "bob", pid=worker.pid).pid == worker.pid
    # In-process teammates are listed with the leader's own pid, each batch alike.
    me = os.getpid()
    first = teams.join_many("alpha", [JoinSpec(name="ann", pid=me)])[0]
    same = JoinSpec(name="ann", pid=me, pid_started_at=first.pid_started_at)
    again = teams.join_many("alpha", [same])[0]
    assert (again.pid, again.pid_started_at, again.color) == (me, first.pid_started_at, first.color)


def test_join_many_refuses_a_name_given_twice(teams: Teams, layout: Layout) -> None:
    teams.create("alpha")
    before = layout.team_file("alpha").read_bytes()
    with pytest.raises(UsageError, match="given twice: bob"):
        teams.join_many("alpha", [JoinSpec(name="bob"), JoinSpec(name="bob")])
    assert layout.team_file("alpha").read_bytes() == before
