"""What the security tests share: a leader of one team started for a test and brought down after
it, and that team's task records read through `shoal ps --json` as a user would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.conftest import Cli
from tests.polling import wait_until

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
TERMINAL = ("completed", "failed", "killed")


@contextmanager
def running_leader(cli: Cli, team: str) -> Iterator[Cli]:
    """`shoal up --detach` for `team` (fast polls), `shoal down` after."""
    up = cli("up", "--team", team, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", team)


class Records:
    """One team's task records (`shoal ps --all --json`)."""

    def __init__(self, team: str) -> None:
        self.team = team

    def all(self, cli: Cli) -> list[dict[str, Any]]:
        out = cli("ps", "--team", self.team, "--all", "--json")
        assert out.returncode == 0, out.stderr
        rows: list[dict[str, Any]] = json.loads(out.stdout)
        return rows

    def one(self, cli: Cli, task_id: str) -> dict[str, Any]:
        (task,) = [t for t in self.all(cli) if t["id"] == task_id]
        return task

    def ended(self, cli: Cli, task_id: str, timeout: float = 60) -> dict[str, Any]:
        """The record once the task is terminal (the test fails after `timeout` s)."""

        def final() -> dict[str, Any] | None:
            task = self.one(cli, task_id)
            return task if task["status"] in TERMINAL else None

        return wait_until(final, timeout=timeout, what=f"task {task_id} to end")
