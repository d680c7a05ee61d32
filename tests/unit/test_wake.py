"""mailbox/wake.py: the wake sockets of polling readers (real abstract unix sockets)."""

from __future__ import annotations

import select
from pathlib import Path

import pytest

from shoal.mailbox.wake import Listener, address, notify


def test_one_address_per_directory_whatever_path_spells_it(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "link").symlink_to(inbox)
    other = tmp_path / "other"
    other.mkdir()
    assert address(inbox) == address(tmp_path / "link") == address(f"{inbox}/.")
    assert address(inbox) != address(other)
    assert address(tmp_path / "missing") is None


def test_a_notify_wakes_the_listener_and_nobody_else(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    la, lb = Listener(a), Listener(b)
    try:
        notify(a)
        notify(a)
        ready, _, _ = select.select([la, lb], [], [], 30)
        assert ready == [la]
        la.drain()
        assert select.select([la], [], [], 0)[0] == []  # (both pokes drained)
    finally:
        la.close()
        lb.close()


def test_nobody_listening_or_no_inbox_is_no_error(tmp_path: Path) -> None:
    notify(tmp_path)  # (nobody bound)
    notify(tmp_path / "missing")


def test_a_second_reader_of_one_inbox_cannot_bind(tmp_path: Path) -> None:
    first = Listener(tmp_path)
    try:
        with pytest.raises(OSError):
            Listener(tmp_path)
    finally:
        first.close()
    Listener(tmp_path).close()  # (free again once the first is closed)
    with pytest.raises(FileNotFoundError, match="missing"):
        Listener(tmp_path / "missing")
