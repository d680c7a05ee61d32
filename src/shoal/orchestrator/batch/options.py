"""A run's options and outcome: the command line's choices (`RunOptions`), how the run
ended (`RunOutcome`), and the defaults a run resolves before it starts (its team's name, the
backend of its members)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.core.names import MAX_NAME_LENGTH
from shoal.orchestrator.batch.ci import Row
from shoal.orchestrator.batch.spec import HaltPolicy


@dataclass(frozen=True)
class RunOptions:
    """Command-line choices of one run; None means "as the spec says"."""

    team: str | None = None
    jobs: int | None = None
    backend: str | None = None
    halt: HaltPolicy | None = None
    junit: Path | None = None
    report: Path | None = None
    joblog: Path | None = None
    resume: bool = False
    forward_leader_events: bool = False
    keep_team: bool = False
    """Keep the run's own team (`run-{stem}`) at the end; a team named by --team or
    `[run] team` is always kept."""
    results: Path | None = None
    """Copy every task's output into this directory as it ends."""
    ray: str | None = None
    """`--backend ray`: the cluster's address (else $SHOAL_RAY_ADDRESS)."""
    ray_insecure: bool = False
    """`--insecure`: send $SHOAL_RAY_TOKEN over plain http to a cluster off this machine."""
    keep_workdirs: bool = False
    """`--keep-workdirs`: keep each Ray task's private working copy on its node."""
    keep_sessions: int | None = None
    """`--keep-sessions N`: at the end, remove the team's oldest finished sessions past N
    (None: `[run] keep_sessions` of config.toml for a team of the run's own, else keep all)."""


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the exit code, the final report and where the run record is."""

    exit_code: int
    report: dict[str, Any]
    record_path: Path
    summary: tuple[Row, ...] = ()
    """The end-of-run table: a row per task, with its tests' counts."""


def default_run_team(spec_path: Path) -> str:
    """The team a run works in when none is named: `run-{stem}` (`CI Build.toml` ->
    `run-ci-build`), a valid team name whatever the file is called."""
    stem = re.sub(r"[^a-z0-9_-]+", "-", spec_path.stem.lower()).strip("-_")
    return f"run-{stem}"[:MAX_NAME_LENGTH].rstrip("-_") if stem else "run"


def resolve_backend(option: str | None, setting: str) -> tuple[str, str]:
    """(backend, why) for the run's members: `--backend`, else `[run] backend`, with `auto`
    resolved here so the run says which one it is (never a silent choice)."""
    from shoal.teams.backends.base import detect

    name = option or setting
    if name == "auto":
        return detect()
    return name, "chosen with --backend" if option else "set by [run] backend in the spec"
