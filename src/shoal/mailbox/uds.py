"""Peers over a unix socket: a listener that delivers into a local inbox, and a sender.

Frames are a 4-byte big-endian length and the message bytes; the listener answers one status
byte and, on refusal, a reason. Only peers with our own uid (SO_PEERCRED) are accepted.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from pathlib import Path

from shoal.core.errors import ShoalError, UsageError
from shoal.mailbox.schema import MAX_MESSAGE_BYTES, DecodeError, decode, encode
from shoal.mailbox.store import Maildir

CONNECT_TIMEOUT_S = 5.0
_OK = b"\x00"
_REFUSED = b"\x01"


class PeerError(ShoalError):
    """A unix-socket peer could not be reached or refused the message."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection early")
        buf += chunk
    return bytes(buf)


def send_uds(path: str, raw: bytes) -> None:
    """Send one encoded message to the listener at `path`; raises PeerError on refusal."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise UsageError(f"message is {len(raw)} bytes, over the {MAX_MESSAGE_BYTES} byte cap")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(path)
            sock.sendall(struct.pack(">I", len(raw)) + raw)
            status = _recv_exact(sock, 1)
        except OSError as exc:
            raise PeerError(f"peer uds:{path} unreachable: {exc.strerror or exc}") from None
        if status != _OK:
            reason = sock.recv(4096).decode("utf-8", "replace")
            raise PeerError(f"peer uds:{path} refused the message: {reason}")


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class UdsListener:
    """Accepts messages on a unix socket and delivers them into `maildir`."""

    def __init__(self, path: Path, maildir: Maildir, *, durable: bool = False) -> None:
        self.path = path
        self.maildir = maildir
        self.durable = durable
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(os.fspath(path))
        finally:
            os.umask(old)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="shoal-uds", daemon=True)
        self._closed = False

    def start(self) -> UdsListener:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(CONNECT_TIMEOUT_S)
                with contextlib.suppress(OSError, ConnectionError):
                    self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        if peer_uid(conn) != os.getuid():
            conn.sendall(_REFUSED + b"peer uid differs from the listener's")
            return
        (size,) = struct.unpack(">I", _recv_exact(conn, 4))
        if size > MAX_MESSAGE_BYTES:
            conn.sendall(_REFUSED + f"message of {size} bytes is over the cap".encode())
            return
        raw = _recv_exact(conn, size)
        try:
            msg = decode(raw)
        except DecodeError as exc:
            conn.sendall(_REFUSED + exc.reason.encode())
            return
        self.maildir.deliver(encode(msg), durable=self.durable)
        conn.sendall(_OK)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
