"""The output cap of shell tasks holds: a fast writer is stopped within OUTPUT_CAP_SLACK of the
cap, not a second of writing later (flat-out writers on a loaded machine: test_output_cap_hard)."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.workers.shell import output_cap as shell
from tests.conftest import Cli
from tests.integration.test_leader import LeaderProc, sh, task_record
from tests.polling import wait_until

CAP = 4 << 20
# A fast writer at a bounded pace (at most 50 MiB/s: 256 KiB every 5 ms), so the bound holds
# with over a second of scheduling delay of the leader on a loaded machine; flat-out `yes` can
# write a gigabyte a second, and a test sharing two cores with others cannot bound that.
PACED_WRITER = (
    'python3 -c "import os, time; '
    "[(os.write(1, b'y' * 262144), time.sleep(0.005)) for _ in iter(int, 1)]\""
)


def test_a_fast_writer_is_killed_within_the_slack_of_a_small_cap(cli: Cli, home: Path) -> None:
    # The loop's normal interval (1 s): a check once a tick let a fast writer run a second.
    leader = LeaderProc(home, env={"SHOAL_OUTPUT_CAP": str(CAP), "SHOAL_POLL_INTERVAL": "1"})
    try:
        task_id = sh(cli, "--", PACED_WRITER)
        wait_until(lambda: task_record(cli, task_id)["status"] == "killed", timeout=30)
        rec = task_record(cli, task_id)
        assert "over the cap of" in rec["kill_reason"], rec
        size = os.path.getsize(rec["output_file"])
        print(f"fast writer, {CAP} byte cap: {size} bytes ({size / CAP:.1f}x the cap)")
        assert CAP < size <= CAP + shell.OUTPUT_CAP_SLACK, size
    finally:
        cli("down", "--team", "t")
        leader.stop()


def test_the_next_look_follows_the_growth_rate() -> None:
    interval = 1.0
    assert shell.next_cap_check(CAP, 0.0, interval) is None  # quiet: the full tick will do
    assert shell.next_cap_check(CAP, 1 << 20, interval) is None  # 1 MiB/s: 32 s from the slack
    slack = shell.cap_slack(CAP)
    due = shell.next_cap_check(CAP, 2 * slack, interval)
    assert due is not None and abs(due - 0.25) < 1e-9
    assert shell.next_cap_check(CAP, 1e15, interval) == shell.CAP_CHECK_FLOOR_S
    big = 5 << 30
    assert shell.cap_slack(big) == big // 10
