"""Shell tasks at the library level: the recording wrapper, kills, adoption, planted symlinks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shoal.core.errors import UnsafePathError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.tasks import LocalShellTaskState, TaskStatus
from shoal.orchestrator.leader import Leader
from shoal.workers.shell import process as shell
from shoal.workers.shell.kind import looks_like_prompt
from tests.conftest import group_gone
from tests.polling import wait_until


def run(argv: list[str], tmp_path: Path, name: str = "t") -> tuple[int | None, str]:
    out = tmp_path / f"{name}.output"
    proc = shell.start(argv, out, cwd=str(tmp_path))
    wait_until(lambda: not proc.poll())
    assert proc.returncode() == shell.recorded_exit(out)
    return shell.recorded_exit(out), out.read_text()


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["-c", "echo hi; echo err >&2"], 0, "hi\nerr\n"),
        (["-c", "exit 7"], 7, ""),
        (["sh", "-c", "exit 5"], 5, ""),
        (["printf", "%s|", "a b", "c"], 0, "a b|c|"),
        (["no-such-command-here"], 127, "not found"),
        (["-c", "kill -TERM $$"], 143, ""),
    ],
)
def test_exit_codes_are_recorded(tmp_path: Path, argv: list[str], code: int, text: str) -> None:
    got_code, output = run(argv, tmp_path)
    assert got_code == code
    assert text in output


def test_working_directory_and_missing_one(tmp_path: Path) -> None:
    assert run(["-c", "pwd"], tmp_path)[1].strip() == str(tmp_path)
    out = tmp_path / "cd.output"
    proc = shell.start(["-c", "true"], out, cwd=str(tmp_path / "gone"))
    wait_until(lambda: not proc.poll())
    assert shell.recorded_exit(out) == 126
    assert "can't cd" in out.read_text() or "No such file" in out.read_text()


def test_a_planted_symlink_at_the_output_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious\n")
    out = tmp_path / "x.output"
    os.symlink(target, out)
    with pytest.raises(UnsafePathError):
        shell.start(["-c", "echo overwritten"], out)
    assert target.read_text() == "precious\n"


def test_kill_takes_the_whole_group_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "k.output"
    proc = shell.start(["-c", "sleep 300 & sleep 300; wait"], out)
    import psutil

    # Both sleeps must be running (exec'd, not just forked): a TERM that lands while the shell
    # forks its foreground command is only acted on after that command ends, and the kill
    # rightly escalates to KILL after the grace.
    wait_until(
        lambda: [c.cmdline() for c in psutil.Process(proc.pid).children()] == [["sleep", "300"]] * 2
    )
    shell.kill(proc, grace=5)
    assert not proc.poll()
    assert proc.returncode() == 143
    wait_until(lambda: group_gone(proc.pid))


def test_kill_escalates_when_term_is_ignored(tmp_path: Path) -> None:
    out = tmp_path / "i.output"
    proc = shell.start(["-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"], out)
    wait_until(lambda: "ready" in out.read_text())
    shell.kill(proc, grace=0.3)
    assert not proc.poll()
    wait_until(lambda: group_gone(proc.pid))


def test_locate_adopts_only_the_same_process(tmp_path: Path) -> None:
    out = tmp_path / "a.output"
    proc = shell.start(["-c", "sleep 300"], out)
    try:
        wait_until(lambda: shell.recorded_pid(out) == proc.pid)
        started, found = shell.locate(None, None, out)  # state lost: found through the pid file
        assert started and found is not None and found.pid == proc.pid
        other = tmp_path / "b.output"
        other.write_text("")
        (tmp_path / "b.pid").write_text(f"{proc.pid}\n")  # someone else's pid
        started, found = shell.locate(None, None, other)
        assert started and found is None
        assert shell.locate(None, None, tmp_path / "never.output") == (False, None)
    finally:
        shell.kill(proc, grace=1)


def test_prompt_detection(tmp_path: Path) -> None:
    out = tmp_path / "p.output"
    for line, expected in [
        ("Overwrite config.yaml? (y/n) ", True),
        ("Press Enter to continue", True),
        ("Are you sure you want to delete it?", True),
        ("Do you want to proceed?", True),
        ("compiling 3 of 9", False),
        ("", False),
    ]:
        out.write_text(f"some output\n{line}")
        assert (looks_like_prompt(out) is not None) is expected, line


def test_leader_reports_a_planted_symlink(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    leader = Leader(Layout(home), "s").start()
    try:
        fixed = "bplanted1"
        monkeypatch.setattr("shoal.orchestrator.requests.new_task_id", lambda _t: fixed)
        target = home / "target"
        target.write_text("precious\n")
        os.symlink(target, leader.session.output_file(fixed))
        task = leader.submit_shell(["echo overwritten"])
        assert task.status is TaskStatus.FAILED
        assert isinstance(task, LocalShellTaskState) and "symlink" in (task.error or "")
        assert target.read_text() == "precious\n"
    finally:
        leader.shutdown()


def test_leader_steps_without_sleeping(home: Path) -> None:
    leader = Leader(Layout(home), "s", jobs=1).start()
    try:
        first = leader.submit_shell(["exit 0"])
        second = leader.submit_shell(["exit 4"])
        assert leader.registry.get(second.id).status is TaskStatus.PENDING  # type: ignore[union-attr]
        wait_until(lambda: not leader.procs[first.id].poll())
        leader.quick_tick()  # reap first, notify, start second
        assert leader.registry.get(second.id).status is TaskStatus.RUNNING  # type: ignore[union-attr]
        wait_until(lambda: not leader.procs[second.id].poll())
        leader.tick()  # reap second and notify: both ended, marked for eviction
        assert second.id not in leader.session.history()
        leader.tick()  # the round after: into the history
        assert leader.session.history()[second.id]["result"]["code"] == 4
        assert leader.session.history()[first.id]["status"] == "completed"
    finally:
        leader.shutdown()


def test_leader_stops_its_tasks_on_sigterm(home: Path) -> None:
    env = {**os.environ, "SHOAL_HOME": str(home)}
    up = subprocess.Popen(
        [sys.executable, "-m", "shoal", "up", "--team", "g"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        from shoal.orchestrator.liveness import leader_alive

        wait_until(lambda: leader_alive(Layout(home), "g") is not None, timeout=30)
        out = subprocess.run(
            [sys.executable, "-m", "shoal", "sh", "--team", "g", "--json", "--", "sleep 300"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        import json

        task_id = json.loads(out.stdout)["id"]
        up.send_signal(signal.SIGHUP)
        assert up.wait(30) == 0
        from shoal.teams.session import current_session

        session = current_session(Layout(home), "g")
        assert session is not None
        record = session.read_state().tasks[task_id]
        assert isinstance(record, LocalShellTaskState)
        assert record.status is TaskStatus.KILLED
        assert not is_alive(record.pid, None)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_state_machine_survives_concurrent_stop_and_exit(home: Path) -> None:
    leader = Leader(Layout(home), "s").start()
    stop = threading.Event()
    loop = threading.Thread(target=leader.run, args=(stop,))
    loop.start()
    try:
        tasks = [leader.submit_shell(["sleep 0.05"]) for _ in range(10)]
        for t in tasks:
            try:
                leader.stop_task(t.id)
            except Exception as exc:  # finished first: that is the other legal outcome
                assert "already finished" in str(exc)
        wait_until(
            lambda: all(
                (leader.registry.get(t.id) is None or leader.registry.get(t.id).is_terminal)  # type: ignore[union-attr]
                for t in tasks
            )
        )
    finally:
        stop.set()
        leader.wake()
        loop.join(10)
        leader.shutdown()


def test_a_resumed_leader_does_not_notify_what_the_event_stream_says_it_did(home: Path) -> None:
    # state.json is written at most every 0.2 s, so a leader killed right after notifying
    # leaves a state that still says "running". Its successor must not notify again.
    first = Leader(Layout(home), "s").start()
    task = first.submit_shell(["exit 3"])
    stale = first.session.state_file.read_bytes()  # the task as running
    wait_until(lambda: not first.procs[task.id].poll())
    first.quick_tick()  # reap, announce, notify
    first.session.write_state_bytes(stale)  # ...and "die" before the next state write
    first.session.close()
    if first._subscription is not None:  # (a kill -9 would leave nothing else behind)
        first._subscription.stop()
    second = Leader(Layout(home), "s").start()  # same pid: it may take over the claim
    try:
        second.tick()
        assert second.session.id == first.session.id
        kinds = [
            e["subtype"]
            for e in second.session.events()
            if e.get("task_id") == task.id and e.get("subtype") != "task_started"
        ]
        assert kinds == ["task_terminated", "task_notification"]  # once each
        final = second.registry.get(task.id) or second.session.history()[task.id]
        status = final.status if not isinstance(final, dict) else final["status"]
        assert status == "failed"
    finally:
        second.shutdown()


def test_a_group_that_outlives_sigterm_gets_it_once_more_before_sigkill(tmp_path: Path) -> None:
    # A process forked while the group's first SIGTERM was delivered can miss it; terminate()
    # sends it again once before the grace ends in SIGKILL.
    from shoal.core.procs import terminate

    count = tmp_path / "terms"
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'a').write('T'))\n"
        "open(sys.argv[1], 'a').close()\n"
        "while True: time.sleep(0.01)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(count)], start_new_session=True)
    try:
        wait_until(count.exists)
        assert terminate(proc.pid, None, grace=1.0, group=True)
        assert count.read_text() == "TT"  # twice, then SIGKILL
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_side_files_are_private_and_the_command_keeps_the_umask(tmp_path: Path) -> None:
    """The wrapper makes its pid and exit files 0600 itself; the command runs with this
    process's umask (what it creates is not made private behind its back)."""
    out = tmp_path / "u.output"
    mask = os.umask(0o022)
    os.umask(mask)
    proc = shell.start(["-c", "umask; touch made.txt"], out, cwd=str(tmp_path))
    wait_until(lambda: shell.recorded_exit(out) == 0)
    assert int(out.read_text().strip(), 8) == mask
    assert (tmp_path / "made.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    for side in (shell.exit_file_for(out), shell.pid_file_for(out)):
        assert side.stat().st_mode & 0o777 == 0o600, side
    assert shell.recorded_pid(out) == proc.pid
