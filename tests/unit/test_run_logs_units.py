"""The pure parts of `shoal run`'s log: result file names, the run's team name, the ETA, the
failure frame and the tagged follower (on real files, no processes)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.core.names import validate_name
from shoal.orchestrator.batch.options import default_run_team
from shoal.orchestrator.batch.results import MAX_STEM, ResultsDir, result_names, safe_stem
from shoal.ui.run_output import FOLLOW_INTERVAL_S, Follower, failure_frame, iter_lines
from shoal.ui.run_progress import estimate_eta, format_eta


@pytest.mark.parametrize(
    ("task_id", "stem"),
    [
        ("name[py=3.11,shard=1]", "name_py=3.11_shard=1"),
        ("build.linux", "build.linux"),
        ("a/b\\c d", "a_b_c_d"),
        (".hidden", "_.hidden"),
        ("-x", "_-x"),
        ("[]", "_"),
    ],
)
def test_safe_stems(task_id: str, stem: str) -> None:
    assert safe_stem(task_id) == stem


@given(st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=20, unique=True))
def test_result_names_are_distinct_safe_and_short(ids: list[str]) -> None:
    names = result_names(ids)
    assert set(names) == set(ids)
    folded = [n.casefold() for n in names.values()]
    assert len(set(folded)) == len(folded)  # distinct even where case does not count
    for name in names.values():
        assert "/" not in name and "\0" not in name and not name.startswith((".", "-"))
        assert len(name.encode()) < 255 and name.endswith(".out")


def test_a_cut_name_gets_a_hash() -> None:
    long = "x" * (MAX_STEM + 10)
    (name,) = result_names([long]).values()
    assert name.startswith("x" * MAX_STEM + "-") and name.endswith(".out")


def test_results_dir_copies_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    src = tmp_path / "task.output"
    src.write_bytes(b"\x00\xff" * 300_000)
    results = ResultsDir(tmp_path / "out" / "deep", ["t[a=1]"])
    dest = results.copy("t[a=1]", src)
    assert dest == tmp_path / "out" / "deep" / "t_a=1.out"
    assert dest.read_bytes() == src.read_bytes()
    with pytest.raises(FileNotFoundError):
        results.copy("t[a=1]", tmp_path / "missing")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["t_a=1.out"]
    link = tmp_path / "link"
    link.symlink_to(src)
    with pytest.raises(OSError):  # an output file is never read through a link
        results.copy("t[a=1]", link)


@pytest.mark.parametrize(
    ("file_name", "team"),
    [
        ("ci.toml", "run-ci"),
        ("CI Build.toml", "run-ci-build"),
        ("123.toml", "run-123"),
        ("???.toml", "run"),
        ("a" * 80 + ".toml", "run-" + "a" * 44),
    ],
)
def test_default_run_team(file_name: str, team: str) -> None:
    assert default_run_team(Path(file_name)) == team
    assert validate_name(team, "team name") == team


@given(st.text(min_size=0, max_size=100))
def test_default_run_team_is_always_a_valid_name(stem: str) -> None:
    name = default_run_team(Path(f"{stem.replace('/', '_')}.toml"))
    assert validate_name(name, "team name") == name


def test_eta() -> None:
    assert estimate_eta([], [1.0], 5, 2) is None  # nothing finished: no estimate
    # One quick task finished while the rest run or wait: nothing to go by yet (not "0s").
    assert estimate_eta([0.015], [3.0, 3.0], 2, 2) is None
    assert estimate_eta([0.015, 0.02], [3.0], 5, 2) is None
    # 4 waiting at 10 s each and one running for 4 s of its 10, on 2 slots: (40 + 6) / 2.
    assert estimate_eta([5.0, 15.0, 10.0], [4.0], 4, 2) == 23.0
    assert estimate_eta([10.0, 10.0, 10.0], [], 3, 0) == 10.0  # no job limit: all at once
    # Past the mean: as long again as it has run (not "done").
    assert estimate_eta([10.0, 10.0, 10.0], [12.0], 0, 4) == 12.0
    assert estimate_eta([10.0, 10.0, 10.0], [], 0, 4) == 0.0
    assert estimate_eta([10.0, 10.0], [], 0, 4) == 0.0  # a run of two: both done
    assert [format_eta(s) for s in (None, 4.4, 80, 3725)] == [
        "ETA ?",
        "ETA 4s",
        "ETA 1m20s",
        "ETA 1h02m",
    ]


def test_failure_frame(tmp_path: Path) -> None:
    out = tmp_path / "b.output"
    out.write_text("".join(f"line {i}\n" for i in range(1, 101)) + "last, no newline")
    lines = failure_frame("unit", "FAILED (exit code 1)", str(out), 3)
    assert lines == [
        f"--- unit: FAILED (exit code 1): last 3 line(s) of {out} ---",
        "line 99",
        "line 100",
        "last, no newline",
        "--- end of unit ---",
    ]
    assert failure_frame("unit", "FAILED", str(out), 0) == []
    empty = tmp_path / "e.output"
    empty.write_text("")
    assert failure_frame("u", "FAILED", str(empty), 5) == [f"--- u: FAILED: {empty} is empty ---"]
    gone = failure_frame("u", "FAILED", str(tmp_path / "none"), 5)
    assert gone == [f"--- u: FAILED: no output to show (of {tmp_path / 'none'} cannot be read) ---"]


def test_iter_lines_reads_across_chunks(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.write_bytes(b"a" * (3 << 20) + b"\nb\n\nc")
    assert [len(x) for x in iter_lines(str(out))] == [3 << 20, 1, 0, 1]


def test_follower_prints_whole_lines_then_the_rest_at_the_end(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.write_text("")
    got: list[str] = []
    follower = Follower(got.append, threading.RLock())
    follower.follow("t[x=1]", str(out))
    with out.open("a") as f:
        f.write("one\ntw")
        f.flush()
        follower._drain(follower.files["t[x=1]"], final=False)  # (one pass of its thread)
        assert got == ["t[x=1]\tone"]
        f.write("o\nthree")
    assert follower.end("t[x=1]") is True
    assert got == ["t[x=1]\tone", "t[x=1]\ttwo", "t[x=1]\tthree"]
    assert follower.end("t[x=1]") is False  # (not followed any more)
    follower.close()


@pytest.mark.timeout(30)
def test_follower_closes_while_its_caller_holds_the_lock(tmp_path: Path) -> None:
    # The progress closes the follower from inside an event, with the shared lock held; the
    # follower's thread, wanting that lock for its next pass, must still end.
    out = tmp_path / "o"
    out.write_text("x\n")
    lock = threading.RLock()
    got: list[str] = []
    follower = Follower(got.append, lock)
    with lock:
        follower.follow("t", str(out))
        # (several of the thread's passes come due meanwhile: it is waiting for the lock)
        threading.Event().wait(5 * FOLLOW_INTERVAL_S)
        follower.close()
    assert got == ["t\tx"]
    assert follower._thread is not None and not follower._thread.is_alive()
