"""`shoal run` end to end for matrix tasks, tasks' own JUnit reports, retry delays and
`--dry-run`: real processes (pytest shards among them), real files, a real XSD validator.

The JUnit report is validated against the Jenkins xunit plugin's `junit-10.xsd` (MIT licence,
Copyright (c) 2014 Gregory Boissinot), from the jenkinsci/xunit-plugin repository at
src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd, when it is
kept as test data in tests/fixtures/junit-10.xsd (`$SHOAL_JUNIT_XSD` names another copy). The
tests fail, never fall back, when it is missing. tests/support/junit_structure.xsd, the same
structure written for these tests, is checked to refuse what junit-10 refuses.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

import xmlschema

from tests.conftest import Cli
from tests.integration.test_run import report_of, run, write_spec

REPO = Path(__file__).resolve().parents[2]
XSD_NAME = "junit-10.xsd"


def jenkins_schema() -> xmlschema.XMLSchema | None:
    """The Jenkins xunit plugin's junit-10.xsd, when it is given (None otherwise)."""
    candidates = [os.environ.get("SHOAL_JUNIT_XSD", "")]
    candidates += [str(REPO / "tests" / "fixtures" / XSD_NAME)]
    candidates += [str(REPO.parent / "shared" / "fixtures" / XSD_NAME)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return xmlschema.XMLSchema(candidate)
    return None


def junit_schema() -> xmlschema.XMLSchema:
    """Jenkins' junit-10.xsd: a missing schema fails the test rather than weakening it."""
    schema = jenkins_schema()
    assert schema is not None, f"tests/fixtures/{XSD_NAME} is missing (Jenkins' JUnit schema)"
    return schema


STRUCTURE_XSD = REPO / "tests" / "support" / "junit_structure.xsd"


def test_the_structure_schema_refuses_what_junit_10_refuses() -> None:
    """tests/support/junit_structure.xsd refuses `skipped` on <testsuites> (the report's old
    mistake), a suite without its test count and a testcase without a name."""
    schema = xmlschema.XMLSchema(str(STRUCTURE_XSD))
    good = '<testsuites tests="1"><testsuite name="s" tests="1"><testcase name="t"/>'
    assert schema.is_valid(good + "</testsuite></testsuites>")
    for bad in (
        '<testsuites skipped="0"><testsuite name="s" tests="0"/></testsuites>',
        '<testsuites><testsuite name="s"/></testsuites>',
        '<testsuites><testsuite name="s" tests="1"><testcase/></testsuite></testsuites>',
        '<testsuites><testsuite name="s" tests="-1"/></testsuites>',
    ):
        assert not schema.is_valid(bad), bad


def write_test_suite(directory: Path) -> int:
    """A small pytest suite in three files (one test fails, one is skipped); returns how many
    tests it has."""
    directory.mkdir()
    (directory / "pytest.ini").write_text("[pytest]\n")  # its own rootdir, no outside config
    files = {
        "test_one.py": "def test_a():\n    pass\n\ndef test_b():\n    pass\n\n"
        "def test_c():\n    assert 1 + 1 == 2\n",
        "test_two.py": "def test_d():\n    pass\n\ndef test_fails():\n    assert 'x' == 'y'\n",
        "test_three.py": "import pytest\n\ndef test_e():\n    pass\n\n"
        "@pytest.mark.skip(reason='a skip the merged JUnit report must count')\n"
        "def test_skipped():\n    pass\n\n"
        "def test_f():\n    pass\n",
    }
    for name, text in files.items():
        (directory / name).write_text(text)
    return 3 + 2 + 3


def pytest_shards_spec(tmp_path: Path, extra: str = "") -> Path:
    """A spec running the suite as three matrix shards, each writing its own JUnit file."""
    return write_spec(
        tmp_path,
        f"""\
        [run]
        team = "shards"

        [[task]]
        id = "prepare"
        run = "mkdir -p reports"

        [[task]]
        id = "pytest"
        matrix = {{ shard = ["one", "two", "three"] }}
        run = ["{sys.executable}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "suite/test_{{shard}}.py", "--junitxml=reports/{{shard}}.xml"]
        junit = "reports/{{shard}}.xml"
        after = "prepare"

        [[task]]
        id = "summary"
        run = "ls reports"
        after = "pytest"
        """
        + textwrap.dedent(extra),
    )


def suites(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    return {str(s.get("name")): s for s in root.findall("testsuite")}


def check_counts(path: Path) -> None:
    """Every count on every suite (and on the root) is that of the testcases it holds."""
    root = ET.parse(path).getroot()
    total = {"tests": 0, "failures": 0, "errors": 0}
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        found = {
            "tests": len(cases),
            "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": sum(1 for c in cases if c.find("error") is not None),
            "skipped": sum(
                1
                for c in cases
                if c.find("skipped") is not None
                and c.find("failure") is None
                and c.find("error") is None
            ),
        }
        assert {k: int(suite.get(k, "-1")) for k in found} == found, suite.get("name")
        for key in total:
            total[key] += found[key]
    assert {k: int(root.get(k, "-1")) for k in total} == total


def test_pytest_shards_merge_every_testcase_and_validate(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    schema = junit_schema()
    count = write_test_suite(tmp_path / "suite")
    spec = pytest_shards_spec(
        tmp_path,
        """
        [[task]]
        id = "passes"
        run = "echo fine"

        [[task]]
        id = "fails"
        run = "echo broken >&2; exit 3"

        [[task]]
        id = "slow"
        run = "sleep 60"
        timeout = "500ms"

        [[task]]
        id = "never"
        run = "echo unreachable"
        after = "fails"
        """,
    )
    junit = tmp_path / "junit.xml"
    out = run(cli, spec, "--junit", str(junit), "--report", str(tmp_path / "r.json"))
    assert out.returncode == 1, out.stdout + out.stderr
    schema.validate(str(junit))
    check_counts(junit)
    found = suites(junit)
    shard_suites = ["pytest[shard=one]", "pytest[shard=two]", "pytest[shard=three]"]
    assert list(found) == ["shards", *shard_suites]
    merged = [c for name in shard_suites for c in found[name].findall("testcase")]
    assert len(merged) == count  # every test of every shard, not one case per shard
    names = {c.get("name") for c in merged}
    assert {"test_a", "test_fails", "test_skipped", "test_f"} <= names
    assert found["pytest[shard=two]"].get("failures") == "1"
    assert found["pytest[shard=three]"].get("skipped") == "1"
    own = {c.get("name"): c for c in found["shards"].findall("testcase")}
    assert list(own) == ["prepare", "summary", "passes", "fails", "slow", "never"]
    assert own["slow"].find("failure") is not None and own["never"].find("skipped") is not None
    root = ET.parse(junit).getroot()
    assert "skipped" not in root.attrib and root.get("tests") == str(count + 6)
    _, tasks = report_of(tmp_path / "r.json")
    assert tasks["pytest[shard=two]"]["status"] == "failed"  # pytest's own exit code 1
    assert tasks["pytest[shard=one]"]["junit"] == str(tmp_path / "reports" / "one.xml")
    assert tasks["summary"]["status"] == "skipped"


def test_a_missing_or_malformed_report_fails_its_task_and_says_so(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    schema = junit_schema()
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "forgot"
        run = "true"
        junit = "out/forgot.xml"

        [[task]]
        id = "garbled"
        run = "mkdir -p out && printf '<testsuite name=\\"x\\"><testcase' > out/garbled.xml"
        junit = "out/garbled.xml"

        [[task]]
        id = "after-forgot"
        run = "true"
        after = "forgot"
        """,
    )
    junit, report = tmp_path / "junit.xml", tmp_path / "r.json"
    out = run(cli, spec, "--junit", str(junit), "--report", str(report))
    assert out.returncode == 1, out.stdout + out.stderr  # not green: nobody saw any test
    schema.validate(str(junit))
    check_counts(junit)
    found = suites(junit)
    forgot = found["forgot"].findall("testcase")
    assert len(forgot) == 1 and forgot[0].get("name") == "forgot"
    error = forgot[0].find("error")
    missing = tmp_path / "out" / "forgot.xml"
    assert error is not None
    assert error.get("message") == f"no JUnit report at {missing}: the task did not write it"
    garbled = found["garbled"].findall("testcase")
    message = garbled[0].find("error")
    assert len(garbled) == 1 and message is not None
    assert f"JUnit report {tmp_path / 'out' / 'garbled.xml'} is not valid XML: " in str(
        message.get("message")
    )
    assert "line 1, column" in str(message.get("message"))
    _, tasks = report_of(report)
    assert tasks["forgot"]["status"] == "failed" and tasks["forgot"]["exit_code"] == 0
    assert tasks["forgot"]["reason"] == f"no JUnit report at {missing}: the task did not write it"
    assert tasks["after-forgot"]["status"] == "skipped"
    assert f"FAILED    forgot  no JUnit report at {missing}" in out.stdout


def test_a_report_left_by_an_earlier_run_is_not_taken_for_this_one(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    write_test_suite(tmp_path / "suite")
    spec = write_spec(
        tmp_path,
        f"""\
        [[task]]
        id = "tests"
        run = '''if [ ! -e done-once ]; then touch done-once
        "{sys.executable}" -m pytest -q -p no:cacheprovider suite/test_one.py --junitxml=r.xml
        fi'''
        junit = "r.xml"
        """,
    )
    first = run(cli, spec)
    assert first.returncode == 0, first.stdout + first.stderr
    second = run(cli, spec, "--report", str(tmp_path / "r.json"))  # writes no report now
    assert second.returncode == 1, second.stdout + second.stderr
    _, tasks = report_of(tmp_path / "r.json")
    assert "was not written by this attempt" in tasks["tests"]["reason"]


def test_retry_delays_double_between_attempts(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "flaky"
        retries = 2
        retry_delay = "300ms"
        run = '''n=$(cat @D/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > @D/count
        [ "$n" -ge 3 ]'''
        """,
    )
    out = run(cli, spec, "--report", str(tmp_path / "r.json"), "--output-format", "stream-json")
    assert out.returncode == 0, out.stdout + out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    retrying = [e for e in events if e.get("subtype") == "task_retrying"]
    assert [e["delay_s"] for e in retrying] == [0.3, 0.6]
    _, tasks = report_of(tmp_path / "r.json")
    log = tasks["flaky"]["attempt_log"]
    assert [a["status"] for a in log] == ["failed", "failed", "succeeded"]

    def at(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    # Each retry starts no sooner than its delay after the attempt before it ended (the
    # report's times are cut to milliseconds).
    for before, after, delay in ((log[0], log[1], 0.3), (log[1], log[2], 0.6)):
        assert at(after["started_at"]) - at(before["ended_at"]) >= delay - 0.001
    (tmp_path / "count").unlink()
    text = run(cli, spec)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "retry flaky: attempt 1 failed (exit code 1); starting attempt 2 of 3 in 300ms" in (
        text.stdout
    )
    assert "starting attempt 3 of 3 in 600ms" in text.stdout


def test_dry_run_prints_the_plan_and_creates_nothing(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [run]
        team = "plan"

        [[task]]
        id = "build"
        run = "touch @D/built"

        [[task]]
        id = "test"
        matrix = { py = ["3.11", "3.12"] }
        run = "touch @D/tested-{py}"
        after = "build"
        retries = 1
        retry_delay = "2s"

        [[task]]
        id = "ship"
        run = "touch @D/shipped"
        after = "test"
        """,
    )
    out = run(cli, spec, "--dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"dry run of {spec}: 4 task(s) in 3 stage(s), team plan")
    assert [line for line in lines if ". [stage" in line] == [
        "1. [stage 1] build",
        "2. [stage 2] test[py=3.11]",
        "3. [stage 2] test[py=3.12]",
        "4. [stage 3] ship",
    ]
    assert f"   run: touch {tmp_path}/tested-3.12" in lines
    assert "   after: test[py=3.11], test[py=3.12]" in lines
    assert f"   cwd {tmp_path}; retries 1 after 2s" in lines
    as_json = run(cli, spec, "--dry-run", "--json", "--jobs", "3")
    assert as_json.returncode == 0, as_json.stderr
    plan: dict[str, Any] = json.loads(as_json.stdout)
    assert plan["dry_run"] is True and plan["jobs"] == 3 and plan["team"] == "plan"
    assert [t["id"] for t in plan["tasks"]] == ["build", "test[py=3.11]", "test[py=3.12]", "ship"]
    assert plan["tasks"][3]["after"] == ["test[py=3.11]", "test[py=3.12]"]
    assert plan["tasks"][1]["matrix"] == {"py": "3.11"} and plan["tasks"][1]["stage"] == 2
    assert list(tmp_path.glob("built")) == list(tmp_path.glob("tested-*")) == []
    assert sorted(p.name for p in home.iterdir()) == []  # no team, session or run record


def test_dry_run_of_a_bad_spec_is_a_spec_error(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "test"
        matrix = { py = [3.10] }
        run = "tox -e py{py} {shard}"
        retry_delay = "later"
        """,
    )
    out = run(cli, spec, "--dry-run", "--json")
    assert out.returncode == 2 and out.stdout == ""
    errors = out.stderr.splitlines()
    assert errors[0] == f"shoal: error: {spec}: 3 errors in the spec; nothing was started"
    assert errors[1].startswith(f'{spec}:3: task "test": matrix key py: 3.1 is a number')
    assert errors[2].startswith(f'{spec}:4: task "test": run: unknown placeholder "{{shard}}"')
    assert errors[3].startswith(f'{spec}:5: task "test": retry_delay: bad duration "later"')
    assert sorted(p.name for p in home.iterdir()) == []
    usage = run(cli, spec, "--json")
    assert usage.returncode == 2 and "--json goes with --dry-run" in usage.stderr
