"""Wake-ups for inboxes read without inotify: a datagram to a per-inbox abstract unix socket.

Linux allows 128 inotify instances per user, so in a big team some members must poll. Polling
often enough for a low latency costs CPU even idle (each timer wake-up of a thread is tens of
microseconds on a VM); polling rarely makes messages wait. So every delivery also sends an
empty datagram to an address derived from the inbox directory's identity (device and inode,
whatever path spells it); a member that polls binds that address and sleeps on it, waking at
once when a message comes and only rarely otherwise (for files other tools drop in). Nobody
bound (an inotify member, or nobody reading) makes the send fail at once, and it is ignored.
The datagram carries nothing: a stray one costs a look into `new/`, never a message.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

_sender: socket.socket | None = None
_sender_lock = threading.Lock()


def address(inbox: str | os.PathLike[str]) -> bytes | None:
    """The abstract socket address that wakes `inbox`'s reader, or None when it is not there."""
    try:
        st = os.stat(inbox)
    except OSError:
        return None
    return f"\0shoal-wake-{os.getuid()}-{st.st_dev:x}-{st.st_ino:x}".encode()


def notify(inbox: str | os.PathLike[str]) -> None:
    """Tell whoever polls `inbox` that it has mail (best effort, never blocks or raises)."""
    where = address(inbox)
    if where is not None:
        poke(where)


def poke(where: bytes) -> None:
    """Send the empty datagram to `where` (an `address`), ignoring that nobody is there."""
    global _sender
    sock = _sender
    if sock is None:
        with _sender_lock:
            if _sender is None:
                made = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                made.setblocking(False)
                _sender = made
            sock = _sender
    with contextlib.suppress(OSError):  # (nobody bound, or its queue is full: it wakes anyway)
        sock.sendto(b"", where)


class Listener:
    """The reader's end for one inbox: readable when a delivery happened since `drain`."""

    def __init__(self, inbox: str | os.PathLike[str]) -> None:
        where = address(inbox)
        if where is None:
            raise FileNotFoundError(f"inbox {inbox} does not exist")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(where)  # (EADDRINUSE: another reader polls this inbox)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.sock.recv(16)

    def close(self) -> None:
        self.sock.close()
