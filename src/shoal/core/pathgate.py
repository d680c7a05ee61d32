"""The one path gate of the file tools: a path resolved beneath a root, no symlink followed.

A name is placed lexically (joined to the base, `..` folded) and must lie beneath one of the
gate's roots; its directory is then opened from the root with `openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` where the kernel has it (Linux >= 5.6), else one
component at a time with `O_NOFOLLOW` directory descriptors (beneath.py), and the last
component is used through that descriptor, never followed. So a symlink anywhere on the way,
planted before or swapped in during a call, leads nowhere; the root itself is reopened by its
real path with no symlink allowed, so a root swapped for a link is noticed.

Reads refuse what is not a regular file (a FIFO, a socket, a device) without opening it for
reading (it is looked at first through its directory, then opened non-blocking and checked
again), and stop at READ_CAP_BYTES. Writes go to a new temp file in the target's directory
(O_CREAT|O_EXCL|O_NOFOLLOW), fsynced, then renamed over the target through the same directory
descriptor: a symlink or a hard link at the target is replaced, never written through. Paths
under `.git` (at any depth) and under the gate's protected paths are never written.

An unconfined gate (bypassPermissions: the user's explicit choice) reads and lists anywhere,
following links on the way as the system does; it still writes by temp file and rename, never
through a symlink in the last component, and never into the protected paths.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from shoal.core.beneath import DIR_REF, fd_path, is_link, open_beneath
from shoal.core.errors import ShoalError

READ_CAP_BYTES: Final = 8 * 1024 * 1024
READ_CAP_TEXT: Final = "8 MiB"

_DIR_LIST: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # to list
_READ: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
GIT_DIR: Final = ".git"
BRACE_LIMIT: Final = 64  # patterns one `{a,b}` expansion may give

Problem = Literal[
    "outside", "link", "missing", "directory", "special", "protected", "cap", "pattern", "other"
]


class GateError(ShoalError):
    """A path a file tool may not use; `problem` says which rule refused it."""

    def __init__(self, message: str, problem: Problem) -> None:
        super().__init__(message)
        self.problem = problem


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "regular file" if stat.S_ISREG(mode) else "special file"


# -- patterns ---------------------------------------------------------------------------------

_BRACES: Final = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """`*.{ts,tsx}` -> `*.ts`, `*.tsx` (unnested braces, at most BRACE_LIMIT patterns)."""
    out, todo = [], [pattern]
    while todo:
        item = todo.pop(0)
        match = _BRACES.search(item)
        if match is None:
            out.append(item)
        else:
            todo += [item[: match.start()] + alt + item[match.end() :]
                     for alt in match.group(1).split(",")]  # fmt: skip
        if len(out) + len(todo) > BRACE_LIMIT:
            raise GateError(f"pattern {pattern!r} expands to more than {BRACE_LIMIT}", "pattern")
    return out


def pattern_parts(pattern: str) -> tuple[str, ...]:
    """A glob pattern's components; absolute patterns and `..` are refused (a GateError for
    the model: the pattern is relative to the directory searched)."""
    if not pattern.strip():
        raise GateError("empty glob pattern; give one such as **/*.py", "pattern")
    if pattern.startswith(("/", "~")) or "\0" in pattern:
        raise GateError(
            f"glob pattern {pattern!r} is absolute; give the directory as `path` and a "
            "pattern relative to it",
            "pattern",
        )
    parts = tuple(p for p in pattern.split("/") if p not in ("", "."))
    if ".." in parts:
        raise GateError(
            f"glob pattern {pattern!r} has a `..` component; patterns match only beneath the "
            "directory searched (give another `path` instead)",
            "pattern",
        )
    return parts or ("*",)


@dataclass(frozen=True)
class Entry:
    """A regular file a walk found: its path as shown, and the descriptor of its directory
    (valid until the walk moves on) with its name there."""

    shown: Path
    dirfd: int
    name: str
    st: os.stat_result


def _walk(
    dirfd: int, prefix: Path, pats: tuple[str, ...], skip: frozenset[str], seen: set[Path]
) -> Iterator[Entry]:
    """Regular files under `dirfd` matching the components `pats` (`**`: any depth), never
    entering a symlink."""
    if not pats:
        return
    head, rest = pats[0], pats[1:]
    try:
        with os.scandir(dirfd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    files, dirs = [], []
    for e in entries:
        try:
            if e.is_symlink():
                continue
            if e.is_dir(follow_symlinks=False):
                dirs.append(e)
            elif e.is_file(follow_symlinks=False):
                files.append(e)
        except OSError:
            continue
    if head == "**":
        if rest:
            yield from _walk(dirfd, prefix, rest, skip, seen)
        else:
            yield from _found(files, prefix, dirfd, seen)
        descend = [(e, pats) for e in dirs if e.name not in skip]
    else:
        if not rest:
            yield from _found([e for e in files if fnmatch.fnmatchcase(e.name, head)], prefix,
                              dirfd, seen)  # fmt: skip
        descend = [
            (e, rest) for e in dirs if rest and e.name not in skip
            and fnmatch.fnmatchcase(e.name, head)
        ]  # fmt: skip
    for e, sub_pats in descend:
        try:
            sub = os.open(e.name, _DIR_LIST | os.O_NOFOLLOW, dir_fd=dirfd)
        except OSError:  # (gone, or swapped for a link meanwhile)
            continue
        try:
            yield from _walk(sub, prefix / e.name, sub_pats, skip, seen)
        finally:
            os.close(sub)


def _found(
    files: list[os.DirEntry[str]], prefix: Path, dirfd: int, seen: set[Path]
) -> Iterator[Entry]:
    for e in files:
        shown = prefix / e.name
        if shown in seen:
            continue
        seen.add(shown)
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        yield Entry(shown, dirfd, e.name, st)


def open_entry(entry: Entry) -> int | None:
    """A read descriptor of a walked file, or None when it is no longer a regular file."""
    try:
        fd = os.open(entry.name, _READ, dir_fd=entry.dirfd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


# -- the gate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spot:
    """A name placed: its absolute path as shown (lexical), the root it lies beneath (None
    for an unconfined gate) and its components below that root."""

    shown: Path
    root: Path | None
    parts: tuple[str, ...]


@dataclass(frozen=True)
class Read:
    """A file read through the gate: its bytes, its fstat and its real path."""

    data: bytes
    st: os.stat_result
    shown: Path
    real: Path


@dataclass(frozen=True)
class Written:
    """A file written through the gate: its real path, whether it existed, its new lstat."""

    shown: Path
    real: Path
    existed: bool
    st: os.stat_result


# Called before a write with the target's real path and its lstat (None: a new file); it
# raises to refuse (a stale Read, a lease).
WriteCheck = Callable[[Path, os.stat_result | None], None]


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


class PathGate:
    """Where one workspace's file tools may read and write.

    `base`: what relative names are joined to. `roots`: where the tools read and write;
    `read_only`: where they only read. `confined=False` drops the roots (reads anywhere).
    `protected`: never written (nor anything under them), except inside a root that lies
    strictly below one (a worktree or a scratchpad under SHOAL_HOME). `where` names the
    roots in errors. New files get `file_mode` (default 0666 less the umask), new
    directories `dir_mode`."""

    def __init__(
        self,
        base: Path,
        roots: Sequence[Path] = (),
        *,
        read_only: Sequence[Path] = (),
        confined: bool = True,
        protected: Sequence[Path] = (),
        where: str | None = None,
        file_mode: int = 0o666,
        dir_mode: int = 0o777,
    ) -> None:
        self.base = _real(base)
        self.roots = tuple(_real(r) for r in roots) or ((self.base,) if confined else ())
        self.read_only = tuple(_real(r) for r in read_only)
        self.confined = confined
        self.protected = tuple(_real(p) for p in protected)
        self.where = where or f"the working directory {self.base}"
        self.file_mode = file_mode
        self.dir_mode = dir_mode

    # -- placing --------------------------------------------------------------------------

    def locate(self, name: str) -> Spot:
        """Place `name`; a GateError when a confined gate has no root above it."""
        if not name or "\0" in name:
            raise GateError(f"bad path {name!r}", "other")
        full = os.path.normpath(os.path.join(self.base, os.path.expanduser(name)))
        shown = Path("/" + full.lstrip("/"))  # (normpath keeps a leading `//`)
        if not self.confined:
            return Spot(shown, None, ())
        roots = sorted((*self.roots, *self.read_only), key=lambda r: len(r.parts), reverse=True)
        for root in roots:
            if _within(shown, root):
                return Spot(shown, root, shown.relative_to(root).parts)
        raise GateError(f"{name} is outside {self.where}", "outside")

    def _outside_or_link(self, name: str, spot: Spot) -> GateError:
        """The error for a symlink in the way: where it leads, so the model can use that."""
        target = _real(spot.shown)
        if not any(_within(target, r) for r in (*self.roots, *self.read_only)):
            return GateError(f"{name} leads through a symlink outside {self.where}", "outside")
        return GateError(
            f"{name} leads through a symlink (to {target}); file tools do not follow "
            "symlinks: use the path it leads to",
            "link",
        )

    def _root_fd(self, root: Path) -> int:
        """The root, reopened by its real path with no symlink allowed on the way."""
        top = os.open("/", DIR_REF)
        try:
            return open_beneath(top, root.parts[1:], DIR_REF)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise GateError(
                    f"{root} changed since the workspace began (it is now a symlink, or "
                    "leads through one); refusing to use it",
                    "outside",
                ) from None
            if exc.errno == errno.ENOENT:
                raise GateError(f"{root} no longer exists", "missing") from None
            raise
        finally:
            os.close(top)

    def _open(self, name: str, spot: Spot, parts: tuple[str, ...], flags: int) -> int:
        """`parts` of `spot`'s root opened (confined), or its path (unconfined)."""
        if spot.root is None:
            return os.open(spot.shown.joinpath(*parts), flags | os.O_CLOEXEC)
        rfd = self._root_fd(spot.root)
        try:
            return open_beneath(rfd, parts, flags)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV):
                raise self._outside_or_link(name, spot) from None
            raise
        finally:
            os.close(rfd)

    def _parent(self, name: str, spot: Spot, *, create: bool = False) -> int:
        """A descriptor of the directory `spot` is in (made, with its parents, if `create`)."""
        if spot.root is None:
            parent = spot.shown.parent
            if create:
                self._make_dirs_unconfined(parent)
            return self._open(name, Spot(parent, None, ()), (), DIR_REF)
        try:
            return self._open(name, spot, spot.parts[:-1], DIR_REF)
        except FileNotFoundError:
            if not create:
                raise
        rfd = self._root_fd(spot.root)
        current = rfd
        try:
            for part in spot.parts[:-1]:
                try:
                    nxt = os.open(part, DIR_REF | os.O_NOFOLLOW, dir_fd=current)
                except FileNotFoundError:
                    self._refuse_protected(self._real_at(current, part), name)
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, self.dir_mode, dir_fd=current)
                    nxt = os.open(part, DIR_REF | os.O_NOFOLLOW, dir_fd=current)
                except OSError:
                    if is_link(current, part):
                        raise self._outside_or_link(name, spot) from None
                    raise
                if current != rfd:
                    os.close(current)
                current = nxt
            return os.dup(current)
        finally:
            if current != rfd:
                os.close(current)
            os.close(rfd)

    def _make_dirs_unconfined(self, parent: Path) -> None:
        missing: list[Path] = []
        at = parent
        while not os.path.lexists(at) and at != at.parent:
            missing.append(at)
            at = at.parent
        for path in reversed(missing):
            self._refuse_protected(_real(path.parent) / path.name, str(path))
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, self.dir_mode)

    @staticmethod
    def _real_at(dirfd: int, name: str) -> Path:
        where = fd_path(dirfd)
        return (where / name) if where is not None else Path(name)

    # -- protection ------------------------------------------------------------------------

    def protected_reason(self, real: Path) -> str | None:
        """Why `real` may never be written by a file tool, or None."""
        if any(part.casefold() == GIT_DIR for part in real.parts):
            return "it is inside a .git directory (git runs what is written there)"
        for guarded in self.protected:
            if not _within(real, guarded):
                continue
            if any(r != guarded and _within(r, guarded) and _within(real, r) for r in self.roots):
                continue  # (a root of this workspace inside the protected tree)
            return f"it is inside {guarded}, which agents' file tools never change"
        return None

    def _refuse_protected(self, real: Path, name: str) -> None:
        reason = self.protected_reason(real)
        if reason is not None:
            raise GateError(f"{name} may not be written: {reason}", "protected")

    # -- reading ---------------------------------------------------------------------------

    def open_file(self, name: str) -> tuple[int, Spot]:
        """A read descriptor of the regular file `name`; a FIFO, socket or device is refused
        (looked at before it is opened, and opened non-blocking, so nothing waits)."""
        spot = self.locate(name)
        if spot.root is not None and not spot.parts:
            raise GateError(f"{spot.shown} is a directory", "directory")
        try:
            if spot.root is None:
                try:
                    before = os.stat(spot.shown)
                except FileNotFoundError:
                    raise GateError(f"file not found: {spot.shown}", "missing") from None
                self._refuse_special(spot.shown, before)
                fd = os.open(spot.shown, (_READ & ~os.O_NOFOLLOW))
            else:
                pfd = self._parent(name, spot)
                try:
                    last = spot.parts[-1]
                    try:
                        before = os.stat(last, dir_fd=pfd, follow_symlinks=False)
                    except FileNotFoundError:
                        raise GateError(f"file not found: {spot.shown}", "missing") from None
                    if stat.S_ISLNK(before.st_mode):
                        raise self._outside_or_link(name, spot)
                    self._refuse_special(spot.shown, before)
                    fd = os.open(last, _READ, dir_fd=pfd)
                finally:
                    os.close(pfd)
        except FileNotFoundError:
            raise GateError(f"file not found: {spot.shown}", "missing") from None
        except NotADirectoryError:
            raise GateError(
                f"file not found: {spot.shown} (a parent is a file)", "missing"
            ) from None
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (
            before.st_dev,
            before.st_ino,
        ):
            os.close(fd)
            raise GateError(f"{spot.shown} changed while it was opened; try again", "special")
        return fd, spot

    @staticmethod
    def _refuse_special(shown: Path, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            raise GateError(f"{shown} is a directory", "directory")
        if not stat.S_ISREG(st.st_mode):
            raise GateError(
                f"{shown} is a {_kind(st.st_mode)}, not a regular file; file tools read "
                "only regular files",
                "special",
            )

    def read(self, name: str, cap: int = READ_CAP_BYTES) -> Read:
        """The bytes of the regular file `name`, at most `cap` of them (a GateError naming
        the cap when it is larger)."""
        fd, spot = self.open_file(name)
        try:
            st = os.fstat(fd)
            too_big = GateError(
                f"{spot.shown} is {st.st_size:,} bytes, over the {READ_CAP_TEXT} cap of the "
                "file tools; search it with Grep, or read a part with Bash (head, sed -n)",
                "cap",
            )
            if st.st_size > cap:
                raise too_big
            chunks, size = [], 0
            while chunk := os.read(fd, min(1 << 20, cap + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    raise too_big  # (it grew while read)
            real = fd_path(fd) or _real(spot.shown)
            return Read(b"".join(chunks), st, spot.shown, real)
        finally:
            os.close(fd)

    def files(
        self,
        name: str | None,
        pattern: str,
        *,
        skip: frozenset[str] = frozenset(),
        anywhere: bool = False,
    ) -> Iterator[Entry]:
        """Regular files under directory `name` (the base when None) whose path below it
        matches the glob `pattern` (`**` any depth, `{a,b}` alternatives; `anywhere`: at any
        depth, as `**/pattern`); no symlink is entered or listed, and directories named in
        `skip` are not entered. A GateError for an absolute pattern or one with `..`."""
        lead = ("**",) if anywhere else ()
        patterns = [(*lead, *pattern_parts(p)) for p in expand_braces(pattern)]
        where = name if name is not None else str(self.base)
        spot = self.locate(where)
        try:
            dfd = self._open(where, spot, spot.parts, _DIR_LIST)
        except FileNotFoundError:
            raise GateError(f"path not found: {spot.shown}", "missing") from None
        except NotADirectoryError:
            raise GateError(f"{spot.shown} is not a directory", "directory") from None
        try:
            seen: set[Path] = set()
            for parts in patterns:
                yield from _walk(dfd, spot.shown, parts, skip, seen)
        finally:
            os.close(dfd)

    # -- writing ---------------------------------------------------------------------------

    def write(
        self, name: str, data: bytes, *, check: WriteCheck | None = None, parents: bool = True
    ) -> Written:
        """Replace (or create) the regular file `name` with `data`: a temp file beside it,
        fsynced, renamed over it through its directory's descriptor. A symlink or anything
        else than a regular file at the target is refused; `check` sees the real target and
        its lstat first. An existing file keeps its mode (less setuid/setgid) and owner."""
        spot = self.locate(name)
        if spot.root is not None and spot.root in self.read_only:
            raise GateError(f"{spot.shown} is read-only here", "protected")
        if (spot.root is not None and not spot.parts) or spot.shown == Path("/"):
            raise GateError(f"{spot.shown} is a directory", "directory")
        self._refuse_protected(spot.shown, name)  # (before a parent is made; again below)
        try:
            pfd = self._parent(name, spot, create=parents)
        except FileNotFoundError:
            raise GateError(f"directory not found: {spot.shown.parent}", "missing") from None
        except NotADirectoryError:
            raise GateError(f"{spot.shown.parent} is not a directory", "directory") from None
        try:
            last = spot.shown.name
            where = fd_path(pfd)
            real = (where if where is not None else _real(spot.shown.parent)) / last
            self._refuse_protected(real, name)
            try:
                st: os.stat_result | None = os.stat(last, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                if spot.root is not None:
                    raise self._outside_or_link(name, spot)
                raise GateError(
                    f"{spot.shown} is a symlink (to {_real(spot.shown)}); file tools do not "
                    "write through links: write the path it leads to",
                    "link",
                )
            if st is not None:
                self._refuse_special(spot.shown, st)
            if check is not None:
                check(real, st)
            self._replace(pfd, last, data, st)
            return Written(spot.shown, real, st is not None,
                           os.stat(last, dir_fd=pfd, follow_symlinks=False))  # fmt: skip
        finally:
            os.close(pfd)

    def _replace(self, pfd: int, last: str, data: bytes, old: os.stat_result | None) -> None:
        tmp = f".{last[:200]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        # (an existing file's new text is never readable by more than its old mode allowed)
        fd = os.open(tmp, flags, 0o600 if old is not None else self.file_mode, dir_fd=pfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if old is not None:
                    os.fchmod(fd, stat.S_IMODE(old.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                        with contextlib.suppress(OSError):  # (only root may give it back)
                            os.fchown(fd, old.st_uid, old.st_gid)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, last, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            raise
