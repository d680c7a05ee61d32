"""A teammate killed with -9 takes its command with it, and a command that had finished is not
run again: real leaders (`shoal up --detach`), real `shoal worker` processes, kill -9.

The teammate lists its command (pid, process group, start time, exit file) in its status file
before the command may run; the leader kills that group before the task goes back to the list,
and settles a task whose command had ended from the exit code the shell wrapper recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.orchestrator.leader import RELEASE_INTERVAL_S, Leader
from shoal.teams.session import current_session
from shoal.teams.store import Teams
from shoal.teams.taskitems import TaskItem
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.commands import CommandRecord, records_of
from tests.conftest import Cli, group_gone
from tests.integration.test_loop import running
from tests.polling import wait_until

TEAM = "o"


def marker_pids(marker: str) -> list[int]:
    """Live processes whose command line carries `marker` (zombies have none)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_marked(marker: str) -> None:
    for pid in marker_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique string for the test's commands; whatever carries it is killed at the end."""
    mark = f"marker-{uuid.uuid4().hex}"
    yield mark
    kill_marked(mark)


@pytest.fixture
def leader(cli: Cli) -> Iterator[Cli]:
    """A detached leader of team TEAM, brought down at the end whatever happened."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def add_task(cli: Cli, subject: str, command: str) -> int:
    res = cli(
        "task", "add", subject, "--team", TEAM, "--json", "--metadata", json.dumps({"run": command})
    )
    assert res.returncode == 0, res.stderr
    return int(json.loads(res.stdout)["id"])


def spawn(cli: Cli, name: str, backend: str = "process") -> dict[str, Any]:
    res = cli("spawn", name, "--backend", backend, "--team", TEAM, "--json")
    assert res.returncode == 0, res.stderr
    spawned: dict[str, Any] = json.loads(res.stdout)
    return spawned


def task(layout: Layout, task_id: int) -> TaskItem:
    return TaskList(Teams(layout), TEAM).get(task_id)


def listed_command(layout: Layout, member: str) -> CommandRecord:
    """The command the member's status file lists (waiting until it lists one)."""
    teams = Teams(layout)
    return wait_until(
        lambda: next(iter(records_of(teams.read_status(TEAM, member))), None),
        what=f"{member}'s status file to list its command",
    )


def test_a_teammate_killed_mid_command_leaves_nothing_running_and_down_finds_nothing(
    leader: Cli, layout: Layout, marker: str
) -> None:
    """The reproduction: kill -9 of the teammate while `sleep 30` runs; the task is handed
    back with its command already dead, and nothing of it outlives `shoal down`."""
    task_id = add_task(leader, "long", f"sleep 30; echo done # {marker}")
    w1 = spawn(leader, "w1")
    command = listed_command(layout, "w1")
    assert command.task_id == task_id and command.pgid == command.pid
    assert marker_pids(marker), "the command runs"
    os.kill(w1["pid"], signal.SIGKILL)
    wait_until(lambda: task(layout, task_id).status == "pending", what="the task back to pending")
    # The group was killed before the task went back: it is gone, or going (SIGKILL sent).
    wait_until(lambda: group_gone(command.pgid), timeout=2, what="the command's group to end")
    assert marker_pids(marker) == []
    down = leader("down", "--team", TEAM, "--json")
    assert down.returncode == 0, down.stderr
    report = json.loads(down.stdout)
    assert set(report) == {"team", "leader_pid", "killed_orphans"}
    assert report["killed_orphans"] == []  # the leader had killed it already
    assert marker_pids(marker) == []
    assert task(layout, task_id).status == "pending" and task(layout, task_id).owner is None


def test_down_kills_the_commands_of_a_teammate_that_died_with_its_leader(
    leader: Cli, layout: Layout, marker: str
) -> None:
    """Leader and teammate both killed -9: `shoal down` finds the command from the teammate's
    status file, kills its group, and reports it as `member:pgid N`."""
    add_task(leader, "long", f"sleep 30 # {marker}")
    w1 = spawn(leader, "w1")
    command = listed_command(layout, "w1")
    session = current_session(layout, TEAM)
    assert session is not None
    state = session.read_state()
    assert state.leader is not None
    os.kill(state.leader.pid, signal.SIGKILL)
    os.kill(w1["pid"], signal.SIGKILL)
    wait_until(lambda: not is_alive(w1["pid"], None), what="the teammate to die")
    lead = state.leader
    wait_until(lambda: not is_alive(lead.pid, lead.started_at), what="the leader to die")
    assert marker_pids(marker), "the command outlived both (its own session)"
    down = leader("down", "--team", TEAM, "--json")
    assert down.returncode == 0, down.stderr
    assert f"w1:pgid {command.pgid}" in json.loads(down.stdout)["killed_orphans"]
    wait_until(lambda: group_gone(command.pgid), timeout=5, what="the command's group to end")
    assert marker_pids(marker) == []


def _stop_then_finish(side: Path, marker: str, code: int) -> str:
    """A command that freezes its own teammate (SIGSTOP to $PPID, the worker), then writes its
    side effect and exits `code`: the teammate cannot mark the task before the test kills it."""
    return f"kill -STOP $PPID; echo x >> {side}; exit {code} # {marker}"


def _exit_recorded(path: str) -> bool:
    try:
        return Path(path).read_text().strip() != ""
    except FileNotFoundError:
        return False


