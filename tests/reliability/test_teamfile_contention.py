"""The team file under 8 concurrent read-modify-write processes, some of them kill -9ed."""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from filelock import FileLock

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from tests.polling import wait_until
from tests.reliability.crashkit import Processes, read_lines

pytestmark = pytest.mark.reliability

WRITERS = 8
INCREMENTS = 300  # per writer process
KILLS = 5
RESTARTS = 3  # the first RESTARTS killed writers are started again with a fresh batch


def exited(proc: subprocess.Popen[bytes]) -> bool:
    """`proc` has ended."""
    return proc.poll() is not None


def test_concurrent_team_file_updates_lose_nothing(
    home: Path, procs: Processes, tmp_path: Path
) -> None:
    """8 processes each increment a counter kept in the team file (`description`) through
    `Teams.update`, 300 times; 5 of them are SIGKILLed at random moments (3 restarted).

    Each writer logs the value its update wrote once `update` returned. Asserted: no value
    was written twice (no lost update); the final counter equals the logged increments plus
    at most one per kill (a kill between the write and the log line); a reader process that
    reads the file in a loop throughout never fails to parse it nor sees it go backwards; at
    the end the lock is free and `team.json.lock` still exists.
    """
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"random seed {seed}")
    rng = random.Random(seed)
    layout = Layout(home)
    teams = Teams(layout)
    teams.create("t", description="0")
    team_file = layout.team_file("t")
    logs = tmp_path / "increments"
    logs.mkdir()

    stop, result = tmp_path / "stop-reader", tmp_path / "reader.json"
    reader = procs.start("reader", home, "t", stop, result)

    def start_writer() -> subprocess.Popen[bytes]:
        log = logs / f"{len(list(logs.iterdir()))}.log"
        log.touch()
        return procs.start("counter", home, "t", INCREMENTS, log)

    writers = [start_writer() for _ in range(WRITERS)]

    def logged() -> list[int]:
        return [int(v) for log in logs.iterdir() for v in read_lines(log)]

    def logged_at_least(count: int) -> bool:
        return len(logged()) >= count

    # Kill at evenly spread points of progress (no sleeps): whichever writer is picked dies
    # wherever it happens to be, holding the lock or not.
    expected_total = INCREMENTS * (WRITERS + RESTARTS)
    killed = []
    for k in range(KILLS):
        threshold = expected_total * (k + 1) // (KILLS + 3)
        wait_until(
            functools.partial(logged_at_least, threshold), 120, 0.02, what=f"{threshold} increments"
        )
        running = [w for w in writers if w.poll() is None and w not in killed]
        assert running, "every writer finished before the kills were done"
        victim = rng.choice(running)
        victim.kill()
        victim.wait()
        killed.append(victim)
        if k < RESTARTS:
            writers.append(start_writer())

    for writer in writers:
        wait_until(functools.partial(exited, writer), 120, 0.02, what="writers to finish")
    for writer in writers:
        if writer not in killed:
            assert writer.returncode == 0, procs.stderr_of(writer)

    stop.touch()
    wait_until(lambda: reader.poll() is not None, 30, 0.02, what="the reader to stop")
    assert reader.returncode == 0, procs.stderr_of(reader)
    seen = json.loads(result.read_text())
    assert seen["failures"] == [], f"the team file failed to parse: {seen['failures']}"
    assert seen["backwards"] == [], f"the counter went backwards: {seen['backwards']}"
    assert seen["reads"] > 100, "the reader hardly ran during the updates"

    final = int(teams.read("t").description)
    values = logged()
    assert len(values) == len(set(values)), "two updates wrote the same value: a lost update"
    assert all(1 <= v <= final for v in values)
    assert len(values) <= final <= len(values) + len(killed), (
        f"final counter {final}, {len(values)} logged increments, {len(killed)} kills"
    )
    finished = WRITERS + RESTARTS - len(killed)
    assert len(values) >= finished * INCREMENTS

    lock = Path(f"{team_file}.lock")
    assert lock.exists()
    with FileLock(str(lock), timeout=1):
        pass
    assert lock.exists(), "releasing the lock deleted the .lock file"
    leftovers = [p.name for p in team_file.parent.iterdir() if p.name.endswith(".tmp")]
    print(
        f"final {final}, {len(values)} logged, {len(killed)} kills, {seen['reads']} reads, "
        f"temp files left by killed writers: {leftovers}"
    )
