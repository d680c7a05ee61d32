"""Fixtures of the reliability tests: a team with an inbox, and the processes a test starts.

`home` (a private SHOAL_HOME, exported to children) comes from tests/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from tests.reliability.crashkit import Processes


@pytest.fixture
def bob_team(home: Path) -> Teams:
    """Team `t` with member `bob` (joined with this process's pid)."""
    teams = Teams(Layout(home))
    teams.create("t")
    teams.join("t", "bob", pid=os.getpid())
    return teams


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Starts child processes; every one still running is killed when the test ends."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()
