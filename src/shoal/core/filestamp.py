"""Telling whether a small, atomically replaced file changed since it was last read.

A file's mtime moves in the kernel's coarse clock ticks, so two writes in one tick can leave
the same (inode, size, mtime): a reader that skips on an equal stamp would miss the second
write for good. As git does with its "racy" index entries, a stamp is trusted only once the
file's mtime is older than SETTLE_NS when it was read; until then the file is read every time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

SETTLE_NS: Final = 50_000_000

Stamp = tuple[int, int, int]


def stamp_of(path: Path) -> Stamp | None:
    """(inode, size, mtime) of `path`, or None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def settled(stamp: Stamp) -> Stamp | None:
    """`stamp` if its mtime is old enough to be trusted next time, else None (read again)."""
    return stamp if time.time_ns() - stamp[2] > SETTLE_NS else None
