"""Teammates as asyncio tasks inside the leader's process, each with a contextvars identity.

Cheap enough for a thousand: one event loop thread, one watch on the team's inbox root, no
process per teammate. The backend knows nothing of what a teammate does: the layer above
gives it a factory that turns a SpawnSpec into the teammate's coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, ClassVar

from shoal.core.errors import ShoalError
from shoal.core.loopthread import LoopThread
from shoal.teams.backends.base import Handle, SpawnSpec

# Who "I" am inside an in-process teammate's coroutine (agent id), None outside one.
current_member: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shoal_current_member", default=None
)

Factory = Callable[[SpawnSpec], Coroutine[Any, Any, int]]


class InProcessBackend:
    """Runs teammate coroutines on one background event loop."""

    name: ClassVar[str] = "in-process"

    def __init__(self, factory: Factory | None = None) -> None:
        # One instance per swarm: its factory builds that swarm's teammates (a second leader
        # in the same process has its own instance, loop and factory).
        self.factory: Factory | None = factory
        self._loop = LoopThread("shoal-inprocess")
        self._futures: dict[str, Future[int]] = {}
        self._lock = threading.Lock()

    def available(self) -> tuple[bool, str]:
        if self.factory is None:
            return False, "in-process teammates run inside a leader (`shoal up`)"
        return True, "runs inside the leader's process"

    @staticmethod
    def key(team: str, name: str) -> str:
        return f"inproc:{team}/{name}"

    def spawn(self, spec: SpawnSpec) -> Handle:
        if self.factory is None:
            raise ShoalError("the in-process backend has no teammate factory (start a leader)")
        loop = self._loop.loop()
        key = self.key(spec.team, spec.name)
        factory = self.factory

        async def main() -> int:
            current_member.set(f"{spec.name}@{spec.team}")
            return await factory(spec)

        future = asyncio.run_coroutine_threadsafe(main(), loop)
        with self._lock:
            self._futures[key] = future
        return Handle(backend=self.name, pid=os.getpid(), pane_id=key)

    def on_done(self, handle: Handle, callback: Callable[[], None]) -> None:
        """Call `callback()` (from the loop thread) when the teammate's coroutine ends."""
        future = self._futures.get(handle.pane_id or "")
        if future is not None:
            future.add_done_callback(lambda _f: callback())

    def is_alive(self, handle: Handle) -> bool:
        future = self._futures.get(handle.pane_id or "")
        return future is not None and not future.done()

    def result(self, handle: Handle) -> int | BaseException | None:
        """The exit code (or the exception) of a finished teammate, None while it runs."""
        future = self._futures.get(handle.pane_id or "")
        if future is None or not future.done():
            return None
        if future.cancelled():
            return 143
        exc = future.exception()
        return exc if exc is not None else future.result()

    def kill(self, handle: Handle) -> None:
        future = self._futures.get(handle.pane_id or "")
        if future is not None and not future.done():
            future.cancel()
            with contextlib.suppress(BaseException):  # cancelled or failed: gone either way
                future.result(timeout=5)

    def close(self, team: str) -> None:
        prefix = self.key(team, "")
        with self._lock:
            for key in [k for k in self._futures if k.startswith(prefix)]:
                future = self._futures.pop(key)
                if not future.done():
                    future.cancel()
