"""Is a team's leader running? Read from the team file (and the session's state), without
importing the leader itself: every CLI call that talks to a leader asks this first."""

from __future__ import annotations

from shoal.core.errors import NotFoundError, ShoalError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams


def leader_alive(layout: Layout, team: str) -> tuple[int, float] | None:
    """(pid, start time) of the team's running leader, or None."""
    try:
        lead = Teams(layout).read(team).member(LEAD_NAME)
    except NotFoundError:
        return None
    if lead is None or lead.pid is None or not is_alive(lead.pid, lead.pid_started_at):
        return None
    return lead.pid, lead.pid_started_at or 0.0


def leader_ready(layout: Layout, team: str) -> int | None:
    """The pid of the team's leader once it has finished starting (its session's state names
    it), else None. `leader_alive` is true a little earlier: from its claim of the lead."""
    alive = leader_alive(layout, team)
    if alive is None:
        return None
    from shoal.orchestrator.session import current_session

    try:
        session = current_session(layout, team)
        state = session.read_state() if session is not None else None
    except ShoalError:
        return None
    if state is None or state.leader is None or state.leader.pid != alive[0]:
        return None
    return alive[0]
