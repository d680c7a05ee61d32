"""A resumed run says apart what an earlier leader left running (stopped) and what it had
queued but never started (dropped), and never calls the latter "stopped on request"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from shoal.core.paths import Layout
from shoal.core.tasks import STOPPED_ON_REQUEST
from shoal.orchestrator.batch.driver import NEVER_STARTED
from shoal.teams.session import Session
from tests.conftest import Cli
from tests.polling import wait_until

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}


def test_never_started_leftovers_are_counted_apart(cli: Cli, home: Path, tmp_path: Path) -> None:
    gate, marker = tmp_path / "gate", tmp_path / "started"
    later = "\n".join(f'[[task]]\nid = "later{i}"\nrun = "true"\n' for i in range(3))
    spec = tmp_path / "notes.toml"
    spec.write_text(
        "[run]\njobs = 1\n\n"
        f'[[task]]\nid = "first"\nrun = "[ -f {marker} ] && exit 0; touch {marker}; '
        f'while [ ! -f {gate} ]; do sleep 0.02; done"\n\n{later}'
    )
    env = {**os.environ, "SHOAL_HOME": str(home), **FAST}
    run = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        # The three later tasks are in the leader's queue (handed out ahead of a free slot).
        wait_until(lambda: marker.exists(), timeout=30, what="the first task")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(10)

    # The first run of "first" is still waiting on the gate: the resumed leader must stop it.
    # Its re-run finds the marker and ends at once. The gate opens afterwards in any case, so
    # a failure leaves nothing looping.
    try:
        again = cli("run", str(spec), "--resume", "--output-format", "stream-json", env=FAST)
    finally:
        gate.touch()
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr
    events = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    notes = [e["text"] for e in events if (e["type"], e.get("subtype")) == ("run", "note")]
    (stopped,) = [n for n in notes if n.startswith("stopped ")]
    (dropped,) = [n for n in notes if "never started" in n]
    assert stopped.startswith("stopped 1 task(s) left running by an earlier leader"), notes
    assert dropped.startswith(
        "3 task(s) queued by an earlier leader of team run-notes never started"
    )
    session = Session(Layout(home), events[-1]["session_id"])
    ids = dropped.rsplit(": ", 1)[1].split()
    records = {**session.history(), **session.read_tasks_raw()}
    reasons = {records[i]["kill_reason"] for i in ids}
    assert reasons == {NEVER_STARTED} and STOPPED_ON_REQUEST not in reasons
    assert all(records[i]["pid"] is None for i in ids), {i: records[i]["pid"] for i in ids}
