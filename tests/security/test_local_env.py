"""`--env` values of local tasks, looked for where an attacker who can read our files would look:
every byte of every file under SHOAL_HOME (state.json, events, history, agent job files,
transcripts, output, inboxes), during and after the run. The commands print a digest of the
value, never the value, so a hit can only be a leak.

Real CLI, real leader (killed -9 for the restart cases), real task and runner processes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.channel.client import leader_alive
from shoal.core.paths import Layout
from tests.conftest import Cli
from tests.polling import wait_until
from tests.security.support import FAST, Records, running_leader

TEAM = "envs"
DIGEST_CMD = 'printf %s "$SECRET" | sha256sum'
records = Records(TEAM)


@pytest.fixture
def leader(cli: Cli) -> Iterator[Cli]:
    with running_leader(cli, TEAM):
        yield cli


def secret_value() -> str:
    """A value found nowhere unless we leaked it."""
    return f"hunter2-{uuid.uuid4().hex}"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def files_holding(root: Path, needle: str) -> list[str]:
    """Every path under `root` whose name or bytes hold `needle` (grep -r, symlinks unread)."""
    found = []
    for path in root.rglob("*"):
        if needle in path.name:
            found.append(str(path))
        if path.is_file() and not path.is_symlink():
            try:
                if needle.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue  # (gone meanwhile: a reply inbox, a tmp file)
    return found


def agent_script(tmp_path: Path) -> str:
    """A scripted model whose Bash prints the digest of $SECRET, in its run and again in a
    resumed run (turns count across the conversation)."""
    turn = (
        '[[turn]]\ntext = "hashing"\n[[turn.call]]\ntool = "Bash"\n'
        f"args = {{ command = '{DIGEST_CMD}', description = \"digest\" }}\n\n"
        '[[turn]]\ntext = "digest: {last}"\n\n'
    )
    path = tmp_path / "digest.toml"
    path.write_text(turn * 2)
    return f"scripted:{path}"


def agent(cli: Cli, model: str, *args: str) -> str:
    out = cli(
        "agent", "--team", TEAM, "--model", model, "--permission-mode", "bypassPermissions",
        *args, "hash it",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def output_of(task: dict[str, Any]) -> str:
    return Path(task["output_file"]).read_text()


def kill_leader(cli: Cli, home: Path) -> None:
    """kill -9 the team's leader (nothing of its memory survives), then start a new one."""
    alive = leader_alive(Layout(home), TEAM)
    assert alive is not None
    os.kill(alive[0], 9)
    wait_until(lambda: leader_alive(Layout(home), TEAM) is None, what="the leader's end")
    again = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert again.returncode == 0, again.stderr


def test_a_shell_task_sees_its_env_value_and_no_file_holds_it(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    """`shoal sh --env SECRET=...` with a retry (its first attempt fails): both attempts see
    the value, the records keep its name only, and no file under SHOAL_HOME holds it."""
    value = secret_value()
    gate = tmp_path / "second-attempt"
    out = leader(
        "sh", "--team", TEAM, "--env", f"SECRET={value}", "--retries", "1", "--",
        f"{DIGEST_CMD}; test -e {gate} || {{ touch {gate}; exit 3; }}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    first = records.ended(leader, out.stdout.strip())

    def last_attempt() -> dict[str, Any] | None:
        done = [t for t in records.all(leader) if t.get("retry_of") == first["id"]]
        return done[0] if done and done[0]["status"] == "completed" else None

    second = wait_until(last_attempt, timeout=60, what="the retry to complete")
    assert not files_holding(home, value)
    for task in (first, second):
        assert digest(value) in output_of(task), output_of(task)
        assert task["env_names"] == ["SECRET"] and not task.get("env"), task
        assert "env_values" not in task
    fg = leader("sh", "--team", TEAM, "-f", "--env", f"SECRET={value}", "--", DIGEST_CMD)
    assert fg.returncode == 0 and digest(value) in fg.stdout, fg
    assert not files_holding(home, value)


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_an_agent_and_its_bash_see_the_env_value_and_no_file_holds_it(
    leader: Cli, home: Path, tmp_path: Path, backend: str
) -> None:
    """`shoal agent --env SECRET=...`: the agent's Bash sees it (its digest is in the output),
    the job file, transcript, state and events do not hold it; a resume (`--resume`, this
    leader still running) sees it again without being given it."""
    value = secret_value()
    model = agent_script(tmp_path)
    task_id = agent(leader, model, "--backend", backend, "--env", f"SECRET={value}")
    task = records.ended(leader, task_id)
    assert task["status"] == "completed", task
    assert digest(value) in output_of(task), output_of(task)
    jobs = list((home / "sessions").rglob("*.job.json"))
    assert jobs and not any(value in j.read_text() for j in jobs)
    assert not files_holding(home, value)
    assert task["env_names"] == ["SECRET"] and "env_values" not in task
    resumed = records.ended(leader, agent(leader, model, "--resume", task_id))
    assert resumed["status"] == "completed", resumed
    assert digest(value) in output_of(resumed), output_of(resumed)
    assert not files_holding(home, value)


def test_a_task_pending_when_its_leader_died_fails_naming_the_env_to_give_again(
    leader: Cli, home: Path
) -> None:
    """A task waiting (`--delay`) when its leader is killed -9 has lost its value with the
    leader's memory: the new leader fails it at once, naming `--env SECRET` and why, and never
    runs the command without it."""
    value = secret_value()
    out = leader(
        "sh", "--team", TEAM, "--env", f"SECRET={value}", "--delay", "3600", "--",
        f"{DIGEST_CMD} > ran.txt",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    kill_leader(leader, home)
    task = records.ended(leader, task_id)
    assert task["status"] == "failed" and task.get("pid") is None, task
    error = task["error"]
    assert "needs --env SECRET," in error and "--env SECRET=VALUE" in error, error
    assert "restarted" in error and value not in error
    assert not files_holding(home, value)


def test_a_resume_after_a_leader_restart_needs_the_env_again(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    """After a restart, `shoal agent --resume ID` without the value is refused with one line
    naming `--env SECRET`; given `--env SECRET=...` again, the resumed agent's Bash sees it."""
    value = secret_value()
    model = agent_script(tmp_path)
    task_id = agent(leader, model, "--backend", "process", "--env", f"SECRET={value}")
    assert records.ended(leader, task_id)["status"] == "completed"
    kill_leader(leader, home)
    refused = leader("agent", "--team", TEAM, "--model", model, "--resume", task_id, "go on")
    assert refused.returncode != 0, refused
    line = refused.stderr.strip()
    assert "\n" not in line and "needs --env SECRET," in line, line
    assert f"shoal agent --resume {task_id} --env SECRET=VALUE" in line, line
    resumed_id = agent(leader, model, "--resume", task_id, "--env", f"SECRET={value}")
    resumed = records.ended(leader, resumed_id)
    assert resumed["status"] == "completed", resumed
    assert digest(value) in output_of(resumed)
    assert not files_holding(home, value)
