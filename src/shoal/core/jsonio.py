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

from shoal.core.errors import CorruptFileError, NotFoundError, ShoalError
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


def atomic_write(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write `data` to `path` by temp file + os.replace, so readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


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
    """A lock stayed taken for the whole timeout."""


class BackoffFileLock(FileLock):
    """A FileLock whose waiters back off: they try every LOCK_POLL_S at first (an update
    holds the lock for a millisecond or two, so a waiter gets it at once), then about ten
    times per time waited so far, at most every LOCK_POLL_MAX_S, with jitter. filelock polls
    a non-blocking flock at one fixed interval: its default 50 ms starves waiters under
    contention, and at 2 ms a hundred waiters (teammates joining at once) burn the CPU the
    holder needs to finish, so that each hold lasts longer and the crowd never drains.

    A timeout raises LockTimeoutError (a Timeout too), naming the lock file.
    """

    def acquire(
        self,
        timeout: float | None = None,
        poll_interval: float | None = None,
        *,
        blocking: bool | None = None,
        **kwargs: Any,
    ) -> AcquireReturnProxy[Any]:
        if blocking is False:
            return super().acquire(blocking=False)
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


def lock_for(path: Path) -> BackoffFileLock:
    """The lock guarding `path` (`{path}.lock`, never deleted)."""
    return BackoffFileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)


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
