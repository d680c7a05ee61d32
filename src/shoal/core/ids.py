"""Task ids as users type them: any unique prefix of an id works, as with git's hashes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable

from shoal.core.errors import UnknownTaskError, UsageError


def resolve_task_id(
    known: Iterable[str], given: str, *, what: str = "task", team: str | None = None
) -> str:
    """The one id in `known` that is `given` or starts with it; UnknownTaskError when none
    is (naming `team` when given), UsageError when several are (naming them)."""
    if not given:
        raise UsageError(f"an empty {what} id")
    matches = sorted({i for i in known if i.startswith(given)})
    if given in matches:
        return given
    if not matches:
        raise UnknownTaskError(given, team, what=what)
    if len(matches) > 1:
        shown = " ".join(matches[:5]) + (" ..." if len(matches) > 5 else "")
        raise UsageError(f"{what} id {given!r} is ambiguous: it starts {shown}")
    return matches[0]


# ULIDs made here rather than by python-ulid's generator, whose import alone is 50 ms (most of
# it importlib.metadata: paid by every CLI request) and whose ids cost a message more than its
# validation does: 48 bits of milliseconds and 80 random bits, the random part counting up
# within a millisecond (monotonic, as python-ulid's default generator makes them), written in
# Crockford base32 two digits (10 bits) at a time.
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_TIME_SHIFTS = (40, 30, 20, 10, 0)  # the first 10 digits: 48 bits of milliseconds
_RANDOM_SHIFTS = (70, 60, 50, 40, 30, 20, 10, 0)  # the last 16: the 80 random bits
_RANDOM_MAX = (1 << 80) - 1
_id_lock = threading.Lock()
# The last id's milliseconds, random part and the milliseconds' 10 digits.
_last_id: tuple[int, int, str] = (0, 0, "")


def new_ulid() -> str:
    """A new ULID string, as python-ulid's `str(ULID())` spells it (time-ordered, unique)."""
    global _last_id
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    with _id_lock:
        last_ms, last_rand, head = _last_id
        if ms <= last_ms:  # (same millisecond, or the clock stepped back)
            ms, rand = last_ms, last_rand + 1
            if rand > _RANDOM_MAX:
                ms, rand = last_ms + 1, rand & _RANDOM_MAX
        if ms != last_ms:
            head = "".join([_PAIRS[(ms >> shift) & 1023] for shift in _TIME_SHIFTS])
        _last_id = (ms, rand, head)
    return head + "".join([_PAIRS[(rand >> shift) & 1023] for shift in _RANDOM_SHIFTS])


def ulid_from_bytes(raw: bytes) -> str:
    """The ULID string of 16 bytes, as python-ulid's `str(ULID.from_bytes(raw))` spells it
    (a message id derived from something stable, such as a task's id)."""
    if len(raw) != 16:
        raise ValueError(f"a ULID is 16 bytes, not {len(raw)}")
    n = int.from_bytes(raw, "big")  # 128 bits: 26 digits, the first of only 3 bits
    middle = "".join([_PAIRS[(n >> shift) & 1023] for shift in range(115, 4, -10)])
    return _CROCKFORD[n >> 125] + middle + _CROCKFORD[n & 31]


def _forget_last_id() -> None:
    # A forked child counting on from its parent's last id would make the parent's next id.
    global _last_id
    _last_id = (0, 0, "")


os.register_at_fork(after_in_child=_forget_last_id)
