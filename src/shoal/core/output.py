"""Task output files: created exclusively without following symlinks, read in bounded deltas."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from shoal.core.errors import UnsafePathError
from shoal.core.paths import FILE_MODE, check_no_symlink
from shoal.core.tasks import OUTPUT_READ_CHUNK

PathLike = str | os.PathLike[str]

# O_EXCL makes a planted file or symlink (even a dangling one) fail with EEXIST instead of
# being opened; O_NOFOLLOW is the belt to that brace.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _symlink_error(path: PathLike) -> UnsafePathError:
    return UnsafePathError(f"{os.fspath(path)} is a symlink; refusing to follow it (remove it)")


def create_output_file(path: PathLike, root: Path | None = None) -> int:
    """Create a new task output file (0600) and return a write-only, append-mode fd.

    Anything already at `path` (a file, or a symlink someone planted) raises UnsafePathError and
    is left untouched. With `root`, every directory component below it is checked too.
    """
    if root is not None:
        check_no_symlink(Path(path).parent, root)
    try:
        return os.open(path, _CREATE_FLAGS, FILE_MODE)
    except FileExistsError:
        kind = "a symlink" if os.path.islink(path) else "a file"
        raise UnsafePathError(
            f"task output file {os.fspath(path)} already exists as {kind}; refusing to reuse or "
            f"follow it (remove it, or start the task under a new id)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _symlink_error(path) from None
        raise


def _open_for_read(path: PathLike) -> int | None:
    try:
        return os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _symlink_error(path) from None
        raise


def read_output_delta(
    path: PathLike, offset: int, max_bytes: int = OUTPUT_READ_CHUNK
) -> tuple[bytes, int]:
    """Read at most `max_bytes` of `path` from `offset`; returns (data, offset + len(data)).

    A missing file, or one shorter than `offset`, yields (b"", offset).
    """
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return b"", offset
    if stat.S_ISREG(st.st_mode) and st.st_size <= offset:
        return b"", offset  # nothing new: no need to open it
    fd = _open_for_read(path)
    if fd is None:
        return b"", offset
    try:
        chunks: list[bytes] = []
        want = max_bytes
        pos = offset
        while want > 0:
            chunk = os.pread(fd, want, pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
            want -= len(chunk)
        return b"".join(chunks), pos
    finally:
        os.close(fd)


def output_size(path: PathLike) -> int:
    """The size of the output file in bytes; 0 if it does not exist yet."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_error(path)
    return st.st_size


def tail(path: PathLike, max_bytes: int = 4096) -> str:
    """The last `max_bytes` of the output file as text (undecodable bytes replaced)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    start = max(0, output_size(path) - max_bytes)
    data, _ = read_output_delta(path, start, max_bytes)
    return data.decode("utf-8", errors="replace")


def tail_lines(path: PathLike, n: int = 10, max_bytes: int = 4096) -> list[str]:
    """The last `n` complete lines within the last `max_bytes` of the output file."""
    if n <= 0:
        return []
    start = max(0, output_size(path) - max_bytes)
    if start == 0:
        data, _ = read_output_delta(path, 0, max_bytes)
    else:
        # Read one byte more so we can tell whether the window starts on a line boundary;
        # a line cut by the window is not a whole line and is dropped.
        data, _ = read_output_delta(path, start - 1, max_bytes + 1)
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    return data.decode("utf-8", errors="replace").splitlines()[-n:]


def partial_char_at_end(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character it does not finish."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back if byte >= 0xC0 and need > back else 0
    return 0


def read_window(path: PathLike, offset: int | None, max_bytes: int) -> tuple[str, int, int, int]:
    """At most `max_bytes` of the output file, from byte `offset` (None: its last `max_bytes`),
    read by seeking: a file of any size costs `max_bytes` of memory. Returns (text, start,
    end, size): the window is bytes [start, end) of a file of `size` bytes, moved to whole
    UTF-8 characters (a character cut by either edge is left to the window beside it)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    if offset is not None and offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    size = output_size(path)
    start = max(0, size - max_bytes) if offset is None else min(offset, size)
    data, _ = read_output_delta(path, start, max_bytes) if start < size else (b"", start)
    if start > 0:  # (a window that starts inside a character skips the rest of it)
        skip = 0
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data, start = data[skip:], start + skip
    if start + len(data) < size:
        data = data[: len(data) - partial_char_at_end(data)]
    return data.decode("utf-8", errors="replace"), start, start + len(data), size
