"""TaskOutput on a 3 GB output file (sparse: a hole, then a tail): its tail comes back, read
by seeking, in a process whose memory stays bounded (its address space is capped at 1 GiB, so
a read of the whole file fails rather than swamping the machine) and whose reads (the
kernel's `rchar`) stay near the 65,536 bytes shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from shoal.workers.agent.team_tools import TASK_OUTPUT_MAX_BYTES

SIZE = 3 * 1024**3
TAIL = "".join(f"line {n}: the end is near\n" for n in range(5000)) + "the very end\n"

CHILD = """
import json, resource, sys, time
from pathlib import Path

resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from shoal.workers.agent.team_tools import TaskOutputArgs, TeamTools

output, offset = sys.argv[1], json.loads(sys.argv[2])


class Port:
    def call(self, op, args):
        raise AssertionError(op)

    def task_records(self):
        return {"b00000001": {"status": "running", "output_file": output}}


def rchar():
    io = Path("/proc/self/io").read_text()
    return int(next(l for l in io.splitlines() if l.startswith("rchar:")).split()[1])


tools = TeamTools(Path(sys.argv[3]), "t", "a00000001", Port())
before, started = rchar(), time.monotonic()
shown = tools.taskoutput(TaskOutputArgs(task_id="b00000001", offset=offset))
seconds, read = time.monotonic() - started, rchar() - before
# VmHWM is this address space's own peak; ru_maxrss would carry the parent's across exec
status = Path("/proc/self/status").read_text()
peak = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1])
print(json.dumps({"shown": shown, "seconds": seconds, "read": read, "peak_kib": peak}))
"""


def _sparse(tmp_path: Path) -> Path:
    path = tmp_path / "b00000001.output"
    with path.open("wb") as out:
        out.truncate(SIZE - len(TAIL.encode()))
        out.seek(0, os.SEEK_END)
        out.write(TAIL.encode())
    assert path.stat().st_size == SIZE and path.stat().st_blocks * 512 < 64 * 1024**2
    return path


def _task_output(tmp_path: Path, path: Path, offset: int | None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), json.dumps(offset), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_tail_of_a_3_gb_output_is_read_by_seeking(tmp_path: Path) -> None:
    path = _sparse(tmp_path)
    got = _task_output(tmp_path, path, None)
    shown: str = got["shown"]
    status, note, text = shown.split("\n", 2)
    assert status == "status: running"
    hidden = SIZE - TASK_OUTPUT_MAX_BYTES
    assert note == f"[{hidden:,} earlier bytes not shown: offset=0 reads from the start]"
    assert len(text.encode()) == TASK_OUTPUT_MAX_BYTES and TAIL.endswith(text), text[:200]
    assert text.endswith("line 4999: the end is near\nthe very end\n")
    assert got["read"] < 1024**2, got  # the window, not the file
    assert got["peak_kib"] < 200 * 1024, got
    print(f"\nTaskOutput on {SIZE:,} bytes: {got['seconds'] * 1000:.1f} ms, "
          f"peak RSS {got['peak_kib'] / 1024:.1f} MiB, {got['read']:,} bytes read")  # fmt: skip


def test_an_offset_reads_on_from_there_and_names_the_next(tmp_path: Path) -> None:
    path = _sparse(tmp_path)
    start = SIZE - len(TAIL.encode()) - 10  # (ten bytes of the hole, then the tail)
    got = _task_output(tmp_path, path, start)
    lines = got["shown"].split("\n")
    assert lines[1] == f"[{start:,} earlier bytes not shown: offset=0 reads from the start]"
    end = start + TASK_OUTPUT_MAX_BYTES
    assert lines[-1] == f"[{SIZE - end:,} later bytes not shown: offset={end} reads on]"
    body = "\n".join(lines[2:-1])
    assert body.startswith("\0" * 10 + "line 0: the end is near\n")
    assert len(body.encode()) == TASK_OUTPUT_MAX_BYTES
    assert got["read"] < 1024**2 and got["peak_kib"] < 200 * 1024, got
    pages, offset = [body], end  # (paging on by the named offsets gives back the rest)
    while True:
        shown = _task_output(tmp_path, path, offset)["shown"].split("\n")
        more = shown[-1].startswith("[") and "later bytes" in shown[-1]
        pages.append("\n".join(shown[2:-1] if more else shown[2:]))
        if not more:
            break
        offset = int(shown[-1].rsplit("offset=", 1)[1].split()[0])
    assert "".join(pages) == "\0" * 10 + TAIL and len(pages) == 3
