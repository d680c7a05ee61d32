"""`shoal remote submit|status`: remote agents and shell commands as Ray Jobs on a cluster.

Eligibility is checked here, before anything is created, one clear line per failure: the
address answers, the working directory is a git repository with a commit, it packs (without
what .gitignore excludes) under the upload limit, and an agent type's model has its key. The
packed work tree is uploaded once per content; the leader then creates the `r...` task and
submits the job. `shoal remote job` is what a remote agent runs on the cluster's node.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import UsageError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TYPES = ("remote-agent", "ultraplan", "ultrareview", "autofix-pr", "background-pr", "shell")


@click.group()
def remote() -> None:
    """Run agents and commands on a Ray cluster (`r...` tasks, polled by the team's leader).

    The cluster is the dashboard's address: --ray ADDRESS, else $SHOAL_RAY_ADDRESS (a token
    from $SHOAL_RAY_TOKEN for clusters with token auth). `ps`, `logs -f`, `stop` and `wait`
    work on remote tasks like on any other.
    """


@remote.command()
@click.option(
    "--type",
    "remote_type",
    type=click.Choice(TYPES),
    default="remote-agent",
    show_default=True,
    help="What runs: an agent of this kind on PROMPT, or (shell) the command after --.",
)
@click.option("--model", default=None, help="The agent's model (default: the usual choice).")
@click.option("--ray", "address", default=None, metavar="ADDRESS", help="The cluster's dashboard.")
@click.option(
    "--cwd",
    default=None,
    type=click.Path(file_okay=False, exists=True),
    help="The working directory packed for the job (default: here); it must be in a git "
    "repository with a commit.",
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY[=VALUE]",
    help="A variable of the job's environment (KEY alone: its value here). Nothing else of "
    "this environment reaches the job, API keys included. Values are never written to disk.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Send $SHOAL_RAY_TOKEN over plain http to a cluster off this machine.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop the job after this many seconds of polling.",
)
@click.option("--long-running", is_flag=True, help="Never time out (overrides --timeout).")
@click.option("--title", default=None, help="The task's title (default: its first line).")
@click.option("--num-cpus", type=click.FloatRange(min=0), default=None, help="CPUs it reserves.")
@click.argument("args", nargs=-1, required=True)
@json_option
@common_options
def submit(
    remote_type: str,
    model: str | None,
    address: str | None,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    insecure: bool,
    timeout: float | None,
    long_running: bool,
    title: str | None,
    num_cpus: float | None,
    args: tuple[str, ...],
    as_json: bool,
) -> None:
    """Submit PROMPT (an agent; `-` reads standard input) or, with --type shell, the command
    after `--` as a Ray job; prints the task's id."""
    from shoal.channel.client import call
    from shoal.core.secretenv import is_secret
    from shoal.workers.remote.packing import check_model_key, pack_workdir
    from shoal.workers.remote.ray_jobs import RayJobs, resolve_address
    from shoal.workers.shell.spec import argv_for

    env = get_env(click.get_current_context())
    team = env.team()
    job_env = job_env_of(env_pairs)  # (a bad pair is refused before the cluster is asked)
    spec: dict[str, Any] = {"remote_type": remote_type}
    if remote_type == "shell":
        spec["command"] = argv_for(list(args))[0]
    else:
        prompt = sys.stdin.read() if args == ("-",) else " ".join(args)
        if not prompt.strip():
            raise UsageError("no prompt given (usage: shoal remote submit PROMPT)")
        spec["prompt"] = prompt
        from shoal.workers.agent.models import DEFAULT_SPEC, ModelSpec, choose_model

        if model is not None:
            ModelSpec.parse(model)  # an unknown provider is a usage error, here and now
        else:  # the usual choice, made here: the model checked is the one the job runs
            chosen = str(choose_model(None, None, {**os.environ, **job_env}, env.layout.home))
            model = None if chosen == DEFAULT_SPEC else chosen
        if model is not None:
            spec["model"] = model
    where = Path(os.path.abspath(cwd or os.getcwd()))
    url = resolve_address(address)
    with RayJobs(url, insecure=insecure) as client:  # (a token over http: refused here)
        client.version()  # the address answers (else: one line naming it)
        package = pack_workdir(where)
        # The job's environment: what --env names (a key only there), and the model's
        # settings, which the leader passes on.
        keys = {**{k: v for k, v in os.environ.items() if not is_secret(k)}, **job_env}
        check_model_key(remote_type, model, keys, env.layout.home, where, package)
        spec["package"] = client.upload_package(package.name, package.data)
    if job_env:
        click.echo(
            f"note: Ray shows a job's environment (--env {', '.join(sorted(job_env))}) to "
            f"whoever reaches the dashboard at {url}",
            err=True,
        )
    spec.update(
        address=url,
        insecure=insecure,
        cwd=os.path.relpath(where.resolve(), package.root.resolve()),
        env=job_env,
        timeout=timeout,
        long_running=long_running,
        title=title,
        num_cpus=num_cpus,
    )
    task = call(env.layout, team, "remote", {"spec": spec})
    if as_json:
        print_json(task)
    else:
        click.echo(task["id"])


def job_env_of(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--env KEY=VALUE` and `--env KEY` (the value of $KEY here) as the job's variables."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not _ENV_NAME.fullmatch(key):
            raise UsageError(f"--env takes KEY or KEY=VALUE, not {pair!r}")
        if not sep:
            if key not in os.environ:
                raise UsageError(
                    f"--env {key}: ${key} is not set in this environment "
                    f"(set it, or pass --env {key}=VALUE)"
                )
            value = os.environ[key]
        out[key] = value
    return out


@remote.command()
@json_option
@common_options
def status(as_json: bool) -> None:
    """The session's remote tasks, ended ones too: type, status, phase, the job's id, node
    and cluster."""
    from shoal.cli.tasks import _session, _tasks

    env = get_env(click.get_current_context())
    # (as `ps --all`: an ended task leaves the session's registry for its history)
    records = _tasks(_session(env.layout, env.team()), include_history=True).values()
    tasks = [t for t in records if t.get("type") == "remote_agent"]
    tasks.sort(key=lambda t: t.get("start_time") or 0)
    if as_json:
        print_json(tasks)
        return
    if not tasks:
        click.echo("no remote tasks in this session (shoal remote submit ...)")
        return
    for t in tasks:
        meta = t.get("remote_task_metadata") or {}
        phase = f" ({t['ultraplan_phase']})" if t.get("ultraplan_phase") else ""
        why = t.get("error") or ""
        click.echo(
            f"{t['id']}  {t.get('remote_task_type', '?'):<13} {t['status'] + phase:<24} "
            f"job {t.get('session_id') or t['id']} on {t.get('host') or '-'} "
            f"at {meta.get('address', '?')}  {t.get('title') or t.get('description', '')}"
            + (f"  [{why}]" if why else "")
        )


@remote.command(hidden=True)
@click.option("--type", "remote_type", type=click.Choice(TYPES[:-1]), required=True)
@click.option("--model", default=None)
@click.option("--cwd", "rel", default=".", help="Where the agent starts, in the work tree.")
@click.argument("prompt")
def job(remote_type: str, model: str | None, rel: str, prompt: str) -> None:
    """On a cluster node: run one remote agent job (see workers/remote/node_job.py)."""
    from shoal.workers.remote.node_job import run_job

    run_job(remote_type, model, rel, prompt)
