"""All JSON I/O: orjson encoding, atomic replace, validated reads and locked read-modify-write."""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
from filelock import AcquireReturnProxy, FileLock, Timeout
from pydantic import BaseModel, ValidationError

from shoal.core.errors import (
    CorruptFileError,
    NoSpaceError,
    NotFoundError,
    ShoalError,
    is_no_space,
)
from shoal.core.paths import FILE_MODE

M = TypeVar("M", bound=BaseModel)

LOCK_TIMEOUT_S = 30.0
LOCK_POLL_S = 0.002
LOCK_POLL_MAX_S = 0.2


def dumps(obj: Any, *, pretty: bool = False) -> bytes:
    """Encode `obj` (pydantic models included) with orjson."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json", by_alias=True)
    option = orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE if pretty else 0
    return orjson.dumps(obj, option=option)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or link in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: str | os.PathLike[str], data: bytes, *, durable: bool = False) -> None:
    """Create `path` (0600, O_EXCL|O_NOFOLLOW: never an existing file or a planted link) and
    write all of `data` to it, fsynced when `durable`; a failed write removes the file.

    The one write loop behind every temp-file-then-publish write (atomic_write here, maildir
    delivery's link into `new/`). FileExistsError and FileNotFoundError from the create pass
    through untouched (nothing was made), so callers can pick another name or report the dir.
    A full disk or quota (ENOSPC, EDQUOT: at the create, a write, the fsync or the close)
    raises NoSpaceError naming `path`, with the file removed.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except OSError as exc:
        if is_no_space(exc):
            raise NoSpaceError.from_os_error(exc, path) from None
        raise
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if is_no_space(exc):
            assert isinstance(exc, OSError)
            raise NoSpaceError.from_os_error(exc, path) from None
        raise


def atomic_write(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write `data` to `path` by temp file + os.replace, so readers see old or new, never half.

    A full disk raises NoSpaceError naming `path` (not the temp file, which is removed); the
    old file is left as it was.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write_new_file(tmp, data, durable=durable)
    except NoSpaceError as exc:
        raise NoSpaceError(path, quota=exc.quota) from None
    try:
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if is_no_space(exc):  # (a rename that must grow its directory, on some filesystems)
            assert isinstance(exc, OSError)
            raise NoSpaceError.from_os_error(exc, path) from None
        raise
    if durable:
        fsync_dir(path.parent)


def append_line(fd: int, line: bytes, path: str | os.PathLike[str]) -> None:
    """Append all of `line` to the O_APPEND file open at `fd` (the one loop behind every
    append-only log: events, history, handled ids).

    A line the disk has no room for raises NoSpaceError naming `path`, and what part of it was
    written is cut off again (when no other writer appended meanwhile), so the log never holds
    a torn line that the next record would be glued to.
    """
    start = os.fstat(fd).st_size
    written = 0
    try:
        view = memoryview(line)
        while view:
            n = os.write(fd, view)
            written += n
            view = view[n:]
    except OSError as exc:
        if written:
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_size == start + written:
                    os.ftruncate(fd, start)
        if is_no_space(exc):
            raise NoSpaceError.from_os_error(exc, path) from None
        raise


def read_bytes_nofollow(path: Path) -> bytes:
    """Read a whole file, refusing to follow a symlink at its last component."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_model(path: Path, model: type[M], what: str = "file") -> M:
    """Read and validate `path` as `model`; a bad file raises CorruptFileError naming it."""
    try:
        raw = read_bytes_nofollow(path)
    except FileNotFoundError:
        raise NotFoundError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise CorruptFileError(path, f"cannot read: {exc.strerror}") from None
    try:
        return model.model_validate(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise CorruptFileError(path, f"not valid JSON ({exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise CorruptFileError(
            path, f"invalid {what}: {loc}: {first['msg']} ({exc.error_count()} error(s))"
        ) from None


class LockTimeoutError(ShoalError):
    """A lock stayed taken for the whole timeout (or, for a non-blocking try, was taken).

    The only error a shoal lock raises: callers never need filelock's own Timeout.
    """


class BackoffFileLock(FileLock):
    """A FileLock whose waiters back off: they try every LOCK_POLL_S at first (an update
    holds the lock for a millisecond or two, so a waiter gets it at once), then about ten
    times per time waited so far, at most every LOCK_POLL_MAX_S, with jitter. filelock polls
    a non-blocking flock at one fixed interval: its default 50 ms starves waiters under
    contention, and at 2 ms a hundred waiters (teammates joining at once) burn the CPU the
    holder needs to finish, so that each hold lasts longer and the crowd never drains.

    A timeout raises LockTimeoutError naming the lock file (a non-blocking try that finds
    the lock taken raises it too), so this module is the only one that imports filelock.
    """

    def acquire(
        self,
        timeout: float | None = None,
        poll_interval: float | None = None,
        *,
        blocking: bool | None = None,
        **kwargs: Any,
    ) -> AcquireReturnProxy[Any]:
        try:
            return self._acquire_backing_off(timeout, poll_interval, blocking=blocking)
        except OSError as exc:  # (creating the lock file on a full disk)
            if is_no_space(exc):
                raise NoSpaceError.from_os_error(exc, self.lock_file) from None
            raise

    def _acquire_backing_off(
        self, timeout: float | None, poll_interval: float | None, *, blocking: bool | None
    ) -> AcquireReturnProxy[Any]:
        if blocking is False:
            try:
                return super().acquire(blocking=False)
            except Timeout:
                raise LockTimeoutError(
                    f"{self.lock_file} is locked (another shoal process holds it)"
                ) from None
        limit = self.timeout if timeout is None else timeout
        start = time.monotonic()
        deadline = None if limit < 0 else start + limit
        first = poll_interval or LOCK_POLL_S
        while True:
            try:
                return super().acquire(blocking=False)
            except Timeout:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise LockTimeoutError(
                        f"{self.lock_file} stayed locked for {limit:g}s "
                        "(another shoal process holds it; is one stuck?)"
                    ) from None
                # The longer the wait, the bigger the crowd: try about ten times per wait so
                # far (a waiter that sleeps is not competing for the CPU the holder needs).
                delay = min(LOCK_POLL_MAX_S, max(first, (now - start) / 10))
                time.sleep(delay * random.uniform(0.5, 1.5))


def lock_at(lock_file: str | os.PathLike[str]) -> BackoffFileLock:
    """A lock on `lock_file` itself (never deleted), for a lock that guards more than one
    file (e.g. a team's whole task list, `tasklist/.lock`)."""
    return BackoffFileLock(lock_file, timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)


def lock_for(path: Path) -> BackoffFileLock:
    """The lock guarding `path` (`{path}.lock`, never deleted)."""
    return lock_at(f"{path}.lock")


def locked_update(
    path: Path,
    model: type[M],
    update: Callable[[M], M],
    *,
    durable: bool = False,
    what: str = "file",
) -> M:
    """Read-modify-write `path` under its lock; a file that fails validation is left untouched.

    `update` returns the new model; returning the same object skips the write.
    """
    with lock_for(path):
        current = read_model(path, model, what)
        new = update(current)
        if new is not current:
            atomic_write(path, dumps(new, pretty=True), durable=durable)
        return new
