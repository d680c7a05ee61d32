"""What a dream works on: the memory directory, its consolidation lock, and the sessions since
the last consolidation.

The memory directory is the project's `.shoal/memory/` when it exists, else
`SHOAL_HOME/memory/`; a memory directory that is a symlink is refused (a dream would write
wherever it points). Its `.consolidate.lock` has two jobs: its mtime is the time of the last
consolidation (0: never), and its body names the dream that holds it, so two dreams never run
at once, in one leader or in two. The body is read and written in place under `flock` of the
file itself (a rename would give the next taker another inode to lock); the mtime is set with
`utime`: taking the lock records the mtime it had (`prior_mtime`, in the task and in the
body) and stamps now, a completed dream stamps its end, and a dream that is killed, fails or
dies puts `prior_mtime` back: the next session retries. A lock taken over from a dead holder
that nobody rolled back inherits that holder's `prior_mtime`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson

from shoal.core.config import config_value
from shoal.core.errors import TaskError, UnsafePathError, UsageError
from shoal.core.paths import DIR_MODE, FILE_MODE, check_path, ensure_dir
from shoal.core.procs import is_alive

MEMORY_DIR: Final = "memory"
PROJECT_MEMORY: Final = Path(".shoal") / MEMORY_DIR
LOCK_NAME: Final = ".consolidate.lock"
DEFAULT_MIN_SESSIONS: Final = 5
DEFAULT_MIN_HOURS: Final = 24.0
NEVER: Final = 0.0  # the lock's mtime when no dream has ever completed


class DreamBusyError(TaskError):
    """Another dream holds the consolidation lock."""


def memory_dir(home: Path, project: Path | None) -> Path:
    """The directory a dream rewrites: `project/.shoal/memory` when it exists (a symlink
    there counts, and is refused by `check_memory_dir`), else `home/memory`."""
    if project is not None:
        candidate = project / PROJECT_MEMORY
        if os.path.lexists(candidate):
            return Path(os.path.abspath(candidate))
    return home / MEMORY_DIR


def check_memory_dir(path: Path, home: Path) -> Path:
    """`path`, a real directory (created 0700 when missing); UnsafePathError when it, or a
    directory on the way to it below the home, is a symlink or not a directory. Nothing is
    written before this passes."""
    try:
        st = check_path(path, "dir")
    except UnsafePathError as exc:
        raise UnsafePathError(
            f"memory directory {path} is not usable: {exc}; a dream writes only into a real "
            "directory"
        ) from None
    if st is not None:
        return path
    if path.is_relative_to(home):
        ensure_dir(path, home)
    else:
        check_path(path.parent, "dir")
        path.mkdir(mode=DIR_MODE, exist_ok=True)
        check_path(path, "dir")
    return path


# -- the lock -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """Who holds the lock: a dream task, its leader and (once started) its runner."""

    task_id: str
    team: str
    pid: int
    pid_started_at: float | None
    runner_pid: int | None = None
    runner_started_at: float | None = None
    prior_mtime: float | None = None
    """The lock's mtime before it took it (what a dream that never completes puts back)."""

    def alive(self) -> bool:
        """True while its leader or its runner still runs."""
        return is_alive(self.pid, self.pid_started_at) or (
            self.runner_pid is not None and is_alive(self.runner_pid, self.runner_started_at)
        )

    def describe(self) -> str:
        runner = f", runner pid {self.runner_pid}" if self.runner_pid else ""
        return f"{self.task_id} (team {self.team}, leader pid {self.pid}{runner})"

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        """The holder a lock body names; None for an empty or unreadable body (free)."""
        try:
            data = orjson.loads(raw) if raw.strip() else None
            return cls(**data) if isinstance(data, dict) else None
        except (orjson.JSONDecodeError, TypeError):
            return None

    def dump(self) -> bytes:
        return orjson.dumps(self.__dict__)


