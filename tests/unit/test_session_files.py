"""Session files as polling readers see them: raw task table, history read incrementally."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from shoal.core.errors import CorruptFileError
from shoal.core.paths import Layout
from shoal.orchestrator.session import HistoryReader, Session


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
