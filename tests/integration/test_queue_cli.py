"""The queue verbs through the real CLI and a real leader: `sh --after/--after-any/--group/
--priority/--timeout/--retries/--delay/--label/--stdin`, `group`, `parallel`, `pause`,
`resume`, `restart`, `clean` and `send-input`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.errors import EXIT_FAILED, EXIT_USAGE
from shoal.core.paths import Layout
from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "q"


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Layout]:
    """Team `q`'s leader, running in the background."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    try:
        yield Layout(home)
    finally:
        cli("down", "--team", TEAM)


def run(cli: Cli, *args: str, code: int = 0) -> str:
    """Run `shoal --team q ARGS`; check its exit code; its stdout (or stderr when it failed)."""
    out = cli("--team", TEAM, *args)
    assert out.returncode == code, (args, out.returncode, out.stdout, out.stderr)
    return out.stdout if code == 0 else out.stderr


def sh(cli: Cli, *args: str) -> str:
    return run(cli, "sh", *args).strip()


def tasks(cli: Cli) -> dict[str, dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(run(cli, "ps", "--all", "--json"))
    return {t["id"]: t for t in rows}


def task(cli: Cli, task_id: str) -> dict[str, Any]:
    return tasks(cli)[task_id]


def ended(cli: Cli, task_id: str) -> dict[str, Any] | None:
    t = tasks(cli).get(task_id)
    return t if t is not None and t["status"] in ("completed", "failed", "killed") else None


def process_state(pid: int) -> str:
    """The state letter of process `pid` (T: stopped)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_after_waits_for_success_and_fails_unstarted_when_a_dependency_fails(
    cli: Cli, leader: Layout
) -> None:
    gate = sh(cli, "--stdin", "--", "read line; exit 3")  # ends when told to
    after = sh(cli, "--after", gate[:5], "--label", "needs-gate", "--", "echo after")
    after_any = sh(cli, "--after-any", gate, "--", "echo any")
    listing = run(cli, "ps")
    assert "needs-gate" in listing and f"waiting for {gate} to complete" in listing
    assert task(cli, after)["status"] == "pending"
    run(cli, "send-input", gate, "go")
    wait_until(lambda: ended(cli, gate), what="the gate task to fail")
    done = wait_until(lambda: ended(cli, after))
    assert done["status"] == "failed"
    assert done["pid"] is None  # never started
    assert gate in done["error"] and "failed" in done["error"]
    assert tuple(done["after"]) == (gate,)
    assert wait_until(lambda: ended(cli, after_any))["status"] == "completed"
    # An unknown id is a usage error naming it; nothing starts.
    assert "nope123" in run(cli, "sh", "--after", "nope123", "--", "true", code=EXIT_USAGE)


def test_groups_limit_parallelism_start_by_priority_and_refuse_removal_while_busy(
    cli: Cli, leader: Layout
) -> None:
    assert "parallel 1" in run(cli, "group", "add", "gpu", "--parallel", "1")
    assert "exists" in run(cli, "group", "add", "gpu", code=EXIT_FAILED)
    assert "invalid group name" in run(cli, "group", "add", "Bad Name", code=EXIT_USAGE)
    assert "nogroup" in run(cli, "sh", "--group", "nogroup", "--", "true", code=EXIT_USAGE)
    busy = sh(cli, "--group", "gpu", "--", "sleep 600")
    low = sh(cli, "--group", "gpu", "--", "echo low")
    high = sh(cli, "--group", "gpu", "--priority", "5", "--", "echo high")
    wait_until(lambda: task(cli, busy)["status"] == "running")
    for queued in (low, high):
        record = task(cli, queued)
        assert record["status"] == "pending"
        assert "group gpu runs 1 at a time" in record["pending_reason"]
    groups = {g["name"]: g for g in json.loads(run(cli, "group", "list", "--json"))}
    assert groups["gpu"]["parallel"] == 1 and groups["gpu"]["running"] == [busy]
    assert sorted(groups["gpu"]["pending"]) == sorted([low, high])
    refused = run(cli, "group", "rm", "gpu", code=EXIT_FAILED)
    assert busy in refused and "running" in refused
    assert "default" in run(cli, "group", "rm", "default", code=EXIT_FAILED)
    run(cli, "stop", busy)
    first = wait_until(lambda: ended(cli, high))
    second = wait_until(lambda: ended(cli, low))
    assert first["start_time"] <= second["start_time"]  # the higher priority went first
    run(cli, "parallel", "0", "--group", "gpu")
    assert "no group" in run(cli, "parallel", "2", "--group", "nope", code=EXIT_FAILED)
    assert "removed group gpu" in run(cli, "group", "rm", "gpu")


def test_parallel_of_the_default_group_takes_effect_at_once(cli: Cli, leader: Layout) -> None:
    run(cli, "parallel", "1")
    busy = sh(cli, "--", "sleep 600")
    waiting = sh(cli, "--", "echo next")
    wait_until(lambda: task(cli, busy)["status"] == "running")
    assert "runs 1 at a time" in task(cli, waiting)["pending_reason"]
    run(cli, "parallel", "2")
    assert wait_until(lambda: ended(cli, waiting))["status"] == "completed"
    run(cli, "stop", busy)


def test_pause_stops_the_process_group_and_paused_time_does_not_count_to_the_timeout(
    cli: Cli, leader: Layout
) -> None:
    # (6 s: time enough to pause it before it times out, however loaded the machine)
    timed = sh(cli, "--timeout", "6", "--", "sleep 600")
    pid = wait_until(lambda: task(cli, timed)["pid"])
    assert f"paused {timed}" in run(cli, "pause", timed[:6])
    assert "paused already" in run(cli, "pause", timed, code=EXIT_FAILED)
    assert process_state(pid) == "T"
    assert task(cli, timed)["paused_at"] is not None
    assert f"{timed}  shell      paused" in run(cli, "ps")
    paused_at = task(cli, timed)["paused_at"]
    wait_until(
        lambda: time.time() > paused_at + 7, timeout=30, what="7 s of pause (over the timeout)"
    )
    assert task(cli, timed)["status"] == "running"  # paused past its timeout: not killed
    assert f"resumed {timed}" in run(cli, "resume", timed)
    assert "not paused" in run(cli, "resume", timed, code=EXIT_FAILED)
    assert process_state(pid) in "RS"
    final = wait_until(lambda: ended(cli, timed), what="the timeout to kill it")
    assert final["status"] == "killed" and final["kill_reason"] == "timed out after 6s"
    assert final["total_paused_ms"] >= 7000
    ran = final["end_time"] - final["start_time"] - final["total_paused_ms"] / 1000
    assert ran >= 6
    assert "no task" in run(cli, "pause", "bzzzzzzzz", code=EXIT_USAGE)  # (an unknown id)
    assert "task ids or --group" in run(cli, "pause", code=EXIT_USAGE)


def test_pausing_a_group_holds_its_queue_and_pauses_what_runs(cli: Cli, leader: Layout) -> None:
    run(cli, "group", "add", "io", "--parallel", "0")
    running = sh(cli, "--group", "io", "--", "sleep 600")
    pid = wait_until(lambda: task(cli, running)["pid"])
    assert running in run(cli, "pause", "--group", "io")
    assert process_state(pid) == "T"
    held = sh(cli, "--group", "io", "--", "echo held")
    assert task(cli, held)["pending_reason"] == "group io is paused"
    run(cli, "resume", "--group", "io")
    assert wait_until(lambda: ended(cli, held))["status"] == "completed"
    assert process_state(pid) in "RS"
    run(cli, "stop", running)


def test_retries_follow_a_failure_and_after_waits_for_the_last_attempt(
    cli: Cli, leader: Layout, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    flaky = sh(
        cli,
        "--retries",
        "2",
        "--retry-delay",
        "0.2",
        "--",
        f"test -e {marker} || {{ touch {marker}; exit 4; }}",
    )
    # `wait` follows the retries: the first attempt's failure is not the task's.
    waited = cli("--team", TEAM, "wait", flaky, "--timeout", "30")
    assert waited.returncode == 0 and f"{flaky} completed (attempt 2: " in waited.stdout, waited
    after = sh(cli, "--after", flaky, "--", "echo after")
    assert wait_until(lambda: ended(cli, after))["status"] == "completed"
    everything = cli("--team", TEAM, "wait")
    assert everything.returncode == 0, everything.stdout + everything.stderr
    first = task(cli, flaky)
    assert first["status"] == "failed" and first["result"]["code"] == 4
    second = task(cli, first["retried_as"])
    assert second["status"] == "completed"
    assert (second["attempt"], second["retry_of"], second["retries"]) == (2, flaky, 1)
    assert second["retry_delay"] == 0.4  # doubled for the next attempt
    events = [json.loads(line) for line in run(cli, "events", "--json").splitlines()]
    notified = {e.get("task_id") for e in events if e.get("subtype") == "task_notification"}
    assert second["id"] in notified and flaky not in notified  # the last attempt's end only


def test_delay_holds_a_task_until_its_time(cli: Cli, leader: Layout) -> None:
    before = time.time()
    delayed = sh(cli, "--delay", "2", "--", "echo late")
    assert task(cli, delayed)["pending_reason"].startswith("start at ")
    done = wait_until(lambda: ended(cli, delayed))
    assert done["status"] == "completed" and done["start_time"] >= before + 2
    assert "bad duration" in run(cli, "sh", "--delay", "soon", "--", "true", code=EXIT_USAGE)
    assert "--retries" in run(cli, "sh", "--retry-delay", "1", "--", "true", code=EXIT_USAGE)


def test_restart_runs_a_finished_task_again(cli: Cli, leader: Layout) -> None:
    done = sh(cli, "--label", "again", "--", "echo run")
    wait_until(lambda: ended(cli, done))
    again = run(cli, "restart", done).strip()
    assert again != done
    record = wait_until(lambda: ended(cli, again))
    assert record["restarted_from"] == done and record["label"] == "again"
    assert run(cli, "logs", again) == "run\n"
    assert run(cli, "restart", done, "--in-place").strip() == done
    in_place = wait_until(lambda: (t := ended(cli, done)) and t["restarts"] == 1 and t)
    assert in_place["status"] == "completed" and run(cli, "logs", done) == "run\n"
    busy = sh(cli, "--", "sleep 600")
    refused = run(cli, "restart", busy, code=EXIT_FAILED)
    assert busy in refused and "only a finished task restarts" in refused
    run(cli, "stop", busy)


def test_send_input_writes_to_a_stdin_task_and_others_keep_eof(cli: Cli, leader: Layout) -> None:
    reader = sh(cli, "--stdin", "--", "read a; echo got $a; cat; echo done")
    wait_until(lambda: task(cli, reader)["status"] == "running")
    assert "wrote 6 bytes" in run(cli, "send-input", reader[:4], "hello")
    run(cli, "send-input", reader, "--no-newline", "tail")
    assert "closed" in run(cli, "send-input", reader, "--eof")
    assert wait_until(lambda: ended(cli, reader))["status"] == "completed"
    assert run(cli, "logs", reader) == "got hello\ntaildone\n"
    plain = sh(cli, "--", "cat; echo eof")  # no --stdin: stdin is /dev/null, EOF at once
    assert wait_until(lambda: ended(cli, plain))["status"] == "completed"
    sleeper = sh(cli, "--", "sleep 600")
    wait_until(lambda: task(cli, sleeper)["status"] == "running")
    refused = run(cli, "send-input", sleeper, "x", code=EXIT_FAILED)
    assert sleeper in refused and "--stdin" in refused
    assert "only a running task" in run(cli, "send-input", reader, "x", code=EXIT_FAILED)
    assert "TEXT" in run(cli, "send-input", reader, code=EXIT_USAGE)
    run(cli, "stop", sleeper)


def test_clean_keeps_an_agent_in_its_panel_grace_unless_forced(cli: Cli, leader: Layout) -> None:
    agent = run(
        cli, "agent", "--backend", "in-process", "--model", "scripted:",
        "--permission-mode", "bypassPermissions", "hello",
    ).strip()  # fmt: skip
    wait_until(lambda: ended(cli, agent), timeout=60, what="the agent to end")
    kept = run(cli, "clean")
    assert "removed 0 finished tasks" in kept and "kept 1 in their grace" in kept, kept
    assert agent in kept and "--force" in kept
    assert agent in tasks(cli)
    assert json.loads(run(cli, "clean", "--force", "--json"))["removed"] == [agent]
    assert agent not in tasks(cli)


def test_clean_drops_finished_tasks_and_old_sessions_but_never_the_live_one(
    cli: Cli, leader: Layout
) -> None:
    done = sh(cli, "--", "echo x")
    wait_until(lambda: ended(cli, done))
    live = sh(cli, "--", "sleep 600")
    output = Path(task(cli, done)["output_file"])
    assert "removed 1 finished task" in run(cli, "clean")
    assert set(tasks(cli)) == {live} and not output.exists()
    old = leader.home / "sessions" / "01oldsession"
    (old / "tasks").mkdir(parents=True)
    stamp = time.time() - 3 * 86400
    for path in (old / "tasks", old):
        os.utime(path, (stamp, stamp))
    removed = json.loads(run(cli, "clean", "--sessions", "1", "--json"))["removed_sessions"]
    assert removed == ["01oldsession"] and not old.exists()
    run(cli, "clean", "--sessions", "0")  # the live session is never removed, however new
    assert task(cli, live)["status"] == "running"
    run(cli, "stop", live)


@pytest.mark.parametrize(
    "verb",
    [
        ("group",),
        ("group", "add"),
        ("group", "list"),
        ("group", "rm"),
        ("parallel",),
        ("pause",),
        ("resume",),
        ("restart",),
        ("clean",),
        ("send-input",),
    ],
)
def test_every_verb_has_help(cli: Cli, verb: tuple[str, ...]) -> None:
    out = cli(*verb, "--help")
    assert out.returncode == 0 and "--team" in out.stdout and "Usage" in out.stdout
