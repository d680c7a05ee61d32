"""The team-file lock: a waiter gets it once it is free, and a timeout is one clear error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shoal.core.errors import ShoalError
from shoal.core.jsonio import LockTimeoutError, lock_for


def test_a_held_lock_times_out_with_an_error_naming_it(tmp_path: Path) -> None:
    holder = lock_for(tmp_path / "team.json")
    holder.acquire()
    try:
        with pytest.raises(LockTimeoutError) as err:
            lock_for(tmp_path / "team.json").acquire(timeout=0.2)
        assert isinstance(err.value, ShoalError)  # one `shoal: error:` line, exit 1
        assert str(tmp_path / "team.json.lock") in str(err.value)
        assert "stayed locked for 0.2s" in str(err.value)
    finally:
        holder.release()


def test_a_waiter_gets_the_lock_soon_after_a_long_hold(tmp_path: Path) -> None:
    taken = threading.Event()

    def hold() -> None:  # (a lock belongs to the thread that took it)
        with lock_for(tmp_path / "team.json"):
            taken.set()
            time.sleep(0.3)  # long enough for the waiter to back off

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(5)
    t0 = time.monotonic()
    with lock_for(tmp_path / "team.json"):
        waited = time.monotonic() - t0
    holder.join()
    assert 0.2 <= waited < 5  # it waited for the holder, and got the lock once it was free
    after = lock_for(tmp_path / "team.json")
    after.acquire(blocking=False)  # free again (raises if not)
    after.release()
