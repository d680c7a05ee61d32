"""What a remote agent job runs on a cluster node (`shoal remote job`, hidden).

One agent runs with `shoal agent --foreground` under a private SHOAL_HOME, in a private copy
of the job's working directory (Ray's unpacked package is shared by the jobs of the same
content: an agent must not change it under another). The job streams the agent's transcript
and its task list as it changes (the `todo` marker: the task's todo_list), then prints the
markers its task's leader reads (`verdicts.py`). A stop at any moment brings the private
leader down and removes the copy.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import orjson

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.teams.session_files import current_session_files
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.remote.spec import preamble
from shoal.workers.remote.verdicts import QUESTION


def run_job(remote_type: str, model: str | None, rel: str, prompt: str) -> None:
    """Run one remote agent job here and print its markers; exits with the agent's code
    when it failed (a stop raises SystemExit(128 + signal))."""
    text = prompt
    if pre := preamble(remote_type):
        text = f"{pre}\n\n{prompt}"
    # Ray stops a job with SIGTERM (SIGINT if so configured) to its processes, and KILLs them
    # a few seconds later: the signal is raised as an exit here, and the private leader (in
    # a session of its own, out of the stop's reach: it would outlive the job on the node) is
    # brought down, and the temp dir removed, by a process of its own that the KILL spares.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    _marker("progress", "starting")
    tmp = Path(tempfile.mkdtemp(prefix="shoal-job-"))
    home, work = tmp / "home", tmp / "work"
    where = work / rel
    env = {**os.environ, "SHOAL_HOME": str(home), "SHOAL_TEAM": "job"}
    shoal = [sys.executable, "-m", "shoal"]
    finished = False
    try:
        home.mkdir()
        shutil.copytree(Path.cwd(), work, symlinks=True)
        up = subprocess.run(
            [*shoal, "up", "--detach", "--quiet"], env=env, check=False, capture_output=True
        )
        if up.returncode != 0:  # (else its line is noise in the job's log)
            sys.stderr.buffer.write(up.stdout + up.stderr)
            sys.exit(up.returncode)
        _marker("progress", "working")
        # Nobody can answer a permission request on a cluster node (the job runs on a copy
        # of the work tree): the agent asks for nothing.
        argv = [*shoal, "agent", "--foreground", "--permission-mode", "bypassPermissions"]
        argv += ["--model", model] if model else []
        argv += ["--cwd", str(where)]
        agent = subprocess.Popen([*argv, "--", text], env=env, cwd=where)
        stop = threading.Event()
        todo = threading.Thread(target=_report_todo, args=(Layout(home), stop), daemon=True)
        todo.start()
        try:
            code = agent.wait()
        except BaseException:  # (a stop: the agent goes first, as subprocess.run would)
            agent.kill()
            agent.wait()
            raise
        finally:
            stop.set()
            todo.join(timeout=5)
        # The agent is done: a stop now must not cut the wrap-up short (`down` inherits this).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        finished = True
    finally:
        if not finished:
            subprocess.Popen(
                [sys.executable, "-c", _CLEANER, str(tmp), *shoal, "down"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
    try:
        subprocess.run([*shoal, "down"], env=env, check=False, capture_output=True)
        # (read after `down`: its last state is written by then, however it was throttled)
        result = _agent_result(Layout(home))
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
            # (in the job's private copy, gone with it: the review's text is the result)
            (where / "review.md").write_text(result + "\n", encoding="utf-8")
            _marker("progress", "done")
            _marker("result-file", "review.md")
        _marker("result", result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# `python -c _CLEANER TMP CMD...`: run CMD (the private leader's `down`), then remove TMP.
_CLEANER = (
    "import shutil, subprocess, sys; subprocess.run(sys.argv[2:], capture_output=True); "
    "shutil.rmtree(sys.argv[1], ignore_errors=True)"
)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _agent_result(layout: Layout) -> str:
    """The final text of the job's agent (its record, live or evicted to the history)."""
    session = current_session_files(layout, "job")
    if session is None:
        return ""
    records = {**session.history(), **session.read_tasks_raw()}.values()
    agents = [t for t in records if t.get("type") == "local_agent"]
    agents.sort(key=lambda t: t.get("start_time") or 0)
    return str(agents[-1].get("result") or "") if agents else ""


TASK_LIST_POLL_S = 0.5


def _report_todo(layout: Layout, stop: threading.Event) -> None:
    """Print the job's agent's task list (its TaskCreate/TaskUpdate list: the job team's)
    as a `todo` marker each time it changes, and once more when `stop` is set."""
    tasks = TaskList(Teams(layout), "job")
    last: list[dict[str, str]] | None = None
    while True:
        stopped = stop.wait(TASK_LIST_POLL_S)
        try:
            items = [{"content": t.subject, "status": t.status.value} for t in tasks.list()]
        except (ShoalError, OSError):
            items = last or []
        if items != (last or []):
            last = items
            sys.stdout.write(f"::shoal-todo:: {orjson.dumps(items).decode()}\n")
            sys.stdout.flush()
        if stopped:
            return


def _marker(name: str, value: str) -> None:
    """One `::shoal-NAME:: "VALUE"` line (the value as a JSON string: one line whatever it
    holds)."""
    sys.stdout.write(f"::shoal-{name}:: {orjson.dumps(value).decode()}\n")
    sys.stdout.flush()
