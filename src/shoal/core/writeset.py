"""Write sets: the files a coordinator's worker may change, as globs relative to its working
directory (`src/calc/*.py`, `docs/**`). Matching is wcmatch's, with `**` for any depth.

`overlaps` decides whether two write sets could name one file, so two workers never write the
same file at once; it errs towards "yes" (two wildcards in one path segment are taken to
overlap when their fixed prefixes and suffixes agree), since a false "no" would break the rule.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final

from shoal.core.errors import UsageError

# (wcmatch and bracex load on the first match: every leader imports this module for its
# agents, and most never match a write set)
WILDCARDS: Final = frozenset("*?[{")
MAX_GLOBS: Final = 100


def check_write_set(raw: Any, what: str = "write_set") -> tuple[str, ...]:
    """`raw` as a write set: a non-empty list of non-empty relative globs that stay inside the
    working directory; anything else is a UsageError that says what is wrong with which."""
    if not isinstance(raw, list | tuple) or not raw:
        raise UsageError(f"{what} must be a non-empty list of globs relative to the working "
                         f"directory (e.g. [\"src/calc/*.py\"]), not {raw!r}")  # fmt: skip
    if len(raw) > MAX_GLOBS:
        raise UsageError(f"{what} has {len(raw)} globs; at most {MAX_GLOBS}")
    out: list[str] = []
    for item in raw:
        if not isinstance(item, str) or not item.strip():
            raise UsageError(f"{what}: {item!r} is not a glob (a non-empty string)")
        text = item.strip().replace("\\", "/")
        if text.startswith("/") or text.startswith("~") or PurePosixPath(text).is_absolute():
            raise UsageError(f"{what}: {item!r} is absolute; give globs relative to the "
                             "working directory")  # fmt: skip
        parts = [p for p in text.split("/") if p not in ("", ".")]
        depth = 0
        for part in parts:
            depth += -1 if part == ".." else 1
            if depth < 0:
                raise UsageError(f"{what}: {item!r} leads outside the working directory")
        if ".." in parts:
            raise UsageError(f"{what}: {item!r} has '..'; name the files from the working "
                             "directory down")  # fmt: skip
        if not parts:
            raise UsageError(f"{what}: {item!r} names the working directory itself; use '**'")
        out.append("/".join(parts))
    return tuple(dict.fromkeys(out))


def relative(path: Path, cwd: Path) -> str | None:
    """`path` relative to `cwd` in posix form, or None when it is not under it."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(cwd)))
    except ValueError:
        return None
    return rel.as_posix()


def covers(write_set: Sequence[str], rel_path: str) -> bool:
    """Whether the file `rel_path` (relative, posix) is in `write_set`."""
    from wcmatch import glob

    flags = glob.GLOBSTAR | glob.DOTGLOB | glob.BRACE
    return bool(glob.globmatch(rel_path, list(write_set), flags=flags))


def _literal(segment: str) -> bool:
    return not (WILDCARDS & set(segment))


def _fixed_ends(segment: str) -> tuple[str, str]:
    """The fixed text before the first wildcard and after the last one."""
    first = min((segment.index(c) for c in WILDCARDS if c in segment), default=len(segment))
    last = max((segment.rindex(c) for c in "*?]}" if c in segment), default=len(segment) - 1)
    return segment[:first], segment[last + 1 :]


def _segments_overlap(a: str, b: str) -> bool:
    from wcmatch import fnmatch

    if a == b:
        return True
    if _literal(a):
        return fnmatch.fnmatch(a, b, flags=fnmatch.DOTMATCH | fnmatch.BRACE)
    if _literal(b):
        return fnmatch.fnmatch(b, a, flags=fnmatch.DOTMATCH | fnmatch.BRACE)
    (pa, sa), (pb, sb) = _fixed_ends(a), _fixed_ends(b)
    return (pa.startswith(pb) or pb.startswith(pa)) and (sa.endswith(sb) or sb.endswith(sa))


def _globs_overlap(a: list[str], b: list[str]) -> bool:
    if not a:
        return all(s == "**" for s in b)
    if not b:
        return all(s == "**" for s in a)
    if a[0] == "**" or b[0] == "**":
        return True  # (`**` takes any number of segments: err towards an overlap)
    return _segments_overlap(a[0], b[0]) and _globs_overlap(a[1:], b[1:])


def _expanded(globs: Sequence[str]) -> list[str]:
    """The globs with their braces expanded (`{src/a,b}/x.py` is two paths' worth)."""
    import bracex

    out: list[str] = []
    for glob_ in globs:
        try:
            out += bracex.expand(glob_, limit=1000)
        except (ValueError, RecursionError):  # (too many: compare it unexpanded)
            out.append(glob_)
    return out


def overlaps(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether some path could be in both write sets."""
    return any(
        _globs_overlap(x.split("/"), y.split("/")) for x in _expanded(a) for y in _expanded(b)
    )
