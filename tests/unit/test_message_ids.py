"""Message ids: valid ULIDs, increasing within a process, not repeated by a forked child."""

from __future__ import annotations

import os
import time

import pytest
from ulid import ULID

from shoal.core import ids
from shoal.mailbox.router import new_message_id


def test_ids_are_ulids_of_now_and_increase() -> None:
    ids = [new_message_id() for _ in range(20_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for i in (ids[0], ids[-1]):
        assert str(ULID.from_str(i)) == i
        assert abs(ULID.from_str(i).timestamp - time.time()) < 60


def test_the_random_part_running_over_moves_to_the_next_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ms = time.time_ns() // 1_000_000 + 10_000
    monkeypatch.setattr(ids, "_last_id", (ms, ids._RANDOM_MAX, ""))
    nxt = ULID.from_str(new_message_id())
    assert int(nxt.timestamp * 1000) == ms + 1
    assert nxt.bytes[6:] == bytes(10)


def test_a_forked_child_does_not_repeat_its_parents_next_id() -> None:
    new_message_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, new_message_id().encode())
        os._exit(0)
    os.close(write)
    mine = new_message_id()
    os.waitpid(pid, 0)
    theirs = os.read(read, 64).decode()
    os.close(read)
    assert len(theirs) == 26 and theirs != mine


def test_ids_from_bytes_are_spelled_as_python_ulid_spells_them() -> None:
    # (a task's notification id is derived from its id: it must not change with the maker)
    samples = [bytes(16), b"\xff" * 16, *(os.urandom(16) for _ in range(2_000))]
    for raw in samples:
        assert ids.ulid_from_bytes(raw) == str(ULID.from_bytes(raw))
    with pytest.raises(ValueError, match="16 bytes"):
        ids.ulid_from_bytes(b"short")
