"""Shell completion through the real console entry point: the scripts for bash, zsh and fish,
and what the completers offer (commands, team names, member names, task ids), read from a
real SHOAL_HOME."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from shoal.core.paths import Layout
from tests.conftest import Cli
from tests.unit.test_ui_fixtures import build_swarm


def complete(cli: Cli, words: str) -> list[str]:
    """What bash completion offers for `words` (the last one is being typed)."""
    parts = words.split(" ")
    out = cli(env={"COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1),
                   "_SHOAL_COMPLETE": "bash_complete"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines() if "," in line]


def test_completion_scripts_for_each_shell(cli: Cli) -> None:
    for shell, marker in (("bash", "complete -o"), ("zsh", "#compdef shoal"),
                          ("fish", "complete --no-files --command shoal")):  # fmt: skip
        out = cli("completion", shell)
        assert out.returncode == 0 and marker in out.stdout, (shell, out.stdout[:300])
        assert "_SHOAL_COMPLETE" in out.stdout
    bad = cli("completion", "tcsh")
    assert bad.returncode == 2 and "'tcsh' is not one of" in bad.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_the_bash_script_is_valid_bash(cli: Cli) -> None:
    script = cli("completion", "bash").stdout
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_commands_teams_members_and_task_ids_complete(cli: Cli, layout: Layout) -> None:
    build_swarm(layout)  # team demo: alice, bob, carol, dave; tasks bshell001, bfailed01, ...
    assert cli("team", "create", "other").returncode == 0
    assert complete(cli, "shoal wa") == ["wait"]
    assert "send-input" in complete(cli, "shoal se")
    assert complete(cli, "shoal ps --team d") == ["demo"]
    assert sorted(complete(cli, "shoal ps --team ")) == ["demo", "other"]
    assert complete(cli, "shoal send --team demo a") == ["alice"]
    assert complete(cli, "shoal logs --team demo bfai") == ["bfailed01"]
    assert "bshell001" in complete(cli, "shoal wait --team demo b")
    assert complete(cli, "shoal logs --team nosuchteam b") == []  # nothing, and no error
