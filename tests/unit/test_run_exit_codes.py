"""`shoal run`'s exit codes: one table, documented as it is, and the engine's verdicts."""

from __future__ import annotations

from pathlib import Path

from shoal.orchestrator.batch import BatchRun, Finished, exitcodes
from shoal.orchestrator.batch.exitcodes import EXIT_CODES, markdown_table
from tests.unit.test_run_spec import Clock, FakeShell, end, make_run, start, statuses

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "run-exit-codes.md"


def test_the_doc_holds_the_table_as_the_code_has_it() -> None:
    assert markdown_table() in DOC.read_text(), (
        "docs/reference/run-exit-codes.md is out of date: put markdown_table() in it"
    )


def test_codes_are_distinct_and_keep_the_cli_contract() -> None:
    codes = [c.code for c in EXIT_CODES]
    assert len(codes) == len(set(codes))
    assert (exitcodes.OK, exitcodes.TASKS_FAILED, exitcodes.USAGE) == (0, 1, 2)
    assert (exitcodes.TIMED_OUT, exitcodes.INTERRUPTED) == (124, 130)
    assert exitcodes.INFRASTRUCTURE not in (0, 1, 2, 124, 130)


TIMEOUTS = """
[[task]]
id = "slow"
run = "x"
timeout = "5s"
[[task]]
id = "after_slow"
run = "y"
after = ["slow"]
[[task]]
id = "other"
run = "z"
"""


def _time_out(run: BatchRun, shell: FakeShell, clock: Clock, task_id: str) -> None:
    handle = start(run, shell, task_id)
    clock.now += 6
    run.tick()
    assert (handle, "timed out after 5s") in shell.stopped
    run.feed(Finished(handle, "killed", exit_code=143, ended_at=clock.now, ran=True))
    run.tick()


def test_only_timeouts_in_the_way_of_green_exit_124() -> None:
    run, shell, _, clock = make_run(TIMEOUTS)
    run.tick()
    _time_out(run, shell, clock, "slow")
    end(run, shell, "other")
    assert run.done
    assert statuses(run) == {"slow": "timed_out", "after_slow": "skipped", "other": "succeeded"}
    assert run.exit_code() == exitcodes.TIMED_OUT == 124


def test_a_failure_beside_a_timeout_exits_1() -> None:
    run, shell, _, clock = make_run(TIMEOUTS)
    run.tick()
    _time_out(run, shell, clock, "slow")
    end(run, shell, "other", "failed", 2)
    assert run.done and run.exit_code() == exitcodes.TASKS_FAILED


# --------------------------------------------------------------------------- always = true

ALWAYS = """
[[task]]
id = "tests"
run = "x"
[[task]]
id = "lint"
run = "y"
[[task]]
id = "publish"
run = "p"
after = ["tests"]
[[task]]
id = "report"
run = "r"
after = ["tests", "lint"]
always = true
"""


def test_an_always_task_runs_after_its_dependencies_fail() -> None:
    run, shell, _, _ = make_run(ALWAYS)
    run.tick()
    end(run, shell, "tests", "failed", 1)
    assert "report" not in shell.ids()  # (lint still runs)
    end(run, shell, "lint")
    assert "report" in shell.ids()
    end(run, shell, "report")
    assert run.done
    assert statuses(run) == {
        "tests": "failed",
        "lint": "succeeded",
        "publish": "skipped",
        "report": "succeeded",
    }
    assert run.exit_code() == exitcodes.TASKS_FAILED


def test_an_always_task_runs_after_a_halt() -> None:
    run, shell, _, _ = make_run(ALWAYS, jobs=1, halt="soon,fail=1")
    run.tick()
    end(run, shell, "tests", "failed", 1)  # halt: lint and publish never start
    assert shell.ids().count("report") == 1
    end(run, shell, "report")
    assert statuses(run)["lint"] == "skipped" and statuses(run)["report"] == "succeeded"
