"""The CLI of teams and mailboxes, run as real processes: output shapes, exit codes, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shoal import __version__
from tests.conftest import Cli
from tests.polling import wait_until


def test_version_and_module_entry(cli: Cli) -> None:
    out = cli("--version")
    assert out.returncode == 0 and __version__ in out.stdout
    helped = cli("--help")
    assert helped.returncode == 0 and "team" in helped.stdout and "send" in helped.stdout


def test_team_lifecycle_json(cli: Cli, home: Path) -> None:
    created = cli("team", "create", "alpha", "--description", "our team", "--json")
    assert created.returncode == 0, created.stderr
    data = json.loads(created.stdout)
    assert data["name"] == "alpha" and data["v"] == 1
    assert data["lead_agent_id"] == "team-lead@alpha"
    listed = json.loads(cli("team", "list", "--json").stdout)
    assert [t["name"] for t in listed] == ["alpha"]
    assert listed[0]["description"] == "our team"
    shown = json.loads(cli("team", "show", "alpha", "--json").stdout)
    assert shown["members"][0]["name"] == "team-lead"
    assert shown["members"][0]["state"] in {"dead", "active"}
    deleted = cli("team", "delete", "alpha", "--json")
    assert deleted.returncode == 0 and json.loads(deleted.stdout) == {"deleted": "alpha"}
    assert json.loads(cli("team", "list", "--json").stdout) == []


def test_home_option_overrides_environment(cli: Cli, tmp_path: Path) -> None:
    other = tmp_path / "other-home"
    assert cli("--home", str(other), "team", "create", "beta").returncode == 0
    assert cli("team", "create", "gamma", "--home", str(other)).returncode == 0
    assert (other / "teams" / "beta" / "team.json").exists()
    assert (other / "teams" / "gamma" / "team.json").exists()
    assert json.loads(cli("team", "list", "--json").stdout) == []


def test_taken_and_invalid_names(cli: Cli, home: Path) -> None:
    assert cli("team", "create", "alpha").returncode == 0
    taken = cli("team", "create", "alpha", "--json")  # (a taken name: a word slug instead)
    assert taken.returncode == 0, taken.stderr
    slugged = json.loads(taken.stdout)["name"]
    assert slugged != "alpha" and not slugged.startswith("alpha")
    assert f"team 'alpha' already exists, so the new team is {slugged!r}" in taken.stderr
    unique = cli("team", "create", "alpha", "--unique", "--json")
    assert json.loads(unique.stdout)["name"].startswith("alpha-")
    for bad in ("../x", "Team", "a b", "", "x" * 49):
        out = cli("team", "create", bad)
        assert out.returncode == 2, bad
        assert out.stderr.startswith("shoal: error: invalid team name")
        assert "Traceback" not in out.stderr
    assert sorted(os.listdir(home / "teams")) == sorted(
        ["alpha", slugged, json.loads(unique.stdout)["name"]]
    )


def test_join_send_inbox_round_trip(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_TEAM", "alpha")  # (the default team is `default`)
    cli("team", "create", "alpha")
    member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        joined = cli("team", "join", "alpha", "bob", "--pid", str(member.pid), "--json")
        assert joined.returncode == 0, joined.stderr
        assert json.loads(joined.stdout)["agent_id"] == "bob@alpha"
        sent = cli("send", "bob", "hello bob", "--team", "alpha")
        assert sent.returncode == 0, sent.stderr
        msg_id = sent.stdout.strip()
        assert len(msg_id) == 26
        sent2 = cli(
            "send", "bob", "--kind", "shutdown_request", "--data", '{"request_id": "r1"}', "--json"
        )
        assert json.loads(sent2.stdout)["recipients"] == ["bob"]
        peeked = json.loads(cli("inbox", "bob", "--peek", "--json").stdout)
        assert [m["kind"] for m in peeked] == ["shutdown_request", "text"]
        assert peeked[1]["id"] == msg_id and peeked[1]["from"] == "team-lead"
        taken = json.loads(cli("inbox", "bob", "--json").stdout)
        assert [m["kind"] for m in taken] == ["shutdown_request", "text"]
        assert json.loads(cli("inbox", "bob", "--json").stdout) == []
        left = cli("team", "leave", "alpha", "bob")
        assert left.returncode == 0
    finally:
        member.kill()
        member.wait()


def test_send_errors(cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_TEAM", "alpha")  # (the default team is `default`)
    cli("team", "create", "alpha")
    unknown = cli("send", "mallory", "hi")
    assert unknown.returncode == 1 and "mallory" in unknown.stderr
    assert not (home / "teams" / "alpha" / "inboxes" / "mallory").exists()
    for verb in (
        ["approve", "mallory"],
        ["reject", "mallory", "--feedback", "no"],
        ["inbox", "mallory"],
    ):
        out = cli(*verb)
        assert out.returncode == 1 and "no member 'mallory' in team 'alpha'" in out.stderr, verb
    forged = cli("send", "team-lead", "hi", "--from", "nobody")
    assert forged.returncode == 1 and "no member 'nobody'" in forged.stderr
    assert not os.listdir(home / "teams" / "alpha" / "inboxes" / "team-lead" / "new")
    bad_json = cli("send", "team-lead", "--data", "{nope")
    assert bad_json.returncode == 2 and "--data is not valid JSON" in bad_json.stderr
    wrong = cli("send", "team-lead", "--kind", "shutdown_response", "--data", '{"approve": 1}')
    assert wrong.returncode == 2 and "shutdown_response" in wrong.stderr
    empty = cli("send", "team-lead")
    assert empty.returncode == 2
    huge = cli("send", "team-lead", "-", input="x" * (1024 * 1024 + 10))
    assert huge.returncode == 2 and "cap" in huge.stderr
    cli("team", "create", "beta")
    monkeypatch.delenv("SHOAL_TEAM")
    nameless = cli("send", "team-lead", "hi")  # (no `default` team: the others are named)
    assert nameless.returncode == 1 and "teams on disk: alpha, beta" in nameless.stderr


def test_team_delete_refused_while_members_are_active(cli: Cli) -> None:
    cli("team", "create", "alpha")
    member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        cli("team", "join", "alpha", "bob", "--pid", str(member.pid))
        refused = cli("team", "delete", "alpha")
        assert refused.returncode == 1 and "bob" in refused.stderr
        forced = cli("team", "delete", "alpha", "--force")
        assert forced.returncode == 0, forced.stderr
        member.wait(timeout=10)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()


def test_corrupt_team_file_is_named(cli: Cli, home: Path) -> None:
    cli("team", "create", "alpha")
    path = home / "teams" / "alpha" / "team.json"
    path.write_text("{ broken")
    out = cli("team", "show", "alpha")
    assert out.returncode == 1 and str(path) in out.stderr
    assert path.read_text() == "{ broken"
    listed = cli("team", "list")
    assert listed.returncode == 0 and "CORRUPT" in listed.stdout


def test_inbox_follow_prints_as_messages_arrive(
    cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_TEAM", "alpha")  # (the default team is `default`)
    cli("team", "create", "alpha")
    cli("team", "join", "alpha", "bob", "--pid", str(os.getpid()))
    follower = subprocess.Popen(
        [sys.executable, "-m", "shoal", "inbox", "bob", "--follow", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(home)},
    )
    try:
        ids = [cli("send", "bob", f"m{i}").stdout.strip() for i in range(3)]
        assert follower.stdout is not None
        lines = [json.loads(follower.stdout.readline()) for _ in range(3)]
        assert [m["id"] for m in lines] == ids
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 130
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    wait_until(lambda: not os.listdir(home / "teams/alpha/inboxes/bob/cur"))


def test_inbox_listens_for_unix_socket_peers(cli: Cli, home: Path, tmp_path: Path) -> None:
    cli("team", "create", "alpha")
    cli("team", "join", "alpha", "bob", "--pid", str(os.getpid()))
    sock = tmp_path / "bob.sock"
    listener = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal",
            "inbox",
            "--team",
            "alpha",
            "bob",
            "--listen",
            str(sock),
            "--json",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(home)},
    )
    try:
        wait_until(sock.exists)
        sent = cli("send", "--team", "alpha", f"uds:{sock}", "over the socket", "--from", "carl")
        assert sent.returncode == 0, sent.stderr
        assert listener.stdout is not None
        msg = json.loads(listener.stdout.readline())
        assert msg["id"] == sent.stdout.strip() and msg["from"] == "carl"
        listener.send_signal(signal.SIGINT)
        assert listener.wait(timeout=10) == 130
        assert not sock.exists()
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    gone = cli("send", "--team", "alpha", f"uds:{sock}", "nobody listens")
    assert gone.returncode == 1 and "unreachable" in gone.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["ps", "--bogus"], "no such option --bogus (see `shoal ps --help`)"),
        (["ps", "--jsn"], "no such option --jsn, did you mean --json? (see `shoal ps --help`)"),
        (["bogus"], "no such command 'bogus' (see `shoal --help`)"),
        (["wiat"], "no such command 'wiat'; did you mean 'wait'? (see `shoal --help`)"),
        (["team", "list", "--bogus"], "(see `shoal team list --help`)"),
        (["sh", "--batch", "/nonexistent/cmds"], "No such file or directory"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(cli: Cli, argv: list[str], says: str) -> None:
    out = cli(*argv)
    assert out.returncode == 2
    assert out.stderr.startswith("shoal: error: ") and out.stderr.count("\n") == 1
    assert says in out.stderr
    assert out.stdout == ""


def test_no_team_at_all_is_not_found(cli: Cli) -> None:
    out = cli("ps")
    assert out.returncode == 1 and "no team 'default'" in out.stderr and "shoal up" in out.stderr


def test_home_and_team_may_come_before_the_subcommand(cli: Cli, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    assert cli("team", "--home", str(other), "create", "far").returncode == 0
    listed = cli("team", "--home", str(other), "list", "--json")
    assert [t["name"] for t in json.loads(listed.stdout)] == ["far"]
    assert json.loads(cli("team", "list", "--json").stdout) == []  # not in the default home
