"""Opening beneath a directory, no symlink followed: `openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` where the kernel has it (Linux >= 5.6), else a
walk of one component at a time with `O_NOFOLLOW` directory descriptors. Either way a
symlink on the way is ELOOP, as openat2 says it. (The path gate's kernel side: pathgate.py.)
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
_RESOLVE: Final = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
# openat2 came after the syscall tables were unified (Linux 5.1): 437 on every architecture
# that uses the common numbering. Elsewhere (mips, alpha, ia64, x32) the walk is used.
_SYS_OPENAT2: Final = 437
_COMMON_TABLE: Final = frozenset(
    {"x86_64", "amd64", "aarch64", "arm64", "armv7l", "armv6l", "riscv64", "ppc64le", "ppc64",
     "s390x", "i386", "i686", "loongarch64"}
)  # fmt: skip
_O_PATH: Final = getattr(os, "O_PATH", 0)
DIR_REF: Final = (_O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC  # to *at() beneath


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_ok: bool | None = None  # probed on first use; a test sets False to force the walk


def _syscall() -> Callable[..., int] | None:
    if platform.system() != "Linux" or platform.machine().lower() not in _COMMON_TABLE:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    call = libc.syscall
    call.restype = ctypes.c_long
    return call


_SYSCALL = _syscall()


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    """openat2(dirfd, path, {flags, mode, RESOLVE_BENEATH|NO_SYMLINKS|NO_MAGICLINKS})."""
    assert _SYSCALL is not None
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
    raw = os.fsencode(path)
    for _ in range(8):  # EAGAIN: a rename raced the `..` check; EINTR: a signal
        fd = _SYSCALL(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(raw),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):
            break
    raise OSError(err, os.strerror(err), path)


def openat2_available() -> bool:
    """Whether this kernel has openat2 with RESOLVE_BENEATH (probed once)."""
    global _openat2_ok
    if _openat2_ok is None:
        _openat2_ok = False
        if _SYSCALL is not None:
            try:
                os.close(_openat2(os.open("/", DIR_REF), ".", DIR_REF))
                _openat2_ok = True
            except OSError:  # ENOSYS (old kernel), EPERM (a seccomp filter), EINVAL
                pass
    return _openat2_ok


def is_link(dirfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_beneath(dirfd: int, parts: Sequence[str], flags: int, mode: int = 0) -> int:
    """A descriptor of `parts` beneath the directory open at `dirfd`, no symlink (nor `..`)
    followed on the way: OSError ELOOP when a symlink is in the way, as openat2 says it."""
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise OSError(errno.EINVAL, f"bad path component {part!r}")
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=dirfd)
    if openat2_available():
        return _openat2(dirfd, "/".join(parts), flags, mode)
    current, opened = dirfd, []
    try:
        for part in parts[:-1]:
            try:
                current = os.open(part, DIR_REF | os.O_NOFOLLOW, dir_fd=current)
            except OSError as exc:
                if is_link(current, part):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), part) from None
                raise exc from None
            opened.append(current)
        last = parts[-1]
        try:
            return os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=current)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP) and is_link(current, last):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), last) from None
            raise exc from None
    finally:
        for fd in opened:
            os.close(fd)


def fd_path(fd: int) -> Path | None:
    """The real path of what `fd` is open on (Linux's /proc), or None when unknown."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return Path(target) if target.startswith("/") and not target.endswith(" (deleted)") else None
