"""A runner a leader spawned is found by its argument whatever the boot time's fraction."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

from shoal.core.procs import find_by_argument


def test_a_process_started_after_since_is_found_though_btime_is_whole_seconds() -> None:
    # /proc's start times are ticks since boot plus a boot time in whole seconds, so they lag
    # the wall clock by up to a second: a process started after `since` must still count.
    marker = f"shoal-find-{uuid.uuid4().hex}"
    since = time.time()
    code = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE)
    try:
        # (a gate: until the child has exec'd, /proc shows the parent's command line)
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        found = find_by_argument(marker, since=since)
        assert found is not None and found[0] == child.pid
        assert find_by_argument(marker, since=since + 60) is None  # (started long before)
    finally:
        child.kill()
        child.wait()
