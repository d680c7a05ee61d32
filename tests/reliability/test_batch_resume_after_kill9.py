"""`shoal run --resume` after the run's leader was killed with kill -9 never runs again a task
that had succeeded: neither one the run record had as succeeded, nor one that ended (exit 0)
after its last save or after the kill, while no leader watched it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.conftest import Cli
from tests.polling import wait_until

N = 200
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}


def runs_of(done: Path) -> dict[str, int]:
    """Task name -> how many times it reached its end (one line per finished run)."""
    return {p.name: len(p.read_text().splitlines()) for p in done.iterdir()}


def tasks_alive(marker: str) -> bool:
    """Whether a process of the spec's tasks (their command lines name `marker`) still runs."""
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and proc.info["status"] != "zombie":
                return True
        except psutil.Error:
            continue
    return False


def test_resume_after_kill9_runs_no_success_twice(cli: Cli, home: Path, tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    # Each task takes a moment and leaves its side effect at its very end.
    tasks = "\n".join(
        f'[[task]]\nid = "t{i:03d}"\nrun = "sleep 0.05; echo ran >> {done}/t{i:03d}"\n'
        for i in range(N)
    )
    spec = tmp_path / "many.toml"
    spec.write_text(f"[run]\njobs = 4\n\n{tasks}")
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST}
    run = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until(lambda: len(list(done.iterdir())) >= N // 4, timeout=60, what="a quarter done")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(10)
    at_kill = runs_of(done)
    assert 0 < len(at_kill) < N, "the kill came too late to test anything"
    # What was running at the kill ends on its own, with no leader to see it.
    wait_until(lambda: not tasks_alive(str(done)), timeout=30, what="the orphaned tasks to end")
    before_resume = runs_of(done)

    again = cli("run", str(spec), "--resume", "--output-format", "stream-json", env=FAST)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr
    final = runs_of(done)
    assert sorted(final) == [f"t{i:03d}" for i in range(N)]
    twice = {name: n for name, n in final.items() if n != 1}
    assert twice == {}, f"ran more than once: {twice}"
    # Every task that had finished before the resume was carried over, not run again.
    events = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    started = {e["id"] for e in events if (e["type"], e.get("subtype")) == ("run", "task_started")}
    assert started.isdisjoint(before_resume), sorted(started & set(before_resume))
    result = events[-1]
    assert result["type"] == "result" and result["exit_code"] == 0, result
    assert result["counts"]["succeeded"] == N
    assert result["counts"]["resumed"] == len(before_resume)
    print(
        f"{len(at_kill)} done at the kill, {len(before_resume) - len(at_kill)} more after it; "
        f"{len(started)} run by the resume"
    )
