"""The task verbs as pueue's and GNU parallel's users expect them, through real processes and
a real leader: `sh` keeps what follows its command, an unknown id is one error (exit 2)
everywhere, `logs` of several tasks heads each and fails as they did, `follow`, `ps` listing
what just ended with its age, `stop` of several tasks (or all, or a group), `wait --group`,
`restart --failed`, `clean` of some tasks, and teammates that fail loudly: a missing program
is refused at `spawn`, a scripted `write` makes its directories, a parked task says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.errors import EXIT_FAILED, EXIT_USAGE
from shoal.core.paths import Layout
from shoal.teams.session_files import current_session_files
from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "t"


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    """Team `t`'s leader in the background; the fixture is the CLI, `--team t` implied."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    try:
        yield Cli(home)
    finally:
        cli("down", "--team", TEAM)


def run(cli: Cli, *args: str, code: int = 0) -> str:
    """`shoal ARGS --team t`-style call (the team given first); checks the exit code."""
    out = cli("--team", TEAM, *args)
    assert out.returncode == code, (args, out.returncode, out.stdout, out.stderr)
    return out.stdout


def sh(cli: Cli, *command: str) -> str:
    return run(cli, "sh", *command).strip()


def record(home: Path, task_id: str) -> dict[str, Any]:
    """Task `task_id`'s record, live or evicted."""
    session = current_session_files(Layout(home), TEAM)
    assert session is not None
    tasks = {**session.history(), **session.read_tasks_raw()}
    return tasks[task_id]


