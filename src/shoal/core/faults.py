"""Named points where a process can be made to stop itself, for crash tests.

A test that must kill the leader at one exact moment (its lease taken, its start written
ahead, its runner spawned) sets SHOAL_PAUSE_AT to the point's name (`NAME`, or `NAME#N` for
its N-th pass) and SHOAL_PAUSE_FILE to a path: there the process writes its pid to the file
and stops (SIGSTOP), so the test kills it there, not somewhere near it. Unset (always,
outside tests), a point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
from typing import Final

PAUSE_AT_VAR: Final = "SHOAL_PAUSE_AT"
PAUSE_FILE_VAR: Final = "SHOAL_PAUSE_FILE"
_passes: dict[str, int] = {}


def pause_point(name: str) -> None:
    """Stop this process here if SHOAL_PAUSE_AT names `name` (see the module docstring)."""
    wanted = os.environ.get(PAUSE_AT_VAR)
    if wanted is None or not wanted.startswith(name):
        return
    point, _, nth = wanted.partition("#")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if nth and str(_passes[name]) != nth:
        return
    path = os.environ.get(PAUSE_FILE_VAR)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(tmp, path)
    os.kill(os.getpid(), signal.SIGSTOP)