class ConsolidationLock:
    """`memory/.consolidate.lock` (see the module docstring)."""

    def __init__(self, memory: Path) -> None:
        self.path = memory / LOCK_NAME

    def last_consolidated(self) -> float | None:
        """When the last dream completed (the lock's mtime), None if never."""
        try:
            st = check_path(self.path, "file")
        except UnsafePathError:
            return None
        return st.st_mtime if st is not None and st.st_mtime > NEVER else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        try:
            fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"{self.path} is a symlink; refusing to follow it") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _holder(fd: int) -> Holder | None:
        return Holder.parse(os.pread(fd, 4096, 0))

    @staticmethod
    def _write(fd: int, body: bytes, mtime: float) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, body, 0)
        os.utime(fd, (mtime, mtime))

    def holder(self) -> Holder | None:
        """The dream that holds the lock now, if any (a dead holder does not count)."""
        if check_path(self.path, "file") is None:
            return None
        with self._locked() as fd:
            found = self._holder(fd)
        return found if found is not None and found.alive() else None

    def acquire(
        self, holder: Holder, stale: Callable[[Holder], bool] | None = None
    ) -> float | None:
        """Take the lock for `holder` and stamp now; returns the mtime it had (None: never
        consolidated), or, taken from a dead holder, the one that holder had found.
        DreamBusyError naming the holder when a live dream has it (`stale` may declare a
        holder dead that still looks alive: a dream its own leader has settled)."""
        existed = check_path(self.path, "file") is not None
        with self._locked() as fd:
            st = os.fstat(fd)
            current = self._holder(fd)
            if current is not None and current.alive() and not (stale and stale(current)):
                raise DreamBusyError(
                    f"a dream is already running: {current.describe()}; it holds {self.path} "
                    f"(`shoal stop {current.task_id}` in team {current.team} ends it)"
                )
            if current is not None:  # a dead holder's stamp is no consolidation: its prior is
                prior = current.prior_mtime
            else:
                prior = st.st_mtime if existed and st.st_mtime > NEVER else None
            taken = Holder(**{**holder.__dict__, "prior_mtime": prior})
            self._write(fd, taken.dump(), time.time())
        return prior

    def started(self, task_id: str, runner_pid: int, runner_started_at: float | None) -> None:
        """Record the runner of the dream holding the lock (its liveness counts too)."""
        with self._locked() as fd:
            current = self._holder(fd)
            if current is None or current.task_id != task_id:
                return
            st = os.fstat(fd)
            updated = Holder(
                **{
                    **current.__dict__,
                    "runner_pid": runner_pid,
                    "runner_started_at": runner_started_at,
                }
            )
            self._write(fd, updated.dump(), st.st_mtime)

    def release(self, task_id: str, mtime: float | None) -> bool:
        """Free the lock held by `task_id`, its mtime set to `mtime` (a completed dream: its
        end; otherwise the prior mtime, None meaning never). False when it does not hold it
        (nothing is changed then: another dream took it, or it was released before — a
        second release must not roll back a stamp a later dream left)."""
        if check_path(self.path, "file") is None:
            return False
        with self._locked() as fd:
            current = self._holder(fd)
            if current is None or current.task_id != task_id:
                return False
            self._write(fd, b"", NEVER if mtime is None else mtime)
        return True


# -- sessions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionFiles:
    """One session's files a dream reads: its transcripts and its event stream."""

    session_id: str
    path: Path
    transcripts: tuple[Path, ...]
    events: Path | None
    touched: float
    """The newest mtime of those files: when the session last did something."""


def _regular(path: Path) -> bool:
    try:
        return check_path(path, "file") is not None
    except UnsafePathError:
        return False


def session_files(path: Path) -> SessionFiles | None:
    """The transcripts and events of the session at `path`; None when it has neither (or
    `path` is a symlink: a planted link is not read)."""
    try:
        if check_path(path, "dir") is None:
            return None
    except UnsafePathError:
        return None
    transcripts: tuple[Path, ...] = ()
    tdir = path / "transcripts"
    with contextlib.suppress(OSError, UnsafePathError):
        if check_path(tdir, "dir") is not None:
            transcripts = tuple(sorted(p for p in tdir.glob("*.jsonl") if _regular(p)))
    events = path / "events.jsonl"
    has_events = _regular(events)
    files = [*transcripts, *([events] if has_events else [])]
    if not files:
        return None
    touched = max(os.lstat(p).st_mtime for p in files)
    return SessionFiles(path.name, path, transcripts, events if has_events else None, touched)


def sessions_since(sessions_root: Path, since: float | None) -> list[SessionFiles]:
    """The sessions that did something after `since` (all, when None), oldest first. The
    leader's own counts too: a team's leader resumes one session across restarts."""
    found: list[SessionFiles] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(sessions_root):
            files = session_files(Path(entry.path))
            if files is not None and (since is None or files.touched > since):
                found.append(files)
    found.sort(key=lambda s: (s.touched, s.session_id))
    return found


# -- the automatic dream --------------------------------------------------------------------


@dataclass(frozen=True)
class DreamConfig:
    """The `auto_dream`, `dream_min_sessions` and `dream_min_hours` of config.toml."""

    auto: bool = False
    min_sessions: int = DEFAULT_MIN_SESSIONS
    min_hours: float = DEFAULT_MIN_HOURS

    @classmethod
    def load(cls, home: Path) -> DreamConfig:
        auto = config_value(home, "auto_dream", bool, "true or false")
        sessions = config_value(home, "dream_min_sessions", int, "a whole number like 5")
        hours = config_value(home, "dream_min_hours", (int, float), "a number of hours like 24")
        for key, value in (("dream_min_sessions", sessions), ("dream_min_hours", hours)):
            if value is not None and (isinstance(value, bool) or value < 0):
                raise UsageError(f"{home / 'config.toml'}: {key} must not be negative")
        return cls(
            auto=bool(auto),
            min_sessions=DEFAULT_MIN_SESSIONS if sessions is None else int(sessions),
            min_hours=DEFAULT_MIN_HOURS if hours is None else float(hours),
        )


def auto_dream_due(
    config: DreamConfig, memory: Path, sessions_root: Path, *, now: float
) -> str | None:
    """Why an automatic dream is due now (e.g. "6 sessions and 30 hours since the last
    consolidation"), or None when it is not: `auto_dream` off, too soon, or too few sessions."""
    if not config.auto:
        return None
    last = ConsolidationLock(memory).last_consolidated()
    hours = (now - last) / 3600 if last is not None else None
    if hours is not None and hours < config.min_hours:
        return None
    count = len(sessions_since(sessions_root, last))
    if count < config.min_sessions:
        return None
    if hours is None:
        return f"{count} sessions and no consolidation yet"
    return f"{count} sessions and {hours:.0f} hours since the last consolidation"
