"""A shell task from a request: the command's argv (a command line or an argv as it is), and
the pending `local_bash` task, checked."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from typing import Any

from shoal.core.errors import TaskError
from shoal.core.tasks import LocalShellTaskState


def argv_for(command: list[str]) -> tuple[str, list[str]]:
    """(display string, argv): one argument is a shell command line (argv ["-c", line]),
    several are an argv run as it is."""
    if len(command) == 1:
        return command[0], ["-c", command[0]]
    return shlex.join(command), list(command)


def new_task(
    command: list[str],
    *,
    task_id: str,
    output_file: str,
    owner: str,
    agent_id: str | None = None,
    description: str | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    env_values: dict[str, str] | None = None,
    env_names: Iterable[str] = (),
    kind: str = "bash",
    background: bool = True,
    tool_use_id: str | None = None,
    **queueing: Any,
) -> LocalShellTaskState:
    """Build (and check) a pending shell task; a bad request is a TaskError naming it.

    `env` is written with the task; `env_values` (`--env`) are kept in memory only, their
    names with the task (`env_names`: names whose values a restart of an earlier task lost).

    `queueing`: the task's fields for when and where it starts (label, group, priority,
    after, after_any, not_before, timeout, retries, retry_delay, stdin_fifo, ...)."""
    if not command or not all(isinstance(a, str) for a in command) or not command[0]:
        raise TaskError("no command given (usage: shoal sh -- CMD ARGS...)")
    if cwd is not None and not os.path.isdir(cwd):
        raise TaskError(f"working directory {cwd!r} does not exist")
    if kind not in ("bash", "monitor"):
        raise TaskError(f"unknown shell task kind {kind!r} (bash or monitor)")
    display, argv = argv_for(command)
    return LocalShellTaskState(
        id=task_id,
        description=description or display,
        command=display,
        argv=tuple(argv),
        cwd=cwd or os.getcwd(),
        env=env or None,
        env_names=tuple(dict.fromkeys([*env_names, *(env_values or {})])),
        env_values=env_values or None,
        output_file=output_file,
        owner=owner,
        agent_id=agent_id,
        kind=kind,
        is_backgrounded=background,
        tool_use_id=tool_use_id,
        **queueing,
    )
