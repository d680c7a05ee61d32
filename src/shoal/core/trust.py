"""Project trust: a project's files that run code or widen what agents may do are used only
in a directory the user trusted.

Those files are `.shoal/mcp.json` and `.mcp.json` (MCP servers: commands run as the user) and
the agent definitions in `.shoal/agents/` and `.claude/agents/` (prompts, tools, models and
permission modes). `shoal trust DIR` records, in `SHOAL_HOME/trust.json`, the directory's
real path and a sha256 digest over those files' relative paths and contents; any change to
them (a file edited, added or removed) makes the directory untrusted again until it is
trusted anew. Nothing is followed: a symlink among them (or a symlinked `.shoal/`,
`.claude/` or definitions directory) is hashed as a link and never used, trusted or not.

The digest also covers the files inside the tree that those MCP servers run: a server's
`command` or an argument that names a regular file of the project (`tools/server.py`, or the
module of `-m tools.server`), opened beneath the project without following a symlink, at most
SCRIPT_COUNT_CAP of them, the first FILE_CAP bytes of each hashed (a larger one by its size and
times). So a trusted project whose server script changes is asked about again, naming it.

The files are read once, here (`scan`), and what is used is what was hashed: the loaders
parse the bytes of the scan, so a file swapped after the check is not the one loaded. (A
server's script is run by its interpreter from the disk, later: it is covered as it was when
the agent started.)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shlex
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from shoal.core.beneath import open_beneath
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
SCRIPT_COUNT_CAP: Final = 64
"""At most this many files named by MCP servers are covered (the rest are named as not)."""
_SYMLINK = "a symlink (never followed: copy the file in, or put it in SHOAL_HOME)"


@dataclass(frozen=True)
class ProjectFile:
    """One of a project's trust-relevant files, as scanned."""

    path: str  # relative to the project, with `/`
    data: bytes | None  # None: never used (see `refused`)
    refused: str | None = None  # why it is never used, trusted or not
    link: str | None = None  # a symlink's target (hashed instead of content)
    used_by: str | None = None  # a file an MCP server runs: the config naming it (never loaded)


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
        return tuple(
            f for f in self.files if f.used_by is None and any(_covers(s, f.path) for s in wanted)
        )

    def run_by(self, sources: Iterable[str]) -> tuple[ProjectFile, ...]:
        """The files the MCP servers of the configs among `sources` run (covered by the
        digest, never loaded by shoal)."""
        configs = {f.path for f in self.select(sources)}
        return tuple(f for f in self.files if f.used_by in configs)


def _covers(source: str, path: str) -> bool:
    return path.startswith(source) if source.endswith("/") else path == source


@dataclass(frozen=True)
class ProjectView:
    """A project as one run may use it: its files when trusted, none when not."""

    project: Project
    trusted: bool
    changed: tuple[str, ...] = ()
    """The files changed, added or removed since the directory was trusted (when known)."""

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
    hashes: dict[str, str] = Field(default_factory=dict)
    """Each file's own digest, by path: what names the files that changed since."""


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
        _scripts(root_fd, root, Path(os.path.abspath(directory)), files)
    finally:
        os.close(root_fd)
    return _project(directory, root, files)


def _project(directory: Path, root: Path, files: list[ProjectFile]) -> Project:
    files.sort(key=lambda f: f.path)
    digest = hashlib.sha256()
    for f in files:
        digest.update(_record(f))
    return Project(directory, root, tuple(files), f"sha256:{digest.hexdigest()}")


def _record(f: ProjectFile) -> bytes:
    """What the digest takes of one file: its path, how it is held, and that content."""
    if f.data is not None:
        kind, payload = b"file", f.data
    elif f.link is not None:
        kind, payload = b"link", os.fsencode(f.link)
    else:
        kind, payload = b"other", (f.refused or "").encode()
    if f.used_by is not None:
        kind = b"run-" + kind  # (a server's file, not a config of the same name)
    return b"%s\0%s\0%d\0%s" % (f.path.encode(), kind, len(payload), payload)


def file_hashes(project: Project) -> dict[str, str]:
    """Each file's own digest by path (TrustEntry.hashes)."""
    return {f.path: hashlib.sha256(_record(f)).hexdigest() for f in project.files}


def changed_files(entry: TrustEntry, project: Project) -> tuple[str, ...]:
    """The files of `project` that changed, or were added or removed, since `entry` was
    recorded (none known for an entry recorded before shoal kept each file's digest)."""
    if not entry.hashes:
        return ()
    now = file_hashes(project)
    paths = sorted(set(now) | set(entry.hashes))
    return tuple(p for p in paths if now.get(p) != entry.hashes.get(p))


# -- the files MCP servers run -----------------------------------------------------------


