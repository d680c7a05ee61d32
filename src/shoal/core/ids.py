"""Task ids as users type them: any unique prefix of an id works, as with git's hashes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from shoal.core.errors import NotFoundError, UsageError


def resolve_task_id(known: Iterable[str], given: str, *, what: str = "task") -> str:
    """The one id in `known` that is `given` or starts with it; NotFoundError when none
    is, UsageError when several are (naming them)."""
    if not given:
        raise UsageError(f"an empty {what} id")
    matches = sorted({i for i in known if i.startswith(given)})
    if given in matches:
        return given
    if not matches:
        raise NotFoundError(f"no {what} {given!r} in this session (see `shoal ps --all`)")
    if len(matches) > 1:
        shown = " ".join(matches[:5]) + (" ..." if len(matches) > 5 else "")
        raise UsageError(f"{what} id {given!r} is ambiguous: it starts {shown}")
    return matches[0]


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_ulid() -> str:
    """A new ULID as python-ulid's `str(ULID())` spells it (48 bits of milliseconds, 80 random
    bits, Crockford base32), for paths that must not pay that library's import (50 ms, most of
    it importlib.metadata): the CLI's requests to a leader."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))
