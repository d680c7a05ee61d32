"""Is a team's leader running? Read from the team file (and the session's state), without
importing the leader itself: every CLI call that talks to a leader asks this first."""

from __future__ import annotations

import contextlib
import os
import resource

from shoal.channel.client import leader_alive as leader_alive
from shoal.core.errors import ConflictError, CorruptFileError, ShoalError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.teams.models import LEAD_NAME, TeamFile
from shoal.teams.store import Teams


def leader_ready(layout: Layout, team: str) -> int | None:
    """The pid of the team's leader once it has finished starting (its session's state names
    it), else None. `leader_alive` is true a little earlier: from its claim of the lead."""
    alive = leader_alive(layout, team)
    if alive is None:
        return None
    from shoal.teams.session import current_session

    try:
        session = current_session(layout, team)
        state = session.read_state() if session is not None else None
    except ShoalError:
        return None
    if state is None or state.leader is None or state.leader.pid != alive[0]:
        return None
    return alive[0]


def claim_lead(teams: Teams, team: str, identity: tuple[int, float]) -> TeamFile:
    """Make process `identity` the team's lead, checked and taken under the team file's lock
    (two `shoal up` at once: one leader); ConflictError naming the one that runs."""
    me, my_start = identity

    def claim(tf: TeamFile) -> TeamFile:
        lead = tf.member(LEAD_NAME)
        if lead is None:
            raise CorruptFileError(teams.layout.team_file(team), "it lists no team-lead")
        if lead.pid not in (None, me) and is_alive(lead.pid, lead.pid_started_at):
            raise ConflictError(
                f"a leader already runs for team {team!r} (pid {lead.pid}); "
                f"stop it with `shoal down --team {team}`"
            )
        update = {"pid": me, "pid_started_at": my_start, "backend": "leader"}
        return tf.with_member(lead.model_copy(update={**update, "cwd": os.getcwd()}))

    return teams.update(team, claim)


def raise_fd_limit(want: int = 65536) -> None:
    """Raise this process's soft limit of open files towards the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
