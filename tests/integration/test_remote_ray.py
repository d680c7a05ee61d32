"""`remote_agent` tasks on a real Ray head: `shoal remote submit` through a real leader
process, each test's work tree a git repository of its own in tmp_path.

Shell jobs end with their real exit codes and see the committed files (not the ignored ones); a
job's log reaches the output file exactly once, line by line, without Ray's preamble, however
it is read; `shoal stop` stops the job on the cluster and its process (and a leader polling a
job does not spin); a leader killed with kill -9 and started again re-attaches to its running
job (and revives no ended one, whose sidecar it removes); `remote status` lists ended tasks
too; every eligibility failure is one line and creates no task; the scripted agent's remote
types (remote-agent, ultrareview, ultraplan with its question and its approval) complete on the
cluster, and a stopped agent job leaves no private leader behind on the node; a head killed
mid-run fails its task within seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from shoal.core.paths import Layout
from shoal.orchestrator.liveness import leader_alive
from shoal.teams.session import current_session
from shoal.workers.remote.ray_jobs import JobExists, JobNotFound, RayJobs
from tests.conftest import Cli
from tests.polling import wait_until
from tests.ray_cluster import RayHead

pytestmark = [pytest.mark.ray_head, pytest.mark.xdist_group("ray")]

TEAM = "default"
TERMINAL = ("completed", "failed", "killed")
JOB_S = 60.0  # a job's end, measured from its submit (the runtime env's setup included)
SECRET = "secret.txt"
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}

# The ultraplan's scripted model: it asks which database first, and plans once it was told.
PLAN_SCRIPT = '''
[[turn]]
[[turn.call]]
tool = "Bash"
args = { description = "decide", command = """
if grep -q 'The user answered: postgres' <<'END_OF_PROMPT'
{prompt}
END_OF_PROMPT
then echo 'PLAN: 1. create the tables in postgres'; else echo 'QUESTION: which database?'; fi""" }

[[turn]]
text = "{last}"
'''

# An agent that sleeps in its one command, after writing the command's pid to the file its
# prompt names.
SLOW_SCRIPT = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { description = "wait", command = "exec sleep 300.{prompt}" }

[[turn]]
text = "slept"
"""

# An agent that makes a task list of two items and completes the first.
TODO_SCRIPT = """
final = "planned"

[[turn]]
[[turn.call]]
tool = "TaskCreate"
args = { subject = "read the code" }
[[turn.call]]
tool = "TaskCreate"
args = { subject = "fix the bug" }

[[turn]]
[[turn.call]]
tool = "TaskUpdate"
args = { taskId = "1", status = "completed" }
"""


# --------------------------------------------------------------------------- helpers


def git_repo(path: Path, files: dict[str, str | bytes], *, commit: bool = True) -> Path:
    """A git repository at `path` holding `files` and an untracked, ignored `secret.txt`
    (committed once unless `commit` is false)."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in {".gitignore": f"{SECRET}\n", **files}.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    (path / SECRET).write_text("must not reach the cluster\n")
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    if commit:
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "work tree"], check=True)
    return path


def submit(cli: Cli, repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`shoal remote submit --cwd REPO ARGS...`: the new task's id (the call must succeed)."""
    out = cli("remote", "submit", "--cwd", str(repo), *args, env=env)
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    assert task_id.startswith("r"), out.stdout
    return task_id


def tasks(home: Path) -> dict[str, dict[str, Any]]:
    """The session's task records by id, evicted ones too (as `shoal ps --all` reads them)."""
    session = current_session(Layout(home), TEAM)
    if session is None:
        return {}
    return {**session.history(), **session.read_tasks_raw()}


def record(home: Path, task_id: str) -> dict[str, Any]:
    """Task `task_id`'s record (waited for: the leader writes its state every so often)."""
    return wait_until(lambda: tasks(home).get(task_id), timeout=10, what=f"task {task_id}")


