"""Errors that reach the user: one line naming the thing and the fix, with an exit code."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Exit codes of the CLI contract.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_FAILED: "a task failed, or a check refused (no team, no leader running, a name taken, "
    "a claim refused, a corrupt file)",
    EXIT_USAGE: "usage or spec error: an unknown command or option, a bad value, an unknown or "
    "ambiguous task id",
    EXIT_TIMEOUT: "`wait --timeout` expired (`shoal run`: only timeouts kept it from green)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
"""What each exit code of every command means (the exit-code table of the docs is this one);
`sh --foreground` and `logs ID` exit with the task's own code instead, and `shoal run` adds 3
(the run itself could not do its job)."""


class ShoalError(Exception):
    """Base of every error shoal reports to a user; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_FAILED


class TimedOutError(ShoalError):
    """A wait ran out of time (`shoal wait --timeout`): exit 124, as `timeout` does."""

    exit_code = EXIT_TIMEOUT


class UsageError(ShoalError):
    """The caller asked for something malformed (bad name, bad JSON argument)."""

    exit_code = EXIT_USAGE


class InvalidNameError(UsageError):
    """A team or member name does not match the allowed pattern."""


class NotFoundError(ShoalError):
    """A team, member, task or file that was named does not exist."""


class UnknownTaskError(UsageError, NotFoundError):
    """A task id (or prefix) that names no task of the session: a usage error (exit 2), as an
    ambiguous prefix is, with one wording whichever command was given it."""

    def __init__(self, given: str, team: str | None = None, *, what: str = "task") -> None:
        self.given = given
        where = f"team {team!r}" if team is not None else "this session"
        super().__init__(f"no {what} {given!r} in {where} (see `shoal ps --all`)")


class ConflictError(ShoalError):
    """A check refused the request (name taken, members still active, task claimed)."""


class UnsafePathError(ShoalError):
    """A path component is a symlink or has the wrong type; shoal refuses to follow it."""


class CorruptFileError(ShoalError):
    """A file on disk failed validation; it is reported and never overwritten."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason} (the file was left untouched; fix or move it aside)")


class MessageTooLargeError(UsageError):
    """A message exceeds the mailbox size cap."""


class UnknownRecipientError(ShoalError):
    """A message names a recipient that is not a member (no phantom inboxes)."""


class TaskError(ShoalError):
    """A task request was refused (unknown task, already finished, bad command)."""


# errno values that mean the filesystem has no room for what is being written.
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(exc: BaseException) -> bool:
    """True for an OSError saying the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS


class NoSpaceError(ShoalError):
    """A write found the filesystem full (ENOSPC) or the quota used up (EDQUOT).

    Raised by the write helpers of core/jsonio.py once they have removed what they began (a
    temp file, a torn line), so the caller's old file is intact and nothing is half written.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, quota: bool = False, what: str = ""
    ) -> None:
        self.path = Path(path)
        self.quota = quota
        where = f"{what} {self.path}" if what else str(self.path)
        cause = (
            "no space left on device (disk quota exceeded)" if quota else "no space left on device"
        )
        super().__init__(f"{cause} writing {where} (free some space and retry)")

    @classmethod
    def from_os_error(
        cls, exc: OSError, path: str | os.PathLike[str], *, what: str = ""
    ) -> NoSpaceError:
        """The NoSpaceError for `exc` (ENOSPC or EDQUOT) met while writing `path`."""
        return cls(path, quota=exc.errno == errno.EDQUOT, what=what)
