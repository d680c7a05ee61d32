"""`shoal team ...`: create, list, show, delete, join and leave teams."""

from __future__ import annotations

import os
from typing import Any

import click

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import CorruptFileError
from shoal.teams.founding import found
from shoal.teams.models import TeamFile
from shoal.teams.store import MemberView, Teams


def _teams() -> Teams:
    return Teams(get_env(click.get_current_context()).layout)


def _team_json(tf: TeamFile, views: list[MemberView] | None = None) -> dict[str, Any]:
    data = tf.model_dump(mode="json")
    if views is not None:
        data["members"] = [v.to_json() for v in views]
    return data


@click.group()
@common_options
def team() -> None:
    """Create, inspect and delete teams; join or leave them from any program."""


@team.command("create")
@click.argument("name")
@click.option("--description", "-d", default="", help="What the team is for.")
@click.option(
    "--unique",
    is_flag=True,
    help="If NAME is taken, name the team NAME plus a word-slug suffix (without it: a "
    "word slug alone, as TeamCreate does).",
)
@json_option
@common_options
def create(name: str, description: str, unique: bool, as_json: bool) -> None:
    """Create team NAME with its lead (team-lead@NAME) and an empty task list, as the
    TeamCreate tool does: a taken NAME gets a word-slug name instead; with --team (or
    $SHOAL_TEAM) naming a team whose leader runs, it is refused (one team per leader)."""
    env = get_env(click.get_current_context())
    acting_for = env.team_arg or os.environ.get("SHOAL_TEAM") or None
    made = found(_teams(), name, description, unique=unique, leader_of=acting_for)
    if as_json:
        print_json(_team_json(made.team))
        for line in made.lines()[1:]:
            click.echo(f"shoal: note: {line}", err=True)
    else:
        for line in made.lines():
            click.echo(line)


@team.command("list")
@json_option
@common_options
def list_(as_json: bool) -> None:
    """List all teams."""
    teams = _teams()
    rows: list[dict[str, Any]] = []
    for tf in teams.all():
        if isinstance(tf, CorruptFileError):
            rows.append({"name": tf.path.parent.name, "error": tf.reason})
            continue
        views = teams.members(tf.name)
        rows.append(
            {
                "name": tf.name,
                "description": tf.description,
                "created_at": tf.created_at,
                "members": len(tf.members),
                "alive": sum(1 for v in views if v.alive),
            }
        )
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no teams (create one with `shoal team create NAME`)")
    for row in rows:
        if "error" in row:
            click.echo(f"{row['name']}\tCORRUPT: {row['error']}")
        else:
            desc = f"\t{row['description']}" if row["description"] else ""
            count = row["members"]
            members = f"{count} member{'' if count == 1 else 's'}"
            click.echo(f"{row['name']}\t{members}, {row['alive']} alive{desc}")


@team.command("show")
@click.argument("name", required=False)
@json_option
@common_options
def show(name: str | None, as_json: bool) -> None:
    """Show team NAME (default: --team or the only team) with each member's state."""
    teams = _teams()
    name = get_env(click.get_current_context()).team(name)
    tf = teams.read(name)
    views = teams.members(name)
    if as_json:
        print_json(_team_json(tf, views))
        return
    click.echo(f"team {tf.name}" + (f" — {tf.description}" if tf.description else ""))
    click.echo(f"created {tf.created_at}; lead {tf.lead_agent_id}")
    for v in views:
        m = v.member
        pid = f"pid {m.pid}" if m.pid else "no pid"
        click.echo(
            f"  {m.name:<20} {v.state.value:<9} {m.color or '-':<10} {m.agent_type:<10} {pid}"
        )
    for p in tf.team_allowed_paths:
        click.echo(f"  allowed path: {p.path} (added by {p.added_by})")


@team.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Stop active members first.")
@json_option
@common_options
def delete(name: str, force: bool, as_json: bool) -> None:
    """Delete team NAME: its file, inboxes, status and worktrees. Refused while non-lead
    members are active (named, with how to stop them) or its leader runs."""
    tf = _teams().delete(name, force=force)
    if as_json:
        print_json({"deleted": tf.name})
    else:
        click.echo(f"deleted team {tf.name}")


@team.command("join")
@click.argument("team_name", metavar="TEAM")
@click.argument("name")
@click.option(
    "--pid",
    type=int,
    default=None,
    help="Process that is the member (default: the calling program, our parent).",
)
@click.option("--agent-type", default="worker", show_default=True, help="Kind of member.")
@click.option("--cwd", default=None, help="Working directory of the member.")
@json_option
@common_options
def join(
    team_name: str, name: str, pid: int | None, agent_type: str, cwd: str | None, as_json: bool
) -> None:
    """Join TEAM as NAME; liveness is tracked through PID and its start time."""
    member = _teams().join(
        team_name,
        name,
        pid=pid if pid is not None else os.getppid(),
        agent_type=agent_type,
        cwd=cwd,
        backend="external",
    )
    if as_json:
        print_json(member.model_dump(mode="json"))
    else:
        click.echo(f"joined {team_name} as {member.agent_id} (pid {member.pid}, {member.color})")


@team.command("leave")
@click.argument("team_name", metavar="TEAM")
@click.argument("name")
@json_option
@common_options
def leave(team_name: str, name: str, as_json: bool) -> None:
    """Leave TEAM as NAME (the member stays listed as departed)."""
    from shoal.teams.tasklist import TaskList

    teams = _teams()
    member = teams.leave(team_name, name)
    released = TaskList(teams, team_name).release_member(name)
    if released and not as_json:
        click.echo(f"its tasks went back to pending: {', '.join(str(t.id) for t in released)}")
    if as_json:
        print_json(member.model_dump(mode="json"))
    else:
        click.echo(f"{member.agent_id} left {team_name}")
