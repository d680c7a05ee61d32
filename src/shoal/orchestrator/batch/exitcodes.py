"""The exit codes of `shoal run`, in one table: what each means and what a CI job does with it.

A pipeline must tell "the tests failed" from "the runner could not do its job": a retry policy
re-runs the second, never the first. The codes keep the CLI contract's 0, 1, 2 and 130, and
add 3 (infrastructure) and 124 (a task ran past its timeout, as `timeout` exits).
docs/reference/run-exit-codes.md is made from `EXIT_CODES` (`markdown_table`), and a test
checks that it still is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shoal.core.errors import ShoalError

OK: Final = 0
TASKS_FAILED: Final = 1
USAGE: Final = 2
INFRASTRUCTURE: Final = 3
TIMED_OUT: Final = 124
INTERRUPTED: Final = 130


@dataclass(frozen=True)
class ExitCode:
    """One exit code of `shoal run`: its number, a short name and when it is given."""

    code: int
    name: str
    meaning: str


EXIT_CODES: Final = (
    ExitCode(OK, "ok", "every task succeeded (or a `success` halt ended the run with no failure)"),
    ExitCode(
        TASKS_FAILED,
        "tasks failed",
        "a task failed, was killed by someone else, or was skipped because a task it waits "
        "for did not succeed (also when some task timed out too)",
    ),
    ExitCode(
        USAGE,
        "spec or usage error",
        "the spec or the command line is wrong (every problem listed, file:line); nothing "
        "was started",
    ),
    ExitCode(
        INFRASTRUCTURE,
        "infrastructure",
        "the run could not do its own part (not the spec's fault, nor a task's): a leader "
        "already runs for its team, a file it needs is unreadable, or a report or a "
        "`--results` copy could not be written",
    ),
    ExitCode(
        TIMED_OUT,
        "a task timed out",
        "every task that did not succeed ran past its `timeout` (or was skipped because of "
        "one that did); as `timeout` exits",
    ),
    ExitCode(
        INTERRUPTED,
        "interrupted",
        "SIGINT, SIGTERM or SIGHUP (or `shoal down`) stopped the run; nothing is left "
        "running and the reports say what had finished",
    ),
)


class RunInfrastructureError(ShoalError):
    """The run could not be carried out for a reason that is not the spec's or a task's
    (a leader already runs for the team, a file it needs is unreadable): exit 3."""

    exit_code = INFRASTRUCTURE


def markdown_table() -> str:
    """The table of EXIT_CODES as Markdown (what docs/reference/run-exit-codes.md holds)."""
    rows = ["| code | name | when |", "|---:|---|---|"]
    rows += [f"| {c.code} | {c.name} | {c.meaning} |" for c in EXIT_CODES]
    return "\n".join(rows) + "\n"
