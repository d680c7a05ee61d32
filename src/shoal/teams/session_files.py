"""A session directory read without models: its paths, its task table and history as the
plain dicts the leader wrote, its event lines. What the CLI's readers (`ps`, `wait`, `logs -f`,
`sh --foreground`) need, at the cost of orjson alone; orchestrator/session.py's `Session`
adds the validated state and the writers on top.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from shoal.core.errors import CorruptFileError
from shoal.core.jsonio import read_bytes_nofollow
from shoal.core.paths import Layout
from shoal.teams.lead import lead_session_id


class SessionFiles:
    """Paths and plain reads of one session directory."""

    def __init__(self, layout: Layout, session_id: str) -> None:
        self.layout = layout
        self.id = session_id
        self.dir = layout.session_dir(session_id)
        # (made once: the leader appends to these for every event and every ended task)
        self.state_file = self.dir / "state.json"
        self.events_file = self.dir / "events.jsonl"
        self.history_file = self.dir / "history.jsonl"
        self.tasks_dir = self.dir / "tasks"

    def output_file(self, task_id: str) -> Path:
        return self.tasks_dir / f"{task_id}.output"

    def team_name(self) -> str:
        """The team this session belongs to (from its state; CorruptFileError when unreadable)."""
        try:
            team = orjson.loads(read_bytes_nofollow(self.state_file)).get("team")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            team = None
        if not isinstance(team, str):
            raise CorruptFileError(self.state_file, "invalid session state: no team name")
        return team

    def read_tasks_raw(self) -> dict[str, dict[str, Any]]:
        """The tasks of state.json as the plain dicts the leader wrote, unvalidated: for
        readers that poll (`ps`, `wait`, `logs -f`) and only show them. {} when absent."""
        try:
            raw = read_bytes_nofollow(self.state_file)
        except FileNotFoundError:
            return {}
        try:
            tasks = orjson.loads(raw).get("tasks")
        except (orjson.JSONDecodeError, AttributeError):
            tasks = None
        if not isinstance(tasks, dict) or not all(
            isinstance(t, dict) and "status" in t for t in tasks.values()
        ):
            raise CorruptFileError(self.state_file, "invalid session state: no task table")
        return tasks

    def group_names(self) -> set[str]:
        """The task groups state.json lists (`shoal group add`); empty when absent."""
        try:
            groups = orjson.loads(read_bytes_nofollow(self.state_file)).get("groups")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return set()
        return set(groups) if isinstance(groups, dict) else set()

    def events(self) -> Iterator[dict[str, Any]]:
        """Every event record so far (a torn last line, from a crash mid-write, is skipped)."""
        yield from _read_jsonl(self.events_file)

    def history(self) -> dict[str, dict[str, Any]]:
        """Final records of evicted tasks by id (a poller keeps a HistoryReader instead)."""
        return HistoryReader(self).read()


class HistoryReader:
    """A session's history read incrementally: each `read()` parses only what was appended
    since the last one (a poller of a long session would otherwise re-read it all)."""

    def __init__(self, session: SessionFiles) -> None:
        self.session = session
        self.records: dict[str, dict[str, Any]] = {}
        self._offset = 0

    def read(self) -> dict[str, dict[str, Any]]:
        """Final records of evicted tasks by id, up to the last complete line."""
        try:
            fd = os.open(self.session.history_file, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return self.records
        with os.fdopen(fd, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        for line in data[:end].splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict) and "id" in record:
                    self.records[record["id"]] = record
        self._offset += end
        return self.records


def _read_jsonl(path: Path, marks: Iterable[bytes] = ()) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (with `marks`, only lines holding one of them)."""
    wanted = list(marks)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as fh:
        for line in fh:
            if wanted and not any(m in line for m in wanted):
                continue
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict):
                    yield record


def current_session_files(layout: Layout, team: str) -> SessionFiles | None:
    """The team's latest session (the team file's lead_session_id), if it is on disk."""
    session_id = lead_session_id(layout, team)
    if session_id is None:
        return None
    files = SessionFiles(layout, session_id)
    return files if layout.checked(files.dir).is_dir() else None
