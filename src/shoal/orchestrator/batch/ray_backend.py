"""`shoal run SPEC --backend ray`: every shell task of the spec is a Ray job.

The run checks, before anything starts, that the cluster answers, that some node of it has
everything each task asks for (`num_cpus`, `num_gpus`, `resources`: what its job holds there),
and that the spec's directory is a git work tree with a commit that packs under the upload
limit; the packed tree
is uploaded once, and each attempt is a `remote_agent` task of type `shell` on the run's
leader, started in the spec task's directory relative to the tree's root, in a private copy of
the unpacked tree on its node (removed after it, unless `--keep-workdirs`). Dependencies,
retries, timeouts, halt, the reports, the joblog (its host column names the node) and
`--resume` are the engine's, as on one machine. Members (teammates) still run here.

A job's environment is the spec's `env` (and the run's own variables), nothing of this
machine's: an API key reaches a job only when the spec names it. The values are not written
to the session's state (the leader keeps them in memory; the spec file holds them already).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import ShoalError, UsageError
from shoal.core.events import TaskTerminated
from shoal.core.tasks import RemoteAgentTaskState, TaskStatus
from shoal.orchestrator.batch.recovery import ENV_RUN
from shoal.orchestrator.batch.spec import Spec, TaskSpec
from shoal.orchestrator.batch.state import Finished, Refused, ShellRequest
from shoal.workers.remote.packing import pack_workdir
from shoal.workers.remote.ray_jobs import NodeInfo, RayJobs, resolve_address
from shoal.workers.remote.spec import RemoteSpec
from shoal.workers.shell.spec import argv_for


@dataclass(frozen=True)
class RayTarget:
    """Where a run's shell tasks go: the cluster, the uploaded tree and the tree's root."""

    address: str
    package: str
    root: Path
    ray_version: str
    insecure: bool = False
    keep_workdirs: bool = False


def prepare(
    spec: Spec, address: str | None, *, insecure: bool = False, keep_workdirs: bool = False
) -> RayTarget:
    """Check the cluster and the spec's work tree, upload the tree; one clear error each
    (a token over plain http to a host off this machine without `insecure` too).
    Per-task JUnit reports are written on the nodes and cannot be merged from here."""
    with_junit = [t.id for t in spec.tasks if getattr(t, "junit", None)]
    if with_junit:
        raise UsageError(
            f"--backend ray: task(s) {', '.join(with_junit)} name a junit report, which is "
            "written on a Ray node and cannot be read back here; run them locally"
        )
    url = resolve_address(address)
    with RayJobs(url, insecure=insecure) as client:
        version = client.version()
        if any(_asked(t) for t in spec.tasks):
            check_placement(spec, _live_nodes(client), url)
        package = pack_workdir(spec.path.parent.resolve())
        uri = client.upload_package(package.name, package.data)
    ray_version = str(version.get("ray_version", "?"))
    return RayTarget(url, uri, package.root, ray_version, insecure, keep_workdirs)


NODES_WAIT_S: Final = 30.0
"""How long a cluster that lists no live node yet (a head that has just started answers before
its own node has joined) is asked again before its resources are judged."""


def _live_nodes(client: RayJobs) -> list[NodeInfo]:
    deadline = time.monotonic() + NODES_WAIT_S
    while not (nodes := client.nodes()) and time.monotonic() < deadline:
        time.sleep(0.2)  # (a cluster's start, polled: nothing to wait on but its API)
    return nodes


def _asked(task: TaskSpec) -> dict[str, float]:
    """What a task's job holds on its node, as Ray names the resources (none asked: {})."""
    asked = {k: v for k, v in task.resources.items() if v > 0}
    if task.num_cpus:
        asked["CPU"] = task.num_cpus
    if task.num_gpus:
        asked["GPU"] = task.num_gpus
    return asked


def check_placement(spec: Spec, nodes: Sequence[NodeInfo], address: str) -> None:
    """Refuse the run when a task asks for more than any one node has (a job runs on one
    node: Ray would keep it pending for ever), naming the task, what it asks for and what
    each node of the cluster has."""
    refused = []
    for task in spec.tasks:
        asked = _asked(task)
        if not asked or task.is_agent:
            continue
        if any(all(n.resources.get(k, 0.0) >= v for k, v in asked.items()) for n in nodes):
            continue
        missing = sorted(k for k in asked if not any(k in n.resources for n in nodes))
        what = (
            f"resource {', '.join(missing)}, which no node of the cluster has"
            if missing
            else "more than any one node of the cluster has"
        )
        refused.append(f'task "{task.id}" asks for {_amounts(asked)}: {what}')
    if refused:
        have = "; ".join(f"{n.name}: {_amounts(n.schedulable()) or 'nothing'}" for n in nodes)
        raise UsageError(
            "--backend ray: "
            + "\n".join(refused)
            + f"\nthe cluster at {address} has {have or 'no live node'}; nothing was started"
        )


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()))


class RayShellMixin:
    """What turns the engine's shell attempts into remote shell tasks (mixed into the
    driver's LeaderShell, whose `leader`, `known` and `run_id` it uses)."""

    leader: Any
    known: set[str]
    run_id: str
    target: RayTarget

    def submit(self, requests: Sequence[ShellRequest]) -> list[str | Refused]:
        out: list[str | Refused] = []
        for req in requests:
            env = {**req.env, ENV_RUN: self.run_id} if self.run_id else dict(req.env)
            try:
                cwd = os.path.relpath(Path(req.cwd).resolve(), self.target.root)
                if cwd.startswith(".."):
                    raise UsageError(f"its directory {req.cwd} is outside the packed work tree")
                spec = RemoteSpec(
                    remote_type="shell",
                    address=self.target.address,
                    package=self.target.package,
                    cwd=cwd,
                    command=argv_for(list(req.command))[0],
                    env=env,
                    description=req.description,
                    insecure=self.target.insecure,
                    keep_workdir=self.target.keep_workdirs,
                    num_cpus=req.num_cpus,
                    num_gpus=req.num_gpus,
                    resources=dict(req.resources),
                )
                task = self.leader.start_remote(spec)
            except ShoalError as exc:
                out.append(Refused(str(exc)))
                continue
            self.known.add(task.id)
            out.append(task.id)
        return out

    def remote_finished(self, event: TaskTerminated, state: RemoteAgentTaskState) -> Finished:
        """The engine's view of a remote shell task's end (its exit code, node and times)."""
        ran = state.session_id is not None and state.status != TaskStatus.PENDING
        return Finished(
            event.task_id,
            state.status.value,
            exit_code=state.exit_code,
            started_at=state.start_time if ran else None,
            ended_at=state.end_time,
            output_file=state.output_file,
            error=state.error or state.kill_reason,
            ran=ran,
            host=state.host,
        )
