"""`shoal remote submit|status`: remote agents and shell commands as Ray Jobs on a cluster.

Eligibility is checked here, before anything is created, one clear line per failure: the
address answers, the working directory is a git repository with a commit, it packs (without
what .gitignore excludes) under the upload limit, and an agent type's model has its key. The
packed work tree is uploaded once per content; the leader then creates the `r...` task and
submits the job. `shoal remote job` is what a remote agent runs on the cluster's node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import orjson

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import UsageError

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
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE", help="Job environment.")
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
    timeout: float | None,
    long_running: bool,
    title: str | None,
    num_cpus: float | None,
    args: tuple[str, ...],
    as_json: bool,
) -> None:
    """Submit PROMPT (an agent; `-` reads standard input) or, with --type shell, the command
    after `--` as a Ray job; prints the task's id."""
    from shoal.cli.agent import _env_pairs
    from shoal.orchestrator.control import call
    from shoal.workers.ray_jobs import RayJobs, resolve_address
    from shoal.workers.remote import check_model_key, pack_workdir
    from shoal.workers.shell import argv_for

    env = get_env(click.get_current_context())
    team = env.team()
    spec: dict[str, Any] = {"remote_type": remote_type}
    if remote_type == "shell":
        spec["command"] = argv_for(list(args))[0]
    else:
        prompt = sys.stdin.read() if args == ("-",) else " ".join(args)
        if not prompt.strip():
            raise UsageError("no prompt given (usage: shoal remote submit PROMPT)")
        spec["prompt"] = prompt
        if model is not None:
            from shoal.workers.agent.models import ModelSpec

            ModelSpec.parse(model)  # an unknown provider is a usage error, here and now
            spec["model"] = model
    where = Path(os.path.abspath(cwd or os.getcwd()))
    url = resolve_address(address)
    with RayJobs(url) as client:
        client.version()  # the address answers (else: one line naming it)
        package = pack_workdir(where)
        check_model_key(remote_type, model, os.environ, env.layout.home, where)
        spec["package"] = client.upload_package(package.name, package.data)
    spec.update(
        address=url,
        cwd=os.path.relpath(where, package.root),
        env=_env_pairs(env_pairs),
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


@remote.command()
@json_option
@common_options
def status(as_json: bool) -> None:
    """The session's remote tasks: type, status, phase, the job's id, node and cluster."""
    from shoal.cli.tasks import _session

    env = get_env(click.get_current_context())
    records = (_session(env.layout, env.team()).read_tasks_raw() or {}).values()
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
            f"{t['id']}  {t.get('remote_task_type', '?'):<13} {t['status']}{phase:<14} "
            f"job {t.get('session_id') or t['id']} on {t.get('host') or '-'} "
            f"at {meta.get('address', '?')}  {t.get('title') or t.get('description', '')}"
            + (f"  [{why}]" if why else "")
        )


@remote.command(hidden=True)
@click.option("--type", "remote_type", type=click.Choice(TYPES[:-1]), required=True)
@click.option("--model", default=None)
@click.argument("prompt")
def job(remote_type: str, model: str | None, prompt: str) -> None:
    """On a cluster node: run one agent with `shoal agent --foreground` under a private home,
    stream its transcript, then print the markers its task's leader reads."""
    from shoal.core.paths import Layout
    from shoal.orchestrator.session import current_session
    from shoal.workers.remote import QUESTION, preamble

    text = prompt
    if pre := preamble(remote_type):
        text = f"{pre}\n\n{prompt}"
    _marker("progress", "starting")
    with tempfile.TemporaryDirectory(prefix="shoal-job-") as home:
        env = {**os.environ, "SHOAL_HOME": home, "SHOAL_TEAM": "job"}
        shoal = [sys.executable, "-m", "shoal"]
        up = subprocess.run([*shoal, "up", "--detach", "--quiet"], env=env, check=False)
        if up.returncode != 0:
            sys.exit(up.returncode)
        try:
            _marker("progress", "working")
            argv = [*shoal, "agent", "--foreground", *(["--model", model] if model else [])]
            code = subprocess.run([*argv, "--", text], env=env, check=False).returncode
            session = current_session(Layout(home), "job")
            records = (session.read_tasks_raw() or {}).values() if session else []
            agents = [t for t in records if t.get("type") == "local_agent"]
            result = str(agents[-1].get("result") or "") if agents else ""
        finally:
            subprocess.run([*shoal, "down"], env=env, check=False, capture_output=True)
    if code != 0:
        sys.exit(code)
    if remote_type == "ultraplan":
        question = QUESTION.search(result)
        if question:
            _marker("question", question.group(1).strip())
            _marker("phase", "needs_input")
        else:
            _marker("phase", "plan_ready")
    if remote_type == "ultrareview":
        Path("review.md").write_text(result + "\n", encoding="utf-8")
        _marker("progress", "done")
        _marker("result-file", "review.md")
    _marker("result", result)


def _marker(name: str, value: str) -> None:
    """One `::shoal-NAME:: "VALUE"` line (the value as a JSON string: one line whatever it
    holds)."""
    sys.stdout.write(f"::shoal-{name}:: {orjson.dumps(value).decode()}\n")
    sys.stdout.flush()
