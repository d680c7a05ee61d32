"""A teammate's options and the `shoal worker` command line written from them agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli.common import get_env
from shoal.cli.worker import worker
from shoal.workers.teammate.worker import WorkerOptions


@pytest.mark.parametrize(
    "options",
    [
        WorkerOptions(team="crew", name="ana"),
        WorkerOptions(
            team="crew",
            name="ben",
            agent="exec",
            cmd="claude -p {prompt}",
            plan_mode=True,
            task_id="t12345678",
            output="/h/sessions/s/tasks/t12345678.output",
            cwd="/work/dir with space",
            backend="tmux",
            joined=True,
        ),
        WorkerOptions(team="crew", name="cy", script="/abs/review.steps", backend="in-process"),
    ],
)
def test_the_command_line_parses_back_to_the_same_options(options: WorkerOptions) -> None:
    argv = options.argv("/usr/bin/python3", Path("/h"))
    assert argv[:6] == ["/usr/bin/python3", "-m", "shoal", "--home", "/h", "worker"]
    ctx = worker.make_context("worker", argv[6:])  # what `shoal worker` would parse
    assert WorkerOptions(team=get_env(ctx).team(), **ctx.params) == options
