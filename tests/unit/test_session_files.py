"""Session files as polling readers see them: raw task table, history read incrementally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from shoal.core.errors import CorruptFileError
from shoal.core.paths import Layout
from shoal.teams.session import HistoryReader, Session


@pytest.fixture
def session(tmp_path: Path) -> Session:
    return Session(Layout(tmp_path / "home"), "s1").ensure()


def test_the_history_reader_parses_only_appended_complete_lines(session: Session) -> None:
    reader = HistoryReader(session)
    assert reader.read() == {}  # no file yet
    with open(session.history_file, "ab") as fh:
        fh.write(b'{"id": "b1", "status": "completed"}\n{"id": "b2", "sta')
    assert list(reader.read()) == ["b1"]  # the torn line waits
    with open(session.history_file, "ab") as fh:
        fh.write(b'tus": "failed"}\nnot json\n{"no": "id"}\n')
    records = reader.read()
    assert records["b2"]["status"] == "failed"
    assert list(records) == ["b1", "b2"]
    assert reader.read() == records  # nothing new, nothing re-read


def test_raw_tasks_come_from_state_json_and_bad_tables_are_refused(session: Session) -> None:
    assert session.read_tasks_raw() == {}
    session.write_state_bytes(orjson.dumps({"tasks": {"b1": {"id": "b1", "status": "running"}}}))
    assert session.read_tasks_raw() == {"b1": {"id": "b1", "status": "running"}}
    for bad in (b"{torn", b"[]", b'{"tasks": []}', b'{"tasks": {"b1": {"id": "b1"}}}'):
        session.state_file.write_bytes(bad)
        with pytest.raises(CorruptFileError) as err:
            session.read_tasks_raw()
        assert str(session.state_file) in str(err.value)


def test_a_pollers_view_parses_state_json_again_only_once_it_changed(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wait`'s view: the history's appends are read as they come, state.json (overriding
    the history, as `_tasks` has it) is parsed again only when its own stat changed."""
    from shoal.cli.wait import _SessionView

    parses: list[int] = []
    real = type(session).read_tasks_raw

    def counted(self: Session) -> dict[str, dict[str, Any]]:
        parses.append(1)
        return real(self)

    monkeypatch.setattr(type(session), "read_tasks_raw", counted)
    session.write_state_bytes(orjson.dumps({"tasks": {"b1": {"id": "b1", "status": "running"}}}))
    view = _SessionView(session)
    assert view.tasks()["b1"]["status"] == "running" and len(parses) == 1
    with open(session.history_file, "ab") as fh:
        fh.write(b'{"id": "b0", "status": "completed"}\n{"id": "b1", "status": "completed"}\n')
    tasks = view.tasks()
    assert tasks["b0"]["status"] == "completed"
    assert tasks["b1"]["status"] == "running"  # (state.json's, as before: it is the newer)
    assert len(parses) == 1
    session.write_state_bytes(orjson.dumps({"tasks": {}}))  # (b1 evicted: replaced whole)
    assert view.tasks()["b1"]["status"] == "completed" and len(parses) == 2
    assert view.tasks(fresh=True) == view.tasks() and len(parses) == 3  # (fresh: once more)


def test_a_resume_takes_ends_and_notifications_from_whole_records_only(session: Session) -> None:
    """What a resumed leader takes from the stream as announced and as notified: whole
    system records of the two subtypes with a task id; torn or foreign lines are skipped."""
    from shoal.orchestrator.session import _ended_in_stream

    lines = [
        b'{"type":"system","subtype":"task_started","task_id":"b0"}',
        b'{"type":"system","subtype":"task_terminated","task_id":"b1","status":"completed"}',
        b'{"type":"system","subtype":"task_notification","task_id":"b1","status":"completed"}',
        b'{"type":"system","subtype":"task_terminated","task_id":"b2","status":"failed"}',
        b'{"type":"user","subtype":"task_notification","task_id":"b3"}',  # not ours
        b'{"type":"system","subtype":"task_notification","task_id":7}',  # no id
        b'{"type":"system","subtype":"task_notification","task_id":"b4","sta',  # torn
    ]
    session.events_file.write_bytes(b"\n".join(lines))
    assert _ended_in_stream(session) == ({"b1", "b2"}, {"b1"})