def test_a_command_that_finished_before_its_teammate_died_is_completed_not_run_again(
    leader: Cli, layout: Layout, marker: str, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    task_id = add_task(leader, "once", _stop_then_finish(side, marker, 0))
    w1 = spawn(leader, "w1")
    command = listed_command(layout, "w1")
    wait_until(lambda: _exit_recorded(command.exit_file), what="the command's recorded exit")
    assert task(layout, task_id).status == "in_progress"  # its teammate is frozen
    os.kill(w1["pid"], signal.SIGKILL)
    wait_until(lambda: task(layout, task_id).status == "completed", what="the task completed")
    # Another teammate would take it if it had gone back to the list.
    spawn(leader, "w2")
    wait_until(
        lambda: (Teams(layout).read_status(TEAM, "w2") or {}).get("state") == "idle",
        what="w2 idle",
    )
    assert side.read_text() == "x\n"
    assert task(layout, task_id).status == "completed"
    assert task(layout, task_id).metadata.get("failures") is None


def test_a_command_that_failed_before_its_teammate_died_counts_one_failure(
    leader: Cli, layout: Layout, marker: str, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    task_id = add_task(leader, "fails", _stop_then_finish(side, marker, 3))
    w1 = spawn(leader, "w1")
    command = listed_command(layout, "w1")
    wait_until(lambda: _exit_recorded(command.exit_file), what="the command's recorded exit")
    os.kill(w1["pid"], signal.SIGKILL)
    wait_until(lambda: task(layout, task_id).status == "pending", what="the task back to pending")
    item = task(layout, task_id)
    assert item.owner is None
    assert item.metadata["failures"] == 1
    assert str(item.metadata["last_error"]).startswith("command failed with exit code 3")
    assert side.read_text() == "x\n"


def _worker_by_hand(home: Path, name: str, output: Path) -> subprocess.Popen[bytes]:
    """`shoal worker` started by the test, not by the leader: a member that joined on its own,
    whose end the leader learns of only from the team file."""
    return subprocess.Popen(
        [sys.executable, "-m", "shoal", "worker", "--name", name, "--team", TEAM,
         "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "SHOAL_HOME": str(home)},
        start_new_session=True,
    )  # fmt: skip


def test_a_member_the_leader_does_not_run_is_settled_from_its_exit_code_when_it_dies(
    leader: Cli, layout: Layout, marker: str, tmp_path: Path
) -> None:
    """The leader's periodic release of a dead member's tasks settles them as the swarm does:
    a command that had finished completes its task, which is not run a second time."""
    side = tmp_path / "side"
    task_id = add_task(leader, "once", _stop_then_finish(side, marker, 0))
    worker = _worker_by_hand(layout.home, "w9", tmp_path / "w9.out")
    try:
        command = listed_command(layout, "w9")
        wait_until(lambda: _exit_recorded(command.exit_file), what="the command's recorded exit")
        assert task(layout, task_id).status == "in_progress"  # its teammate is frozen
        worker.kill()
        worker.wait(10)
        wait_until(
            lambda: task(layout, task_id).status == "completed",
            timeout=30,
            what=lambda: f"the task completed (it is {task(layout, task_id).status})",
        )
        assert side.read_text() == "x\n"
        assert task(layout, task_id).metadata.get("failures") is None
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def test_a_member_the_leader_does_not_run_has_its_command_killed_before_its_task_goes_back(
    leader: Cli, layout: Layout, marker: str, tmp_path: Path
) -> None:
    """A member that joined on its own, killed mid-command: its command's group is killed
    before its task goes back to the list, so no copy of it runs on beside a new one."""
    task_id = add_task(leader, "long", f"sleep 30; echo done # {marker}")
    worker = _worker_by_hand(layout.home, "w9", tmp_path / "w9.out")
    try:
        command = listed_command(layout, "w9")
        assert marker_pids(marker), "the command runs"
        worker.kill()
        worker.wait(10)
        wait_until(
            lambda: task(layout, task_id).status == "pending",
            timeout=30,
            what="the task back to pending",
        )
        wait_until(lambda: group_gone(command.pgid), timeout=5, what="the command's group to end")
        assert marker_pids(marker) == []
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def test_the_periodic_release_leaves_a_teammate_the_leader_runs_to_its_own_settling(
    layout: Layout, tmp_path: Path, marker: str
) -> None:
    """A teammate this leader runs dies, and the leader's periodic release of departed members'
    tasks comes before the swarm has noticed: it must leave that task alone. The swarm then
    settles it from the exit code its finished command recorded. Before, the release sent the
    finished task back to the list, to run a second time.

    The kill and the release run as one call on the leader's own thread, so no tick of the
    loop can come between them."""
    side = tmp_path / "side"
    with running(Leader(layout, TEAM)) as lead:
        tasks = TaskList(Teams(layout), TEAM)
        task_id = tasks.add("once", metadata={"run": _stop_then_finish(side, marker, 0)}).id
        answers: list[Any] = []
        spec = {"name": "w1", "backend": "process", "cwd": str(tmp_path)}
        lead.call(partial(lead.spawn, [spec], lambda result, error: answers.append(error)))
        wait_until(lambda: answers, timeout=60, what="w1 to start")
        assert answers == [None]
        command = listed_command(layout, "w1")
        wait_until(lambda: _exit_recorded(command.exit_file), what="the command's recorded exit")
        member = Teams(layout).read(TEAM).member("w1")
        assert member is not None and member.pid is not None
        pid, started = member.pid, member.pid_started_at

        def kill_then_release() -> TaskItem:
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not is_alive(pid, started), what="w1 to die")
            lead.release_orphaned_tasks(time.monotonic() + RELEASE_INTERVAL_S + 1)
            return task(layout, task_id)

        seen = lead.call(kill_then_release).result(60)
        assert (seen.status, seen.owner) == ("in_progress", "w1"), seen
        wait_until(lambda: task(layout, task_id).status == "completed", what="the task completed")
    assert side.read_text() == "x\n"
    assert task(layout, task_id).metadata.get("failures") is None
