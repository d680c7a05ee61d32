"""`shoal run` spec features without processes: matrix expansion, retry delays, a task's own
JUnit report merged into the run's, and the dry-run plan."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.orchestrator.batch import Finished, RunStatus
from shoal.orchestrator.batch.junit import check_written, read_cases, stamp
from shoal.orchestrator.batch.plan import build_plan, render_plan
from shoal.orchestrator.batch.report import junit_xml
from shoal.orchestrator.batch.spec import parse_delay
from tests.unit.test_run_spec import end, errors_of, make_run, spec_of, start, statuses

# --------------------------------------------------------------------------- matrix

MATRIX = """
[[task]]
id = "build"
run = "make"

[[task]]
id = "unit"
matrix = { py = ["3.11", "3.12"], shard = [1, 2] }
run = ["tox", "-e", "py{py}", "--", "--shard={shard}", "${HOME}", "{{py}}"]
description = "unit tests {py}/{shard}"
env = { SHARD = "{shard}" }
cwd = "py{py}"
junit = "reports/{shard}.xml"
after = "build"

[[task]]
id = "lint"
matrix.py = ["3.12"]
run = "ruff --target py{py}"
after = "unit[py=3.11,shard=2]"

[[task]]
id = "report"
run = "collect"
after = ["unit", "lint"]
"""


def test_a_matrix_task_expands_into_one_task_per_combination() -> None:
    spec = spec_of(MATRIX)
    ids = [t.id for t in spec.tasks]
    units = ["unit[py=3.11,shard=1]", "unit[py=3.11,shard=2]"]
    units += ["unit[py=3.12,shard=1]", "unit[py=3.12,shard=2]"]
    assert ids == ["build", *units, "lint[py=3.12]", "report"]
    assert [t.seq for t in spec.tasks] == list(range(1, 8))  # the joblog's Seq stays unique
    first = spec.task("unit[py=3.11,shard=1]")
    assert first.run == ("tox", "-e", "py3.11", "--", "--shard=1", "${HOME}", "{py}")
    assert first.description == "unit tests 3.11/1" and first.env["SHARD"] == "1"
    assert first.cwd == "/project/ci/py3.11"
    assert first.junit == "/project/ci/py3.11/reports/1.xml"  # relative to the task's cwd
    assert first.base == "unit" and dict(first.matrix) == {"py": "3.11", "shard": "1"}
    assert first.after == ("build",) and first.line == spec.task("unit[py=3.12,shard=2]").line
    # after = "unit" waits for every combination; a full id names one of them
    assert spec.task("report").after == (*units, "lint[py=3.12]")
    assert spec.task("lint[py=3.12]").after == ("unit[py=3.11,shard=2]",)
    assert spec.task("lint[py=3.12]").run == "ruff --target py3.12"


def test_matrix_tasks_run_in_dependency_order() -> None:
    run, shell, _, _ = make_run(MATRIX)
    assert shell.ids() == ["build"]
    end(run, shell, "build")
    assert sorted(shell.ids()[1:]) == sorted(t for t in run.tasks if t.startswith("unit["))
    end(run, shell, "unit[py=3.11,shard=1]", "failed", 1)
    assert statuses(run)["report"] == "skipped"
    assert run.tasks["report"].reason == 'dependency "unit[py=3.11,shard=1]" failed'


@pytest.mark.parametrize(
    ("matrix", "fragment"),
    [
        ('["3.11"]', "matrix must be a table of KEY = [values]"),
        ("{}", "not an empty table"),
        ("{ py = [] }", "matrix key py must be a non-empty array of values, not an empty array"),
        ('{ py = "3.11" }', "must be a non-empty array of values, not a string"),
        ("{ py = [3.10] }", 'write such values as strings ("3.10", not 3.10'),
        ("{ py = [true] }", "values are strings or integers, not a boolean"),
        ('{ py = ["a b"] }', "bad value 'a b'"),
        ('{ py = ["x]"] }', "bad value 'x]'"),
        ('{ py = ["1", 1] }', 'matrix key py lists "1" twice'),
        ('{ "2py" = ["1"] }', 'matrix key "2py" is not a name'),
        (
            f"{{ a = {list(range(10))}, b = {list(range(10))}, c = {list(range(11))} }}",
            "matrix has 1100 combinations; at most 1000",
        ),
    ],
)
def test_bad_matrices_are_spec_errors_at_their_line(matrix: str, fragment: str) -> None:
    errors = errors_of(f'[[task]]\nid = "t"\nrun = "echo {{py}}"\nmatrix = {matrix}\n')
    assert any(e.startswith("spec.toml:4: ") and fragment in e for e in errors), errors


def test_unknown_placeholders_are_spec_errors_naming_the_field() -> None:
    errors = errors_of(
        '[[task]]\nid = "t"\nmatrix = { py = ["3.11"] }\nrun = "echo {pyy}"\n'
        'junit = "r/{shard}.xml"\n'
    )
    assert errors == [
        'spec.toml:4: task "t": run: unknown placeholder "{pyy}" (did you mean "py"?); the '
        'matrix keys are py (write {{pyy}} for a literal "{pyy}")',
        'spec.toml:5: task "t": junit: unknown placeholder "{shard}"; the matrix keys are py '
        '(write {{shard}} for a literal "{shard}")',
    ]


def test_a_spec_without_matrix_keeps_its_braces_as_written() -> None:
    spec = spec_of("[[task]]\nid = 't'\nrun = \"awk '{print}' {x} {{y}}\"\n")
    assert spec.task("t").run == "awk '{print}' {x} {{y}}"


def test_matrix_errors_in_other_fields_are_reported_once() -> None:
    errors = errors_of(
        '[[task]]\nid = "t"\nmatrix = { n = [1, 2, 3] }\nrun = "echo {n}"\ntimeout = "soon"\n'
        'after = ["t", "nope"]\njunit = "same.xml"\n'
    )
    assert sum("timeout" in e for e in errors) == 1
    assert 'spec.toml:6: task "t": lists itself in after' in errors
    assert 'spec.toml:6: task "t": after names unknown task "nope"' in errors
    assert (
        errors.count(
            'spec.toml:7: task "t[n=2]": junit file /project/ci/same.xml is also the report of '
            'task "t[n=1]" (use a matrix placeholder in junit)'
        )
        == 1
    )


def test_a_matrix_base_id_is_unique_among_task_ids() -> None:
    errors = errors_of(
        '[[task]]\nid = "t"\nrun = "x"\n[[task]]\nid = "t"\nmatrix = { n = [1] }\nrun = "{n}"\n'
    )
    assert errors == ['spec.toml:5: task id "t" is used twice (first at line 2)']


def test_junit_is_for_run_tasks_and_paths_are_not_shared() -> None:
    errors = errors_of(
        '[[member]]\nname = "m"\n[[task]]\nid = "a"\nprompt = "p"\nassign = "m"\n'
        'junit = "a.xml"\n[[task]]\nid = "b"\nrun = "x"\njunit = "r.xml"\n'
        '[[task]]\nid = "c"\nrun = "y"\njunit = "./r.xml"\n'
    )
    assert errors == [
        'spec.toml:7: task "a": junit is for run tasks (a command\'s report)',
        'spec.toml:15: task "c": junit file /project/ci/r.xml is also the report of task "b"',
    ]


# --------------------------------------------------------------------------- retry delay


@pytest.mark.parametrize(
    ("value", "seconds"), [(0, 0.0), ("0", 0.0), ("0s", 0.0), (2, 2.0), ("1.5s", 1.5), ("1m", 60)]
)
def test_retry_delays(value: object, seconds: float) -> None:
    assert parse_delay(value) == seconds


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('"soon"', 'retry_delay: bad duration "soon"'),
        ("-1", "retry_delay: a duration must be more than zero"),
        ("true", "retry_delay: a timeout is a number of seconds"),
        ("[1]", "retry_delay: a duration is a number"),
    ],
)
def test_bad_retry_delays_are_spec_errors(value: str, fragment: str) -> None:
    errors = errors_of(f'[[task]]\nid = "t"\nrun = "x"\nretries = 1\nretry_delay = {value}\n')
    assert len(errors) == 1 and errors[0].startswith('spec.toml:5: task "t": ' + fragment)
    errors = errors_of(f'[run]\nretry_delay = {value}\n[[task]]\nid = "t"\nrun = "x"\n')
    assert len(errors) == 1 and errors[0].startswith("spec.toml:2: [run]: " + fragment)


def test_retry_delay_doubles_on_each_retry() -> None:
    spec = spec_of(
        '[run]\nretry_delay = "2s"\n[[task]]\nid = "a"\nrun = "x"\nretries = 3\n'
        '[[task]]\nid = "b"\nrun = "y"\nretry_delay = 0\n'
    )
    assert [spec.task("a").delay_before(n) for n in (1, 2, 3, 4)] == [0.0, 2.0, 4.0, 8.0]
    assert spec.task("b").delay_before(2) == 0.0


def test_a_retry_waits_out_its_delay_before_it_is_submitted() -> None:
    run, shell, events, clock = make_run(
        "[[task]]\nid = 'f'\nrun = 'x'\nretries = 3\nretry_delay = '10s'\n"
    )
    delays = []
    for attempt, wait in ((1, 10.0), (2, 20.0), (3, 40.0)):
        end(run, shell, "f", "failed", 1, attempt=attempt)
        assert shell.ids().count("f") == attempt  # not yet
        assert run.next_deadline() == pytest.approx(clock.now + wait)
        clock.now += wait - 0.001
        run.tick()
        assert shell.ids().count("f") == attempt and run.tasks["f"].status == RunStatus.PENDING
        clock.now += 0.001
        run.tick()
        assert shell.ids().count("f") == attempt + 1
        delays.append(next(e for e in reversed(events) if e["subtype"] == "task_retrying"))
    assert [e["delay_s"] for e in delays] == [10.0, 20.0, 40.0]
    end(run, shell, "f", "completed", 0, attempt=4)
    assert run.done and statuses(run) == {"f": "succeeded"}


def test_an_interrupt_during_a_retry_delay_keeps_the_failure() -> None:
    run, shell, _, _ = make_run("[[task]]\nid = 'f'\nrun = 'x'\nretries = 1\nretry_delay = 60\n")
    end(run, shell, "f", "failed", 1)
    run.interrupt("SIGINT")
    assert run.done and statuses(run) == {"f": "failed"} and run.next_deadline() is None


# --------------------------------------------------------------------------- a task's JUnit

PYTEST_REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="1" skipped="1"
 tests="3" time="0.1" timestamp="2026-01-01T00:00:00" hostname="h">
<testcase classname="test_a" name="test_ok" file="test_a.py" line="1" time="0.001">
 <properties><property name="k" value="v"/></properties></testcase>
<testcase classname="test_a" name="test_bad" time="0.002"><failure message="assert 1 == 2">
 trace <b>bold</b></failure><system-out>printed</system-out></testcase>
<testcase classname="test_a" name="test_skip" time="0"><skipped type="pytest.skip"
 message="later">why</skipped></testcase>
</testsuite></testsuites>
"""


