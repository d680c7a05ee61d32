"""The team-file lock: a waiter gets it once it is free, and a timeout is one clear error."""

from __future__ import annotations

import os
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


def test_filelock_and_shoal_exclude_each_other(tmp_path: Path) -> None:
    """The lock is flock(2) on the same `.lock` file filelock uses: either holds it against
    the other (other tools, older shoal processes)."""
    from filelock import FileLock

    other = FileLock(str(tmp_path / "team.json.lock"))
    with other, pytest.raises(LockTimeoutError):
        lock_for(tmp_path / "team.json").acquire(blocking=False)
    with lock_for(tmp_path / "team.json"), pytest.raises(TimeoutError):  # (filelock's Timeout)
        FileLock(str(tmp_path / "team.json.lock")).acquire(timeout=0.1)
    with FileLock(str(tmp_path / "team.json.lock"), timeout=5):  # (free again)
        pass


def test_reentrant_in_a_thread_exclusive_across_threads(tmp_path: Path) -> None:
    lock = lock_for(tmp_path / "team.json")
    with lock, lock:
        assert lock.is_locked
        seen: list[bool] = []

        def other() -> None:
            try:
                lock.acquire(blocking=False)
            except LockTimeoutError:
                seen.append(False)
            else:
                seen.append(True)
                lock.release()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert seen == [False]  # (another thread of this process waits like anyone)
        assert lock.is_locked  # (still held: one release of two)
    assert not lock.is_locked
    lock.acquire(blocking=False)
    lock.release()


def test_a_waiter_that_timed_out_does_not_keep_the_lock(tmp_path: Path) -> None:
    """A timed-out waiter leaves its helper blocked in flock; when the holder lets go, the
    helper drops the lock at once, so it is free for the next comer."""
    holder = lock_for(tmp_path / "team.json")
    holder.acquire()
    with pytest.raises(LockTimeoutError):
        lock_for(tmp_path / "team.json").acquire(timeout=0.1)
    holder.release()
    later = lock_for(tmp_path / "team.json")
    later.acquire(timeout=10)  # (the abandoned helper got it and let go)
    later.release()


def test_a_forked_child_does_not_hold_its_parents_lock(tmp_path: Path) -> None:
    lock = lock_for(tmp_path / "team.json")
    with lock:
        pid = os.fork()
        if pid == 0:  # (the child: it does not hold it, so it cannot take it either)
            code = 0 if not lock.is_locked else 3
            try:
                lock.acquire(blocking=False)
                code = 4
            except LockTimeoutError:
                pass
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lock.is_locked
