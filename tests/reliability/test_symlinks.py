"""No symlink under SHOAL_HOME is ever followed: a link planted where shoal keeps a directory (or
the team file) makes the real CLI command that would enter it fail with one error naming the
link, exit 1, and nothing is written where the link points."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from tests.conftest import Cli

TEAM = "t"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The directory every planted link points to; it must stay empty."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Layout]:
    """Team `t` with member `bob`, and its leader running in the background."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    joined = cli("team", "join", TEAM, "bob", "--pid", str(os.getpid()))
    assert joined.returncode == 0, joined.stderr
    try:
        yield Layout(home)
    finally:
        cli("down", "--team", TEAM)


@pytest.fixture
def stopped(cli: Cli, leader: Layout) -> Layout:
    """As `leader`, its leader stopped again (so the team has a session on disk)."""
    down = cli("down", "--team", TEAM)
    assert down.returncode == 0, down.stderr
    return leader


def session_dir(layout: Layout) -> Path:
    session = Teams(layout).read(TEAM).lead_session_id
    assert session is not None
    return layout.session_dir(session)


def plant(link: Path, target: Path) -> None:
    """Replace whatever is at `link` with a symlink to `target`."""
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(target)


def assert_refused(
    out: subprocess.CompletedProcess[str], link: Path, outside: Path, code: int = 1
) -> None:
    """The command failed (exit `code`) naming `link`, and wrote nothing through it."""
    assert out.returncode == code, (out.stdout, out.stderr)
    # One error line (`up --detach` prefixes the leader's own with "the leader exited at start").
    assert out.stderr.startswith("shoal: error: "), out.stderr
    assert f"{link} is a symlink; refusing to follow it (remove it)\n" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert sorted(os.listdir(outside)) == []


def test_sh_refuses_a_linked_tasks_directory(cli: Cli, leader: Layout, outside: Path) -> None:
    link = session_dir(leader) / "tasks"
    plant(link, outside)
    out = cli("sh", "--team", TEAM, "--", "echo", "hi")
    assert_refused(out, link, outside)
    listed = cli("ps", "--team", TEAM, "--json")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "[]"  # no task was created either


def test_sh_batch_refuses_a_linked_tasks_directory(
    cli: Cli, leader: Layout, outside: Path, tmp_path: Path
) -> None:
    link = session_dir(leader) / "tasks"
    plant(link, outside)
    batch = tmp_path / "cmds.txt"
    batch.write_text("echo one\necho two\n")
    out = cli("sh", "--team", TEAM, "--batch", str(batch))
    assert_refused(out, link, outside)


def test_up_refuses_a_linked_session_directory(cli: Cli, stopped: Layout, outside: Path) -> None:
    link = session_dir(stopped)
    plant(link, outside)
    out = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert_refused(out, link, outside)


def test_up_refuses_a_linked_logs_directory(
    cli: Cli, home: Path, stopped: Layout, outside: Path
) -> None:
    link = home / "logs"
    plant(link, outside)
    out = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert_refused(out, link, outside)


def test_a_linked_team_file_is_refused_by_every_reader(
    cli: Cli, stopped: Layout, outside: Path
) -> None:
    link = stopped.team_file(TEAM)
    plant(link, outside / "team.json")  # dangling: a write through it would create it
    for args in (
        ("team", "show", TEAM),
        ("task", "add", "--team", TEAM, "--owner", "bob", "a chore"),
        ("send", "--team", TEAM, "bob", "hello"),
        ("up", "--team", TEAM, "--detach", "--quiet"),
    ):
        assert_refused(cli(*args), link, outside)


def test_send_refuses_a_linked_inbox(cli: Cli, leader: Layout, outside: Path) -> None:
    link = leader.inbox_dir(TEAM, "bob")
    plant(link, outside)
    out = cli("send", "--team", TEAM, "bob", "hello")
    assert_refused(out, link, outside)


def test_task_add_refuses_a_linked_task_list(cli: Cli, stopped: Layout, outside: Path) -> None:
    link = stopped.tasklist_dir(TEAM)
    plant(link, outside)
    assert_refused(cli("task", "add", "--team", TEAM, "a chore"), link, outside)
    assert_refused(cli("task", "list", "--team", TEAM), link, outside)


def test_a_linked_status_directory_is_refused(cli: Cli, stopped: Layout, outside: Path) -> None:
    link = stopped.status_dir(TEAM)
    plant(link, outside)
    assert_refused(cli("team", "show", TEAM), link, outside)


def test_run_refuses_a_linked_runs_directory(
    cli: Cli, home: Path, outside: Path, tmp_path: Path
) -> None:
    link = home / "runs"
    plant(link, outside)
    spec = tmp_path / "spec.toml"
    marker = tmp_path / "ran"
    spec.write_text(
        textwrap.dedent(
            f"""\
            [[task]]
            id = "one"
            run = "touch {marker}"
            """
        )
    )
    out = cli("run", str(spec))
    assert_refused(out, link, outside, code=3)  # (shoal run: infrastructure, not a task)
    assert not marker.exists()  # refused before any task started
