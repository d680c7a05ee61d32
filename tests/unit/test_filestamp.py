"""A status file's stamp is trusted only once its mtime has settled (coarse timestamps)."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.core.filestamp import SETTLE_NS, settled, stamp_of


def test_a_fresh_stamp_is_not_trusted_so_a_second_write_in_the_same_tick_is_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "status.json"
    path.write_text('{"waiting": null}')
    first = stamp_of(path)
    assert first is not None and settled(first) is None
    # A second write of the same size in the same timestamp tick: the stamp cannot tell.
    ino = os.stat(path).st_ino
    path.write_text('{"waiting": "Wr"}')
    os.utime(path, ns=(first[2], first[2]))
    assert stamp_of(path) == (ino, first[1], first[2])


def test_a_settled_stamp_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text("{}")
    old = os.stat(path).st_mtime_ns - 10 * SETTLE_NS
    os.utime(path, ns=(old, old))
    stamp = stamp_of(path)
    assert stamp is not None and settled(stamp) == stamp


def test_a_missing_file_has_no_stamp(tmp_path: Path) -> None:
    assert stamp_of(tmp_path / "gone.json") is None
