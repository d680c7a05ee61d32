"""`shoal run --results DIR`: every task's output copied into DIR as it ends, one file per task.

CI systems keep a directory as an artifact, not SHOAL_HOME, so a task's whole output must land
where the pipeline collects it. File names are made from task ids (matrix ids such as
`test[py=3.11,shard=1]` hold characters that shells and artifact uploaders trip on), and two
ids that would give the same name (also when only their case differs) both get a short hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from shoal.core.errors import UsageError

SUFFIX: Final = ".out"
# Kept as they are; anything else becomes "_" (runs of it one "_").
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._=-]+")
# Room for a hash and the suffix within the 255 bytes most filesystems allow.
MAX_STEM: Final = 200
COPY_CHUNK: Final = 1 << 20


def safe_stem(task_id: str) -> str:
    """A file-name stem for `task_id`: `test[py=3.11,shard=1]` -> `test_py=3.11_shard=1`
    (not cut to MAX_STEM: `result_names` does that)."""
    stem = _UNSAFE.sub("_", task_id).strip("_")
    if not stem or stem[0] in ".-":
        stem = f"_{stem}"  # never a hidden file, never read as an option
    return stem


def _hash(task_id: str) -> str:
    return hashlib.sha256(task_id.encode()).hexdigest()[:8]


def result_names(task_ids: Iterable[str]) -> dict[str, str]:
    """The file name of each task's copy; distinct even on a case-insensitive filesystem."""
    ids = list(dict.fromkeys(task_ids))
    full = {t: safe_stem(t) for t in ids}
    stems = {t: s[:MAX_STEM] for t, s in full.items()}
    seen: dict[str, int] = {}
    for stem in stems.values():
        seen[stem.casefold()] = seen.get(stem.casefold(), 0) + 1
    names: dict[str, str] = {}
    for task_id, stem in stems.items():
        if seen[stem.casefold()] > 1 or len(full[task_id]) > MAX_STEM:
            stem = f"{stem}-{_hash(task_id)}"
        names[task_id] = stem + SUFFIX
    return names


class ResultsDir:
    """The directory of `--results`: made and checked writable before the run starts."""

    def __init__(self, path: Path, task_ids: Iterable[str]) -> None:
        self.path = path
        self.names = result_names(task_ids)
        self.copied: dict[str, Path] = {}
        self._check()

    def _check(self) -> None:
        """Create the directory and write a probe file in it: an unwritable place is a usage
        error now, not a lost copy at the end (os.access is no proof: root passes it)."""
        where = f"--results {self.path}"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise UsageError(f"{where}: exists and is not a directory") from None
        except OSError as exc:
            raise UsageError(f"{where}: cannot create the directory: {exc.strerror}") from None
        if not self.path.is_dir():
            raise UsageError(f"{where}: exists and is not a directory")
        probe = self.path / f".shoal-probe-{secrets.token_hex(4)}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise UsageError(f"{where}: cannot write in it: {exc.strerror}") from None
        os.close(fd)
        os.unlink(probe)

    def file_for(self, task_id: str) -> Path:
        """Where the copy of `task_id`'s output goes."""
        name = self.names.get(task_id)
        if name is None:  # (not a task of the spec: named on its own)
            name = result_names([task_id])[task_id]
        return self.path / name

    def copy(self, task_id: str, output_file: str | os.PathLike[str]) -> Path:
        """Copy the output whole (temp file + rename: a reader never sees half of it); the
        source is opened without following links, as every output file is. OSError on failure,
        with nothing left behind."""
        dest = self.file_for(task_id)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        src_fd = os.open(output_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            # The directory is the user's, not SHOAL_HOME: the umask decides who may read
            # the copies (an artifact uploader of another uid, in CI).
            dst_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                with open(src_fd, "rb", closefd=False) as src, open(dst_fd, "wb") as dst:
                    shutil.copyfileobj(src, dst, COPY_CHUNK)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        finally:
            os.close(src_fd)
        self.copied[task_id] = dest
        return dest