def ended(home: Path, task_id: str, timeout: float = JOB_S) -> dict[str, Any]:
    """Task `task_id`'s record once it has ended."""

    def final() -> dict[str, Any] | None:
        task = tasks(home).get(task_id)
        return task if task is not None and task["status"] in TERMINAL else None

    return wait_until(
        final, timeout=timeout, interval=0.1, what=lambda: f"{task_id} to end: {tasks(home)}"
    )


def logs(cli: Cli, task_id: str, code: int = 0) -> str:
    """What `shoal logs ID` prints; it exits `code` (a task that ended without completing:
    non-zero, as `logs` of a failed task does)."""
    out = cli("logs", task_id)
    assert out.returncode == code, out.stderr
    return out.stdout


def ray_jobs(address: str) -> list[dict[str, Any]]:
    """Every job the cluster knows (`GET /api/jobs/`)."""
    with urllib.request.urlopen(f"{address}/api/jobs/", timeout=10) as response:
        data: list[dict[str, Any]] = json.loads(response.read())
    return data


def ray_status(address: str, job_id: str) -> str:
    """The cluster's status of job `job_id` ("" while it has no such job: the leader submits
    a task's job a moment after creating the task)."""
    with RayJobs(address) as client:
        try:
            return client.info(job_id).status
        except JobNotFound:
            return ""


def pid_gone(pid: int) -> bool:
    """True once process `pid` is gone (a zombie awaiting its reaping counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def leader_cpu_seconds(pid: int, over: float) -> float:
    """CPU seconds process `pid` uses in the next `over` seconds of wall time."""
    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(over)  # (a measurement window, not a wait for a state)
    after = proc.cpu_times()
    return (after.user - before.user) + (after.system - before.system)


def no_ray_lines(text: str) -> None:
    """Assert that none of Ray's own lines about the job reached the output."""
    assert "job_manager.py" not in text and "Running entrypoint for job" not in text, text


