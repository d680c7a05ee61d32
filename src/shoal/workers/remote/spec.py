"""What a remote task is asked to run: the request (`RemoteSpec`), the pending task made from
it, and the shell command its Ray job starts with.

A job's environment is what `--env` names (Ray shows it to whoever reaches the dashboard),
never the leader's keys by default; the values of `--env` travel in the request and stay in
the leader's memory (the task's record names them only).
"""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from shoal.core.errors import ShoalError, UsageError
from shoal.core.tasks import RemoteAgentTaskState, RemoteTaskType, TaskType, new_task_id

AGENT_TYPES: Final = ("remote-agent", "ultraplan", "ultrareview", "autofix-pr", "background-pr")
REMOTE_TYPES: Final = (*AGENT_TYPES, "shell")
SHOAL_COMMAND_ENV: Final = "SHOAL_RAY_SHOAL"
"""How a cluster node runs shoal for a remote agent (default `shoal`, on the node's PATH)."""


class RemoteError(ShoalError):
    """A remote task cannot be created (the cluster, the working directory or the model)."""


class RemoteSpec(BaseModel):
    """What `shoal remote submit` (or a batch run on Ray) asks the leader to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    remote_type: RemoteTaskType = "remote-agent"
    address: str
    package: str | None = None
    """The uploaded working directory (`gcs://_ray_pkg_*.zip`), if any."""
    cwd: str = "."
    """Where the job starts, relative to the packed work tree's root."""
    prompt: str | None = None
    command: str | None = None
    model: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    """The job's environment: the values travel in the request and stay in the leader's
    memory; the task's record keeps their names only."""
    insecure: bool = False
    """Send $SHOAL_RAY_TOKEN over plain http to a host off this machine (--insecure)."""
    timeout: float | None = Field(default=None, gt=0)
    long_running: bool = False
    title: str | None = None
    description: str | None = None
    keep_workdir: bool = False
    """A shell job keeps its private working copy on the node (for debugging)."""
    num_cpus: float | None = Field(default=None, ge=0)
    num_gpus: float | None = Field(default=None, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources the job's entrypoint holds (NAME -> amount)."""


def new_remote_task(spec: RemoteSpec, output_file: Callable[[str], Path]) -> RemoteAgentTaskState:
    """A pending `remote_agent` task for `spec` (checked: an agent type has a prompt, a shell
    one a command)."""
    if spec.remote_type == "shell":
        if not (spec.command or "").strip():
            raise UsageError(
                "a remote shell task needs a command (shoal remote submit --type shell -- CMD)"
            )
        what = spec.command or ""
    else:
        if not (spec.prompt or "").strip():
            raise UsageError(f"a {spec.remote_type} task needs a prompt")
        what = spec.prompt or ""
    task_id = new_task_id(TaskType.REMOTE_AGENT)
    title = spec.title or first_line(what)[:80]
    entry = entrypoint(spec)
    metadata: dict[str, Any] = {
        "address": spec.address,
        "package": spec.package,
        "cwd": spec.cwd,
        "entrypoint": entry,
        "env_names": sorted(spec.env),
        "insecure": spec.insecure,
        "model": spec.model,
        "prompt": spec.prompt,
        "timeout_s": spec.timeout,
        "num_cpus": spec.num_cpus,
        "num_gpus": spec.num_gpus,
        "resources": dict(spec.resources),
        "job": 1,
    }
    return RemoteAgentTaskState(
        id=task_id,
        description=spec.description or title,
        output_file=str(output_file(task_id)),
        remote_task_type=spec.remote_type,
        remote_task_metadata=metadata,
        session_id=task_id,
        command=spec.command or "",
        title=title,
        is_long_running=spec.long_running,
        is_remote_review=spec.remote_type == "ultrareview",
        is_ultraplan=spec.remote_type == "ultraplan",
        ultraplan_phase="running" if spec.remote_type == "ultraplan" else None,
    )


def entrypoint(spec: RemoteSpec, prompt: str | None = None) -> str:
    """The job's shell command: a shell task's command, or shoal's agent on the node; each
    works in a private copy of the working directory, entered at `cwd` there (the unpacked
    package is Ray's cache, shared by every job of the same content: what one job writes
    there, the next would see)."""
    if spec.remote_type == "shell":
        return private_copy(spec.cwd, f"sh -c {shlex.quote(spec.command or '')}", spec.keep_workdir)
    shoal = os.environ.get(SHOAL_COMMAND_ENV) or "shoal"
    argv = ["remote", "job", "--type", spec.remote_type]
    if spec.cwd not in ("", "."):
        argv += ["--cwd", spec.cwd]
    if spec.model:
        argv += ["--model", spec.model]
    argv += ["--", prompt if prompt is not None else spec.prompt or ""]
    return f"{shoal} {shlex.join(argv)}"


WORKDIR_PREFIX: Final = "shoal-task-"
"""A shell job's private copy is `$TMPDIR/shoal-task-XXXXXX/` on its node."""


def private_copy(cwd: str, command: str, keep: bool) -> str:
    """A shell line that runs `command` in a private copy of the job's working directory
    (Ray's unpacked package, where the job starts), entered at `cwd`, with the command's exit
    code. The copy is removed when the command ends or the job is stopped (TERM, INT), unless
    `keep`, when its path is said on stderr. Plain POSIX sh and coreutils: a node needs no
    shoal for a shell task."""
    enter = f" && cd {shlex.quote(cwd)}" if cwd not in ("", ".") else ""
    if keep:
        clean = 'echo "shoal: kept the working copy of this task: $w" >&2'
    else:
        clean = 'cd / && rm -rf "$w"'
    return (
        f'w=$(mktemp -d "${{TMPDIR:-/tmp}}/{WORKDIR_PREFIX}XXXXXX") || exit 70; '
        f"trap '{clean}' EXIT; trap 'exit 143' TERM; trap 'exit 130' INT; "
        f'cp -pR . "$w/work" && cd "$w/work"{enter} || exit 70; '
        f"{command}"
    )


def preamble(remote_type: str) -> str:
    """What an agent of `remote_type` is told before the prompt (remote_prompts.toml)."""
    text = resources.files("shoal.workers.remote").joinpath("remote_prompts.toml").read_text()
    return str(tomllib.loads(text).get(remote_type, {}).get("preamble", ""))


def first_line(text: str | None) -> str:
    """The first line of `text` that is not blank, stripped ("" when there is none)."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""
