"""Test-side helpers of the reliability tests: child processes and the fork server.

Waiting for a condition: `tests.polling.wait_until`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

CHILDREN = Path(__file__).with_name("crash_children.py")


def read_lines(path: Path) -> list[str]:
    """Complete lines of an append-only log (a torn last line, if any, is left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    return [line.decode() for line in lines[:-1]]


def process_state(pid: int) -> str:
    """The one-letter state of `pid` from /proc (R, S, T for stopped, Z, ...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


class Child:
    """A forked child of the zygote, held by a pidfd (immune to pid reuse)."""

    def __init__(self, pid: int, err: Path) -> None:
        self.pid = pid
        self.err = err
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self.pidfd = None  # already gone (it killed itself)

    def wait(self, timeout: float) -> bool:
        """True once the child has exited (waiting up to `timeout` s)."""
        if self.pidfd is None:
            return True
        ready, _, _ = select.select([self.pidfd], [], [], timeout)
        return bool(ready)

    def kill(self) -> None:
        """SIGKILL the child and wait for it to be gone."""
        if self.pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            assert self.wait(10), f"child {self.pid} survived SIGKILL"

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def error(self) -> str:
        """The traceback the child recorded, or ''."""
        return self.err.read_text() if self.err.exists() else ""


class Zygote:
    """Client of the `zygote` role: forks pre-imported shoal children on request."""

    def __init__(self, proc: subprocess.Popen[bytes], errors: Path) -> None:
        self.proc = proc
        self.errors = errors
        self.children: list[Child] = []
        assert proc.stdout is not None and proc.stdin is not None
        self._out: IO[bytes] = proc.stdout
        self._in: IO[bytes] = proc.stdin
        line = self._out.readline()
        assert line == b"ready\n", f"zygote did not start: {line!r}"

    def spawn(self, role: str, *args: object) -> Child:
        """Fork a child running `role(*args)`; returns once its pid is known."""
        err = self.errors / f"{len(self.children)}.err"
        request = {"role": role, "args": [str(a) for a in args], "err": str(err)}
        self._in.write(json.dumps(request).encode() + b"\n")
        self._in.flush()
        line = self._out.readline()
        assert line.strip().isdigit(), f"zygote failed: {line!r}"
        child = Child(int(line), err)
        self.children.append(child)
        return child

    def close(self) -> None:
        """Kill every child still running, then the zygote."""
        for child in self.children:
            child.kill()
            child.close()
        self.proc.kill()
        self.proc.wait()


class Processes:
    """Every process a test starts; `close` kills what is still running."""

    def __init__(self, tmp: Path) -> None:
        self.logs = tmp / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.popens: list[subprocess.Popen[bytes]] = []
        self.stderr_files: dict[int, Path] = {}
        self.zygotes: list[Zygote] = []

    def start(self, role: str, *args: object) -> subprocess.Popen[bytes]:
        """Start `crash_children.py role args...` as a fresh interpreter."""
        stderr = self.logs / f"{role}-{len(self.popens)}.stderr"
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(CHILDREN), role, *map(str, args)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.popens.append(proc)
        self.stderr_files[proc.pid] = stderr
        return proc

    def stderr_of(self, proc: subprocess.Popen[bytes]) -> str:
        """What a process started with `start` wrote to stderr so far."""
        return self.stderr_files[proc.pid].read_text()

    def zygote(self) -> Zygote:
        """Start a fork server (its children are killed with it)."""
        errors = self.logs / f"zygote-{len(self.zygotes)}"
        errors.mkdir()
        with open(errors / "zygote.stderr", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(CHILDREN), "zygote"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.popens.append(proc)
        zygote = Zygote(proc, errors)
        self.zygotes.append(zygote)
        return zygote

    def close(self) -> None:
        for zygote in self.zygotes:
            zygote.close()
        for proc in self.popens:
            if proc.poll() is None:
                proc.kill()  # SIGKILL ends a SIGSTOPped process too
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
