"""The CI side of `shoal run` without processes: which CI, GitHub's command escaping, where
a failure is, the table's cut and GitLab's section lines."""

from __future__ import annotations

from pathlib import Path

from shoal.orchestrator.batch.ci import (
    Row,
    detect,
    fold_end,
    fold_start,
    github_annotations,
    github_command,
    text_table,
)


def test_detect_reads_the_ci_from_the_environment() -> None:
    assert detect("auto", {"GITHUB_ACTIONS": "true"}) == "github"
    assert detect("auto", {"GITLAB_CI": "true"}) == "gitlab"
    assert detect("auto", {"CI": "true"}) == "none"
    assert detect("none", {"GITHUB_ACTIONS": "true"}) == "none"
    assert detect("gitlab", {}) == "gitlab"


def test_github_commands_are_escaped() -> None:
    line = github_command("error", "50% off\nline two", file="a,b.py", line=3, title="t: x")
    assert line == "::error file=a%2Cb.py,line=3,title=t%3A x::50%25 off%0Aline two"
    assert github_command("warning", "m", file=None) == "::warning::m"


def test_a_failure_is_located_from_its_attributes_or_its_trace(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuite name="s">'
        '<testcase classname="pkg.test_a" name="t1" file="pkg/test_a.py" line="9">'
        '<failure message="no">x</failure></testcase>'
        '<testcase classname="pkg.test_b" name="t2"><error message="boom">'
        "trace\npkg/helpers.py:4: in f\npkg/test_b.py:12: ValueError</error></testcase>"
        '<testcase classname="c" name="ok"/></testsuite>'
    )
    task = {"id": "unit", "status": "failed", "junit": str(report), "reason": "exit code 1"}
    skipped = {"id": "later", "status": "skipped"}
    bare = {"id": "lint", "status": "failed", "reason": "exit code 2"}
    lines = github_annotations(
        {"tasks": [task, skipped, bare]}, {"unit": str(tmp_path / "sub")}, base=str(tmp_path)
    )
    assert lines == [
        "::error file=sub/pkg/test_a.py,line=9,title=unit%3A pkg.test_a.t1::no",
        "::error file=sub/pkg/test_b.py,line=12,title=unit%3A pkg.test_b.t2::boom",
        "::error title=shoal run%3A task lint::exit code 2",
    ]


def test_a_long_table_leaves_out_plain_successes() -> None:
    rows = [Row(f"t{i}", "succeeded", 1, 0.5) for i in range(60)]
    rows += [Row("unit", "succeeded", 1, 3.0, 10, 0, 1), Row("bad", "failed", 2, 1.0)]
    lines = text_table(rows, limit=50)
    assert [ln.split()[0] for ln in lines[1:3]] == ["unit", "bad"]
    assert lines[-1] == "(and 60 more task(s) that succeeded, without tests)"
    assert lines[1].split() == ["unit", "succeeded", "1", "3.0", "s", "10", "0", "1"]


def test_folding_lines() -> None:
    assert fold_start("github", "x", "x: ok", 5.0) == "::group::x: ok"
    assert fold_end("github", "x", 5.0) == "::endgroup::"
    start = fold_start("gitlab", "shard[py=3.12]", "shard: ok", 17.9)
    assert start == "\x1b[0Ksection_start:17:shard_py_3.12[collapsed=true]\r\x1b[0Kshard: ok"
    assert (
        fold_end("gitlab", "shard[py=3.12]", 18.0) == "\x1b[0Ksection_end:18:shard_py_3.12\r\x1b[0K"
    )
    assert fold_start("none", "x", "x", 0) is None
