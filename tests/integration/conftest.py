"""Fixtures shared by the integration tests (the project-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from shoal.teams.store import Teams


@pytest.fixture
def team(teams: Teams) -> str:
    """Team `crew` with members bob and carol, both this process (a module may define its own
    `team`, which then wins)."""
    teams.create("crew")
    teams.join("crew", "bob", pid=os.getpid())
    teams.join("crew", "carol", pid=os.getpid())
    return "crew"
