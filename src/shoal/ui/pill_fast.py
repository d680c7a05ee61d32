"""`shoal pill` without click or pydantic: tmux runs it every few seconds, so it must start fast.

Only the standard library, orjson and `shoal.ui.pill` are imported. The team file and
`state.json` are read as plain dicts; the label comes from the same `pill_for` every view uses.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from shoal.ui.pill import pill_for

_OPTIONS = ("--home", "--team")
# shoal.core.names.NAME_PATTERN (tested equal); importing it would pull in `secrets`/`hashlib`.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,47}$")


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """shoal.core.paths.resolve_home without its imports: `home`, $SHOAL_HOME or ~/.shoal."""
    raw = home if home is not None else os.environ.get("SHOAL_HOME") or Path.home() / ".shoal"
    return Path(os.path.realpath(os.path.expanduser(os.fspath(raw))))


class PillError(Exception):
    """A one-line error for stderr, with the CLI's exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_pill_argv(argv: Sequence[str]) -> dict[str, str] | None:
    """{home?, team?} when `argv` (without the program) is `[opts] pill [opts]`; else None.

    Options are `--home DIR`, `--team NAME` (or `--opt=value`), before or after `pill`, and
    `--detail` after it (as {"detail": "1"}). Anything else (`--help`, `--json`, a typo)
    returns None so click answers it properly.
    """
    opts: dict[str, str] = {}
    seen_pill = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "pill" and not seen_pill:
            seen_pill = True
            i += 1
            continue
        if arg == "--detail" and seen_pill:
            opts["detail"] = "1"
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in _OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        opts[name[2:]] = value
        i += 1
    return opts if seen_pill else None


def _is_shoal_program(argv0: str) -> bool:
    """True when the running program is shoal's own entry point (console script or -m shoal)."""
    parts = Path(argv0).parts
    return bool(parts) and (parts[-1] == "shoal" or parts[-2:] == ("shoal", "__main__.py"))


def _read_json(path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object in `path`; None when the file does not exist; PillError when corrupt."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PillError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PillError(f"corrupt {what} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise PillError(f"corrupt {what} {path}: not a JSON object")
    return data


def _team(home: Path, explicit: str | None) -> str:
    name = explicit or os.environ.get("SHOAL_TEAM")
    if name:
        if not NAME_PATTERN.fullmatch(name):
            raise PillError(f"invalid team name {name!r}; names match ^[a-z][a-z0-9_-]{{0,47}}$", 2)
        return name
    return "default"  # (never "the only team on disk": see cli/common.py)


def _team_names(home: Path, but: str) -> list[str]:
    """The teams under `home` other than `but` (for the message of a missing team)."""
    try:
        entries = sorted(os.listdir(home / "teams"))
    except OSError:
        return []
    return [
        e
        for e in entries
        if e != but and not e.startswith(".") and (home / "teams" / e / "team.json").exists()
    ]


def pill_text(
    home: str | os.PathLike[str] | None = None, team: str | None = None, *, detail: bool = False
) -> str:
    """The pill label of `team`'s current session under `home` ("" when nothing runs)."""
    root = resolve_home(home)
    name = _team(root, team)
    team_file = root / "teams" / name / "team.json"
    tf = _read_json(team_file, "team file")
    if tf is None:
        others = _team_names(root, name)
        there = (
            f"; teams on disk: {', '.join(others)} (pass --team NAME or set SHOAL_TEAM)"
            if others
            else ""
        )
        raise PillError(f"no team {name!r} (start its leader with `shoal up --team {name}`{there})")
    session = tf.get("lead_session_id")
    if not isinstance(session, str) or not session or "/" in session or session.startswith("."):
        return ""
    state = _read_json(root / "sessions" / session / "state.json", "session state")
    tasks = state.get("tasks") if state else None
    if not isinstance(tasks, dict):
        return ""
    return pill_for((t for t in tasks.values() if isinstance(t, dict)), detail=detail)


def run(argv: Sequence[str]) -> int:
    """Print the pill for `argv` (already parsed as a pill invocation); the exit code."""
    opts = parse_pill_argv(argv) or {}
    try:
        label = pill_text(opts.get("home"), opts.get("team"), detail="detail" in opts)
    except PillError as exc:
        sys.stderr.write(f"shoal: error: {exc}\n")
        return exc.exit_code
    if label:
        sys.stdout.write(label + "\n")
    return 0


def run_if_pill(argv: Sequence[str]) -> None:
    """Exit with the pill's answer when `argv` is `shoal [--home H] [--team T] pill ...`.

    Called by `shoal.cli.main` before it imports click; returns for any other command line.
    """
    if len(argv) < 2 or "pill" not in argv[1:] or not _is_shoal_program(argv[0]):
        return
    if parse_pill_argv(argv[1:]) is None:
        return
    code = run(argv[1:])
    sys.stdout.flush()
    raise SystemExit(code)