def test_a_report_is_read_and_cut_to_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(PYTEST_REPORT)
    cases = read_cases(str(path))
    assert [c.get("name") for c in cases] == ["test_ok", "test_bad", "test_skip"]
    assert cases[0].attrib == {"name": "test_ok", "classname": "test_a", "time": "0.001"}
    assert list(cases[0]) == []  # per-case properties are not in the schema
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "assert 1 == 2"
    assert list(failure) == [] and "trace bold" in (failure.text or "")
    assert [c.tag for c in cases[1]] == ["failure", "system-out"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no JUnit report at {p}: the task did not write it"),
        ("<testsuites><testcase", "JUnit report {p} is not valid XML: "),
        ("<html/>", "JUnit report {p} is not JUnit XML: its root element is <html>"),
    ],
)
def test_unusable_reports_name_the_file_and_the_problem(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    path = tmp_path / "r.xml"
    if content is not None:
        path.write_text(content)
    problem = check_written(str(path), None)
    assert problem is not None and fragment.format(p=path) in problem


def test_a_report_left_from_before_the_attempt_is_not_this_attempts(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(PYTEST_REPORT)
    before = stamp(str(path))
    assert "was not written by this attempt" in (check_written(str(path), before) or "")
    path.unlink()
    path.write_text(PYTEST_REPORT)  # a new file (another inode) with the same content
    assert check_written(str(path), before) is None


def _task(task_id: str, status: str, **fields: Any) -> dict[str, Any]:
    return {"id": task_id, "status": status, "duration_s": 1.25, **fields}


def suites_of(report: dict[str, Any]) -> dict[str, ET.Element]:
    root = ET.fromstring(junit_xml(report))
    return {str(s.get("name")): s for s in root.findall("testsuite")}


def test_a_tasks_report_is_merged_as_its_own_suite(tmp_path: Path) -> None:
    good = tmp_path / "good.xml"
    good.write_text(PYTEST_REPORT)
    report = {
        "team": "ci",
        "spec": "/p/s.toml",
        "duration_s": 3.0,
        "tasks": [
            _task("build", "succeeded"),
            _task("unit[n=1]", "failed", exit_code=1, junit=str(good)),
            _task("unit[n=2]", "timed_out", reason="timed out after 1s", junit=str(good)),
            _task("unit[n=3]", "failed", junit=str(tmp_path / "none.xml"), reason="exit code 2"),
            _task(
                "unit[n=4]",
                "failed",
                junit=str(good),
                junit_error="JUnit report X was not written by this attempt",
                reason="JUnit report X was not written by this attempt",
            ),
            _task("unit[n=5]", "skipped", reason='dependency "build" failed', junit=str(good)),
        ],
    }
    root = ET.fromstring(junit_xml(report))
    assert "skipped" not in root.attrib
    suites = suites_of(report)
    assert list(suites) == ["ci", "unit[n=1]", "unit[n=2]", "unit[n=3]", "unit[n=4]", "unit[n=5]"]
    assert [c.get("name") for c in suites["ci"].iter("testcase")] == ["build"]
    one = suites["unit[n=1]"]
    assert [c.get("name") for c in one.iter("testcase")] == ["test_ok", "test_bad", "test_skip"]
    assert (one.get("tests"), one.get("failures"), one.get("errors"), one.get("skipped")) == (
        "3",
        "1",
        "0",
        "1",
    )
    assert one.get("time") == "1.250"
    # passing testcases do not tell why the task timed out: its own case does
    two = [c.get("name") for c in suites["unit[n=2]"].iter("testcase")]
    assert two == ["test_ok", "test_bad", "test_skip"]  # (this one had a failure already)
    three = list(suites["unit[n=3]"].iter("testcase"))
    assert len(three) == 1 and three[0].get("name") == "unit[n=3]"
    error = three[0].find("error")
    assert error is not None and error.get("type") == "junit_report"
    assert error.get("message") == (
        f"no JUnit report at {tmp_path / 'none.xml'}: the task did not write it "
        "(the task failed: exit code 2)"
    )
    four = list(suites["unit[n=4]"].iter("testcase"))
    assert len(four) == 1 and four[0].find("error") is not None
    five = list(suites["unit[n=5]"].iter("testcase"))
    assert len(five) == 1 and five[0].find("skipped") is not None
    assert root.get("tests") == str(1 + 3 + 3 + 1 + 1 + 1)
    assert root.get("failures") == "2" and root.get("errors") == "2"


def test_a_timed_out_task_with_only_passing_cases_gets_its_own_case(tmp_path: Path) -> None:
    passing = tmp_path / "p.xml"
    passing.write_text('<testsuite name="x" tests="1"><testcase name="t_ok"/></testsuite>')
    suites = suites_of(
        {"team": "ci", "tasks": [_task("u", "timed_out", reason="timed out", junit=str(passing))]}
    )
    cases = list(suites["u"].iter("testcase"))
    assert [c.get("name") for c in cases] == ["t_ok", "u"]
    assert suites["u"].get("failures") == "1" and suites["u"].get("tests") == "2"


def test_a_finished_attempt_carries_its_junit_problem_into_the_report() -> None:
    run, shell, _, _ = make_run("[[task]]\nid = 'u'\nrun = 'pytest'\nretries = 0\n")
    handle = start(run, shell, "u")
    run.feed(Finished(handle, "failed", exit_code=0, error="no JUnit", junit_error="no JUnit"))
    task = run.tasks["u"].to_json()
    assert task["status"] == "failed" and task["reason"] == "no JUnit"
    assert task["junit_error"] == "no JUnit"


# --------------------------------------------------------------------------- the plan


def test_the_plan_lists_tasks_in_start_order_with_stages(tmp_path: Path) -> None:
    spec = spec_of(
        '[run]\nteam = "ci"\n'
        + MATRIX.replace('run = "collect"', 'run = "collect"\nretries = 2\nretry_delay = 3')
    )
    plan = build_plan(spec, Layout(tmp_path), jobs=2)
    assert plan["dry_run"] is True and plan["jobs"] == 2 and plan["team"] == "ci"
    stages = {t["id"]: t["stage"] for t in plan["tasks"]}
    assert stages["build"] == 1 and stages["unit[py=3.12,shard=2]"] == 2
    assert stages["lint[py=3.12]"] == 3 and stages["report"] == 4
    assert plan["tasks"][0]["id"] == "build"
    assert plan["tasks"][-1]["id"] == "report"
    report = plan["tasks"][-1]
    assert report["retry_delays_s"] == [3.0, 6.0] and report["after"][0] == "unit[py=3.11,shard=1]"
    unit = next(t for t in plan["tasks"] if t["id"] == "unit[py=3.11,shard=1]")
    assert unit["matrix"] == {"py": "3.11", "shard": "1"} and unit["base"] == "unit"
    assert unit["argv"][:3] == ["tox", "-e", "py3.11"]
    assert plan["counts"] == {"total": 7, "stages": 4, "carried": 0}
    text = render_plan(plan)
    assert text.splitlines()[0].startswith("dry run of /project/ci/spec.toml: 7 task(s) in 4")
    assert "nothing is started" in text.splitlines()[0]
    assert "retries 2 after 3s, 6s" in text
    assert "   after: unit[py=3.11,shard=1], unit[py=3.11,shard=2]" in text
    # without a team named, the run's own team, as the run would name it
    assert build_plan(spec_of(MATRIX), Layout(tmp_path))["team"] == "run-spec"
    assert build_plan(spec_of(MATRIX), Layout(tmp_path), team="mine")["team"] == "mine"
