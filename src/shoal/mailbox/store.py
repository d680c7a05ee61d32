"""One maildir inbox on disk: delivery by O_EXCL + link, claim by rename, ack by unlink.

Layout: `tmp/` (being written), `new/` (delivered), `cur/` (claimed, not yet acked), `bad/`
(undecodable or failing messages, each beside a `.error` file saying why). A message is
visible in `new/` only once it is whole, so every file there parses (or is quarantined).

Only the user's own files are messages: an inbox's directories must be the user's and writable
by no one else, and a message file another uid owns (checked with fstat on the descriptor
opened to read it: no window between check and read) is quarantined unread. Every kind is read
through `Maildir.read`, so control requests, permission and plan answers and shutdown requests
all get the check. (Everything shoal delivers is written by one user today; a peer of another
uid has the `uds:` route, whose SO_PEERCRED check is its own.)
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import stat
import time
from pathlib import Path

from shoal.core.errors import (
    MessageTooLargeError,
    NoSpaceError,
    NotFoundError,
    UnsafePathError,
    is_no_space,
)
from shoal.core.jsonio import append_line, fsync_dir, write_new_file
from shoal.core.paths import FILE_MODE, check_owned, check_path, ensure_dir
from shoal.mailbox import wake

MAX_MESSAGE_BYTES = 1024 * 1024
"""The cap of one message file (here, not with the schemas: a deliverer needs no models)."""

SUBDIRS = ("tmp", "new", "cur", "bad")
HANDLED_LOG = "handled.log"
# A tmp/ file older than this is stale even if its writer still lives (maildir's own rule).
STALE_TMP_S = 36 * 3600.0
# A tmp/ file whose writer is gone is stale once it is this old (covers pid reuse races).
ORPHAN_TMP_S = 5.0

_seq = itertools.count()
_HOST = socket.gethostname().replace("/", "\\057").replace(":", "\\072") or "localhost"


def unique_name() -> str:
    """A maildir file name `{time_ns}.{pid}_{seq}.{host}`, unique across processes and hosts."""
    return f"{time.time_ns()}.{os.getpid()}_{next(_seq)}.{_HOST}"


def _writer_pid(name: str) -> int | None:
    try:
        return int(name.split(".", 2)[1].split("_", 1)[0])
    except (IndexError, ValueError):
        return None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Maildir:
    """An inbox directory with its four subdirectories; all paths checked against symlinks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path / "tmp"
        self.new = path / "new"
        self.cur = path / "cur"
        self.bad = path / "bad"
        self._handled_fd: int | None = None
        # String forms for the per-message paths (pathlib joins cost more than the syscalls).
        self._dir = os.fspath(path)
        self._tmp_s = os.fspath(self.tmp)
        self._new_s = os.fspath(self.new)
        self._cur_s = os.fspath(self.cur)
        self._wake: bytes | None = None  # (its wake address, found at the first delivery)
        self._handled_s = os.fspath(path / HANDLED_LOG)
        self._uid = os.geteuid()

    @classmethod
    def create(cls, path: Path, home: Path) -> Maildir:
        """Create (or check) the inbox at `path` under `home`: 0700 dirs, no symlinks anywhere,
        every directory below the home the user's and writable by no one else."""
        ensure_dir(path, home, strict=True)
        for sub in SUBDIRS:  # the parents are checked: only these four are left to make
            ensure_dir(path / sub, path, strict=True)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> Maildir:
        """An existing inbox; refuses a symlinked inbox or subdirectory, and one that it, its
        parent (`inboxes/`) or a subdirectory lets another user write in."""
        parent = check_path(path.parent, "dir")
        if parent is not None:
            check_owned(path.parent, parent)
        for p in (path, *(path / s for s in SUBDIRS)):
            st = check_path(p, "dir")
            if st is None:
                raise NotFoundError(f"no inbox at {p}")
            check_owned(p, st)
        return cls(path)

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, data: bytes, *, durable: bool = False) -> str:
        """Deliver one whole message file; returns its maildir name.

        Written in `tmp/` with O_EXCL|O_NOFOLLOW, fsynced when `durable`, then hard-linked into
        `new/` (so `new/` only ever holds complete files) and unlinked from `tmp/`. A full
        disk raises NoSpaceError naming the inbox, with nothing left in `tmp/` or `new/`.
        """
        if len(data) > MAX_MESSAGE_BYTES:
            raise MessageTooLargeError(
                f"message is {len(data)} bytes, over the {MAX_MESSAGE_BYTES} byte cap; "
                "put large content in a file and send its path"
            )
        while True:
            name = unique_name()
            tmp = f"{self._tmp_s}/{name}"
            try:
                write_new_file(tmp, data, durable=durable)
            except FileExistsError:
                continue
            except FileNotFoundError:
                raise NotFoundError(f"inbox {self.path} is gone (was the team deleted?)") from None
            except NoSpaceError as exc:  # (write_new_file removed the tmp/ file)
                raise NoSpaceError(self.path, quota=exc.quota, what="a message to") from None
            try:
                os.link(tmp, f"{self._new_s}/{name}")
            except FileExistsError:
                os.unlink(tmp)
                continue
            except OSError as exc:
                os.unlink(tmp)
                if is_no_space(exc):  # (new/ could not grow to hold one more name)
                    raise NoSpaceError.from_os_error(exc, self.path, what="a message to") from None
                raise
            os.unlink(tmp)
            if durable:
                fsync_dir(self.new)
            # A reader without inotify sleeps on this. The address (the inbox's device and
            # inode) is found once: a stat per message is not needed to name the same dir.
            if self._wake is None:
                self._wake = wake.address(self._dir)
            if self._wake is not None:
                wake.poke(self._wake)
            return name

    # -- receiving ---------------------------------------------------------------------------

    def pending(self) -> list[str]:
        """Names in `new/`, oldest first."""
        try:
            names = os.listdir(self._new_s)
        except FileNotFoundError:
            return []
        names.sort()
        return names

    def claimed(self) -> list[str]:
        """Names in `cur/` (claimed but not acked: left over from a crash), oldest first."""
        try:
            names = os.listdir(self.cur)
        except FileNotFoundError:
            return []
        names.sort()
        return names

    def read(self, sub: str, name: str) -> bytes:
        """Read a message file without following a symlink (ELOOP -> UnsafePathError); a
        file that is not regular, or that another uid owns, is an UnsafePathError too, read
        from the descriptor's own fstat (so nothing can swap the file after the check)."""
        try:
            fd = os.open(f"{self._dir}/{sub}/{name}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"{self.path / sub / name} is a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePathError(f"{self.path / sub / name} is not a regular file")
            if st.st_uid != self._uid:
                raise UnsafePathError(
                    f"{self.path / sub / name} is owned by uid {st.st_uid}, not by this "
                    f"process's uid {self._uid}: a message from another user is never acted on"
                )
            # Files in new/ and cur/ are whole (linked in once written): one read of the size
            # fstat gave (+1, to see EOF) is the whole file. A file that grew meanwhile (another
            # tool writing in place) is read on to EOF, up to just over the cap.
            want = min(st.st_size, MAX_MESSAGE_BYTES) + 1
            first = os.read(fd, want)
            if len(first) < want:
                return first
            chunks = [first]
            size = len(first)
            while size <= MAX_MESSAGE_BYTES and (chunk := os.read(fd, 1 << 20)):
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def claim(self, name: str) -> bool:
        """Move `new/name` to `cur/name`; False when someone else claimed it first."""
        try:
            os.rename(f"{self._new_s}/{name}", f"{self._cur_s}/{name}")
        except FileNotFoundError:
            return False
        return True

    def ack(self, name: str) -> None:
        """Remove a handled message from `cur/`."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self._cur_s}/{name}")

    def quarantine(self, sub: str, name: str, reason: str) -> None:
        """Move `sub/name` into `bad/` with a `.error` file beside it saying why.

        The reason is written first: on a full disk NoSpaceError is raised and the message
        stays where it was (a `.error` alone is never listed as a bad message).
        """
        error_file = self.bad / f"{name}.error"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(error_file)  # (left by an earlier quarantine of the same name)
        write_new_file(error_file, reason.encode("utf-8", "replace") + b"\n")
        try:
            os.rename(self.path / sub / name, self.bad / name)
        except FileNotFoundError:  # (claimed or quarantined by another reader meanwhile)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(error_file)

    def bad_messages(self) -> list[tuple[str, str]]:
        """(name, reason) of every quarantined message."""
        out = []
        for name in sorted(os.listdir(self.bad)):
            if name.endswith(".error"):
                continue
            try:
                reason = (self.bad / f"{name}.error").read_text().strip()
            except OSError:
                reason = "(no reason recorded)"
            out.append((name, reason))
        return out

    # -- exactly-once effects ----------------------------------------------------------------

    @property
    def handled_log(self) -> Path:
        return self.path / HANDLED_LOG

    def handled_ids(self) -> set[str]:
        """Ids recorded as handled (their effect is done even if the ack was lost)."""
        try:
            fd = os.open(self.handled_log, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return set()
        with os.fdopen(fd, "rb") as fh:
            return {line.strip().decode() for line in fh if line.strip()}

    def mark_handled(self, message_id: str, *, durable: bool = False) -> None:
        """Append `message_id` to the handled log (one O_APPEND write, atomic for short lines).

        The log stays open between messages (a reader handles many). On a full disk
        NoSpaceError, and the log is as it was (the message stays in `cur/`, not acked)."""
        if self._handled_fd is None:
            self._handled_fd = os.open(
                self._handled_s,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                FILE_MODE,
            )
        append_line(self._handled_fd, message_id.encode() + b"\n", self._handled_s)
        if durable:
            os.fsync(self._handled_fd)

    def close(self) -> None:
        """Close the handled log if it is open."""
        if self._handled_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._handled_fd)
            self._handled_fd = None

    def __del__(self) -> None:
        self.close()

    def compact_handled(self, keep: set[str]) -> None:
        """Rewrite the handled log keeping only `keep` (ids whose files are still in `cur/`)."""
        from shoal.core.jsonio import atomic_write

        self.close()  # the next append opens the new file
        atomic_write(self.handled_log, b"".join(i.encode() + b"\n" for i in sorted(keep)))

    # -- housekeeping ------------------------------------------------------------------------

    def janitor(
        self,
        *,
        now: float | None = None,
        stale_after: float = STALE_TMP_S,
        orphan_after: float = ORPHAN_TMP_S,
    ) -> list[str]:
        """Remove stale `tmp/` files (dead writer, or older than `stale_after`); returns them."""
        now = time.time() if now is None else now
        removed: list[str] = []
        try:
            names = os.listdir(self.tmp)
        except FileNotFoundError:
            return removed  # the inbox is gone (team deleted)
        for name in names:
            path = self.tmp / name
            try:
                age = now - os.lstat(path).st_mtime
            except FileNotFoundError:
                continue
            pid = _writer_pid(name)
            dead = pid is not None and pid != os.getpid() and not _pid_exists(pid)
            if age > stale_after or (dead and age > orphan_after):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(name)
        return removed
