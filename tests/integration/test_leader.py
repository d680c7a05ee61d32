"""The leader and its shell tasks, through the real CLI and real processes."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.orchestrator.liveness import leader_alive, leader_ready
from shoal.teams.session import current_session
from tests.conftest import Cli, group_gone, pid_gone
from tests.polling import wait_until

FAST = {
    "SHOAL_POLL_INTERVAL": "0.1",
    "SHOAL_STALL_CHECK_INTERVAL": "0.2",
    "SHOAL_STALL_AFTER": "1",
    "SHOAL_KILL_GRACE": "2",
}


class LeaderProc:
    """A foreground `shoal up` in a real process."""

    def __init__(
        self,
        home: Path,
        team: str = "t",
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.home = home
        self.team = team
        self.env = {**os.environ, "SHOAL_HOME": str(home), **FAST, **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", "up", "--team", team, *args],
            # Its line per event is not read: a pipe would fill up and stop the leader.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        layout = Layout(home)
        wait_until(
            lambda: self.proc.poll() is not None or leader_ready(layout, team) == self.proc.pid,
            timeout=30,
        )
        assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def leader(home: Path, cli: Cli) -> Iterator[LeaderProc]:
    proc = LeaderProc(home)
    yield proc
    cli("down", "--team", "t", env=FAST)
    proc.stop()


def sh(cli: Cli, *args: str) -> str:
    out = cli("sh", "--team", "t", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def task_record(cli: Cli, task_id: str) -> dict[str, Any]:
    rows = json.loads(cli("ps", "--all", "--json", "--team", "t").stdout)
    return next(r for r in rows if r["id"] == task_id)


def events(home: Path, team: str = "t") -> list[dict[str, Any]]:
    session = current_session(Layout(home), team)
    assert session is not None
    return list(session.events())


def test_no_leader_fails_at_once_naming_up(cli: Cli) -> None:
    cli("team", "create", "t")
    out = cli("sh", "--team", "t", "--", "echo", "hi")
    assert out.returncode == 1
    assert "shoal up" in out.stderr
    out = cli("stop", "--team", "t", "b12345678")
    assert out.returncode == 1 and "shoal up" in out.stderr


def test_sh_ps_logs_wait_events(cli: Cli, leader: LeaderProc, home: Path) -> None:
    ok = sh(cli, "--", "echo", "hello world")
    bad = sh(cli, "--", "echo out; echo err >&2; exit 3")
    missing = sh(cli, "--", "definitely-not-a-command-xyz")
    assert ok.startswith("b") and len(ok) == 9
    waited = cli("wait", "--team", "t", ok)
    assert waited.returncode == 0 and f"{ok} completed" in waited.stdout
    failed = cli("wait", "--team", "t", ok, bad, missing)
    assert failed.returncode == 1
    assert cli("logs", "--team", "t", ok).stdout == "hello world\n"
    assert cli("logs", "--team", "t", bad).stdout == "out\nerr\n"
    assert "not found" in cli("logs", "--team", "t", missing).stdout
    assert task_record(cli, bad)["result"] == {"code": 3, "interrupted": False}
    rec = task_record(cli, missing)
    assert rec["status"] == "failed" and rec["result"]["code"] == 127
    kinds = [(e["subtype"], e.get("task_id")) for e in events(home) if e["type"] == "system"]
    for task_id in (ok, bad, missing):
        assert kinds.count(("task_started", task_id)) == 1
        assert kinds.count(("task_terminated", task_id)) == 1
        assert kinds.count(("task_notification", task_id)) == 1
    note = next(
        e for e in events(home) if e.get("subtype") == "task_notification" and e["task_id"] == bad
    )
    assert "<status>failed</status>" in note["notification"]
    assert "exit code 3" in note["notification"]
    streamed = cli("events", "--team", "t", "--json")
    assert all(json.loads(line)["session_id"] for line in streamed.stdout.splitlines())
    human = cli("events", "--team", "t").stdout.splitlines()  # one line per event
    assert len(human) == len(streamed.stdout.splitlines())
    assert any(f" started   {bad}  " in line for line in human), human
    assert any(f" failed    {bad}  " in line for line in human), human
    assert not any(line.startswith("{") for line in human)
    logged = json.loads(cli("logs", "--team", "t", bad, "--json").stdout)
    assert (logged["id"], logged["status"], logged["output"]) == (bad, "failed", "out\nerr\n")
    assert logged["output_truncated"] is False
    assert cli("logs", "--team", "t", bad, "--json", "-f").returncode == 2
    assert cli("logs", "--team", "t", "bnosuch00", "--json").returncode == 2  # (an unknown id)


def test_stop_kills_the_group_quietly(cli: Cli, leader: LeaderProc, home: Path) -> None:
    task_id = sh(cli, "--", "sleep 300 & sleep 300; wait")
    wait_until(lambda: task_record(cli, task_id)["status"] == "running")
    pid = task_record(cli, task_id)["pid"]
    out = cli("stop", "--team", "t", task_id)
    assert out.returncode == 0 and task_id in out.stdout
    rec = task_record(cli, task_id)
    assert rec["status"] == "killed" and rec["result"]["interrupted"] is True
    wait_until(lambda: group_gone(pid))
    subtypes = [e["subtype"] for e in events(home) if e.get("task_id") == task_id]
    assert "task_notification" not in subtypes  # a requested kill is not news
    again = cli("stop", "--team", "t", task_id)
    assert again.returncode == 1 and "already finished" in again.stderr
    unknown = cli("stop", "--team", "t", "bzzzzzzzz")
    assert unknown.returncode == 2 and "no task 'bzzzzzzzz' in team 't'" in unknown.stderr
    assert cli("logs", "--team", "t", "bnope1234").returncode == 2


def test_foreground_streams_and_exits_with_the_code(cli: Cli, leader: LeaderProc) -> None:
    out = cli("sh", "--team", "t", "--foreground", "--", "echo streamed; exit 4")
    assert out.returncode == 4  # the task's own code, as `timeout` passes it on
    assert out.stdout == "streamed\n"
    assert out.stderr.startswith("shoal: task b") and out.stderr.endswith("failed (exit code 4)\n")
    ok = cli("sh", "--team", "t", "-f", "--", "echo fine")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "fine\n", "")
    killed = cli("sh", "--team", "t", "-f", "--", "kill -USR1 $$")
    assert killed.returncode == 128 + signal.SIGUSR1, killed.stderr


def test_wait_with_no_ids_counts_failures_from_before_it_was_called(
    cli: Cli, leader: LeaderProc
) -> None:
    failed = sh(cli, "--", "exit 5")
    wait_until(lambda: task_record(cli, failed)["status"] == "failed", what="the task's end")
    first = cli("wait", "--team", "t")
    assert first.returncode == 1, first.stdout + first.stderr
    assert f"{failed} failed" in first.stdout and "1 of 1 tasks did not complete" in first.stderr
    # Since that wait: nothing new, so nothing failed.
    assert cli("wait", "--team", "t").returncode == 0
    ok = sh(cli, "--", "true")
    again = cli("wait", "--team", "t")
    assert again.returncode == 0 and f"{ok} completed" in again.stdout
    assert failed not in again.stdout
    # An explicit id is always waited for, and any unique prefix of it works.
    assert cli("wait", "--team", "t", failed[:5]).returncode == 1
    slow = sh(cli, "--", "sleep 30")
    timed = cli("wait", "--team", "t", slow, "--timeout", "0.5")
    assert timed.returncode == 124 and "timed out after 0.5s" in timed.stderr
    assert cli("stop", "--team", "t", slow[:6]).returncode == 0  # (prefixes everywhere)
    assert cli("logs", "--team", "t", failed[:6]).returncode == 5  # (fails as the task did)
    ambiguous = cli("wait", "--team", "t", "b")
    assert ambiguous.returncode == 2 and "ambiguous" in ambiguous.stderr
    unknown = cli("wait", "--team", "t", "bzzzz")
    assert unknown.returncode == 2 and "no task 'bzzzz' in team 't'" in unknown.stderr


def test_wait_says_when_the_leader_dies_under_it(cli: Cli, home: Path) -> None:
    first = LeaderProc(home)
    slow = sh(cli, "--", "sleep 30")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "shoal", "wait", "--team", "t", slow],
        env={**os.environ, "SHOAL_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: task_record(cli, slow)["status"] == "running")
        first.kill9()
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 1, out + err
        assert "no leader is running for team 't'" in err and "shoal up --team t" in err
    finally:
        if waiter.poll() is None:
            waiter.kill()
        cli("down", "--team", "t")


def test_env_cwd_and_jobs_limit(cli: Cli, home: Path, tmp_path: Path) -> None:
    proc = LeaderProc(home, args=("--jobs", "1"))
    try:
        work = tmp_path / "work"
        work.mkdir()
        gate = tmp_path / "go"
        ids = [
            sh(
                cli,
                "--cwd",
                str(work),
                "--env",
                f"N={i}",
                "--",
                f"echo $N > n$N; while [ ! -f {gate} ]; do sleep 0.02; done",
            )
            for i in range(3)
        ]
        wait_until(lambda: (work / "n0").exists())
        statuses = [task_record(cli, i)["status"] for i in ids]
        assert statuses == ["running", "pending", "pending"]
        gate.touch()
        assert cli("wait", "--team", "t", *ids).returncode == 0
        assert sorted(p.name for p in work.iterdir()) == ["n0", "n1", "n2"]
        assert (work / "n2").read_text() == "2\n"
        bad = cli("sh", "--team", "t", "--env", "NOEQUALS", "--", "true")
        assert bad.returncode == 2
    finally:
        cli("down", "--team", "t")
        proc.stop()


def test_stall_watchdog_reports_a_prompt_once_and_spares_monitors(
    cli: Cli, leader: LeaderProc, home: Path
) -> None:
    asks = sh(cli, "--", "printf 'Overwrite existing file? (y/n) '; sleep 300")
    quiet = sh(cli, "--", "echo working; sleep 300")
    watch = sh(cli, "--monitor", "--", "printf 'Continue? [y/n] '; sleep 300")
    wait_until(lambda: any(e.get("subtype") == "task_stalled" for e in events(home)), timeout=30)
    stalls = [e for e in events(home) if e.get("subtype") == "task_stalled"]
    assert [e["task_id"] for e in stalls] == [asks]
    assert "interactive input" in stalls[0]["notification"]
    assert "(y/n)" in stalls[0]["notification"]
    # Let several more checks pass (a slow machine only makes this check weaker, never wrong):
    # still one notice, none for the silent or the monitor task.
    time.sleep(1.0)
    assert [e["task_id"] for e in events(home) if e.get("subtype") == "task_stalled"] == [asks]
    for task_id in (asks, quiet, watch):
        assert cli("stop", "--team", "t", task_id).returncode == 0


def test_output_cap_kills_and_says_why(cli: Cli, home: Path) -> None:
    proc = LeaderProc(home, env={"SHOAL_OUTPUT_CAP": "100000"})
    try:
        task_id = sh(cli, "--", "yes")
        wait_until(lambda: task_record(cli, task_id)["status"] == "killed", timeout=30)
        rec = task_record(cli, task_id)
        assert "cap" in rec["kill_reason"]
        notes = [e for e in events(home) if e.get("subtype") == "task_notification"]
        assert [n["task_id"] for n in notes] == [task_id]
        assert "<status>killed</status>" in notes[0]["notification"]
    finally:
        cli("down", "--team", "t")
        proc.stop()


def test_orphaned_tasks_die_with_their_agent(cli: Cli, leader: LeaderProc, home: Path) -> None:
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert cli("team", "join", "t", "bob", "--pid", str(agent.pid)).returncode == 0
        task_id = sh(cli, "--agent", "bob", "--", "sleep 300")
        wait_until(lambda: task_record(cli, task_id)["status"] == "running")
        agent.kill()
        agent.wait()
        wait_until(lambda: task_record(cli, task_id)["status"] == "killed", timeout=30)
        assert "bob" in task_record(cli, task_id)["kill_reason"]
        inbox = home / "teams/t/inboxes/bob/new"
        (name,) = os.listdir(inbox)
        msg = json.loads((inbox / name).read_text())
        assert msg["kind"] == "task_notification" and msg["data"]["task_id"] == task_id
        unknown = cli("sh", "--team", "t", "--agent", "ghost", "--", "true")
        assert unknown.returncode == 1 and "ghost" in unknown.stderr
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_kill9_and_resume_adopts_and_reports_real_codes(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    first = LeaderProc(home)
    gate_a, gate_b = tmp_path / "a", tmp_path / "b"
    loop = "while [ ! -f {} ]; do sleep 0.02; done; exit {}"
    a = sh(cli, "--", loop.format(gate_a, 3))
    b = sh(cli, "--", loop.format(gate_b, 0))
    done = sh(cli, "--", "exit 0")
    assert cli("wait", "--team", "t", done).returncode == 0
    wait_until(
        lambda: (
            task_record(cli, a)["status"] == "running"
            and task_record(cli, b)["status"] == "running"
        )
    )
    pid_a = task_record(cli, a)["pid"]
    first.kill9()
    assert cli("sh", "--team", "t", "--", "true").returncode == 1  # no leader now
    gate_a.touch()  # a ends while no leader runs
    wait_until(lambda: not is_alive(pid_a, None))
    second = LeaderProc(home)
    try:
        gate_b.touch()  # b ends under the new leader, which is not its parent
        waited = cli("wait", "--team", "t", a, b)
        assert waited.returncode == 1
        assert task_record(cli, a)["result"]["code"] == 3
        assert task_record(cli, a)["status"] == "failed"
        assert task_record(cli, b)["status"] == "completed"
        terminated = [e["task_id"] for e in events(home) if e.get("subtype") == "task_terminated"]
        notified = [e["task_id"] for e in events(home) if e.get("subtype") == "task_notification"]
        for task_id in (a, b, done):
            assert terminated.count(task_id) == 1, task_id
            assert notified.count(task_id) == 1, task_id
    finally:
        cli("down", "--team", "t")
        second.stop()


def test_down_leaves_no_process_even_after_a_crash(cli: Cli, home: Path) -> None:
    leader = LeaderProc(home)
    ids = [sh(cli, "--", "sleep 300") for _ in range(3)]
    wait_until(lambda: all(task_record(cli, i)["status"] == "running" for i in ids))
    pids = [task_record(cli, i)["pid"] for i in ids]
    leader.kill9()
    out = cli("down", "--team", "t", "--json")
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(out.stdout)["killed_orphans"]) == sorted(ids)
    for pid in pids:
        wait_until(functools.partial(pid_gone, pid))
    assert all(task_record(cli, i)["status"] == "killed" for i in ids)
    # And a clean down of a live leader stops it with its tasks.
    again = LeaderProc(home)
    task_id = sh(cli, "--", "sleep 300")
    wait_until(lambda: task_record(cli, task_id)["status"] == "running")
    pid = task_record(cli, task_id)["pid"]
    assert cli("down", "--team", "t").returncode == 0
    assert again.proc.wait(20) == 0
    assert not is_alive(pid, None)
    assert leader_alive(Layout(home), "t") is None


def test_corrupt_state_is_reported_and_set_aside(cli: Cli, home: Path) -> None:
    first = LeaderProc(home)
    first.kill9()
    session = current_session(Layout(home), "t")
    assert session is not None
    session.state_file.write_text("{ this is not state")
    second = LeaderProc(home)
    try:
        aside = list(session.dir.glob("state.json.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_text() == "{ this is not state"
        new_session = current_session(Layout(home), "t")
        assert new_session is not None and new_session.id != session.id
    finally:
        cli("down", "--team", "t")
        second.stop()
    assert second.proc.stderr is not None
    assert "invalid session state" in second.proc.stderr.read()
    # Detached, the note reaches the person who ran `up`, not only the leader's log.
    third = current_session(Layout(home), "t")
    assert third is not None
    third.state_file.write_text("[]")
    detached = cli("up", "--team", "t", "--detach")
    try:
        assert detached.returncode == 0, detached.stderr
        assert "note: " in detached.stderr and "invalid session state" in detached.stderr
    finally:
        cli("down", "--team", "t")


def test_second_leader_is_refused(cli: Cli, leader: LeaderProc) -> None:
    out = cli("up", "--team", "t")
    assert out.returncode == 1 and "already runs" in out.stderr


def test_detach(cli: Cli, home: Path) -> None:
    out = cli("up", "--team", "d", "--detach")
    assert out.returncode == 0, out.stderr
    assert leader_alive(Layout(home), "d") is not None
    assert cli("down", "--team", "d").returncode == 0
    assert leader_alive(Layout(home), "d") is None


def test_sh_batch_starts_one_task_per_line(cli: Cli, leader: LeaderProc, tmp_path: Path) -> None:
    batch = tmp_path / "cmds.txt"
    batch.write_text("# a comment\necho one\n\necho two; exit 2\n  echo three  \n")
    out = cli("sh", "--team", "t", "--batch", str(batch))
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert len(ids) == 3
    waited = cli("wait", "--team", "t", *ids)
    assert waited.returncode == 1  # one failed
    assert [task_record(cli, i)["status"] for i in ids] == ["completed", "failed", "completed"]
    assert cli("logs", "--team", "t", ids[2]).stdout == "three\n"
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    assert cli("sh", "--team", "t", "--batch", str(empty)).returncode == 2
    both = cli("sh", "--team", "t", "--batch", str(batch), "--", "echo", "x")
    assert both.returncode == 2
    from_stdin = cli("sh", "--team", "t", "--batch", "-", input="echo piped\n")
    assert from_stdin.returncode == 0 and len(from_stdin.stdout.split()) == 1


def test_a_batch_larger_than_one_message_is_sent_in_parts(
    cli: Cli, leader: LeaderProc, tmp_path: Path
) -> None:
    # 1,200 tasks' records do not fit one answer under the 1 MiB message cap.
    batch = tmp_path / "many.txt"
    batch.write_text("".join(f"true {i}\n" for i in range(1200)))
    out = cli("sh", "--team", "t", "--batch", str(batch), "--json")
    assert out.returncode == 0, out.stderr
    started = json.loads(out.stdout)
    assert [t["command"] for t in started] == [f"true {i}" for i in range(1200)]  # in order
    assert len({t["id"] for t in started}) == 1200
    assert cli("wait", "--team", "t").returncode == 0


def test_team_delete_and_lead_inbox_are_guarded_while_the_leader_runs(
    cli: Cli, leader: LeaderProc
) -> None:
    refused = cli("team", "delete", "t", "--force")
    assert refused.returncode == 1 and "shoal down" in refused.stderr
    taking = cli("inbox", "team-lead", "--team", "t")
    assert taking.returncode == 1 and "--peek" in taking.stderr
    assert cli("inbox", "team-lead", "--team", "t", "--peek").returncode == 0
    # The leader still answers (nothing of its control channel was taken).
    assert cli("sh", "--team", "t", "--", "true").returncode == 0
