"""A corrupt or missing team file never strands a leader: `shoal down` finds the leader from its
session's own record (pid + start time) and stops it with everything it started."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.teams.session import SessionState, current_session
from shoal.workers.shell import process as shell
from tests.conftest import Cli, group_gone
from tests.polling import wait_until


def _leader_with_a_task(cli: Cli, layout: Layout, team: str) -> tuple[int, float, int, str]:
    """A detached leader running one long shell task: (leader pid, its start, task pgid, marker)."""
    up = cli("up", "--team", team, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    marker = f"marker-{uuid.uuid4().hex}"
    sh = cli("sh", "--team", team, "--", f"sleep 300 # {marker}")
    assert sh.returncode == 0, sh.stderr
    task_id = sh.stdout.split()[0]
    session = current_session(layout, team)
    assert session is not None

    def listed() -> SessionState | None:
        s = session.read_state()
        return s if s.leader is not None and task_id in s.tasks else None

    state = wait_until(listed, what="state.json to list the leader and the task")
    assert state.leader is not None
    output = state.tasks[task_id].output_file
    pgid = wait_until(lambda: shell.recorded_pid(output), what="the task's recorded pid")
    return state.leader.pid, state.leader.started_at, pgid, marker


@pytest.mark.parametrize("damage", ["garbage", "moved aside"])
def test_down_stops_a_leader_whose_team_file_is_damaged(
    cli: Cli, layout: Layout, damage: str
) -> None:
    pid, started, pgid, _marker = _leader_with_a_task(cli, layout, "c")
    team_file = layout.team_file("c")
    if damage == "garbage":
        team_file.write_bytes(b"\x00not json{{")
    else:
        os.replace(team_file, team_file.with_name("team.json.aside"))
    try:
        down = cli("down", "--team", "c", "--json")
        assert down.returncode == 0, down.stderr
        assert json.loads(down.stdout)["leader_pid"] == pid
        assert "own record of its leader" in down.stderr  # it says how it found the leader
        assert str(team_file) in down.stderr or "team" in down.stderr
        wait_until(lambda: not is_alive(pid, started), what="the leader to stop")
        wait_until(lambda: group_gone(pgid), what="the task's process group to end")
    finally:
        if is_alive(pid, started):
            os.kill(pid, 9)
        if not group_gone(pgid):
            os.killpg(pgid, 9)
    if damage == "garbage":  # the damaged file is evidence: left as it was
        assert team_file.read_bytes() == b"\x00not json{{"


def test_down_of_a_team_that_never_existed_still_says_no_team(cli: Cli) -> None:
    down = cli("down", "--team", "nosuch")
    assert down.returncode == 1
    assert "nosuch" in down.stderr and "Traceback" not in down.stderr
