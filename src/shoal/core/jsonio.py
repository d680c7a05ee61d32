"""All JSON I/O: orjson encoding, atomic replace, validated reads and locked read-modify-write."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from shoal.core.errors import (
    CorruptFileError,
    NoSpaceError,
    NotFoundError,
    ShoalError,
    is_no_space,
)
from shoal.core.paths import FILE_MODE
from shoal.core.validation import first_error

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

LOCK_TIMEOUT_S = 30.0
# A taken lock is first tried again a few times over SPIN_FOR_S (sleeps from SPIN_FIRST_S,
# doubling up to SPIN_MAX_S), then waited for in a blocking flock (see ShoalLock).
SPIN_FIRST_S = 0.00005
SPIN_MAX_S = 0.001
SPIN_FOR_S = 0.005


def dumps(obj: Any, *, pretty: bool = False) -> bytes:
    """Encode `obj` (pydantic models included) with orjson."""
    dump = getattr(obj, "model_dump", None)  # (a model: pydantic need not be imported here)
    if dump is not None:
        obj = dump(mode="json", by_alias=True)
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


def append_line(fd: int, line: bytes, path: str | os.PathLike[str], *, what: str = "") -> None:
    """Append all of `line` to the O_APPEND file open at `fd` (the one loop behind every
    append-only log: events, history, handled ids).

    A line the disk has no room for raises NoSpaceError naming `path`, and what part of it was
    written is cut off again (when no other writer appended meanwhile), so the log never holds
    a torn line that the next record would be glued to.
    """
    written = 0
    start = -1  # where this line begins, once a short write makes it matter
    try:
        written = os.write(fd, line)
        if written == len(line):  # (the usual case: one write, no fstat or lseek)
            return
        # O_APPEND left the offset just past the part written, so the line starts before it.
        start = os.lseek(fd, 0, os.SEEK_CUR) - written
        view = memoryview(line)[written:]
        while view:
            n = os.write(fd, view)
            written += n
            view = view[n:]
    except OSError as exc:
        if written and start >= 0:
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_size == start + written:
                    os.ftruncate(fd, start)
        if is_no_space(exc):
            raise NoSpaceError.from_os_error(exc, path, what=what) from None
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
    from pydantic import ValidationError

    try:
        return model.model_validate(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise CorruptFileError(path, f"not valid JSON ({exc})") from None
    except ValidationError as exc:
        raise CorruptFileError(path, f"invalid {what}: {first_error(exc, count=True)}") from None


class LockTimeoutError(ShoalError):
    """A lock stayed taken for the whole timeout (or, for a non-blocking try, was taken).

    The only error a shoal lock raises.
    """


class ShoalLock:
    """An exclusive `flock(2)` on `lock_file` (created 0600 if missing, never deleted).

    It is the very lock filelock's `UnixFileLock` takes on that file, so a process holding it
    with filelock (another tool, an older shoal) and a shoal process exclude each other. It
    is written here rather than taken from filelock because filelock 4 spends about 150 us
    of Python on each acquire and release (a raw flock costs 3 us), which made every team
    file update several times dearer than its read, change and write together.

    Reentrant within a thread; two threads of one process exclude each other (each opens its
    own file description). A free lock is taken with one non-blocking flock. A taken one is
    tried again a few times over 5 ms (an update holds it for a fraction of a millisecond),
    then waited for with a *blocking* flock on a helper thread, so that the kernel hands it
    over the moment the holder lets go (no crowd of pollers competing for the CPU the holder
    needs), while the caller waits for that thread up to its timeout; a wait that times out
    leaves the helper to drop the lock as soon as it gets it.
    """

    def __init__(
        self, lock_file: str | os.PathLike[str], timeout: float = LOCK_TIMEOUT_S,
        mode: int = FILE_MODE,
    ) -> None:  # fmt: skip
        self.lock_file = os.fspath(lock_file)
        self.timeout = timeout
        self.mode = mode
        self._local = threading.local()

    def _held(self) -> tuple[int, int] | None:
        """(fd, count) this thread holds, forgetting what a forked child inherited."""
        local = self._local
        held: tuple[int, int, int] | None = getattr(local, "held", None)
        if held is None:
            return None
        if held[2] != os.getpid():  # (inherited over fork: the parent's, not ours)
            with contextlib.suppress(OSError):
                os.close(held[0])
            local.held = None
            return None
        return held[0], held[1]

    @property
    def is_locked(self) -> bool:
        """Whether this thread holds it."""
        return self._held() is not None

    def _open(self) -> int:
        flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(self.lock_file, os.O_RDWR | flags, self.mode)
        except PermissionError:  # (a lock file we may only read still locks)
            return os.open(self.lock_file, os.O_RDONLY | flags, self.mode)
        except OSError as exc:
            if is_no_space(exc):  # (creating the lock file on a full disk)
                raise NoSpaceError.from_os_error(exc, Path(self.lock_file)) from None
            raise

    def acquire(
        self,
        timeout: float | None = None,
        poll_interval: float | None = None,
        *,
        blocking: bool | None = None,
    ) -> ShoalLock:
        """Take the lock (again, in a thread that holds it); LockTimeoutError after `timeout`
        seconds (default: the lock's; negative: forever), at once with `blocking=False`.
        `poll_interval` is accepted for filelock's signature and ignored (nothing polls)."""
        held = self._held()
        if held is not None:
            self._local.held = (held[0], held[1] + 1, os.getpid())
            return self
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if blocking is False:
                os.close(fd)
                raise LockTimeoutError(
                    f"{self.lock_file} is locked (another shoal process holds it)"
                ) from None
            limit = self.timeout if timeout is None else timeout
            if not _spin_for_flock(fd) and not _wait_for_flock(fd, None if limit < 0 else limit):
                raise LockTimeoutError(
                    f"{self.lock_file} stayed locked for {limit:g}s "
                    "(another shoal process holds it; is one stuck?)"
                ) from None
        except BaseException:
            os.close(fd)
            raise
        self._local.held = (fd, 1, os.getpid())
        return self

    def release(self) -> None:
        """Let go once (the lock is free when every acquire of this thread is released)."""
        held = self._held()
        if held is None:
            return
        fd, count = held
        if count > 1:
            self._local.held = (fd, count - 1, os.getpid())
            return
        self._local.held = None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> ShoalLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _spin_for_flock(fd: int) -> bool:
    """A few quick tries first: an update holds a lock for a fraction of a millisecond, and
    a try costs less than handing the wait to a thread."""
    delay = SPIN_FIRST_S
    waited = 0.0
    while waited < SPIN_FOR_S:
        time.sleep(delay)
        waited += delay
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            delay = min(delay * 2, SPIN_MAX_S)
            continue
        return True
    return False


def _wait_for_flock(fd: int, timeout: float | None) -> bool:
    """Block in flock(LOCK_EX) on a helper thread; True once `fd` holds the lock. False after
    `timeout`: the helper then owns `fd` and closes it (freeing the lock) when it gets it."""
    got = threading.Event()
    guard = threading.Lock()
    state: dict[str, Any] = {"abandoned": False, "error": None}

    def wait() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            state["error"] = exc
        with guard:
            if state["abandoned"]:
                os.close(fd)
                return
            got.set()

    threading.Thread(target=wait, name="shoal-lock-wait", daemon=True).start()
    if not got.wait(timeout):
        with guard:
            if not got.is_set():
                state["abandoned"] = True
                return False
    if state["error"] is not None:
        raise state["error"]
    return True


def lock_at(lock_file: str | os.PathLike[str]) -> ShoalLock:
    """A lock on `lock_file` itself (never deleted), for a lock that guards more than one
    file (e.g. a team's whole task list, `tasklist/.lock`)."""
    return ShoalLock(lock_file, timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)


def lock_for(path: Path) -> ShoalLock:
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
