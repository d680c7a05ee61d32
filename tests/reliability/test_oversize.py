"""Oversize input is refused at the edge, with its size and the limit, before anything starts:
no task, no output file (against a real leader started with `shoal up --detach`)."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.channel.client import ControlError, call
from shoal.core.cmdsize import COMMAND_MAX_BYTES, SPEC_MAX_JSON_BYTES
from shoal.core.errors import EXIT_USAGE
from shoal.core.paths import Layout
from shoal.core.taskupdates import RESULT_CAP_CHARS
from shoal.mailbox.schema import MAX_MESSAGE_BYTES
from shoal.teams.session import current_session
from tests.conftest import Cli

TEAM = "t"
MAX_ARG = COMMAND_MAX_BYTES + 1  # one byte over what one exec argument may be
LIMIT = f"the limit is {COMMAND_MAX_BYTES:,} (put it in a script file)"


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Layout]:
    """Team `t` (with member `bob`) and its leader, running in the background."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    joined = cli("team", "join", TEAM, "bob", "--pid", str(os.getpid()))
    assert joined.returncode == 0, joined.stderr
    try:
        yield Layout(home)
    finally:
        cli("down", "--team", TEAM)


def assert_nothing_started(cli: Cli, layout: Layout) -> None:
    """No task in the registry and no output file in the session."""
    listed = cli("ps", "--team", TEAM, "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    session = current_session(layout, TEAM)
    assert session is not None
    assert sorted(os.listdir(session.tasks_dir)) == []


def test_sh_refuses_a_200_kb_command(cli: Cli, leader: Layout, tmp_path: Path) -> None:
    # (one 200 KB argument could not even reach shoal: the kernel caps one at 128 KiB)
    half = "x" * (100 * 1024)
    out = cli("sh", "--team", TEAM, "--", "echo", half, half)
    assert out.returncode == EXIT_USAGE, out.stderr
    size = len("echo") + 2 * len(half) + 2
    assert out.stderr == f"shoal: error: command is {size:,} bytes; {LIMIT}\n"
    assert_nothing_started(cli, leader)


def test_a_command_at_the_limit_runs(cli: Cli, leader: Layout, tmp_path: Path) -> None:
    """The limit is what exec takes: a command line of exactly that size starts and runs."""
    script = tmp_path / "at-limit.txt"
    prefix = ": "
    script.write_text(prefix + "x" * (COMMAND_MAX_BYTES - len(prefix)) + "\n")
    out = cli("sh", "--team", TEAM, "--batch", str(script))
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    waited = cli("wait", "--team", TEAM, task_id, "--timeout", "30")
    assert waited.returncode == 0, (waited.stdout, waited.stderr)


def test_sh_batch_with_one_oversize_line_starts_none(
    cli: Cli, leader: Layout, tmp_path: Path
) -> None:
    batch = tmp_path / "cmds.txt"
    big = "echo " + "y" * (600 * 1024)
    batch.write_text(f"echo one\n# a comment\n{big}\necho two\n")
    out = cli("sh", "--team", TEAM, "--batch", str(batch))
    assert out.returncode == EXIT_USAGE, out.stderr
    assert out.stderr == (
        f"shoal: error: line 3 of {batch}: command is {len(big):,} bytes; {LIMIT}\n"
    )
    assert out.stdout == ""
    assert_nothing_started(cli, leader)


def test_sh_refuses_a_command_whose_request_is_over_its_share_of_a_message(
    cli: Cli, leader: Layout
) -> None:
    """Under the exec limit, but a control character is six bytes in JSON: its request (and
    its answer, which repeats it) would not fit the message cap."""
    command = "\x01" * (COMMAND_MAX_BYTES // 2)
    out = cli("sh", "--team", TEAM, "--", command)
    assert out.returncode == EXIT_USAGE, out.stderr
    assert "the task's request is " in out.stderr
    assert f"the limit is {SPEC_MAX_JSON_BYTES:,} (put it in a script file)" in out.stderr
    assert_nothing_started(cli, leader)


def test_the_leader_refuses_an_oversize_request_itself(cli: Cli, leader: Layout) -> None:
    """A client that skips the check (another program writing to the lead's inbox) is refused
    by the leader, with the same words, and nothing starts."""
    big = "echo " + "z" * (COMMAND_MAX_BYTES)
    batch = [{"command": ["echo ok"]}, {"command": [big]}]
    with pytest.raises(ControlError) as info:
        call(leader, TEAM, "sh", {"batch": batch})
    assert info.value.exit_code == EXIT_USAGE
    assert str(info.value) == (
        f"command 2 of the batch of 2: command is {len(big):,} bytes; {LIMIT}"
    )
    with pytest.raises(ControlError, match="environment variable BIG is"):
        call(leader, TEAM, "sh", {"command": ["true"], "env": {"BIG": "v" * MAX_ARG}})
    assert_nothing_started(cli, leader)


def test_run_refuses_a_spec_with_an_oversize_command(cli: Cli, home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    big = "y" * (200 * 1024)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            [[task]]
            id = "small"
            run = "touch {marker}"

            [[task]]
            id = "big"
            run = ["echo", "{big}"]
            """
        )
    )
    out = cli("run", str(spec))
    assert out.returncode == EXIT_USAGE, out.stderr
    size = len("echo") + 1 + len(big)
    assert f'{spec}:7: task "big": command is {size:,} bytes; {LIMIT}' in out.stderr
    assert not marker.exists()
    assert not (home / "sessions").exists() or os.listdir(home / "sessions") == []


def test_send_refuses_a_message_over_the_cap(cli: Cli, leader: Layout) -> None:
    text = "m" * (MAX_MESSAGE_BYTES + 1)
    out = cli("send", "--team", TEAM, "bob", "-", input=text)
    assert out.returncode == EXIT_USAGE, out.stderr
    assert f"over the {MAX_MESSAGE_BYTES} byte cap" in out.stderr
    inbox = leader.inbox_dir(TEAM, "bob")
    assert all(os.listdir(inbox / sub) == [] for sub in ("tmp", "new", "cur"))


def test_a_two_megabyte_answer_is_capped_in_the_record_and_whole_in_the_output(
    cli: Cli, leader: Layout, tmp_path: Path
) -> None:
    """A 2 MB final answer: the record, `ps --json`, the notification and events.jsonl carry
    its first RESULT_CAP_CHARS characters and a mark naming the rest; the output file (what
    `shoal logs` shows) keeps all of it."""
    answer = "A" * 2_000_000
    path = tmp_path / "big.toml"
    path.write_text(f'[[turn]]\ntext = "{answer}"\n')
    out = cli(
        "agent", "--team", TEAM, "--model", f"scripted:{path}", "--backend", "in-process",
        "--cwd", str(tmp_path), "--json", "answer at length",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task_id = json.loads(out.stdout)["id"]
    waited = cli("wait", "--team", TEAM, task_id, "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    listed = cli("ps", "--team", TEAM, "--all", "--json")
    (task,) = [t for t in json.loads(listed.stdout) if t["id"] == task_id]
    rest = 2_000_000 - RESULT_CAP_CHARS
    mark = f"\n[result cut: {rest:,} more characters in `shoal logs {task_id}`]"
    assert task["result"] == "A" * RESULT_CAP_CHARS + mark
    session = current_session(leader, TEAM)
    assert session is not None
    notes = [
        line
        for line in (session.dir / "events.jsonl").read_text().splitlines()
        if task_id in line and "task_notification" in line
    ]
    assert len(notes) == 1 and len(notes[0]) < RESULT_CAP_CHARS + 10_000
    assert "[result cut: " in notes[0]
    assert answer in Path(task["output_file"]).read_text()
    assert len(session.state_file.read_bytes()) < RESULT_CAP_CHARS + 50_000
