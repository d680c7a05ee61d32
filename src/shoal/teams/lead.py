"""A team's leader as its team file says, read as plain JSON without the models: is it
running, which session is the team's. Every CLI call asks this first, so it imports little."""

from __future__ import annotations

from typing import Any

import orjson

from shoal.core.errors import NotFoundError, ShoalError
from shoal.core.jsonio import read_bytes_nofollow
from shoal.core.names import LEAD_NAME
from shoal.core.paths import Layout, check_path
from shoal.core.procs import is_alive


class NoLeaderError(ShoalError):
    """No leader runs for the team: one wording (and exit 1) whichever command needed it;
    `why` says what cannot happen without one."""

    def __init__(self, team: str, why: str = "") -> None:
        self.team = team
        because = f" ({why})" if why else ""
        super().__init__(
            f"no leader is running for team {team!r}{because}; "
            f"start one with `shoal up --team {team}`"
        )


def team_record(layout: Layout, team: str) -> dict[str, Any]:
    """The team file as plain data. A missing file, or one that is not what shoal writes, is
    read again by the validating store, which raises the error naming it (NotFoundError for
    no team at all)."""
    path = layout.team_file(team)
    if check_path(str(path), "file") is not None:  # (a planted link is refused by name)
        layout.checked(path)
        try:
            data = orjson.loads(read_bytes_nofollow(path))
        except (OSError, orjson.JSONDecodeError):
            data = None
        if (
            isinstance(data, dict)
            and data.get("v") == 1
            and isinstance(data.get("members"), list)
            and all(isinstance(m, dict) for m in data["members"])
        ):
            return data
    from shoal.teams.store import Teams

    return Teams(layout).read(team).model_dump(mode="json")


def lead_session_id(layout: Layout, team: str) -> str | None:
    """The id of the team's latest leader session, if it has one (NotFoundError: no team)."""
    value = team_record(layout, team).get("lead_session_id")
    return value if isinstance(value, str) else None


def leader_alive(layout: Layout, team: str) -> tuple[int, float] | None:
    """(pid, start time) of the team's running leader, or None."""
    try:
        record = team_record(layout, team)
    except NotFoundError:
        return None
    lead = next((m for m in record["members"] if m.get("name") == LEAD_NAME), None)
    if lead is None:
        return None
    pid, started = lead.get("pid"), lead.get("pid_started_at")
    if not isinstance(pid, int) or not is_alive(pid, started):
        return None
    return pid, float(started or 0.0)


def require_leader(layout: Layout, team: str) -> tuple[int, float]:
    """The running leader's (pid, start time), or NoLeaderError naming `shoal up`."""
    alive = leader_alive(layout, team)
    if alive is None:
        raise NoLeaderError(team)
    return alive
