"""A leader killed -9 at the exact moments of a worker's start (its lease just taken, its start
just written ahead, its runner just spawned) is followed by one that runs the worker once or
ends the attempt, never twice; a finished worker's lease does not outlive a restart.

The leader stops itself at a named point (SHOAL_PAUSE_AT, core/faults.py) and the test kills
it there: no timing race decides where the kill lands. So each kill tests the same moment;
the suite kills three times at the lease (SHOAL_TEST_KILLS=20 kills twenty times).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.faults import PAUSE_AT_VAR, PAUSE_FILE_VAR
from shoal.core.procs import is_alive
from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, FAST, script
from tests.polling import wait_until

TEAM = "wa"
TERMINAL = ("completed", "failed", "killed")

# A coordinator that starts two workers with one write set: the second waits for the first's
# lease and takes it in a later pass of the leader's loop (the gap where a kill used to make
# the next leader start it twice). Each appends its name to runs.txt, which so counts runs.
TWO_WORKERS = """
final = "done"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "one", prompt = "Append one", write_set = ["runs.txt"] }
[[turn.call]]
tool = "Agent"
args = { description = "two", prompt = "Append two", write_set = ["runs.txt"] }

[[turn]]
text = "Waiting for the workers."

[[worker]]
match = "^Append one"
final = "appended"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "echo one >> runs.txt" }

[[worker]]
match = "^Append two"
final = "appended"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "echo two >> runs.txt" }
"""
# The second worker's lease is the second taken in the leader's life; its start the third
# (after the coordinator's and the first worker's).
SECOND_LEASE, THIRD_START = "#2", "#3"


def rows(cli: Cli) -> list[dict[str, Any]]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    assert out.returncode == 0, out.stderr
    found: list[dict[str, Any]] = json.loads(out.stdout)
    return found


def workers(tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["description"]: t for t in tasks if t.get("worker_of")}


@pytest.fixture
def team(cli: Cli) -> Iterator[Cli]:
    yield cli
    cli("down", "--team", TEAM)


def kill_at(cli: Cli, point: str, tmp_path: Path) -> tuple[str, Path]:
    """Start a leader that stops itself at `point`, a coordinator whose second worker brings
    it there, and kill the leader -9 once it has stopped; then start the next leader:
    (the coordinator's id, its cwd)."""
    gate = tmp_path / "paused"
    work = tmp_path / "work"
    work.mkdir()
    (work / "runs.txt").touch()  # (a lease's file must exist for the sandbox to grant it)
    env = {**FAST, PAUSE_AT_VAR: point, PAUSE_FILE_VAR: str(gate)}
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=env)
    assert up.returncode == 0, up.stderr
    out = cli(
        "agent", "--team", TEAM, "--coordinator", "--backend", "process", "--model",
        script(tmp_path, TWO_WORKERS), "--cwd", str(work), *BYPASS, "go",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    wait_until(gate.exists, timeout=60, what=f"the leader to stop at {point}")
    pid = int(gate.read_text())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not is_alive(pid, None), what="the killed leader to be gone")
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    return out.stdout.strip(), work


def settled(cli: Cli, coordinator: str) -> list[dict[str, Any]]:
    """Every task of the session once the coordinator and both workers have ended."""

    def done() -> list[dict[str, Any]] | None:
        found = rows(cli)
        mine = [t for t in found if t["id"] == coordinator or t.get("worker_of")]
        ended = len(mine) == 3 and all(t["status"] in TERMINAL for t in mine)
        return found if ended else None

    return wait_until(done, timeout=90, what="the coordinator and its workers to end")


def shown(tasks: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a failed check prints: each task's id, status and error."""
    return [(t["id"], t.get("description"), t["status"], t.get("error")) for t in tasks]


def runs(work: Path) -> list[str]:
    """Who ran, once per run (the workers may take the lease in either order)."""
    return sorted((work / "runs.txt").read_text().splitlines())


def later(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The worker that waited for the other's lease (it started second)."""
    return max(workers(tasks).values(), key=lambda t: t.get("start_time") or float("inf"))


def leases(task: dict[str, Any]) -> dict[str, Any]:
    path = Path(task["output_file"]).parent.parent / "leases.json"
    held: dict[str, Any] = json.loads(path.read_text())["leases"] if path.exists() else {}
    return held


@pytest.mark.parametrize("attempt", range(int(os.environ.get("SHOAL_TEST_KILLS", "3"))))
def test_a_leader_killed_as_a_waiting_worker_takes_its_lease_runs_it_once(
    team: Cli, tmp_path: Path, attempt: int
) -> None:
    coordinator, work = kill_at(team, "lease-taken" + SECOND_LEASE, tmp_path)
    tasks = settled(team, coordinator)
    assert all(t["status"] == "completed" for t in workers(tasks).values()), shown(tasks)
    assert runs(work) == ["one", "two"]  # the second not run twice
    two = later(tasks)
    wait_until(lambda: not leases(two), what="the workers' leases to be released")


def test_a_leader_killed_after_writing_a_start_ahead_never_starts_it_again(
    team: Cli, tmp_path: Path
) -> None:
    coordinator, work = kill_at(team, "started-ahead" + THIRD_START, tmp_path)
    tasks = settled(team, coordinator)
    (two,) = [t for t in workers(tasks).values() if t["status"] != "completed"]
    assert two["status"] == "failed", two
    assert "its leader stopped while starting it" in two["error"], two
    assert f"shoal agent --resume {two['id']}" in two["error"]
    assert runs(work) == [next(iter(set(workers(tasks)) - {two["description"]}))]
    wait_until(lambda: not leases(two), what="the workers' leases to be released")


def test_a_leader_killed_after_spawning_adopts_the_runner(team: Cli, tmp_path: Path) -> None:
    coordinator, work = kill_at(team, "spawned" + THIRD_START, tmp_path)
    tasks = settled(team, coordinator)
    assert all(t["status"] == "completed" for t in workers(tasks).values()), shown(tasks)
    assert later(tasks)["pid"] is not None  # (found by its job file in the process table)
    assert runs(work) == ["one", "two"]