@pytest.fixture
def ray(ray_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> RayHead:
    """The session's head, exported as $SHOAL_RAY_ADDRESS (for the leader and the CLI)."""
    monkeypatch.setenv("SHOAL_RAY_ADDRESS", ray_head.address)
    return ray_head


def up(cli: Cli, env: dict[str, str] | None = None) -> None:
    """Start the team's leader in the background (its loop's full tick every 0.1 s)."""
    started = cli("up", "-d", "-q", env={**FAST, **(env or {})})
    assert started.returncode == 0, started.stderr


@pytest.fixture
def leader(cli: Cli, ray: RayHead) -> Iterator[Cli]:
    """A leader in the background (brought down at the end)."""
    up(cli)
    try:
        yield cli
    finally:
        cli("down", timeout=120)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed work tree with a data file and the scripts of the agent tests."""
    return git_repo(
        tmp_path / "repo",
        {
            "data.txt": "committed data 7f3a\n",
            "sub/inner.txt": "in\n",
            "plan.toml": PLAN_SCRIPT,
            "slow.toml": SLOW_SCRIPT,
            "todo.toml": TODO_SCRIPT,
        },
    )


# --------------------------------------------------------------------------- shell jobs


def test_shell_jobs_end_with_their_exit_codes_on_the_committed_tree(
    leader: Cli, home: Path, repo: Path, tmp_path: Path
) -> None:
    """A shell job runs (status running) then completes with exit code 0 (`shoal wait` exits
    0); it saw the committed file and not the ignored one; a job exiting 3 fails with an
    error naming exit code 3, and `shoal wait` exits 1; a job submitted from a subdirectory
    starts there, with the whole tree beside it."""
    gate = tmp_path / "gate"
    ok = submit(
        leader, repo, "--type", "shell", "--",
        # (it runs until the test opens its gate: "running" is a state, not a timing)
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        f"cat data.txt; ls -A; test -e {SECRET} || echo no-secret-here",
    )  # fmt: skip
    bad = submit(leader, repo, "--type", "shell", "--", "echo failing; exit 3")
    inner = submit(leader, repo / "sub", "--type", "shell", "--", "cat inner.txt ../data.txt")
    wait_until(lambda: record(home, ok)["status"] == "running", timeout=60,
               what="the gated job to run")  # fmt: skip
    gate.touch()
    done = ended(home, ok)
    assert done["status"] == "completed" and done["exit_code"] == 0, done
    assert done["remote_task_type"] == "shell" and done["host"] == "127.0.0.1"
    waited = leader("wait", ok)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    text = logs(leader, ok)
    listing = text.splitlines()
    assert listing[0] == "committed data 7f3a"
    assert "data.txt" in listing and ".gitignore" in listing and "sub" in listing
    assert SECRET not in text and listing[-1] == "no-secret-here", text
    no_ray_lines(text)

    failed = ended(home, bad)
    assert failed["status"] == "failed" and failed["exit_code"] == 3, failed
    assert "exited with code 3" in failed["error"], failed["error"]
    assert logs(leader, bad, code=1) == "failing\n"
    assert leader("wait", bad).returncode == 1

    # --cwd a subdirectory: the whole work tree is packed, the job starts in the subdirectory.
    assert ended(home, inner)["status"] == "completed"
    assert logs(leader, inner) == "in\ncommitted data 7f3a\n"


# --------------------------------------------------------------------------- logs


def test_logs_reach_the_output_file_once_each_in_order(leader: Cli, home: Path, repo: Path) -> None:
    """10,000 lines at once: the output holds exactly lines 1..10000, once each, in order,
    and no line of Ray's. A job printing slowly, read while it runs: every read is a prefix
    of its lines (some partial), and in the end each line is there exactly once."""
    many = submit(leader, repo, "--type", "shell", "--", "seq 1 10000")
    slow = submit(
        leader, repo, "--type", "shell", "--", "for i in $(seq 1 30); do echo $i; sleep 0.1; done"
    )
    expected = [str(i) for i in range(1, 31)]
    output = Path(record(home, slow)["output_file"])
    seen: list[list[str]] = []

    def slow_done() -> bool:
        text = output.read_text() if output.exists() else ""
        seen.append(text.splitlines())
        assert text == "" or text.endswith("\n"), f"a partial line was written: {text!r}"
        return record(home, slow)["status"] in TERMINAL

    wait_until(slow_done, timeout=JOB_S, interval=0.05, what="the slow job to end")
    for lines in seen:
        assert lines == expected[: len(lines)], lines
    assert any(0 < len(lines) < len(expected) for lines in seen), "never read while running"
    assert record(home, slow)["status"] == "completed"
    assert logs(leader, slow).splitlines() == expected

    assert ended(home, many)["status"] == "completed"
    text = logs(leader, many)
    assert text.splitlines() == [str(i) for i in range(1, 10001)]
    no_ray_lines(text)


# --------------------------------------------------------------------------- status, stop


def test_remote_status_lists_tasks_and_stop_stops_the_job(
    cli: Cli, home: Path, repo: Path, ray: RayHead, tmp_path: Path
) -> None:
    """While a job runs `sleep 300`: its leader (full ticks every second) sleeps between polls,
    under 0.3 s of CPU in 3 s (its loop does not spin on a due poll); `shoal remote status`
    (and --json) lists it running, and a job that ended and left the session's registry for
    its history (`shoal ps` no longer shows it) as completed. `shoal stop` then kills the
    task, the cluster's job is STOPPED, and the sleep process is gone."""
    up(cli, env={"SHOAL_POLL_INTERVAL": "1"})
    try:
        quick = submit(cli, repo, "--type", "shell", "--", "true")
        pid_file = tmp_path / "sleep.pid"
        task_id = submit(
            cli, repo, "--type", "shell", "--", f"echo $$ > {pid_file}; exec sleep 300"
        )

        def sleeping() -> int | None:
            text = pid_file.read_text().strip() if pid_file.exists() else ""
            if not text:
                return None
            try:
                return int(text) if psutil.Process(int(text)).name() == "sleep" else None
            except psutil.NoSuchProcess:
                return None

        pid = wait_until(sleeping, timeout=JOB_S, interval=0.1, what="the job to start its sleep")
        alive = leader_alive(Layout(home), TEAM)
        assert alive is not None
        spent = leader_cpu_seconds(alive[0], over=3.0)
        assert spent < 0.3, f"the leader used {spent:.2f} s of CPU in 3 s polling its jobs"

        assert ended(home, quick)["status"] == "completed"

        def evicted() -> bool:
            session = current_session(Layout(home), TEAM)
            return session is not None and quick not in session.read_tasks_raw()

        wait_until(evicted, timeout=15, what=f"{quick} to be evicted to the history")
        # (ps lists a task that ended in the last ten minutes, evicted or not, as finished)
        shown = [line for line in cli("ps").stdout.splitlines() if line.startswith(quick)]
        assert len(shown) == 1 and "completed" in shown[0], shown
        listed = cli("remote", "status")
        assert listed.returncode == 0, listed.stderr
        lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
        assert set(lines) == {quick, task_id}, listed.stdout
        assert "shell" in lines[quick] and "completed" in lines[quick]
        assert "running" in lines[task_id] and f"job {task_id} on 127.0.0.1" in lines[task_id]
        as_json = cli("remote", "status", "--json")
        assert as_json.returncode == 0, as_json.stderr
        statuses = {t["id"]: t["status"] for t in json.loads(as_json.stdout)}
        assert statuses == {quick: "completed", task_id: "running"}

        stopped = cli("stop", task_id)
        assert stopped.returncode == 0, stopped.stderr
        final = ended(home, task_id, timeout=30)
        assert final["status"] == "killed", final
        assert ray_status(ray.address, task_id) == "STOPPED"
        wait_until(lambda: pid_gone(pid), timeout=15, what=f"the job's sleep ({pid}) to end")
    finally:
        cli("down", timeout=120)


# --------------------------------------------------------------------------- kill -9


def test_a_leader_killed_with_kill_9_re_attaches_on_resume_and_leaves_no_sidecar(
    cli: Cli, home: Path, repo: Path, ray: RayHead, tmp_path: Path
) -> None:
    """A leader killed with kill -9 mid-job, then started again: the running task is
    re-attached (its log says so; no second submit, so no JobExists), completes, and its output
    holds every line exactly once; a task that had completed and been notified before the kill
    stays completed (same end), and the sidecar the killed leader still kept for it (it keeps
    them a while after the notification) is removed by the new leader; the cluster has one job
    for each task, no new one, and once all is notified no sidecar is left."""
    up(cli, env={"SHOAL_RAY_SIDECAR_KEEP_S": "600"})
    gate = tmp_path / "gate"
    try:
        done = submit(cli, repo, "--type", "shell", "--", "echo done-before")
        before = wait_until(
            lambda: (t := ended(home, done))["notified"] and t,
            timeout=JOB_S,
            what=f"{done} to be notified",
        )
        assert before["status"] == "completed"
        output = Path(before["output_file"])
        sidecars = output.parent.parent / "remote"
        assert (sidecars / f"{done}.json").exists()  # (kept: SHOAL_RAY_SIDECAR_KEEP_S)
        running = submit(
            cli, repo, "--type", "shell", "--",
            f"for i in $(seq 1 5); do echo line-$i; done; "
            f"while [ ! -e {gate} ]; do sleep 0.05; done; "
            "for i in $(seq 6 40); do echo line-$i; done",
        )  # fmt: skip
        output = Path(record(home, running)["output_file"])
        wait_until(
            lambda: output.exists() and len(output.read_text().splitlines()) >= 5,
            timeout=JOB_S,
            what="the job's first lines",
        )
        alive = leader_alive(Layout(home), TEAM)
        assert alive is not None
        os.kill(alive[0], signal.SIGKILL)
        wait_until(lambda: leader_alive(Layout(home), TEAM) is None, what="the leader to die")
        assert record(home, running)["status"] == "running"
        assert {p.stem for p in sidecars.glob("*.json")} == {done, running}
        up(cli)
        wait_until(
            lambda: not (sidecars / f"{done}.json").exists(),
            timeout=15,
            what=f"the sidecar of {done} (ended, notified) to be removed on resume",
        )
        assert record(home, running)["status"] == "running"
        gate.touch()
        final = ended(home, running)
        assert final["status"] == "completed", final
        assert final["error"] is None and final["exit_code"] == 0
        assert "re-attached" in [entry["status"] for entry in final["log"]], final["log"]
        assert logs(cli, running).splitlines() == [f"line-{i}" for i in range(1, 41)]
        after = record(home, done)
        assert after["status"] == "completed" and after["end_time"] == before["end_time"]
        assert logs(cli, done) == "done-before\n"
        jobs = ray_jobs(ray.address)
        for task_id in (done, running):
            assert [j["submission_id"] for j in jobs].count(task_id) == 1
            owned = [j for j in jobs if (j.get("metadata") or {}).get("shoal_task") == task_id]
            assert len(owned) == 1, owned
        # Once notified, the task's sidecar goes too: nothing is left.
        wait_until(
            lambda: not list(sidecars.glob("*.json")),
            timeout=15,
            what=lambda: f"{sorted(sidecars.glob('*.json'))} to be removed",
        )
    finally:
        cli("down", timeout=120)


# --------------------------------------------------------------------------- eligibility


@dataclass(frozen=True)
class Ineligible:
    """One eligibility failure: the work tree to submit from, the submit's arguments, its
    environment (and what it lacks), and what its one line of error says."""

    tree: Callable[[Path], Path]
    args: tuple[str, ...]
    said: str
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()


def _plain_dir(tmp: Path) -> Path:
    """A directory in no git repository."""
    (tmp / "plain").mkdir(parents=True)
    return tmp / "plain"


def _small_repo(tmp: Path) -> Path:
    return git_repo(tmp / "small", {"a.txt": "a\n"})


SHELL_TRUE = ("--type", "shell", "--", "true")
INELIGIBLE = {
    "not a git repository": Ineligible(_plain_dir, SHELL_TRUE, "is not in a git repository"),
    "no commit": Ineligible(
        lambda tmp: git_repo(tmp / "fresh", {"a.txt": "a\n"}, commit=False),
        SHELL_TRUE,
        "has no commit yet: commit once first",
    ),
    "over the upload limit": Ineligible(
        lambda tmp: git_repo(tmp / "big", {"blob.bin": os.urandom(50 * 1024)}),
        SHELL_TRUE,
        "packs to more than 0.01 MB (the upload limit; $SHOAL_RAY_UPLOAD_LIMIT_MB raises it)",
        env={"SHOAL_RAY_UPLOAD_LIMIT_MB": "0.01"},
    ),
    "unreachable address": Ineligible(
        _small_repo,
        ("--ray", "127.0.0.1:1", *SHELL_TRUE),
        "cannot reach the Ray cluster at http://127.0.0.1:1",
    ),
    "no address": Ineligible(
        _small_repo,
        SHELL_TRUE,
        "no Ray cluster address: pass --ray ADDRESS or set SHOAL_RAY_ADDRESS",
        unset=("SHOAL_RAY_ADDRESS",),
    ),
    "model key missing": Ineligible(
        _small_repo,
        ("--model", "anthropic:claude-x", "review this"),
        "model anthropic:claude-x needs $ANTHROPIC_API_KEY",
    ),
    "script not in the work tree": Ineligible(
        _small_repo,
        ("--model", f"scripted:{SECRET}", "plan this"),
        "is not in the packed work tree",
    ),
}


def test_an_ineligible_submit_is_one_line_and_creates_no_task(
    cli: Cli, home: Path, ray: RayHead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each eligibility failure (no git repository, no commit, over the upload limit, an
    address that does not answer, no address, a model without its key, a script the job would
    not have) exits non-zero with one clear line on stderr, and creates no task (`shoal ps
    --all` stays empty) although a leader runs."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    up(cli)
    try:
        for case, bad in INELIGIBLE.items():
            with monkeypatch.context() as scoped:
                for name in bad.unset:
                    scoped.delenv(name, raising=False)
                where = bad.tree(tmp_path / case.replace(" ", "-"))
                out = cli("remote", "submit", "--cwd", str(where), *bad.args, env=bad.env)
            assert out.returncode != 0 and out.stdout == "", (case, out)
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("shoal: error: "), (case, out.stderr)
            assert bad.said in lines[0], (case, lines[0])
        listed = cli("ps", "--all", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == []
    finally:
        cli("down")


def test_a_submission_id_is_used_once(ray: RayHead) -> None:
    """Submitting a second job under an id the cluster knows is a JobExists naming the id and
    the cluster, saying why (a task's id is its job's)."""
    job_id = f"rdup{uuid.uuid4().hex[:8]}"
    with RayJobs(ray.address) as client:
        assert client.submit(job_id, "true") == job_id
        try:
            with pytest.raises(JobExists) as info:
                client.submit(job_id, "true")
            message = str(info.value)
            assert f"already has a job {job_id!r}" in message and ray.address in message
            assert "used once" in message
        finally:
            wait_until(lambda: client.info(job_id).terminal, timeout=JOB_S)
            client.delete(job_id)


# --------------------------------------------------------------------------- agents


def test_remote_agent_and_ultrareview_complete_with_their_results(
    leader: Cli, home: Path, repo: Path
) -> None:
    """The scripted agent on the cluster: a remote-agent's result (from its `result` marker)
    is the agent's final text, which saw the work tree; an ultrareview completes with the
    review as its result, `result_file` review.md and its progress done; an agent that makes
    a task list leaves it, as it last was on the node, in its task's `todo_list`."""
    agent = submit(leader, repo, "say hello")
    review = submit(leader, repo, "--type", "ultrareview", "look at data.txt")
    planner = submit(leader, repo, "--model", "scripted:todo.toml", "make a plan")
    final = ended(home, agent)
    assert final["status"] == "completed", (final, logs(leader, agent))
    result = final["result"]
    assert result.startswith("Asked: say hello\nThe working directory holds:\n"), result
    assert "data.txt" in result.splitlines() and SECRET not in result
    assert '::shoal-result:: "Asked: say hello' in logs(leader, agent)
    done = ended(home, review)
    assert done["status"] == "completed", (done, logs(leader, review))
    assert done["remote_task_metadata"]["result_file"] == "review.md"
    assert done["review_progress"] == {"stage": "done"}
    assert "Review the code" in done["result"] and "look at data.txt" in done["result"]
    planned = ended(home, planner)
    assert planned["status"] == "completed", (planned, logs(leader, planner))
    assert planned["result"] == "planned"
    assert planned["todo_list"] == [
        {"content": "read the code", "status": "completed"},
        {"content": "fix the bug", "status": "pending"},
    ], planned["todo_list"]


def test_stopping_an_agent_job_brings_its_private_leader_down(
    leader: Cli, home: Path, repo: Path, ray: RayHead, tmp_path: Path
) -> None:
    """`shoal stop` of a remote agent in the middle of its command (run in a private copy of
    the work tree): the task is killed, the job is STOPPED, the command and the private leader
    the job started on the node (in a session of its own, out of the stop's reach) are gone,
    and so is the job's temp dir (its home and its copy of the tree)."""
    # The command is found by its unique argument: it runs in the command sandbox, where only
    # its private copy of the tree is writable (no pid file outside it).
    marker = str(os.getpid()) + str(time.monotonic_ns() % 10**6)
    task_id = submit(leader, repo, "--model", "scripted:slow.toml", marker)

    def command() -> psutil.Process | None:
        for proc in psutil.process_iter(["name", "cmdline"]):
            if proc.info["name"] == "sleep" and proc.info["cmdline"] == ["sleep", f"300.{marker}"]:
                return proc
        return None

    sleeping = wait_until(command, timeout=JOB_S, interval=0.1, what="the agent's command")
    ancestors = sleeping.parents()
    # (the private leader: `python -m shoal --home /tmp/shoal-job-*/home up ...`)
    private = [p for p in ancestors if "up" in p.cmdline() and "shoal-job-" in str(p.cmdline())]
    assert len(private) == 1, [p.cmdline() for p in ancestors]
    argv = private[0].cmdline()
    job_dir = Path(argv[argv.index("--home") + 1]).parent  # (its home and its work tree)
    assert (job_dir / "work" / "data.txt").read_text() == "committed data 7f3a\n"
    watched = {proc.pid: " ".join(proc.cmdline()) for proc in [sleeping, *private]}
    stopped = leader("stop", task_id)
    assert stopped.returncode == 0, stopped.stderr
    assert ended(home, task_id, timeout=30)["status"] == "killed"
    assert ray_status(ray.address, task_id) == "STOPPED"
    wait_until(
        lambda: all(pid_gone(pid) for pid in watched),
        timeout=30,
        what=lambda: f"these to end: {[c for p, c in watched.items() if not pid_gone(p)]}",
    )
    wait_until(lambda: not job_dir.exists(), timeout=30, what=f"{job_dir} to be removed")


def test_ultraplan_asks_then_plans_then_is_approved(leader: Cli, home: Path, repo: Path) -> None:
    """An ultraplan whose model asks `QUESTION: which database?`: the task stays running in
    phase needs_input (the pill says so); `approve --feedback postgres` continues it as job
    `{id}-2`, which reaches plan_ready with the plan; `approve` then completes it."""
    task_id = submit(leader, repo, "--type", "ultraplan", "--model", "scripted:plan.toml", "db?")

    def phase(name: str) -> dict[str, Any] | None:
        task = record(home, task_id)
        assert task["status"] == "running", task
        return task if task["ultraplan_phase"] == name else None

    asking = wait_until(lambda: phase("needs_input"), timeout=JOB_S, what="the question")
    assert asking["remote_task_metadata"]["question"] == "which database?"
    assert asking["result"] == "QUESTION: which database?"
    pill = leader("pill")
    assert "ultraplan needs your input" in pill.stdout, pill.stdout + pill.stderr

    answered = leader("approve", task_id, "--feedback", "postgres")
    assert answered.returncode == 0, answered.stderr
    ready = wait_until(lambda: phase("plan_ready"), timeout=JOB_S, what="the plan")
    assert ready["session_id"] == f"{task_id}-2"
    assert ready["result"] == "PLAN: 1. create the tables in postgres"
    assert leader("pill").stdout.strip().endswith("ultraplan ready")

    approved = leader("approve", task_id)
    assert approved.returncode == 0, approved.stderr
    final = ended(home, task_id, timeout=15)
    assert final["status"] == "completed" and final["ultraplan_phase"] == "plan_ready"
    assert final["result"] == "PLAN: 1. create the tables in postgres"
    submitted = {j["submission_id"] for j in ray_jobs(final["remote_task_metadata"]["address"])}
    assert {task_id, f"{task_id}-2"} <= submitted


# --------------------------------------------------------------------------- a dead head


def test_a_head_killed_mid_run_fails_its_task(cli: Cli, home: Path, repo: Path) -> None:
    """A second head killed (kill -9) while its job runs `sleep 300`: with
    SHOAL_RAY_UNREACHABLE_S=3 the task fails within 30 s with an error naming the cluster's
    address and saying it stopped answering; `shoal down` then returns."""
    head = RayHead()
    try:
        up(cli, env={"SHOAL_RAY_UNREACHABLE_S": "3"})
        try:
            task_id = submit(cli, repo, "--ray", head.address, "--type", "shell", "--", "sleep 300")
            wait_until(
                lambda: ray_status(head.address, task_id) == "RUNNING",
                timeout=JOB_S,
                interval=0.2,
                what="the job to run",
            )
            head.kill()
            final = ended(home, task_id, timeout=30)
            assert final["status"] == "failed", final
            assert head.address in final["error"] and "stopped answering" in final["error"]
        finally:
            down = cli("down", timeout=60)
        assert down.returncode == 0, down.stderr
    finally:
        head.stop()
