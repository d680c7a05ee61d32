"""The run record's journal: verdicts given between two whole writes of the record are on disk
at once, and `load` reads them over the record (what `--resume` plans from)."""

from __future__ import annotations

from pathlib import Path

import orjson

from shoal.core.paths import Layout
from shoal.orchestrator.batch.report import REPORT_VERSION, RecordSaver, RunRecords


def _report(run_id: str, **statuses: str) -> dict[str, object]:
    return {
        "v": REPORT_VERSION,
        "run_id": run_id,
        "tasks": [{"id": i, "status": s, "fingerprint": f"fp-{i}"} for i, s in statuses.items()],
    }


def _statuses(record: dict[str, object] | None) -> dict[str, str]:
    assert record is not None
    tasks = record["tasks"]
    assert isinstance(tasks, list)
    return {t["id"]: t["status"] for t in tasks}


def test_verdicts_between_writes_are_read_over_the_record(tmp_path: Path) -> None:
    records = RunRecords(Layout(tmp_path))
    spec = tmp_path / "spec.toml"
    state = {"a": "running", "b": "pending"}
    settled: list[str] = []
    saver = RecordSaver(records, "team", spec, "run1", interval=3600.0)

    def report() -> dict[str, object]:
        return _report("run1", **state)

    def entry(task_id: str) -> dict[str, str]:
        return {"id": task_id, "status": state[task_id], "fingerprint": f"fp-{task_id}"}

    assert saver.sync(1, settled, report, entry, full=True)  # the first write is whole
    state["a"] = "succeeded"
    settled.append("a")
    assert saver.sync(2, settled, report, entry, ended=True)
    # The record itself was not rewritten; its journal has the verdict.
    raw = orjson.loads(records.path("team", spec).read_bytes())
    assert _statuses(raw) == {"a": "running", "b": "pending"}
    assert _statuses(records.load("team", spec)) == {"a": "succeeded", "b": "pending"}
    # Nothing new: nothing written, not even with an ended attempt (a retry has no verdict).
    assert not saver.sync(3, settled, report, entry, ended=True)
    # A whole write makes the journal void.
    state["b"] = "failed"
    settled.append("b")
    assert saver.sync(4, settled, report, entry, full=True)
    assert not records.ends_path("team", spec).exists()
    assert _statuses(records.load("team", spec)) == {"a": "succeeded", "b": "failed"}


def test_a_journal_of_another_run_and_a_torn_line_are_ignored(tmp_path: Path) -> None:
    records = RunRecords(Layout(tmp_path))
    spec = tmp_path / "spec.toml"
    records.save("team", spec, _report("run2", a="running", b="running", c="running"))
    records.note_ends("team", spec, "run1", [{"id": "a", "status": "succeeded"}])
    records.note_ends("team", spec, "run2", [{"id": "b", "status": "succeeded"}])
    with open(records.ends_path("team", spec), "ab") as fh:
        fh.write(b'{"run_id": "run2", "task": {"id": "c", "stat')  # (the run died mid-write)
    assert _statuses(records.load("team", spec)) == {
        "a": "running",
        "b": "succeeded",
        "c": "running",
    }
    assert records.ends_path("team", spec).stat().st_mode & 0o777 == 0o600