def _scripts(root_fd: int, root: Path, given: Path, files: list[ProjectFile]) -> None:
    """Add the in-tree files that the servers of the scanned MCP configs run (see the
    module docstring): each named once, by its path beneath the project."""
    seen = {f.path for f in files}
    for config in [f for f in files if f.path in MCP_FILES and f.data is not None]:
        assert config.data is not None
        for candidate in _named_paths(config.data):
            rel = _beneath(candidate, (root, given))
            if rel is None or rel in seen:
                continue
            if sum(f.used_by is not None for f in files) >= SCRIPT_COUNT_CAP:
                files.append(
                    ProjectFile(rel, None, f"past the first {SCRIPT_COUNT_CAP}", None, config.path)
                )
                return
            found = _script(root_fd, rel, config.path)
            if found is not None:
                seen.add(rel)
                files.append(found)


def _named_paths(data: bytes) -> Iterator[str]:
    """Every string of an MCP config's servers that could name a file: the command, each
    argument (and the value of `--opt=VALUE`), and the module file of `-m MODULE`. The
    loaders report a malformed config; here it simply names nothing."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    for spec in servers.values() if isinstance(servers, dict) else ():
        if not isinstance(spec, dict):
            continue
        args = spec.get("args")
        words = [spec.get("command"), *(args if isinstance(args, list) else ())]
        strings = [w for w in words if isinstance(w, str) and w and "\0" not in w]
        for number, word in enumerate(strings):
            if word.startswith("-"):
                if "=" in word:
                    yield word.split("=", 1)[1]
                if word == "-m" and number + 1 < len(strings):
                    module = strings[number + 1].replace(".", "/")
                    yield f"{module}.py"
                    yield f"{module}/__main__.py"
                continue
            yield word


def _beneath(candidate: str, roots: tuple[Path, ...]) -> str | None:
    """`candidate` as a path beneath the project (relative to it, `..` folded; an absolute
    path inside the tree counts too), or None when it leads out of it."""
    if os.path.isabs(candidate):
        for root in roots:
            try:
                candidate = Path(os.path.normpath(candidate)).relative_to(root).as_posix()
                break
            except ValueError:
                continue
        else:
            return None
    rel = os.path.normpath(candidate)
    if rel in (".", "") or rel == ".." or rel.startswith(("../", "/")):
        return None
    return Path(rel).as_posix()


def _script(root_fd: int, rel: str, config: str) -> ProjectFile | None:
    """File `rel` (beneath the project) as a server's: its bytes (the first FILE_CAP of
    them; a larger file by its size and times), a symlink by its target (never followed),
    something else by what it is; None when nothing regular is there (a plain argument)."""
    try:
        fd = open_beneath(root_fd, rel.split("/"), os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return None  # (no such file: an argument like `UTC`)
        link = _link_on_the_way(root_fd, rel)
        why = "a symlink (not followed: its target is not covered)"
        return ProjectFile(rel, None, why, link, config)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            return ProjectFile(rel, None, "not a regular file", None, config)
        if st.st_size > FILE_CAP:
            times = f"size {st.st_size}, mtime {st.st_mtime_ns}, ctime {st.st_ctime_ns}"
            why = f"larger than {FILE_CAP} bytes: only its {times} are covered"
            return ProjectFile(rel, None, why, None, config)
        return ProjectFile(rel, os.read(fd, FILE_CAP + 1)[:FILE_CAP] or b"", None, None, config)
    except OSError as exc:
        return ProjectFile(rel, None, f"unreadable ({exc.strerror})", None, config)
    finally:
        os.close(fd)


def _link_on_the_way(root_fd: int, rel: str) -> str:
    """Where the first symlink on the way to `rel` leads (`?` if it cannot be read)."""
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        head = "/".join(parts[:depth])
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(head, dir_fd=root_fd).st_mode):
                return f"{head} -> {os.readlink(head, dir_fd=root_fd)}"
    return "?"


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
        hashes=file_hashes(project),
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
    """Scan `directory` and decide whether this run may use its files (and, for a directory
    trusted before, which of them changed since)."""
    project = scan(directory, home)
    if is_trusted(home, project, granted):
        return ProjectView(project, True)
    entry = load_store(home).projects.get(str(project.root))
    return ProjectView(project, False, changed_files(entry, project) if entry else ())


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
        why = ["these files run code or widen what agents may do"]
        run = [f.path for f in view.project.run_by(sources)]
        if run:
            why.append(f"their servers run {', '.join(run)}")
        if view.changed:
            why.append(f"changed since it was trusted: {', '.join(view.changed)}")
        parts.append(
            f"left out {', '.join(untrusted)}: {view.root} is not trusted ({'; '.join(why)}); "
            f"to use them: {trust_command(view.root)}"
        )
    if refused:
        parts.append(f"left out {'; '.join(refused)}")
    return "; ".join(parts) or None


def trust_command(root: Path) -> str:
    """The command that trusts `root`, quoted for a shell."""
    return f"shoal trust {shlex.quote(str(root))}"
