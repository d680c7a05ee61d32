"""Swarms end to end: teammates on each backend that runs here, driven through the real CLI."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.tasks import InProcessTeammateTaskState
from shoal.teams.session import current_session
from shoal.teams.store import MemberState, Teams
from shoal.teams.tasklist import TaskList
from tests.conftest import Cli, pid_gone
from tests.integration.test_leader import FAST, LeaderProc
from tests.polling import wait_until

BACKENDS = ["process", "in-process", pytest.param("tmux", marks=pytest.mark.tmux)]


@pytest.fixture
def leader(home: Path, cli: Cli, tmp_path: Path) -> Iterator[LeaderProc]:
    proc = LeaderProc(
        home,
        env={"SHOAL_SHUTDOWN_TIMEOUT": "3", "SHOAL_TMUX_SOCKET": f"shoal-test-{tmp_path.name}"},
    )
    yield proc
    cli("down", "--team", "t", env=FAST)
    proc.stop()


def spawn(cli: Cli, name: str, *args: str) -> dict[str, Any]:
    out = cli("spawn", "--team", "t", name, "--json", *args)
    assert out.returncode == 0, out.stderr
    info: dict[str, Any] = json.loads(out.stdout)
    return info


def events(home: Path) -> list[dict[str, Any]]:
    session = current_session(Layout(home), "t")
    assert session is not None
    return list(session.events())


def messages(home: Path, kind: str) -> list[dict[str, Any]]:
    return [
        e["message"]
        for e in events(home)
        if e.get("type") == "message" and e["message"]["kind"] == kind
    ]


def states(home: Path) -> dict[str, MemberState]:
    return {v.member.name: v.state for v in Teams(Layout(home)).members("t")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_teammates_take_dependent_tasks_talk_and_shut_down(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path, backend: str
) -> None:
    script = tmp_path / "brain.toml"
    script.write_text(
        '[[step]]\nwhen = "task"\nrun = "echo {subject} by {name} >> '
        + str(tmp_path / "log")
        + '"\n[[step]]\nwhen = "task"\nsend = "{meta_tell}"\ntext = "{name} did {task_id}"\n'
        '[[step]]\nwhen = "message"\nresult = "noted {prompt}"\n'
    )
    first = spawn(cli, "ana", "--backend", backend, "--script", str(script))
    second = spawn(cli, "ben", "--backend", backend, "--script", str(script))
    assert first["backend"] == backend and first["task_id"].startswith("t")
    assert {"ana", "ben"} <= set(states(home))
    assert all(states(home)[n] in (MemberState.IDLE, MemberState.ACTIVE) for n in ("ana", "ben"))
    tasks = TaskList(Teams(Layout(home)), "t")
    a = tasks.add("alpha", metadata={"tell": "ben"})
    b = tasks.add("beta", blocked_by=[a.id], metadata={"tell": "ana"})
    c = tasks.add("gamma", blocked_by=[b.id], metadata={"tell": "ben"})
    wait_until(lambda: all(t.status == "completed" for t in tasks.list()), timeout=60)
    assert (tmp_path / "log").read_text().split("\n")[:3] == [
        f"alpha by {tasks.get(a.id).owner}",
        f"beta by {tasks.get(b.id).owner}",
        f"gamma by {tasks.get(c.id).owner}",
    ]
    # They told each other, and every turn was reported to the lead.
    wait_until(lambda: len(messages(home, "task_notification")) >= 6, timeout=30)
    froms = {m["from"] for m in messages(home, "task_notification")}
    assert froms <= {"ana", "ben"}
    pids = [first["pid"], second["pid"]]
    down = cli("down", "--team", "t")
    assert down.returncode == 0, down.stderr
    assert leader.proc.wait(30) == 0
    assert all(states(home)[n] is MemberState.LEFT for n in ("ana", "ben")), states(home)
    if backend != "in-process":
        for pid in pids:
            wait_until(functools.partial(pid_gone, pid))
    terminated = [
        e
        for e in events(home)
        if e.get("subtype") == "task_terminated"
        and e["task_id"] in (first["task_id"], second["task_id"])
    ]
    assert sorted(e["status"] for e in terminated) == ["completed", "completed"]


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_prompt_turn_and_exec_brain(cli: Cli, leader: LeaderProc, home: Path, backend: str) -> None:
    info = spawn(
        cli,
        "eve",
        "--backend",
        backend,
        "--agent",
        "exec",
        "--cmd",
        "sh -c 'echo exec got: $0' {prompt}",
        "--prompt",
        "hello there",
    )
    wait_until(lambda: messages(home, "task_notification"), timeout=30)
    note = messages(home, "task_notification")[0]
    assert note["from"] == "eve" and note["data"]["status"] == "completed"
    assert "exec got: hello there" in note["data"]["result"]
    assert "<task-notification>" in note["text"]
    output = Path(note["data"]["output_file"]).read_text()
    assert "exec got: hello there" in output
    assert info["task_id"] in note["text"]


def test_names_taken_and_invalid(cli: Cli, leader: LeaderProc) -> None:
    spawn(cli, "ana", "--backend", "process")
    taken = cli("spawn", "--team", "t", "ana", "--backend", "process")
    assert taken.returncode == 1 and "already" in taken.stderr
    for bad in ("Ana", "../x", "a b", "team-lead"):
        out = cli("spawn", "--team", "t", bad)
        assert out.returncode in (1, 2) and "shoal: error" in out.stderr, bad
    missing = cli("spawn", "--team", "t", "zed", "--agent", "exec")
    assert missing.returncode == 2 and "--cmd" in missing.stderr


def test_tmux_absent_is_a_clear_error_without_fallback(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    proc = LeaderProc(home, env={"PATH": str(empty)})
    try:
        out = cli("spawn", "--team", "t", "ana", "--backend", "tmux")
        assert out.returncode == 1
        assert "tmux" in out.stderr and "not" in out.stderr
        assert "ana" not in states(home)
    finally:
        cli("down", "--team", "t")
        proc.stop()


@pytest.mark.parametrize("policy", ["reject", "ignore"])
def test_a_teammate_that_will_not_shut_down_is_killed(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path, policy: str
) -> None:
    script = tmp_path / "stubborn.toml"
    script.write_text(f'on_shutdown = "{policy}"\nshutdown_reason = "too busy"\n')
    info = spawn(cli, "mule", "--backend", "process", "--script", str(script))
    assert cli("down", "--team", "t").returncode == 0
    wait_until(lambda: not is_alive(info["pid"], None))
    notes = [e.get("text", "") for e in events(home) if e.get("subtype") == "note"]
    assert any("did not shut down" in n and "mule" in n for n in notes)
    if policy == "reject":
        assert any("declined" in n and "too busy" in n for n in notes)
        responses = messages(home, "shutdown_response")
        assert responses[0]["data"]["approve"] is False


def test_plan_mode_approve_and_reject(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    target = tmp_path / "written.txt"
    spawn(cli, "pat", "--backend", "process", "--plan-mode")
    tasks = TaskList(Teams(Layout(home)), "t")
    first = tasks.add("write it", metadata={"run": f"echo ok > {target}"})
    teams = Teams(Layout(home))
    wait_until(lambda: (teams.read_status("t", "pat") or {}).get("awaiting_approval"))
    plan = teams.read_status("t", "pat")["awaiting_approval"]["plan"]  # type: ignore[index]
    assert str(target) in plan
    assert not target.exists()  # nothing written before approval
    wait_until(lambda: messages(home, "plan_approval_request"))
    assert messages(home, "plan_approval_request")[0]["from"] == "pat"
    assert cli("approve", "--team", "t", "pat").returncode == 0
    wait_until(lambda: tasks.get(first.id).status == "completed")
    assert target.read_text() == "ok\n"
    second = tasks.add("write again", metadata={"run": f"echo again > {target}"})
    wait_until(lambda: (teams.read_status("t", "pat") or {}).get("awaiting_approval"))
    assert cli("reject", "--team", "t", "pat", "--feedback", "not now").returncode == 0
    wait_until(
        lambda: any(
            "plan rejected: not now" in (m["data"].get("result") or "")
            for m in messages(home, "task_notification")
        )
    )
    assert target.read_text() == "ok\n"
    # The rejected task went back to the list (with the reason) for another plan.
    wait_until(lambda: "plan rejected" in tasks.get(second.id).metadata.get("last_error", ""))
    assert tasks.get(second.id).status != "completed"
    nothing = cli("approve", "--team", "t", "nobody")
    assert nothing.returncode == 1


def test_stop_a_teammate_and_its_tasks_return(cli: Cli, leader: LeaderProc, home: Path) -> None:
    info = spawn(cli, "sam", "--backend", "process")
    tasks = TaskList(Teams(Layout(home)), "t")
    slow = tasks.add("slow", metadata={"run": "sleep 300"})
    wait_until(lambda: tasks.get(slow.id).owner == "sam")
    out = cli("stop", "--team", "t", info["task_id"])
    assert out.returncode == 0, out.stderr
    wait_until(lambda: not is_alive(info["pid"], None))
    assert tasks.get(slow.id).status == "pending" and tasks.get(slow.id).owner is None
    assert states(home)["sam"] is MemberState.DEAD


def test_ui_message_buffer_is_capped(cli: Cli, leader: LeaderProc, home: Path) -> None:
    spawn(cli, "bea", "--backend", "in-process")
    from shoal.mailbox.router import send

    directory = Teams(Layout(home)).directory("t")
    for i in range(60):
        send(directory, to="bea", sender="team-lead", kind="progress", data={"activity": str(i)})
    teams = Teams(Layout(home))
    wait_until(
        lambda: (
            len((teams.read_status("t", "bea") or {}).get("messages", [])) == 50
            and teams.read_status("t", "bea")["messages"][-1]["kind"] == "progress"  # type: ignore[index]
            and not os.listdir(home / "teams/t/inboxes/bea/new")
        )
    )


def test_worker_without_inotify_polls_and_gets_everything(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import errno\n"
        "from watchdog.observers import inotify_c\n"
        "def _no(cls):\n"
        "    raise OSError(errno.EMFILE, 'inotify instance limit reached')\n"
        "inotify_c.InotifyFD._create_inotify_fd = classmethod(_no)\n"
    )
    proc = LeaderProc(home, env={"PYTHONPATH": str(site)})
    try:
        spawn(cli, "pol", "--backend", "process")
        teams = Teams(Layout(home))
        assert teams.read_status("t", "pol")["watcher"] == "polling"  # type: ignore[index]
        from shoal.mailbox.router import send

        assert cli("send", "--team", "t", "pol", "note 0").returncode == 0
        for i in range(1, 20):
            send(teams.directory("t"), to="pol", sender="team-lead", text=f"note {i}")
        wait_until(lambda: len(messages(home, "task_notification")) == 20, timeout=60)
        texts = sorted(m["data"]["result"] for m in messages(home, "task_notification"))
        assert texts == sorted(f"done: note {i}" for i in range(20))
    finally:
        cli("down", "--team", "t")
        proc.stop()


def test_worktree_per_member(cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f.txt").write_text("x\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    spawn(cli, "wes", "--backend", "process", "--worktree", "--cwd", str(repo))
    member = Teams(Layout(home)).read("t").member("wes")
    assert member is not None and member.worktree_path
    worktree = Path(member.worktree_path)
    assert (worktree / "f.txt").exists() and member.cwd == str(worktree)
    assert cli("down", "--team", "t").returncode == 0
    leader.stop()
    assert cli("team", "delete", "t").returncode == 0
    assert not worktree.exists()
    listed = subprocess.run([*git, "worktree", "list"], capture_output=True, text=True)
    assert str(worktree) not in listed.stdout
    not_git = cli("spawn", "--team", "t", "x", "--worktree", "--cwd", str(tmp_path))
    assert not_git.returncode != 0


def test_worker_dying_at_start_is_reported(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from shoal.orchestrator.leader import Leader

    leader = Leader(Layout(home), "t").start()
    stop = threading.Event()
    loop = threading.Thread(target=leader.run, args=(stop,))
    loop.start()
    try:
        tasks = TaskList(Teams(Layout(home)), "t")
        # The worker command of this spawn fails at start (as a broken install would), once
        # the test has given the new member a task.
        gate = home / "gate"
        broken = home / "broken-python"
        broken.write_text(
            f"#!/bin/sh\nwhile [ ! -f {gate} ]; do sleep 0.02; done\n"
            "echo 'ImportError: a broken install' >&2\nexit 3\n"
        )
        broken.chmod(0o755)
        monkeypatch.setattr("shoal.workers.teammate.swarm.sys.executable", str(broken))
        got: dict[str, Any] = {}
        done = threading.Event()

        def answer(result: Any, error: Any) -> None:
            got["result"], got["error"] = result, error
            done.set()

        leader.swarm.spawn({"name": "dud", "backend": "process"}, answer)
        item = tasks.add("for dud", owner="dud")
        gate.touch()
        assert done.wait(30)
        assert got["result"] is None and "died at start" in str(got["error"])
        assert "a broken install" in str(got["error"])
        assert states(home)["dud"] is MemberState.DEAD
        wait_until(lambda: tasks.get(item.id).owner is None)
        (teammate,) = leader.registry.get_task_by_type("in_process_teammate")
        assert isinstance(teammate, InProcessTeammateTaskState)
        assert teammate.status == "failed"
        assert "died at start" in (teammate.error or "")
    finally:
        stop.set()
        leader.wake()
        loop.join(10)
        leader.shutdown()


def test_teammates_outlive_a_crashed_leader_and_are_adopted(cli: Cli, home: Path) -> None:
    first = LeaderProc(home)
    info = spawn(cli, "ada", "--backend", "process")
    first.kill9()
    assert is_alive(info["pid"], None)
    second = LeaderProc(home)
    try:
        wait_until(
            lambda: any(
                "adopted teammate ada" in e.get("text", "")
                for e in events(home)
                if e.get("subtype") == "note"
            )
        )
        assert cli("send", "--team", "t", "ada", "still there?").returncode == 0
        wait_until(
            lambda: any(
                "still there?" in (m["data"].get("result") or "")
                for m in messages(home, "task_notification")
            ),
            timeout=30,
        )
        assert cli("down", "--team", "t").returncode == 0
        wait_until(lambda: not is_alive(info["pid"], None))
        assert states(home)["ada"] is MemberState.LEFT
    finally:
        second.stop()


def test_spawn_several_in_one_batch(cli: Cli, leader: LeaderProc, home: Path) -> None:
    out = cli("spawn", "--team", "t", "--backend", "in-process", "--json", "x1", "x2", "x3")
    assert out.returncode == 0, out.stderr
    spawned = json.loads(out.stdout)
    assert [s["name"] for s in spawned] == ["x1", "x2", "x3"]
    assert len({s["task_id"] for s in spawned}) == 3
    assert all(states(home)[n] is MemberState.IDLE for n in ("x1", "x2", "x3"))
    dup = cli("spawn", "--team", "t", "--backend", "in-process", "y1", "y1")
    assert dup.returncode == 2 and "twice" in dup.stderr
    taken = cli("spawn", "--team", "t", "--backend", "in-process", "y2", "x1")
    assert taken.returncode == 1 and "x1" in taken.stderr
    assert "y2" not in states(home)  # checked before anything started


def test_down_after_a_leader_crash_stops_its_teammates(cli: Cli, home: Path) -> None:
    leader = LeaderProc(home)
    info = spawn(cli, "orphan", "--backend", "process")
    leader.kill9()
    out = cli("down", "--team", "t", "--json")
    assert out.returncode == 0, out.stderr
    assert info["task_id"] in json.loads(out.stdout)["killed_orphans"]
    wait_until(lambda: not is_alive(info["pid"], None))
    assert states(home)["orphan"] is MemberState.DEAD
