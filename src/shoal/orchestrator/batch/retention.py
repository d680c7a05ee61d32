"""What a batch run leaves behind: its own team (made at its start, removed at its end) and
its sessions (`shoal run --keep-sessions N`, or `[run] keep_sessions` in
SHOAL_HOME/config.toml): a CI machine that runs a spec every few minutes would otherwise keep
one team's worth of session directories per run forever.

Only finished sessions of the run's team go: their leader is gone and every task in them has
ended. A session that a run record of the team still points into (its own, or the output
files of tasks a `--resume` carried over) is kept, whatever its age.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Final

import orjson

from shoal.core.config import config_file
from shoal.core.errors import ConflictError, ShoalError, UsageError
from shoal.core.jsonio import read_bytes_nofollow
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.teams.store import Teams

CONFIG_TABLE: Final = "run"
CONFIG_KEY: Final = "keep_sessions"
_TERMINAL: Final = frozenset({"completed", "failed", "killed"})


def configured_keep(home: Path) -> int | None:
    """`[run] keep_sessions` of SHOAL_HOME/config.toml (None: unset, every session kept)."""
    table = config_file(home).get(CONFIG_TABLE) or {}
    value = table.get(CONFIG_KEY) if isinstance(table, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            f"{home / 'config.toml'}: [run] {CONFIG_KEY} must be a whole number >= 1, "
            f"not {value!r} (e.g. {CONFIG_KEY} = 10)"
        )
    return value


def _state(path: Path) -> dict[str, Any] | None:
    try:
        data = orjson.loads(read_bytes_nofollow(path / "state.json"))
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _finished(state: dict[str, Any]) -> bool:
    """No leader runs the session and none of its tasks is still going."""
    leader = state.get("leader") or {}
    if isinstance(leader, dict) and is_alive(leader.get("pid"), leader.get("started_at")):
        return False
    tasks = state.get("tasks") or {}
    return all(isinstance(t, dict) and t.get("status") in _TERMINAL for t in tasks.values())


def referenced_sessions(layout: Layout, team: str) -> set[str]:
    """Sessions the team's run records point into: each record's own session and those of
    its tasks' output files (a task carried over by --resume keeps its first run's)."""
    sessions = os.path.realpath(layout.sessions_dir) + os.sep
    found: set[str] = set()
    runs = layout.home / "runs" / team
    with contextlib.suppress(OSError):
        for record in runs.glob("*.json"):
            try:
                data = orjson.loads(read_bytes_nofollow(record))
            except (OSError, orjson.JSONDecodeError):
                continue
            if not isinstance(data, dict):
                continue
            if isinstance(data.get("session_id"), str):
                found.add(data["session_id"])
            for task in data.get("tasks") or []:
                if not isinstance(task, dict):
                    continue
                files = [task.get("output_file")]
                files += [
                    a.get("output_file")
                    for a in task.get("attempt_log") or []
                    if isinstance(a, dict)
                ]
                for file in files:
                    if isinstance(file, str) and file.startswith(sessions):
                        found.add(file[len(sessions) :].split(os.sep, 1)[0])
    return found


def prune_sessions(layout: Layout, team: str, keep: int, current: str | None) -> list[str]:
    """Remove the oldest finished sessions of `team` so that at most `keep` are left (the
    current one counts, and is never removed); returns the ids removed."""
    root = layout.sessions_dir
    protected = referenced_sessions(layout, team) | ({current} if current else set())
    candidates: list[tuple[float, str]] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if not entry.is_dir(follow_symlinks=False) or entry.name in protected:
                continue
            state = _state(Path(entry.path))
            if state is None or state.get("team") != team or not _finished(state):
                continue
            updated = state.get("updated_at")
            candidates.append(
                (float(updated) if isinstance(updated, int | float) else 0.0, entry.name)
            )
    kept_already = len(protected & _team_sessions(root, team, protected))
    room = max(0, keep - kept_already)
    candidates.sort(reverse=True)  # (newest first: those are kept)
    removed: list[str] = []
    for _, name in candidates[room:]:
        with contextlib.suppress(OSError):
            shutil.rmtree(root / name)
            removed.append(name)
    return sorted(removed)


def _team_sessions(root: Path, team: str, names: set[str]) -> set[str]:
    """Those of `names` that are sessions of `team` on disk."""
    out = set()
    for name in names:
        state = _state(root / name)
        if state is not None and state.get("team") == team:
            out.add(name)
    return out


def make_run_team(layout: Layout, team: str, description: str) -> None:
    """Create a run's team if it is not there yet. A run of the same spec that created it a
    moment earlier is no error here: the claim of its lead refuses the second."""
    teams = Teams(layout)
    if not teams.exists(team):
        with contextlib.suppress(ConflictError):
            teams.create(team, description)


def remove_run_team(layout: Layout, team: str) -> str | None:
    """Delete a run's own team, so that no team is left behind for later commands to trip
    on; None once it is gone, else why it is kept (its members have worktrees: their work
    would go with it; or it could not be deleted)."""
    teams = Teams(layout)
    try:
        held = [
            f"{m.name}: {m.worktree_path}"
            for m in teams.read(team).members
            if m.worktree_path and os.path.exists(m.worktree_path)
        ]
        if held:
            return (
                f"team {team} kept: its members' worktrees hold their work "
                f"({'; '.join(held)}); `shoal team delete {team}` removes them"
            )
        teams.delete(team)
    except (ShoalError, OSError) as exc:
        return f"team {team} kept: {exc}"
    return None
