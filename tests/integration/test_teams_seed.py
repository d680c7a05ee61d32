"""TeamCreate / TeamDelete as the seed's, through the CLI and the agent tools alike, with a real
leader: one team per leader, a word-slug name on a clash, a new team's list starts empty, and
delete refused while members are active, naming them and how to stop them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.errors import ConflictError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.teams.store import Teams
from shoal.workers.agent.team_tools import TeamCreateArgs, TeamDeleteArgs, TeamTools
from tests.conftest import Cli
from tests.integration.test_leader import FAST, LeaderProc
from tests.polling import wait_until


class _Port:
    """The leader port of an agent tool call that does not reach the leader."""

    def call(self, op: str, args: dict[str, Any]) -> Any:
        raise AssertionError(f"{op} is not used by the team tools")

    def task_records(self) -> dict[str, dict[str, Any]]:
        return {}


def tools(home: Path, team: str) -> TeamTools:
    """The team tools of an agent of team `team` (as its runner builds them)."""
    return TeamTools(home, team, "a00000000", _Port())


@pytest.fixture
def leader(home: Path, cli: Cli) -> Iterator[LeaderProc]:
    proc = LeaderProc(home, env={"SHOAL_SHUTDOWN_TIMEOUT": "3"})
    yield proc
    cli("down", "--team", "t", env=FAST)
    proc.stop()


def test_a_running_leader_refuses_a_second_team_naming_the_one_it_leads(
    cli: Cli, leader: LeaderProc, home: Path
) -> None:
    refused = cli("team", "create", "side", "--team", "t")
    assert refused.returncode == 1, refused
    message = refused.stderr.removeprefix("shoal: error: ").strip()
    assert message.startswith(
        f"the leader of team 't' (pid {leader.proc.pid}) already leads team 't', and a leader "
        "leads one team at a time; team 'side' was not created"
    )
    assert "`shoal up --team side`" in message
    as_env = cli("team", "create", "side", env={"SHOAL_TEAM": "t"})
    assert as_env.returncode == 1 and message in as_env.stderr
    # The agent tool of an agent of that leader: the same rule, the same words.
    with pytest.raises(ConflictError) as err:
        tools(home, "t").teamcreate(TeamCreateArgs(team_name="side"))
    assert str(err.value) == message
    assert not Teams(Layout(home)).exists("side")
    # Asked for by no leader (no --team, no $SHOAL_TEAM), the team is made.
    made = cli("team", "create", "side", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["name"] == "side"
    # Once the leader has stopped, it leads nothing: its agents' tool may create again.
    assert cli("down", "--team", "t", env=FAST).returncode == 0
    leader.proc.wait(30)
    answer = tools(home, "t").teamcreate(TeamCreateArgs(team_name="later"))
    assert answer == "created team later (lead team-lead@later)"


def test_a_taken_name_gets_a_word_slug_from_the_cli_and_the_tool(cli: Cli, home: Path) -> None:
    assert cli("team", "create", "alpha").returncode == 0
    taken = cli("team", "create", "alpha")
    assert taken.returncode == 0, taken.stderr
    first, second = taken.stdout.splitlines()
    slug = first.split()[2]
    assert slug != "alpha" and not slug.startswith("alpha") and "-" in slug
    assert second == f"team 'alpha' already exists, so the new team is {slug!r}"
    answer = tools(home, "alpha").teamcreate(TeamCreateArgs(team_name="alpha"))
    other = answer.split()[2]
    assert other not in ("alpha", slug)
    assert f"team 'alpha' already exists, so the new team is {other!r}" in answer
    unique = cli("team", "create", "alpha", "--unique", "--json")  # (still NAME-slug)
    assert json.loads(unique.stdout)["name"].startswith("alpha-")
    assert set(Teams(Layout(home)).names()) == {
        "alpha",
        slug,
        other,
        json.loads(unique.stdout)["name"],
    }


def test_a_new_team_does_not_inherit_the_list_an_earlier_team_of_its_name_left(
    cli: Cli, home: Path
) -> None:
    assert cli("team", "create", "alpha").returncode == 0
    for subject in ("old one", "old two"):
        assert cli("task", "add", subject, "--team", "alpha").returncode == 0
    # The team file is lost (by hand, or a crash): its directory and list stay behind.
    (home / "teams" / "alpha" / "team.json").unlink()
    again = cli("team", "create", "alpha")
    assert again.returncode == 0, again.stderr
    listed = cli("task", "list", "--team", "alpha", "--json")
    assert json.loads(listed.stdout) == []
    assert again.stdout.splitlines()[1:] == [
        "cleared 2 task(s) an earlier team 'alpha' left in its list: a new team starts with "
        "an empty list (their ids are not issued again)"
    ]
    added = cli("task", "add", "new", "--team", "alpha", "--json")
    assert json.loads(added.stdout)["id"] == 3  # (1 and 2 were the old team's)


def test_delete_is_refused_while_teammates_are_active_naming_them(
    cli: Cli, leader: LeaderProc, home: Path
) -> None:
    spawned = cli("spawn", "--team", "t", "ana", "--backend", "process", "--json")
    assert spawned.returncode == 0, spawned.stderr
    pid = json.loads(spawned.stdout)["pid"]
    refused = cli("team", "delete", "t")
    assert refused.returncode == 1
    message = refused.stderr.removeprefix("shoal: error: ").strip()
    assert message.startswith("team 't' still has active members: ana (")
    assert "send each a shutdown request (`shoal send ana --kind shutdown_request" in message
    assert message.endswith("or pass --force to shut them all down; nothing was deleted")
    # The agent tool (of an agent of another team) is refused in the same words.
    with pytest.raises(ConflictError) as err:
        tools(home, "home").teamdelete(TeamDeleteArgs(team_name="t"))
    assert str(err.value).split(": ana (")[0] == message.split(": ana (")[0]
    assert Teams(Layout(home)).exists("t")
    # Doing what it says: the shutdown request stops the teammate...
    command = message.split("(`", 1)[1].split("`)", 1)[0]
    data = command.split("--data '", 1)[1].split("'", 1)[0]
    asked = cli("send", "ana", "--kind", "shutdown_request", "--data", data, "--team", "t")
    assert asked.returncode == 0, asked.stderr
    wait_until(lambda: not is_alive(pid, None), timeout=30)
    # ...then only the leader stands in the way, and says so.
    leader_runs = cli("team", "delete", "t")
    assert leader_runs.returncode == 1
    assert "the leader of team 't' is running" in leader_runs.stderr
    assert cli("down", "--team", "t", env=FAST).returncode == 0
    leader.proc.wait(30)
    deleted = cli("team", "delete", "t", "--json")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout) == {"deleted": "t"}
