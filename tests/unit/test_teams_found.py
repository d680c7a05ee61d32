"""`found` (TeamCreate and `team create`) and `TaskList.reset`, on real files."""

from __future__ import annotations

import os

import pytest

from shoal.core.errors import ConflictError
from shoal.core.paths import Layout
from shoal.teams.founding import found
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList


def test_a_clash_gets_a_word_slug_and_unique_a_suffix(tmp_path: os.PathLike[str]) -> None:
    teams = Teams(Layout(tmp_path))
    assert not found(teams, "alpha").renamed
    slugged = found(teams, "alpha")
    assert slugged.renamed and slugged.asked == "alpha"
    assert not slugged.team.name.startswith("alpha")
    assert found(teams, "alpha", unique=True).team.name.startswith("alpha-")
    with pytest.raises(ConflictError, match="already exists"):
        teams.create("alpha")  # (a leader's own team: still refused, never renamed)


def test_one_team_per_running_leader(tmp_path: os.PathLike[str]) -> None:
    teams = Teams(Layout(tmp_path))
    teams.create("home")
    assert found(teams, "side", leader_of="home").team.name == "side"  # (no leader runs)
    teams.update_member("home", LEAD_NAME, pid=os.getpid())  # this process leads "home"
    with pytest.raises(ConflictError, match="already leads team 'home'"):
        found(teams, "other", leader_of="home")
    assert not teams.exists("other")


def test_reset_empties_the_list_and_keeps_its_ids_issued(tmp_path: os.PathLike[str]) -> None:
    teams = Teams(Layout(tmp_path))
    teams.create("alpha")
    tasks = TaskList(teams, "alpha")
    for subject in ("a", "b", "c"):
        tasks.add(subject)
    assert tasks.reset() == 3
    assert tasks.list() == []
    assert tasks.add("d").id == 4
    assert tasks.reset() == 1 and tasks.reset() == 0
