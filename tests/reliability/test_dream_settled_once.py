"""A dream whose runner died with its leader is rolled back once: the next leader says so,
and every later one, finding it settled, says nothing of it."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from tests.conftest import Cli, pid_gone
from tests.integration.test_dream import (
    FAST,
    LOCK,
    PRIOR,
    TEAM,
    blocking,
    ended,
    memory,
    start,
    waiting_mid_update,
)
from tests.polling import wait_until

ROLLED_BACK = "did not complete; the consolidation lock was rolled back"


def up(cli: Cli) -> tuple[int, str]:
    """Start the team's leader in the background: its pid, and its start notes (stderr)."""
    out = cli("up", "--team", TEAM, "-d", env=FAST)
    assert out.returncode == 0, out.stderr
    pid = re.search(r"\(pid (\d+)\)", out.stdout)
    assert pid is not None, out.stdout
    return int(pid[1]), out.stderr


def kill_leader(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid_gone(pid), what="the leader to die")


def test_a_dead_dreams_rollback_is_said_once(cli: Cli, home: Path, tmp_path: Path) -> None:
    model = blocking(home, tmp_path)
    mem = memory(home, A="old A", B="old B")
    up(cli)
    try:
        task = start(cli, "--model", model)
        wait_until(lambda: waiting_mid_update(cli, task["id"]), timeout=60, what="the dream")
        holder = json.loads((mem / LOCK).read_bytes())
        os.kill(holder["pid"], signal.SIGKILL)
        wait_until(lambda: pid_gone(holder["pid"]), what="the leader to die")
        os.kill(holder["runner_pid"], signal.SIGKILL)
        wait_until(lambda: pid_gone(holder["runner_pid"]), what="the runner to die")
        _pid, first = up(cli)
        assert ended(cli, task["id"])["status"] == "failed"
        assert (mem / LOCK).stat().st_mtime == PRIOR
        assert first.count(ROLLED_BACK) == 1, first
        for _ in range(2):
            assert cli("down", "--team", TEAM).returncode == 0
            _pid, later = up(cli)
            assert ROLLED_BACK not in later, later
            assert ended(cli, task["id"])["status"] == "failed"
    finally:
        cli("down", "--team", TEAM)


def test_a_dream_that_died_under_its_leader_is_not_news_later(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    model = blocking(home, tmp_path)
    mem = memory(home, A="old A", B="old B")
    pid, _notes = up(cli)
    try:
        task = start(cli, "--model", model)
        wait_until(lambda: waiting_mid_update(cli, task["id"]), timeout=60, what="the dream")
        holder = json.loads((mem / LOCK).read_bytes())
        os.kill(holder["runner_pid"], signal.SIGKILL)
        assert ended(cli, task["id"])["status"] == "failed"
        said = []
        for stop in ("down", "kill", "down"):  # (a leader killed -9 leaves no stop event)
            if stop == "down":
                assert cli("down", "--team", TEAM).returncode == 0
            else:
                kill_leader(pid)
            pid, notes = up(cli)
            said.append(notes)
            assert ended(cli, task["id"])["status"] == "failed"
        assert not [s for s in said if ROLLED_BACK in s], said
    finally:
        cli("down", "--team", TEAM)
