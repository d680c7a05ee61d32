"""The output cap of a shell task: the file size limit that makes it hard, and the leader's
look at how fast a task's output grows.

The output cap is hard: a task runs under a file size limit (RLIMIT_FSIZE) of its cap plus
OUTPUT_CAP_SLACK, set by its wrapper before the command runs, so the kernel refuses every byte
past that (EFBIG, and SIGXFSZ to the writer) however loaded the machine is. The limit holds
for every file the task's processes write, not only its output. The leader still looks at
the size and kills a task at the cap (with the reason), the slack being the room for that
look; a task the limit stopped first is given the same reason (`cap_reached`).
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Final

from shoal.core.output import output_size

OUTPUT_CAP_SLACK: Final = 64 << 10
_FSIZE_BLOCK = 512  # (`ulimit -f` counts 512-byte blocks)

# The leader's look: a task whose file grows fast is looked at again before it could write
# half of max(CAP_SLACK_SHARE of the cap, CAP_SLACK_MIN) bytes, at most every
# CAP_CHECK_FLOOR_S; a quiet one only at the loop's full ticks. A new task is looked at once
# right after it starts.
CAP_SLACK_SHARE = 0.1
CAP_SLACK_MIN = 64 << 20
CAP_CHECK_FLOOR_S = 0.01


def output_limit(cap: int) -> int:
    """The file size limit (bytes) of a task whose output cap is `cap`: cap + OUTPUT_CAP_SLACK,
    in whole 512-byte blocks, never above this process's hard RLIMIT_FSIZE (a child cannot be
    given more; RLIM_INFINITY bounds nothing)."""
    limit = max(cap, 0) + OUTPUT_CAP_SLACK
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    return limit - limit % _FSIZE_BLOCK


def limit_blocks(limit: int | None) -> str:
    """The wrapper's `ulimit -f` argument for `limit` bytes ("" for no limit)."""
    return "" if limit is None else str(limit // _FSIZE_BLOCK)


def cap_reason(size: int, cap: int) -> str:
    """Why a task whose output reached `size` bytes was ended by the cap."""
    if size > cap:
        return f"output reached {size} bytes, over the cap of {cap} bytes"
    return (
        f"output reached {size} bytes, the file size limit (RLIMIT_FSIZE) of the leader, "
        f"below the cap of {cap} bytes"
    )


def cap_reached(output_file: str | Path, cap: int) -> str | None:
    """The cap's reason for a task that ended with its output at the file size limit (its
    writes were refused: by SIGXFSZ, or a writer that ignores it and failed on EFBIG), else
    None."""
    size = output_size(output_file)
    return cap_reason(size, cap) if size >= output_limit(cap) else None


def cap_slack(cap: int) -> int:
    """How far past `cap` the leader's look aims to catch a fast writer (the file size limit
    stops it at OUTPUT_CAP_SLACK past the cap before that)."""
    return max(int(cap * CAP_SLACK_SHARE), CAP_SLACK_MIN)


def next_cap_check(cap: int, rate: float, interval: float) -> float | None:
    """Seconds until a file growing at `rate` bytes/s must be looked at again (half the time
    it needs to write the slack, at least CAP_CHECK_FLOOR_S), or None when the loop's full
    tick every `interval` s comes soon enough."""
    if rate <= 0:
        return None
    due = cap_slack(cap) / (2 * rate)
    return None if due >= interval else max(CAP_CHECK_FLOOR_S, due)
