"""How messages reach a running agent: the `Feed` (put from any thread, drained into the
conversation at the next tool round boundary, or kept for the next run once it is over), the
thread that drains the agent's maildir inbox into it, and the turn in progress it can stop.
A task's end that already reached the agent (in an attachment, or recorded before a crash)
is not fed twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.core.notify import END_NOTIFICATION
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.schema import PermissionResponseMessage
from shoal.mailbox.store import Maildir
from shoal.workers.agent.attachments import attached_ends
from shoal.workers.agent.loop import AgentLoop


class Feed:
    """Pending messages for a running agent: `put` from any thread, drained into the loop at
    the next tool-round boundary (or kept for the next run once it is over)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agent: AgentLoop | None = None
        self.late: list[str] = []
        self.waiting: dict[str, asyncio.Future[tuple[bool, str | None]]] = {}
        self.turn: asyncio.Future[Any] | None = None  # the turn in progress
        self.turn_aborted = False
        self._waiter: asyncio.Future[str] | None = None
        self.waiting_shown: list[str] = []  # a coordinator's outstanding workers, as last said
        self.on_text: Callable[[str], str] | None = None  # sees each message as it is fed

    def attach(self, loop: asyncio.AbstractEventLoop, agent: AgentLoop) -> None:
        self._loop, self._agent = loop, agent

    def put(
        self, text: str, ack: Callable[[], None] | None = None, *, counted: bool = True
    ) -> None:
        """Queue `text`; `ack` (a coordinator's notification) runs once it is recorded in the
        transcript, and at once when a notification of that task is there already. A message
        sent to the task (neither acked nor said by shoal itself, `counted`) is one of its
        pending messages until it reaches the conversation."""
        if self._loop is None or self._agent is None:
            assert ack is None, "acked messages are fed only once the agent runs"
            self.late.append(text)
            return
        self._loop.call_soon_threadsafe(self._deliver, text, ack, counted and ack is None)

    def _deliver(
        self, text: str, ack: Callable[[], None] | None = None, counted: bool = True
    ) -> None:
        if self.on_text is not None and ack is None:
            text = self.on_text(text)
        if ack is None and self._agent is not None:
            task_id = notification_task(text)
            if task_id is not None and task_id in attached_ends(self._agent.user_texts()):
                return  # (its end, and its last output, reached the agent in an attachment)
        if ack is not None and self._agent is not None:
            task_id = notification_task(text)
            if task_id is not None and task_id in recorded_notifications(self._agent):
                ack()  # (delivered again after a crash between the transcript and the ack)
                return
            self._agent.on_recorded(text, ack)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(text)  # (the agent waits for a message after a stopped turn)
            if counted and self._agent is not None:
                self._agent.progress.drained += 1
        elif self._agent is not None:
            self._agent.enqueue(text, counted=counted)

    async def next_message(self, timeout: float | None = None) -> str | None:
        """Wait for the next message (after a stopped turn, or a coordinator's idle turn);
        None when `timeout` passes first."""
        assert self._agent is not None
        queued = self._agent.pending()
        if queued:
            return "\n\n".join(queued)
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiter = None
        # (a message may have come between the timeout and this task's turn on the loop)
        if waiter.done() and not waiter.cancelled():
            return waiter.result()
        waiter.cancel()
        return None

    def abort_turn(self) -> bool:
        """Stop the turn in progress (from any thread); the agent then waits for a message."""
        if self._loop is None:
            return False
        self._loop.call_soon_threadsafe(self.abort_turn_now)
        return True

    def abort_turn_now(self) -> None:
        """`abort_turn` on the agent's own event loop (its SIGUSR1 handler)."""
        if self.turn is not None and not self.turn.done():
            self.turn_aborted = True
            self.turn.cancel()

    def answer(self, request_id: str, approve: bool, reason: str | None) -> bool:
        """The lead's answer to permission request `request_id` (from any thread); False
        when nothing waits on it."""
        future = self.waiting.get(request_id)
        if future is None or self._loop is None:
            return False

        def settle() -> None:
            if not future.done():
                future.set_result((approve, reason))

        self._loop.call_soon_threadsafe(settle)
        return True


def notification_task(text: str) -> str | None:
    """The task id of a `<task-notification>` of a task's end, else None."""
    found = END_NOTIFICATION.match(text.lstrip())
    return found.group(1) if found else None


def recorded_notifications(agent: AgentLoop) -> set[str]:
    """The task ids whose end notifications are in the agent's conversation."""
    return {m.group(1) for text in agent.user_texts() for m in END_NOTIFICATION.finditer(text)}


def watch_inbox(path: Path, home: Path, feed: Feed, stop: threading.Event) -> threading.Thread:
    """Drain the agent's maildir inbox into `feed` on a thread (a message is acked once fed)."""

    def run() -> None:
        maildir = Maildir.create(path, home)
        with Inbox(maildir) as inbox:
            while not stop.is_set():
                delivery = inbox.receive(timeout=0.2)
                if delivery is None:
                    continue
                msg = delivery.message
                if isinstance(msg, PermissionResponseMessage):
                    feed.answer(msg.data.request_id, msg.data.approve, msg.data.reason)
                elif msg.text:
                    feed.put(msg.text)
                inbox.ack(delivery)

    thread = threading.Thread(target=run, name="agent-inbox", daemon=True)
    thread.start()
    return thread
