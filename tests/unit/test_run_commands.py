"""Plain commands as a spec (orchestrator/batch/commands.py): `:::` arguments combined and
put in place as GNU parallel does, a commands file's lines, and the spec they make."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.core.errors import UsageError
from shoal.orchestrator.batch.commands import commands_of_args, commands_of_file, spec_of_commands
from shoal.orchestrator.batch.spec import SpecError


def test_arguments_are_appended_or_put_in_place() -> None:
    assert commands_of_args(["echo", ":::", "a", "b c"]) == ["echo a", "echo 'b c'"]
    assert commands_of_args(["echo", "{}", "x", ":::", "a"]) == ["echo a x"]
    assert commands_of_args(["cp", "{1}", "{2}", ":::", "a", "b", ":::", "/d", "/e"]) == [
        "cp a /d",
        "cp a /e",
        "cp b /d",
        "cp b /e",
    ]
    assert commands_of_args(["echo {}", ":::", "$HOME"]) == ["echo '$HOME'"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([":::", "a"], "no command before :::"),
        (["echo", ":::"], "at least one argument"),
        (["echo", "{3}", ":::", "a"], "{3}: there are 1 ::: sources"),
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str], says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("{", r"\{").replace("}", r"\}")):
        commands_of_args(argv)


def test_a_commands_file_makes_one_numbered_task_per_line(tmp_path: Path) -> None:
    path = tmp_path / "jobs"
    path.write_text('echo one\n\n# a comment\n  echo "two \\\\ words"  \n')
    commands = commands_of_file(path, "jobs")
    assert commands == ["echo one", 'echo "two \\\\ words"']
    spec = spec_of_commands(commands, path, display="jobs", timeout=90.0, retries=2)
    assert [(t.id, t.run, t.timeout, t.retries) for t in spec.tasks] == [
        ("1", "echo one", 90.0, 2),
        ("2", 'echo "two \\\\ words"', 90.0, 2),
    ]
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(SpecError, match="no commands in it"):
        commands_of_file(tmp_path / "empty", "empty")
    with pytest.raises(SpecError, match="no such file"):
        commands_of_file(tmp_path / "missing", "missing")
