"""Where things live under SHOAL_HOME, and safe creation of directories below it.

Every directory shoal creates is 0700 and every component below the home is checked not to be
a symlink, so a planted link can never redirect a write. The home, the directories above it,
`teams/`, `sessions/` and every inbox on the way to a message are refused unless they are the
user's and no one else can write in them (OpenSSH's StrictModes): another user who could
write there could drive the leader.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path
from typing import Literal

from shoal.core.errors import UnsafePathError, UsageError
from shoal.core.names import validate_name

SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

DIR_MODE = 0o700
FILE_MODE = 0o600

PathKind = Literal["file", "dir"]


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The shoal home: `home`, else $SHOAL_HOME, else ~/.shoal (symlinks in it resolved)."""
    raw = home if home is not None else os.environ.get("SHOAL_HOME") or Path.home() / ".shoal"
    return Path(os.path.realpath(os.path.expanduser(os.fspath(raw))))


def unsafe_reason(st: os.stat_result, kind: PathKind | None = None) -> str | None:
    """Why a path whose lstat is `st` must not be used (as `kind`, when given), or None.

    The one symlink check: every lstat-based refusal in shoal words it through here.
    """
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink; refusing to follow it"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if kind == "dir" and not stat.S_ISDIR(st.st_mode):
        return "exists and is not a directory"
    return None


def ownership_reason(
    path: str | os.PathLike[str], st: os.stat_result, *, above_home: bool = False
) -> str | None:
    """Why a directory whose lstat is `st` must not be trusted with shoal's files, or None.

    It must be owned by this user and writable by no one else. A directory above the home may
    also be root's, and may be writable by others when its sticky bit is set (as /tmp is):
    others can then add entries but not rename or remove ours.
    """
    uid = os.geteuid()
    if st.st_uid != uid and not (above_home and st.st_uid == 0):
        return (
            f"{os.fspath(path)} is owned by uid {st.st_uid}, not by you (uid {uid}); another user "
            f"could drive shoal through it: make it yours (`chown {uid} "
            f"{shlex.quote(os.fspath(path))}`) or use a SHOAL_HOME of your own"
        )
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (above_home and st.st_mode & stat.S_ISVTX):
        who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}.get(writable, "group and others")
        return (
            f"{os.fspath(path)} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); "
            "another user could drive shoal through it: run "
            f"`chmod go-w {shlex.quote(os.fspath(path))}`"
        )
    return None


def check_owned(
    path: str | os.PathLike[str], st: os.stat_result, *, above_home: bool = False
) -> None:
    """Raise UnsafePathError when `ownership_reason` refuses `path` (its lstat `st`)."""
    reason = ownership_reason(path, st, above_home=above_home)
    if reason is not None:
        raise UnsafePathError(reason)


_CHECKED_HOMES: set[str] = set()


def check_home(home: Path) -> Path:
    """Refuse a home that another user could write in: the directories above it (each the
    user's or root's, and not writable by others unless sticky), the home itself, `teams/`
    and `sessions/` (each the user's, writable by no one else). UnsafePathError names the
    path and the command that fixes it. A few lstat calls, once per home per process; what
    does not exist yet is created 0700 by shoal."""
    key = os.fspath(home)
    if key in _CHECKED_HOMES:
        return home
    parts = key.split("/")
    for end in range(1, len(parts)):  # "/", "/tmp", ... up to the home's parent
        parent = "/".join(parts[:end]) or "/"
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            break  # (shoal makes the rest)
        check_owned(parent, st, above_home=True)
    for path in (key, f"{key}/teams", f"{key}/sessions"):
        found = check_path(path, "dir")
        if found is None:
            if path == key:
                break  # (nothing below a missing home either)
            continue
        check_owned(path, found)
    _CHECKED_HOMES.add(key)
    return home


def check_path(path: str | os.PathLike[str], kind: PathKind | None = None) -> os.stat_result | None:
    """lstat `path` and refuse a symlink (or, with `kind`, anything else than that kind) with
    UnsafePathError naming it; None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    reason = unsafe_reason(st, kind)
    if reason is not None:
        raise UnsafePathError(f"{os.fspath(path)} {reason} (remove it)")
    return st


def check_no_symlink(path: Path, root: Path) -> None:
    """Raise UnsafePathError if any existing component of `path` below `root` is a symlink."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if check_path(current) is None:
            return


def ensure_dir(path: Path, root: Path, *, strict: bool = False) -> Path:
    """Create `path` (and parents up from `root`) as 0700 directories, refusing symlinks.

    `strict`: every existing directory on the way (not `root`) must also be the user's and
    writable by no one else (`check_owned`), as an inbox's must: the check costs nothing more
    than the lstat already made.
    """
    current = root
    parts = path.relative_to(root).parts
    if not os.path.isdir(root):
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    for part in parts:
        current = current / part
        found = check_path(current, "dir")
        if found is None:
            try:
                os.mkdir(current, DIR_MODE)
                continue
            except FileExistsError:  # made by someone else meanwhile: check what it is
                found = check_path(current, "dir")
        if strict and found is not None:
            check_owned(current, found)
    return path


class Layout:
    """The disk layout of one SHOAL_HOME (see DESIGN.md); pure path arithmetic, no I/O."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.home = resolve_home(home)

    @property
    def teams_dir(self) -> Path:
        return self.home / "teams"

    @property
    def sessions_dir(self) -> Path:
        return self.home / "sessions"

    def team_dir(self, team: str) -> Path:
        return self.teams_dir / validate_name(team, "team name")

    def team_file(self, team: str) -> Path:
        return self.team_dir(team) / "team.json"

    def inboxes_dir(self, team: str) -> Path:
        return self.team_dir(team) / "inboxes"

    def inbox_dir(self, team: str, member: str) -> Path:
        return self.inboxes_dir(team) / validate_name(member, "member name")

    def status_dir(self, team: str) -> Path:
        return self.team_dir(team) / "status"

    def tasklist_dir(self, team: str) -> Path:
        return self.team_dir(team) / "tasklist"

    def scratchpad_dir(self, team: str) -> Path:
        return self.team_dir(team) / "scratchpad"

    def worktrees_dir(self, team: str) -> Path:
        return self.team_dir(team) / "worktrees"

    def session_dir(self, session: str) -> Path:
        if not SESSION_ID.fullmatch(session):
            raise UsageError(f"invalid session id {session!r} (letters, digits, '-' and '_')")
        return self.sessions_dir / session

    def check(self) -> Layout:
        """This layout, once its home passes `check_home` (UnsafePathError naming the fix)."""
        check_home(self.home)
        return self

    def ensure(self, path: Path) -> Path:
        """Create directory `path` under the home safely (0700, no symlinks)."""
        return ensure_dir(path, self.home)

    def checked(self, path: Path) -> Path:
        """`path`, once no existing component of it below the home is a symlink (else
        UnsafePathError naming the link): for entering what shoal did not just create."""
        check_no_symlink(path, self.home)
        return path
