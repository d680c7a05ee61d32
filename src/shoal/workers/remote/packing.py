"""What a remote task may take to the cluster: its working directory packed for upload (the
git work tree, nothing from outside it), and the model key or file its agent needs there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shoal.core import git
from shoal.core.errors import UsageError
from shoal.workers.remote.spec import AGENT_TYPES, RemoteError

UPLOAD_LIMIT_ENV: Final = "SHOAL_RAY_UPLOAD_LIMIT_MB"
UPLOAD_LIMIT_MB: Final = 100


@dataclass(frozen=True)
class Package:
    """A work tree packed for upload: Ray's content-addressed name and the zip's bytes."""

    root: Path
    name: str
    data: bytes
    files: int
    names: frozenset[str] = frozenset()  # the packed files' paths (relative to the root)


def upload_limit() -> int:
    """The largest working directory (zipped bytes) a remote task may take."""
    raw = os.environ.get(UPLOAD_LIMIT_ENV)
    try:
        mb = float(raw) if raw else UPLOAD_LIMIT_MB
    except ValueError:
        raise UsageError(f"${UPLOAD_LIMIT_ENV} must be a number of MB, not {raw!r}") from None
    return int(mb * 1024 * 1024)


def pack_workdir(cwd: Path, limit: int | None = None) -> Package:
    """Zip the git work tree `cwd` is in (what .gitignore excludes stays out), checking that
    it is a repository with a commit and that the zip stays under the upload limit.

    Nothing from outside the tree is packed: a symlink whose target leaves it is refused
    (named), one that stays inside is packed as a copy of its target (Ray unpacks with
    `zipfile`, which restores no links; the target's bytes are the tree's own), and a file
    with hard links that are not all in the tree is refused (its data is some other file's)."""
    import io
    import zipfile

    limit = upload_limit() if limit is None else limit
    root = git.toplevel(cwd)
    if root is None:
        raise RemoteError(
            f"{cwd} is not in a git repository: a remote task runs on a copy of the work tree "
            "(git init && git add -A && git commit)"
        )
    if not git.has_commit(root):
        raise RemoteError(f"the git repository {root} has no commit yet: commit once first")
    buffer = io.BytesIO()
    count = 0
    names: set[str] = set()
    real_root = os.path.realpath(root)
    links: dict[tuple[int, int], list[str]] = {}  # (dev, inode) -> packed names, nlink > 1
    nlinks: dict[tuple[int, int], int] = {}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for rel in git.listed_files(root):
            read = _read_inside(root, real_root, rel)
            if read is None:
                continue  # tracked but deleted, a dangling link, a submodule's directory
            st, content = read
            if st.st_nlink > 1:
                links.setdefault((st.st_dev, st.st_ino), []).append(rel)
                nlinks[(st.st_dev, st.st_ino)] = st.st_nlink
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IMODE(st.st_mode) | stat.S_IFREG) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, content)
            count += 1
            names.add(rel)
            if buffer.tell() > limit:
                break
    for inode, packed in links.items():
        if len(packed) < nlinks[inode]:
            raise RemoteError(
                f"{root / packed[0]} is a hard link to a file outside the work tree (it has "
                f"{nlinks[inode]} links, {len(packed)} of them here), whose data would be "
                "uploaded: give it its own copy (cp --remove-destination) or remove it"
            )
    data = buffer.getvalue()
    if len(data) > limit:
        raise RemoteError(
            f"the work tree {root} packs to more than {_mb(limit)} (the upload limit; "
            f"${UPLOAD_LIMIT_ENV} raises it): add what the job does not need to .gitignore"
        )
    name = f"_ray_pkg_{hashlib.sha1(data).hexdigest()}.zip"
    return Package(root=root, name=name, data=data, files=count, names=frozenset(names))


def _read_inside(root: Path, real_root: str, rel: str) -> tuple[os.stat_result, bytes] | None:
    """The stat and bytes of the regular file `rel` of the tree (a symlink: its target's),
    None when there is none; a link (or a linked directory on the way) that leads out of the
    tree, or into its .git (which may hold credentials), is refused. Where the file was
    opened is checked again (/proc/self/fd), so a link swapped in meanwhile is caught too."""
    path = root / rel
    try:
        lst = os.lstat(path)
    except OSError:
        return None
    real = os.path.realpath(path)
    if not os.path.exists(real):
        return None  # a dangling link: nothing to pack
    what = "a symlink" if stat.S_ISLNK(lst.st_mode) else "reached through a symlink"
    _check_beneath(path, rel, real, root, real_root, what)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None  # a submodule's directory, a link to a directory, a FIFO
        with contextlib.suppress(OSError):  # (no /proc: the check above stands alone)
            opened = os.readlink(f"/proc/self/fd/{fd}")
            _check_beneath(path, rel, opened, root, real_root, "now a link")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return st, b"".join(chunks)
    finally:
        os.close(fd)


def _check_beneath(path: Path, rel: str, real: str, root: Path, real_root: str, what: str) -> None:
    """Refuse `path` (resolving to `real`) unless it stays in the tree, out of its .git."""
    if not _beneath(real, real_root):
        where = f"outside the work tree {root}"
    elif _beneath(real, os.path.join(real_root, ".git")):
        where = "in the repository's .git (which may hold credentials)"
    else:
        return
    raise RemoteError(
        f"{path} is {what} to {real}, {where}: its target would be uploaded with the tree; "
        f"remove the link (git rm {shlex.quote(rel)}) or make it point inside the tree"
    )


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_model_key(
    remote_type: str,
    model: str | None,
    env: Mapping[str, str],
    home: Path,
    cwd: Path,
    package: Package | None = None,
) -> None:
    """An agent type needs its model's key in the job's environment `env` (what `--env`
    names: a key in ours alone does not reach the job; the offline scripted model needs none).
    A script's or a transcript's file is the node's, relative to the job's working directory:
    with the `package` the job gets (at submit), it must be a file packed in it (relative to
    `cwd`) or, absolute, a file here; without one (the leader) it is not checked."""
    if remote_type not in AGENT_TYPES:
        return
    from shoal.workers.agent.models import PROVIDER_ENV, check_model, choose_model

    spec = choose_model(model, None, env, home)
    if spec.provider in PROVIDER_ENV:
        key = PROVIDER_ENV[spec.provider][0]
        if not env.get(key):
            raise RemoteError(
                f"model {spec} needs ${key} on the cluster: pass --env {key} (its value is "
                "taken from this environment; a key reaches a Ray job only when named)"
            )
        return
    if not spec.name or package is None:
        return
    if Path(os.path.expanduser(spec.name)).is_absolute():
        check_model(spec, env, cwd)
        return
    what = "script" if spec.provider == "scripted" else "transcript"
    path = Path(os.path.abspath(cwd / spec.name))
    rel = os.path.relpath(path.resolve(), Path(package.root).resolve())
    if rel.startswith("..") or rel not in package.names:
        raise RemoteError(
            f"model {spec}: the {what} {path} is not in the packed work tree of "
            f"{package.root}, where the job reads it (add it there, out of .gitignore's reach)"
        )


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.3g} MB"  # (the limit as set: 0.01, not 0.00999928)
