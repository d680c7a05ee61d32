"""Bad tool arguments never end an agent by default: through the real CLI and leader, a
scripted model that sends one tool bad arguments several times in a row is told why each
time and goes on to its answer; `tool_retries` in SHOAL_HOME/config.toml caps how many in a
row it may send, and the run that goes past it fails naming the tool and the setting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.test_agent_tasks import FAST, ended, script

TEAM = "ag"  # (the helpers of test_agent_tasks read this team)
BAD_READ = """
[[turn]]
text = "Reading."
[[turn.call]]
tool = "Read"
args = { path = "notes.txt" }
"""  # (Read takes file_path: `path` fails its schema)


def bad_reads(n: int) -> str:
    return BAD_READ * n + '\n[[turn]]\ntext = "answered after {turn} turns"\n'


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def run_agent(cli: Cli, model: str, tmp_path: Path) -> str:
    out = cli("agent", "--team", TEAM, "--model", model, "--backend", "in-process",
              "--cwd", str(tmp_path), "read the notes")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_bad_arguments_many_times_in_a_row_keep_the_agent_going(
    leader: Cli, tmp_path: Path
) -> None:
    task_id = run_agent(leader, script(tmp_path, bad_reads(6)), tmp_path)
    task = ended(leader, task_id)
    assert task["status"] == "completed", task
    assert task["result"] == "answered after 7 turns"
    output = Path(task["output_file"]).read_text()
    assert output.count("Read: bad arguments: file_path: Field required") == 6  # (told why)


def test_tool_retries_in_config_caps_them_and_names_the_setting(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    (home / "config.toml").write_text("tool_retries = 2\n")
    task_id = run_agent(leader, script(tmp_path, bad_reads(3)), tmp_path)
    task = ended(leader, task_id)
    assert task["status"] == "failed", task
    assert "tool Read bad arguments 3 times in a row" in task["error"], task["error"]
    assert "tool_retries = 2" in task["error"], task["error"]


def test_a_bad_tool_retries_setting_is_refused_naming_the_file(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    (home / "config.toml").write_text("tool_retries = 0\n")
    task_id = run_agent(leader, script(tmp_path, bad_reads(1)), tmp_path)
    task = ended(leader, task_id)
    assert task["status"] == "failed", task
    assert "config.toml: tool_retries must be a whole number, 1 or more" in task["error"]
