"""An asyncio event loop on a daemon thread of its own, started on first use: where a
leader runs coroutines (in-process teammates, in-process agents) beside its own loop."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    """One event loop, served forever by a daemon thread named `name` once it is first
    asked for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now, and waited for, on the first call)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=serve, name=self.name, daemon=True).start()
                ready.wait()
                self._loop = loop
            return self._loop
