"""A real pytest suite (generated: 300 tests in 10 files, tests/support/pysuite.py) sharded
three ways through `shoal run`, as a GitHub Actions job runs it: one test fails every time,
one only on its shard's first attempt. The merged JUnit report is valid against Jenkins'
junit-10.xsd and shows the flaky test as flaky; GitHub gets an `::error` line at the failing
test's file and line, and a step summary with each shard's tests counted."""

from __future__ import annotations

import re
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.conftest import Cli
from tests.integration.test_run_junit_matrix import junit_schema
from tests.support.pysuite import Suite, write_suite

FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
SHARDS = 3


def spec_for(tmp_path: Path, fail: str, flaky: str) -> Path:
    spec = tmp_path / "ci.toml"
    spec.write_text(
        textwrap.dedent(f"""
        [run]
        jobs = 2

        [run.env]
        PYTEST_DISABLE_PLUGIN_AUTOLOAD = "1"
        SUITE_FAIL = "{fail}"
        SUITE_FLAKY = "{flaky}"

        [[task]]
        id = "tests"
        matrix = {{ shard = [1, 2, 3] }}
        cwd = "suite"
        env = {{ SUITE_SHARD = "{{shard}}", SUITE_SHARDS = "{SHARDS}" }}
        run = ["{sys.executable}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--junitxml=../reports/{{shard}}.xml"]
        junit = "../reports/{{shard}}.xml"
        retries = 1

        [[task]]
        id = "lint"
        run = "true"

        [[task]]
        id = "collect"
        run = "ls reports > collected.txt"
        after = ["tests"]
        always = true
        """)
    )
    return spec


def assert_line(suite: Suite, node_id: str) -> tuple[str, int]:
    """The file and line of the assertion by which `node_id` fails when chosen."""
    file, name = node_id.split("::")
    lines = (suite.root / file).read_text().splitlines()
    start = lines.index(f"def {name}(request):")
    return file, start + 3  # (1-based: the line after `value = ...`)


def test_a_sharded_pytest_suite_on_github_actions(cli: Cli, tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "suite", files=10, per_file=30)
    fail = suite.in_shard(2, SHARDS)[7]
    flaky = suite.in_shard(1, SHARDS)[3]
    spec = spec_for(tmp_path, fail, flaky)
    merged, summary = tmp_path / "merged.xml", tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    env = {
        **FAST,
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_WORKSPACE": str(tmp_path),
    }
    out = cli("run", str(spec), "--junit", str(merged), env=env, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    assert (tmp_path / "collected.txt").read_text().split() == ["1.xml", "2.xml", "3.xml"]

    # The merged report: valid, every test once, the failure and the flaky test shown.
    junit_schema().validate(str(merged))
    root = ET.parse(merged).getroot()
    cases = {
        f"{c.get('classname')}.{c.get('name')}": c
        for s in root.findall("testsuite")
        if str(s.get("name")).startswith("tests[")
        for c in s.iter("testcase")
    }
    assert len(cases) == len(suite.node_ids) == 300
    failing = cases[fail.replace(".py::", ".")]
    assert failing.find("failure") is not None and len(failing.findall("rerunFailure")) == 1
    shaky = cases[flaky.replace(".py::", ".")]
    assert shaky.find("failure") is None and len(shaky.findall("flakyFailure")) == 1
    assert "chosen to fail" in (shaky.find("flakyFailure/stackTrace").text or "")  # type: ignore[union-attr]
    assert root.get("failures") == "1" and root.get("errors") == "0"

    # GitHub: an error annotation at the failing assertion, and the step summary.
    file, line = assert_line(suite, fail)
    errors = [ln for ln in out.stdout.splitlines() if ln.startswith("::error ")]
    module, test = fail.split("::")
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        f"::error file=suite/{file},line={line},"
        f"title=tests[shard=2]%3A {module.removesuffix('.py')}.{test}::"
    ), errors
    assert "chosen to fail" in errors[0]
    text = summary.read_text()
    assert text.startswith("earlier step\n### shoal run ci.toml: failed (exit 1)\n"), text
    rows = {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| task")
        for cells in [[c.strip() for c in line.strip("|").split(" | ")]]
    }
    shards = {f"tests[shard={n}]": len(suite.in_shard(n, SHARDS)) for n in (1, 2, 3)}
    assert set(rows) == {*shards, "lint", "collect"}
    for task_id, count in shards.items():
        _status, attempts, _took, passed, failed, skipped = rows[task_id]
        bad = 1 if task_id == "tests[shard=2]" else 0
        assert (int(passed), int(failed), int(skipped)) == (count - bad, bad, 0), rows[task_id]
        assert attempts == ("1" if task_id == "tests[shard=3]" else "2")
    assert rows["tests[shard=1]"][0].endswith("flaky")
    assert rows["tests[shard=2]"][0].endswith("failed")
    assert re.search(r"^tests\[shard=1\] +flaky +2 ", out.stdout, re.MULTILINE), out.stdout
