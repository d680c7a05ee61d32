"""Project trust: a project's files that run code or widen what agents may do are used only
in a directory the user trusted.

Those files are `.shoal/mcp.json` and `.mcp.json` (MCP servers: commands run as the user) and
the agent definitions in `.shoal/agents/` and `.claude/agents/` (prompts, tools, models and
permission modes). `shoal trust DIR` records, in `SHOAL_HOME/trust.json`, the directory's
real path and a sha256 digest over those files' relative paths and contents; any change to
them (a file edited, added or removed) makes the directory untrusted again until it is
trusted anew. Nothing is followed: a symlink among them (or a symlinked `.shoal/`,
`.claude/` or definitions directory) is hashed as a link and never used, trusted or not.

The files are read once, here (`scan`), and what is used is what was hashed: the loaders
parse the bytes of the scan, so a file swapped after the check is not the one loaded.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shlex
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from shoal.core.errors import NotFoundError
from shoal.core.jsonio import atomic_write, dumps, lock_for, read_model
from shoal.core.paths import ensure_dir

TRUST_FILE: Final = "trust.json"
MCP_FILES: Final = (".shoal/mcp.json", ".mcp.json")
DEFINITION_DIRS: Final = (".claude/agents", ".shoal/agents")
DEFINITION_SOURCES: Final = tuple(f"{d}/" for d in DEFINITION_DIRS)
AGENT_SOURCES: Final = (".shoal/mcp.json", *DEFINITION_SOURCES)
"""What an agent uses of a project (`.mcp.json` is `shoal monitor`'s)."""
MONITOR_SOURCES: Final = (".mcp.json", ".shoal/mcp.json")
FILE_CAP: Final = 1 << 20
"""A project file larger than this (1 MiB) is never used (no definition or config is)."""
_SYMLINK = "a symlink (never followed: copy the file in, or put it in SHOAL_HOME)"


@dataclass(frozen=True)
class ProjectFile:
    """One of a project's trust-relevant files, as scanned."""

    path: str  # relative to the project, with `/`
    data: bytes | None  # None: never used (see `refused`)
    refused: str | None = None  # why it is never used, trusted or not
    link: str | None = None  # a symlink's target (hashed instead of content)


@dataclass(frozen=True)
class Project:
    """The trust-relevant files of a directory and their digest."""

    directory: Path  # as given (the loaders name files by it)
    root: Path  # its real path (what trust is recorded for)
    files: tuple[ProjectFile, ...]
    digest: str

    def select(self, sources: Iterable[str]) -> tuple[ProjectFile, ...]:
        """The files among `sources` (a file's path, or a directory's ending in `/`)."""
        wanted = tuple(sources)
        return tuple(f for f in self.files if any(_covers(s, f.path) for s in wanted))


def _covers(source: str, path: str) -> bool:
    return path.startswith(source) if source.endswith("/") else path == source


@dataclass(frozen=True)
class ProjectView:
    """A project as one run may use it: its files when trusted, none when not."""

    project: Project
    trusted: bool

    @property
    def directory(self) -> Path:
        return self.project.directory

    @property
    def root(self) -> Path:
        return self.project.root

    def usable(self, source: str) -> tuple[ProjectFile, ...]:
        """The files under `source` this run may use (none in an untrusted project)."""
        if not self.trusted:
            return ()
        return tuple(f for f in self.project.select((source,)) if f.data is not None)

    def data(self, path: str) -> bytes | None:
        """The content of file `path` when this run may use it."""
        found = self.usable(path)
        return found[0].data if found else None

    def left_out(self, sources: Iterable[str]) -> tuple[str, ...]:
        """The files among `sources` this run goes without (untrusted, or refused)."""
        return tuple(
            f.path for f in self.project.select(sources) if not self.trusted or f.data is None
        )

    @property
    def granted(self) -> str | None:
        """The digest a child run may carry on (None: nothing trusted, or nothing to trust)."""
        return self.project.digest if self.trusted and self.project.files else None


class TrustEntry(BaseModel):
    """One trusted directory: the digest of its files when it was trusted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    files: list[str] = Field(default_factory=list)
    trusted_at: str


class TrustStore(BaseModel):
    """`SHOAL_HOME/trust.json`: the trusted directories by real path."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    projects: dict[str, TrustEntry] = Field(default_factory=dict)


# -- scanning ----------------------------------------------------------------------------


def scan(directory: Path, home: Path | None = None) -> Project:
    """Read a directory's trust-relevant files (no symlink followed) and digest them.

    A `.shoal/` that is `home` itself (a project at `~` with the default SHOAL_HOME) is the
    user's own and not scanned: its definitions are read as SHOAL_HOME's."""
    root = Path(os.path.realpath(directory))
    files: list[ProjectFile] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return _project(directory, root, files)
    try:
        for top in (".shoal", ".claude"):
            fd = _open_dir(root_fd, top, files, top)
            if fd is None:
                continue
            try:
                if top == ".shoal" and home is not None and _same(fd, home):
                    continue
                if top == ".shoal":
                    _file(fd, "mcp.json", ".shoal/mcp.json", files)
                sub = _open_dir(fd, "agents", files, f"{top}/agents")
                if sub is not None:
                    try:
                        _every_file(sub, f"{top}/agents", files)
                    finally:
                        os.close(sub)
            finally:
                os.close(fd)
        _file(root_fd, ".mcp.json", ".mcp.json", files)
    finally:
        os.close(root_fd)
    return _project(directory, root, files)


def _project(directory: Path, root: Path, files: list[ProjectFile]) -> Project:
    files.sort(key=lambda f: f.path)
    digest = hashlib.sha256()
    for f in files:
        if f.data is not None:
            kind, payload = b"file", f.data
        elif f.link is not None:
            kind, payload = b"link", os.fsencode(f.link)
        else:
            kind, payload = b"other", (f.refused or "").encode()
        digest.update(b"%s\0%s\0%d\0" % (f.path.encode(), kind, len(payload)))
        digest.update(payload)
    return Project(directory, root, tuple(files), f"sha256:{digest.hexdigest()}")


def _same(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _open_dir(parent: int, name: str, files: list[ProjectFile], rel: str) -> int | None:
    """A directory's fd (never through a symlink; a symlink is recorded as refused)."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _not_followed(parent, name, rel, files)
        return None


def _not_followed(parent: int, name: str, rel: str, files: list[ProjectFile]) -> None:
    try:
        st = os.lstat(name, dir_fd=parent)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        files.append(ProjectFile(rel, None, _SYMLINK, os.readlink(name, dir_fd=parent)))


def _every_file(fd: int, rel: str, files: list[ProjectFile]) -> None:
    """Every entry of a definitions directory but its subdirectories (nothing reads those)."""
    for entry in sorted(_entries(fd)):
        try:
            st = os.lstat(entry, dir_fd=fd)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            _file(fd, entry, f"{rel}/{entry}", files)


def _entries(fd: int) -> Iterator[str]:
    with os.scandir(fd) as it:
        for entry in it:
            yield entry.name


def _file(parent: int, name: str, rel: str, files: list[ProjectFile]) -> None:
    """Read one file into `files` (a symlink, a FIFO, a device or a too-large file is recorded
    as refused; nothing there, nothing recorded)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _not_followed(parent, name, rel, files)
        elif exc.errno not in (errno.ENOTDIR, errno.EISDIR):
            files.append(ProjectFile(rel, None, f"unreadable ({exc.strerror})"))
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return
        if not stat.S_ISREG(st.st_mode):
            files.append(ProjectFile(rel, None, "not a regular file"))
            return
        if st.st_size > FILE_CAP:
            files.append(ProjectFile(rel, None, f"larger than {FILE_CAP} bytes"))
            return
        chunks = []
        left = FILE_CAP + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > FILE_CAP:
            files.append(ProjectFile(rel, None, f"larger than {FILE_CAP} bytes"))
            return
        files.append(ProjectFile(rel, data))
    except OSError as exc:
        files.append(ProjectFile(rel, None, f"unreadable ({exc.strerror})"))
    finally:
        os.close(fd)


# -- the store ---------------------------------------------------------------------------


def store_path(home: Path) -> Path:
    return home / TRUST_FILE


def load_store(home: Path) -> TrustStore:
    """The trust store (empty when there is none); a malformed one raises CorruptFileError
    naming it (every project is untrusted until it is fixed or moved aside)."""
    try:
        return read_model(store_path(home), TrustStore, "trust store")
    except NotFoundError:
        return TrustStore()


def record(home: Path, project: Project) -> TrustEntry:
    """Trust `project`'s directory with its files as they are now."""
    entry = TrustEntry(
        digest=project.digest,
        files=[f.path for f in project.files],
        trusted_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    _update(home, lambda projects: {**projects, str(project.root): entry})
    return entry


def revoke(home: Path, directory: Path) -> str:
    """Forget a trusted directory (by its real path, or as recorded); returns the path
    removed; NotFoundError when it was not trusted."""
    store = load_store(home)
    candidates = (os.path.realpath(directory), os.path.abspath(directory))
    found = next((c for c in candidates if c in store.projects), None)
    if found is None:
        raise NotFoundError(f"{candidates[0]} is not trusted (see `shoal trust --list`)")
    _update(home, lambda projects: {k: v for k, v in projects.items() if k != found})
    return found


def _update(home: Path, change: Callable[[dict[str, TrustEntry]], dict[str, TrustEntry]]) -> None:
    """Read-modify-write the store under its lock (0600, by temp file and rename)."""
    ensure_dir(home, home)
    path = store_path(home)
    with lock_for(path):
        store = load_store(home)
        new = TrustStore(projects=change(dict(store.projects)))
        atomic_write(path, dumps(new, pretty=True))


def is_trusted(home: Path, project: Project, granted: str | None = None) -> bool:
    """Whether `project`'s files may be used: nothing to trust, `granted` (a digest trusted
    for this run: `--trust`, or a parent's) is theirs, or the store records them as they are."""
    if not project.files or granted == project.digest:
        return True
    entry = load_store(home).projects.get(str(project.root))
    return entry is not None and entry.digest == project.digest


def view(home: Path, directory: Path, granted: str | None = None) -> ProjectView:
    """Scan `directory` and decide whether this run may use its files."""
    project = scan(directory, home)
    return ProjectView(project, is_trusted(home, project, granted))


def grant(home: Path, directory: Path) -> ProjectView:
    """`directory` trusted for this run only (`--trust`): nothing recorded."""
    return ProjectView(scan(directory, home), True)


def left_out_note(view: ProjectView, sources: Iterable[str]) -> str | None:
    """The one line that says what a run went without and how to use it, or None."""
    selected = view.project.select(sources)
    untrusted = [f.path for f in selected if f.data is not None and not view.trusted]
    refused = [f"{f.path}: {f.refused}" for f in selected if f.data is None]
    parts = []
    if untrusted:
        parts.append(
            f"left out {', '.join(untrusted)}: {view.root} is not trusted (these files run "
            f"code or widen what agents may do); to use them: {trust_command(view.root)}"
        )
    if refused:
        parts.append(f"left out {'; '.join(refused)}")
    return "; ".join(parts) or None


def trust_command(root: Path) -> str:
    """The command that trusts `root`, quoted for a shell."""
    return f"shoal trust {shlex.quote(str(root))}"
