"""How the Bash tool runs a command in the foreground: /bin/sh in a process group of its own,
its output kept up to OUTPUT_KEEP_CHARS characters (the rest counted), the group killed past
the timeout, and each group told to the runner as it starts and ends. Confined, it starts by
core/sandbox.py's `popen_confined` and its end is awaited on a pidfd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from shoal.core.sandbox import Policy, SandboxError, popen_confined
from shoal.workers.agent.tool_args import ToolFailure

OUTPUT_KEEP_CHARS: Final = 30_000  # of a command's output, the rest is noted


class _ConfinedProcess:
    """A command started confined (core/sandbox.py's `popen_confined`: vfork-fast, where a
    pre-exec hook would make Python fork the whole agent process), with asyncio's process
    interface as far as run_foreground uses it: `pid`, `stdout`, `wait()`, `returncode`.
    Its end is awaited on a pidfd: no thread waits for it."""

    def __init__(self, popen: Any, stdout: asyncio.StreamReader, transport: Any) -> None:
        self.popen = popen
        self.pid: int = popen.pid
        self.stdout = stdout
        self._transport = transport
        self._pidfd = os.pidfd_open(popen.pid)

    @classmethod
    async def start(
        cls, command: str, cwd: Path, env: dict[str, str], sandbox: Policy
    ) -> _ConfinedProcess:
        import subprocess

        popen = popen_confined(
            sandbox,
            ["/bin/sh", "-c", command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), popen.stdout
        )
        return cls(popen, reader, transport)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode  # type: ignore[no-any-return]

    async def wait(self) -> int:
        if self.popen.returncode is None:
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not ended.done():
                    ended.set_result(None)

            loop.add_reader(self._pidfd, readable)
            try:
                await ended
            finally:
                loop.remove_reader(self._pidfd)
            self.popen.wait()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
            self._transport.close()
        return int(self.popen.returncode)


async def run_foreground(
    command: str,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    track: Callable[[int, bool], None] | None = None,
    sandbox: Policy | None = None,
) -> str:
    """Run `command` in its own process group; its output (stdout+stderr) is kept up to
    OUTPUT_KEEP_CHARS characters, the rest counted; past `timeout` the group is killed.
    `track(pgid, running)` hears of the group as it starts and once it is over (the runner
    lists it in its status, so a runner killed -9 leaves nothing the leader cannot kill).
    With `sandbox` the command and all it starts are confined to that policy (Landlock)."""
    proc: Any
    if sandbox is None:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    else:
        try:
            proc = await _ConfinedProcess.start(command, cwd, {**os.environ, **env}, sandbox)
        except SandboxError as exc:
            raise ToolFailure(f"the command was not run: its sandbox failed ({exc})") from None
    assert proc.stdout is not None
    if track is not None:
        track(proc.pid, True)
    kept = bytearray()
    dropped = 0

    async def drain() -> None:
        nonlocal dropped
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            room = OUTPUT_KEEP_CHARS * 4 - len(kept)  # bytes: up to 4 per character
            kept.extend(chunk[: max(room, 0)])
            dropped += max(len(chunk) - max(room, 0), 0)
        await proc.wait()

    timed_out = False
    try:
        await asyncio.wait_for(drain(), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if track is not None:
            track(proc.pid, False)
    text = kept.decode("utf-8", "replace")
    extra = len(text) - OUTPUT_KEEP_CHARS
    if extra > 0:
        text = text[:OUTPUT_KEEP_CHARS]
    notes = []
    if extra > 0 or dropped:
        more = f"{max(extra, 0) + dropped:,} more " + ("bytes" if dropped else "characters")
        notes.append(f"[output truncated: {more} not shown]")
    if timed_out:
        notes.append(f"[killed after the timeout of {timeout:g}s]")
    elif proc.returncode:
        notes.append(f"[exit code {proc.returncode}]")
    return "\n".join([text.rstrip("\n"), *notes]).strip("\n") or "(no output)"