def ended(home: Path, task_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        t = record(home, task_id)
        return t if t["status"] in ("completed", "failed", "killed") else None

    return wait_until(done, timeout=30, what=f"task {task_id} to end")


def test_sh_passes_what_follows_the_command_on(leader: Cli, home: Path) -> None:
    kept = sh(leader, "--", "echo", "--", "hi")
    assert run(leader, "wait", kept).startswith(f"{kept} completed")
    assert run(leader, "logs", kept) == "-- hi\n"
    flags = sh(leader, "echo", "-n", "x", "--timeout", "5")  # (after its first word: its own)
    ended(home, flags)
    assert run(leader, "logs", flags) == "x --timeout 5"


def test_an_unknown_id_is_one_usage_error_everywhere(leader: Cli) -> None:
    said = "no task 'bzzzzzzzz' in team 't' (see `shoal ps --all`)"
    for argv in (
        ["logs", "bzzzzzzzz"], ["logs", "--json", "bzzzzzzzz"], ["follow", "bzzzzzzzz"],
        ["stop", "bzzzzzzzz"], ["kill", "bzzzzzzzz"], ["wait", "bzzzzzzzz"],
        ["restart", "bzzzzzzzz"], ["pause", "bzzzzzzzz"], ["resume", "bzzzzzzzz"],
        ["clean", "bzzzzzzzz"], ["send-input", "bzzzzzzzz", "x"],
        ["sh", "--after", "bzzzzzzzz", "--", "true"],
    ):  # fmt: skip
        out = leader("--team", TEAM, *argv)
        assert out.returncode == EXIT_USAGE, (argv, out.stderr)
        assert out.stderr.count("\n") == 1 and said in out.stderr, (argv, out.stderr)


def test_logs_of_several_tasks_heads_each_and_fails_as_they_did(leader: Cli, home: Path) -> None:
    good = sh(leader, "--", "echo fine")
    bad = sh(leader, "--", "echo broken; exit 3")
    ended(home, good)
    ended(home, bad)
    both = leader("--team", TEAM, "logs", good, bad)
    assert both.returncode == EXIT_FAILED
    assert both.stdout == (
        f"==> {good} completed (exit code 0): echo fine <==\nfine\n\n"
        f"==> {bad} failed (exit code 3): echo broken; exit 3 <==\nbroken\n"
    )
    one = leader("--team", TEAM, "log", bad)  # (one task: its output bare, its exit code)
    assert (one.returncode, one.stdout) == (3, "broken\n")
    assert one.stderr == f"shoal: task {bad} failed (exit code 3)\n"
    assert run(leader, "logs", good) == "fine\n"
    listed = json.loads(run(leader, "logs", "--json", good, bad))
    assert [t["output"] for t in listed] == ["fine\n", "broken\n"]
    assert json.loads(run(leader, "logs", "--json", good))["output"] == "fine\n"


def test_follow_and_logs_take_the_one_running_task(leader: Cli, home: Path, tmp_path: Path) -> None:
    assert "no task of team 't' runs" in leader("--team", TEAM, "logs").stderr
    gate = tmp_path / "gate"
    task = sh(leader, "--", f"echo started; until [ -e {gate} ]; do sleep 0.05; done; echo done")
    wait_until(lambda: record(home, task)["status"] == "running", what="the task to run")
    follower = subprocess.Popen(
        [sys.executable, "-m", "shoal", "--team", TEAM, "follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(home)},
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "started\n"
        gate.touch()
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert (follower.returncode, out) == (0, "done\n"), err
    assert leader("--team", TEAM, "logs").returncode == EXIT_USAGE  # (nothing runs now)


def test_ps_lists_a_task_that_just_ended_and_ages_it(leader: Cli, home: Path) -> None:
    task = sh(leader, "--", "true")
    ended(home, task)

    def evicted() -> bool:
        return all(t["id"] != task for t in json.loads(run(leader, "ps", "--json")))

    wait_until(evicted, timeout=30, what=f"{task} to be evicted to the history")
    line = next(ln for ln in run(leader, "ps").splitlines() if ln.startswith(task))
    assert " completed " in line

    def age() -> float:
        text = next(ln for ln in run(leader, "ps").splitlines() if ln.startswith(task)).split()[3]
        return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]

    # Its age grows after its end (its run time would not).
    wait_until(lambda: age() >= 1.0, timeout=30, what="the finished task's age to grow")


def test_stop_takes_several_ids_all_or_a_group(leader: Cli, home: Path) -> None:
    first, second = sh(leader, "--", "sleep 60"), sh(leader, "--", "sleep 60")
    stopped = run(leader, "stop", first, second[:6])
    assert stopped == f"stopped {first}\nstopped {second}\n"
    assert {record(home, i)["status"] for i in (first, second)} == {"killed"}
    # One of several already ended: said, the others stopped all the same, exit 1.
    third = sh(leader, "--", "sleep 60")
    mixed = leader("--team", TEAM, "kill", first, third)
    assert mixed.returncode == EXIT_FAILED and mixed.stdout == f"stopped {third}\n"
    assert f"{first}: task {first} already finished" in mixed.stderr
    assert run(leader, "group", "add", "slow", "--parallel", "2")
    grouped = [sh(leader, "--group", "slow", "--", "sleep 60") for _ in range(2)]
    other = sh(leader, "--", "sleep 60")
    assert sorted(run(leader, "stop", "--group", "slow").split()) == sorted(
        ["stopped", "stopped", *grouped]
    )
    assert record(home, other)["status"] == "running"
    assert run(leader, "stop", "--all") == f"stopped {other}\n"
    assert "no task of team 't' runs or is queued" in run(leader, "stop", "--all")
    refused = leader("--team", TEAM, "stop", "--all", other)
    assert refused.returncode == EXIT_USAGE


def test_wait_for_a_group(leader: Cli, home: Path) -> None:
    run(leader, "group", "add", "batch", "--parallel", "0")
    ok = sh(leader, "--group", "batch", "--", "true")
    bad = sh(leader, "--group", "batch", "--", "exit 4")
    outside = sh(leader, "--", "sleep 60")
    waited = leader("--team", TEAM, "wait", "--group", "batch", "--timeout", "1m")
    assert waited.returncode == EXIT_FAILED, waited.stderr
    assert f"{ok} completed" in waited.stdout and f"{bad} failed" in waited.stdout
    assert outside not in waited.stdout + waited.stderr
    unknown = leader("--team", TEAM, "wait", "--group", "nope")
    assert unknown.returncode == EXIT_USAGE and "no group 'nope'" in unknown.stderr
    run(leader, "stop", outside)


def test_restart_failed_and_clean_some(leader: Cli, home: Path) -> None:
    good = sh(leader, "--", "true")
    bad = sh(leader, "--", "exit 2")
    for task in (good, bad):
        ended(home, task)
    again = run(leader, "restart", "--failed").split()
    assert len(again) == 1 and record(home, again[0])["restarted_from"] == bad
    ended(home, again[0])  # (it fails again: next time it is the one restarted, not `bad`)
    (third,) = run(leader, "restart", "--failed").split()
    assert record(home, third)["restarted_from"] == again[0]
    ended(home, third)
    # Only the completed ones go with --successful-only; then one id at a time.
    cleaned = json.loads(run(leader, "clean", "--successful-only", "--json"))
    assert cleaned["removed"] == [good]
    assert json.loads(run(leader, "remove", bad, "--json"))["removed"] == [bad]
    everything = {t["id"] for t in json.loads(run(leader, "ps", "--all", "--json"))}
    assert good not in everything and bad not in everything
    running = sh(leader, "--", "sleep 60")
    refused = leader("--team", TEAM, "clean", running)
    assert refused.returncode == EXIT_FAILED and "only finished tasks" in refused.stderr
    run(leader, "stop", running)


def test_spawn_refuses_a_program_that_is_not_there(leader: Cli) -> None:
    out = leader(
        "--team", TEAM, "spawn", "ben", "--agent", "exec", "--backend", "process",
        "--cmd", "no-such-agent-cli-xyz -p {prompt}",
    )  # fmt: skip
    assert out.returncode == EXIT_USAGE, out.stderr
    assert "no command 'no-such-agent-cli-xyz'" in out.stderr and out.stdout == ""
    members = json.loads(run(leader, "team", "show", TEAM, "--json"))["members"]
    assert [m["name"] for m in members] == ["team-lead"]


def test_a_scripted_write_makes_its_directories(leader: Cli, home: Path, tmp_path: Path) -> None:
    script = tmp_path / "notes.toml"
    script.write_text('[[step]]\nwhen = "task"\nwrite = "notes/{task_id}.md"\ntext = "seen"\n')
    spawned = leader(
        "--team", TEAM, "spawn", "ana", "--backend", "process", "--script", str(script),
        "--cwd", str(tmp_path),
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    item = json.loads(run(leader, "task", "add", "take notes", "--json"))

    def done() -> bool:
        got = json.loads(run(leader, "task", "get", str(item["id"]), "--json"))
        return bool(got["status"] == "completed")

    wait_until(done, timeout=60, what="the task's turn")
    assert (tmp_path / "notes" / f"{item['id']}.md").read_text() == "seen"


def test_task_list_says_a_task_is_parked(cli: Cli) -> None:
    assert cli("team", "create", TEAM).returncode == 0
    meta = json.dumps({"failures": 3, "last_error": "cannot write notes/1.md: No such file"})
    assert cli("task", "add", "--team", TEAM, "stuck", "--metadata", meta).returncode == 0
    assert cli("task", "add", "--team", TEAM, "fresh").returncode == 0
    listed = cli("task", "list", "--team", TEAM).stdout.splitlines()
    stuck = next(line for line in listed if "stuck" in line)
    assert "[parked after 3 failed turns; last: cannot write notes/1.md: No such file;" in stuck
    assert "`shoal task update 1 --owner NAME`" in stuck
    assert "parked" not in next(line for line in listed if "fresh" in line)
    shown = cli("task", "get", "--team", TEAM, "1").stdout
    assert shown.splitlines()[0].startswith("task 1: stuck  [parked after 3 failed turns")


def test_a_task_added_with_run_is_done_by_a_scripted_teammate(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    helped = run(leader, "task", "add", "--help")
    assert "--run CMD" in helped and "metadata.run" in helped
    empty = leader("--team", TEAM, "task", "add", "nothing", "--run", " ")
    assert empty.returncode == EXIT_USAGE
    both = leader(
        "--team", TEAM, "task", "add", "x", "--run", "true", "--metadata", '{"run": "false"}'
    )
    assert both.returncode == EXIT_USAGE
    made = tmp_path / "made"
    item = json.loads(
        run(leader, "task", "add", "build", "--run", f"echo built > {made}", "--json")
    )
    assert item["metadata"] == {"run": f"echo built > {made}"}
    spawned = leader("--team", TEAM, "spawn", "ana", "--backend", "process", "--cwd", str(tmp_path))
    assert spawned.returncode == 0, spawned.stderr

    def done() -> bool:
        got = json.loads(run(leader, "task", "get", str(item["id"]), "--json"))
        return bool(got["status"] == "completed")

    wait_until(done, timeout=60, what="the teammate to run the task's command")
    assert made.read_text() == "built\n"
