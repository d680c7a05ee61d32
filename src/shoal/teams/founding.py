"""TeamCreate, as the seed's: the one way `shoal team create` and the TeamCreate tool make a
team. One team per leader; a taken name gets a word-slug name; the new team's task list starts
empty (Team = Project = TaskList: nothing an earlier team of the name left is inherited).
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.core.errors import ConflictError, NotFoundError
from shoal.core.names import validate_name, with_slug, word_slug
from shoal.core.procs import is_alive
from shoal.teams.models import LEAD_NAME, TeamFile
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList

# Clashes tried with a slug alone (the seed's) before NAME-slug: 900 slugs, so a few are taken.
SLUG_TRIES = 20


@dataclass(frozen=True)
class CreatedTeam:
    """What `found` made: the team, the name asked for, and what it cleared."""

    team: TeamFile
    asked: str
    cleared_tasks: int = 0
    """Items of a task list an earlier team of this name left, removed (ids stay issued)."""

    @property
    def renamed(self) -> bool:
        """True when the name asked for was taken and the team got another."""
        return self.team.name != self.asked

    def lines(self) -> list[str]:
        """What to tell whoever asked (the CLI prints these, TeamCreate answers them)."""
        tf = self.team
        out = [f"created team {tf.name} (lead {tf.lead_agent_id})"]
        if self.renamed:
            out.append(f"team {self.asked!r} already exists, so the new team is {tf.name!r}")
        if self.cleared_tasks:
            out.append(
                f"cleared {self.cleared_tasks} task(s) an earlier team {tf.name!r} left in its "
                "list: a new team starts with an empty list (their ids are not issued again)"
            )
        return out


def found(
    teams: Teams,
    team: str,
    description: str = "",
    *,
    unique: bool = False,
    leader_of: str | None = None,
) -> CreatedTeam:
    """Create team `team` as TeamCreate does.

    Asked for by (an agent of) the leader of team `leader_of`, it is refused while that
    leader runs, naming the team it leads. A taken name is not an error: the team gets a
    word-slug name instead (with `unique`, NAME plus a word-slug suffix). Items an earlier
    team of the name left in the list are removed; the high-water mark keeps their ids.
    """
    validate_name(team, "team name")
    if leader_of is not None:
        refuse_a_second_team(teams, leader_of, team)
    teams.layout.ensure(teams.layout.teams_dir)
    name = team
    for attempt in range(2 * SLUG_TRIES):
        created = teams.try_create(name, description)
        if created is not None:
            return CreatedTeam(created, team, _reset_tasklist(teams, created.name))
        name = with_slug(team) if unique or attempt >= SLUG_TRIES else word_slug()
    raise ConflictError(f"could not find a free name for team {team!r}")


def refuse_a_second_team(teams: Teams, leader_of: str, team: str) -> None:
    """ConflictError when the leader of `leader_of` runs: it leads that team already."""
    try:
        lead = teams.read(leader_of).member(LEAD_NAME)
    except NotFoundError:
        return  # no such team: no leader asking
    if lead is None or not is_alive(lead.pid, lead.pid_started_at):
        return
    raise ConflictError(
        f"the leader of team {leader_of!r} (pid {lead.pid}) already leads team "
        f"{leader_of!r}, and a leader leads one team at a time; team {team!r} was not "
        f"created: give it its own leader with `shoal up --team {team}` (which creates "
        f"it), or stop this one first with `shoal down --team {leader_of}`"
    )


def _reset_tasklist(teams: Teams, team: str) -> int:
    """Empty a new team's task list (see `TaskList.reset`); how many items it removed."""
    if not any(teams.layout.tasklist_dir(team).glob("*.json")):
        return 0
    return TaskList(teams, team).reset()
