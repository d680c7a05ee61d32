"""Edges of the CLI through real processes: `ps` after a teammate shut down, bad messages in an
inbox, an empty --team, and an empty message from standard input."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.errors import EXIT_USAGE
from shoal.core.paths import Layout
from shoal.teams.store import Teams
from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "t"


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Layout]:
    """Team `t`'s leader, running in the background."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    try:
        yield Layout(home)
    finally:
        cli("down", "--team", TEAM)


def tasks(cli: Cli, *args: str) -> list[dict[str, Any]]:
    out = cli("ps", "--team", TEAM, "--json", *args)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def test_ps_lists_a_teammate_that_shut_down(cli: Cli, leader: Layout) -> None:
    spawned = cli("spawn", "--team", TEAM, "ana", "--backend", "process", "--json")
    assert spawned.returncode == 0, spawned.stderr
    task_id = json.loads(spawned.stdout)["task_id"]
    asked = cli(
        "send",
        "--team",
        TEAM,
        "ana",
        "--kind",
        "shutdown_request",
        "--data",
        '{"request_id": "r1"}',
    )
    assert asked.returncode == 0, asked.stderr

    def ended() -> dict[str, Any] | None:
        row = {t["id"]: t for t in tasks(cli, "--all")}.get(task_id)
        return (
            row if row is not None and row["status"] in ("completed", "failed", "killed") else None
        )

    final = wait_until(ended, timeout=30, what=f"teammate task {task_id} to end")
    assert isinstance(final["result"], str)  # a teammate's result is its closing text
    for args in ((), ("--all",)):
        out = cli("ps", "--team", TEAM, *args)
        assert out.returncode == 0, out.stderr
        if args:
            assert task_id in out.stdout and final["status"] in out.stdout


def test_inbox_says_which_messages_went_to_bad(cli: Cli, home: Path) -> None:
    teams = Teams(Layout(home))
    teams.create(TEAM)
    teams.join(TEAM, "bob", pid=os.getpid())
    assert cli("send", "--team", TEAM, "bob", "hello").returncode == 0
    new = Layout(home).inbox_dir(TEAM, "bob") / "new"
    (new / "1700000000000000000.1_1.host").write_text("not json")
    (new / "1700000000000000001.1_2.host").write_text('{"v": 1, "kind": "text"}')
    out = cli("inbox", "--team", TEAM, "bob")
    assert out.returncode == 0, out.stderr
    assert "hello" in out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    bad = Layout(home).inbox_dir(TEAM, "bob") / "bad"
    assert lines[0].startswith(
        f"shoal: warning: bad message 1700000000000000000.1_1.host moved to {bad}: not valid JSON"
    )
    assert lines[1].startswith(
        f"shoal: warning: bad message 1700000000000000001.1_2.host moved to {bad}: invalid message"
    )
    again = cli("inbox", "--team", TEAM, "bob")  # said once: they were moved by the first read
    assert again.returncode == 0 and again.stderr == "" and again.stdout == ""


def test_an_empty_team_option_is_refused(cli: Cli, home: Path) -> None:
    Teams(Layout(home)).create("only")
    for args in (("ps", "--team", ""), ("--team", "", "ps"), ("up", "--detach", "--team", "")):
        out = cli(*args)
        assert out.returncode == EXIT_USAGE, out.stderr
        assert out.stderr.startswith("shoal: error: Invalid value for '--team': ")
        assert "the team name is empty" in out.stderr
    # An empty $SHOAL_TEAM is unset, as empty variables go: the default team is taken.
    Teams(Layout(home)).create("default")
    out = cli("team", "show", env={"SHOAL_TEAM": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("team default")


def test_send_refuses_an_empty_message(cli: Cli, home: Path) -> None:
    teams = Teams(Layout(home))
    teams.create(TEAM)
    teams.join(TEAM, "bob", pid=os.getpid())
    for args, stdin in (("-", ""), ("-", " \n"), ("", None)):
        out = cli("send", "--team", TEAM, "bob", args, input=stdin)
        assert out.returncode == EXIT_USAGE, out.stderr
        assert out.stderr.startswith("shoal: error: nothing to send: ")
    assert os.listdir(Layout(home).inbox_dir(TEAM, "bob") / "new") == []
    sent = cli("send", "--team", TEAM, "bob", "-", input="real text\n")
    assert sent.returncode == 0, sent.stderr
