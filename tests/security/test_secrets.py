"""Secrets, tried as an attacker would read them: from Ray's job API (whoever reaches the
dashboard), from the files under SHOAL_HOME, from `ps` (every user of the machine), from the
wire (a bearer token over plain http), and from a packed work tree (a cloned repository's
committed symlink to a file of ours).

Real parts throughout: the real CLI in its own process, a real leader, the session's loopback
Ray head (tests/ray_cluster.py; its tests run in the `ray` xdist group), real tmux servers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import psutil
import pytest

from shoal.core.secretenv import is_secret
from shoal.teams.backends.base import SpawnSpec
from shoal.teams.backends.tmux import SECRETS_DIR, TmuxBackend
from shoal.workers.remote.packing import pack_workdir
from shoal.workers.remote.ray_jobs import RayError, RayJobs
from shoal.workers.remote.spec import RemoteError
from tests.conftest import Cli
from tests.polling import wait_until
from tests.ray_cluster import RayHead

RAY = [pytest.mark.ray_head, pytest.mark.xdist_group("ray")]
TERMINAL = ("completed", "failed", "killed")
JOB_S = 60.0
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
FAR = "http://10.1.2.3:8265"  # not this machine (and, in the tests, never reached)


# --------------------------------------------------------------------------- helpers


def git_repo(path: Path, files: dict[str, str]) -> Path:
    """A committed git repository at `path` holding `files`."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    commit(path)
    return path


def commit(path: Path) -> None:
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    if not (path / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "tree", "--allow-empty"], check=True)


def marker() -> str:
    """A value that appears nowhere unless we leaked it."""
    return f"marker-{uuid.uuid4().hex}"


def files_holding(root: Path, needle: str) -> list[str]:
    """Every file under `root` whose bytes contain `needle` (grep -r, names too)."""
    found = []
    for path in root.rglob("*"):
        if needle in path.name:
            found.append(str(path))
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                if needle.encode() in path.read_bytes():
                    found.append(str(path))
    return found


def command_lines_holding(*needles: str) -> list[str]:
    """The command line of every process of the machine that holds one of `needles`."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            if any(n in line for n in needles):
                found.append(f"{proc.pid}: {line}")
    return found


def tasks(home: Path) -> dict[str, dict[str, Any]]:
    from shoal.core.paths import Layout
    from shoal.teams.session import current_session

    session = current_session(Layout(home), "default")
    if session is None:
        return {}
    return {**session.history(), **session.read_tasks_raw()}


def ended(home: Path, task_id: str) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        task = tasks(home).get(task_id)
        return task if task is not None and task["status"] in TERMINAL else None

    return wait_until(final, timeout=JOB_S, interval=0.1, what=lambda: f"{task_id} to end")


def job_of(address: str, job_id: str) -> dict[str, Any]:
    """The job as Ray's Jobs API shows it to anyone who reaches the dashboard."""
    try:
        with urllib.request.urlopen(f"{address}/api/jobs/{job_id}", timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError:
        return {}  # (not submitted yet: the leader submits a moment after creating the task)
    return data


def job_env(address: str, job_id: str) -> dict[str, str]:
    env: dict[str, str] = (job_of(address, job_id).get("runtime_env") or {}).get("env_vars") or {}
    return env


def submit(cli: Cli, repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = cli("remote", "submit", "--cwd", str(repo), *args, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@contextlib.contextmanager
def leader(cli: Cli, env: dict[str, str]) -> Iterator[None]:
    started = cli("up", "-d", "-q", env={**FAST, **env})
    assert started.returncode == 0, started.stderr
    try:
        yield
    finally:
        cli("down", timeout=120)


def offline(argv: list[str]) -> list[str]:
    """`argv` in a network namespace of its own (no route anywhere: a connection attempt
    fails at once, so an error that is not ours would show), where the machine allows it."""
    if os.geteuid() == 0 and shutil.which("unshare"):
        return ["unshare", "--net", "--", *argv]
    return argv  # (the unit test below proves, without a namespace, that nothing connects)


@pytest.fixture
def ray(ray_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> RayHead:
    monkeypatch.setenv("SHOAL_RAY_ADDRESS", ray_head.address)
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SHOAL_RAY_TOKEN", "SHOAL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    return ray_head


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("SHOAL_RAY_TOKEN", True),
        ("ANTHROPIC_API_KEY", True),
        ("OPENAI_API_KEY", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET", True),
        ("ssh_key", True),
        ("DB_PASSWORD_FILE", True),
        ("SHOAL_HOME", False),
        ("SHOAL_TEAM", False),
        ("PATH", False),
        ("ANTHROPIC_BASE_URL", False),
        ("KEYBOARD", False),
    ],
)
def test_which_names_are_secret(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


# --------------------------------------------------------------------------- the packer


def _leaky_repo(tmp_path: Path, how: str) -> tuple[Path, str, str]:
    """A cloned repository whose committed `leak` reaches a file of ours outside the tree
    (or in its .git), and the marker that file holds."""
    secret = marker()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_text(f"PRIVATE KEY {secret}\n")
    repo = git_repo(tmp_path / "repo", {"README": "hello\n"})
    if how == "absolute":
        (repo / "leak").symlink_to(outside / "id_rsa")
    elif how == "relative":
        (repo / "leak").symlink_to(Path("..") / "outside" / "id_rsa")
    elif how == "into .git":
        with (repo / ".git" / "config").open("a") as fh:
            fh.write(f'[remote "origin"]\n\turl = https://{secret}@example.com/x.git\n')
        (repo / "leak").symlink_to(Path(".git") / "config")
    elif how == "linked directory":
        (repo / "leak").mkdir()
        (repo / "leak" / "id_rsa").write_text("placeholder\n")
        commit(repo)
        shutil.rmtree(repo / "leak")
        (repo / "leak").symlink_to(outside)
        # (ignored, the link itself is not listed; the index still lists leak/id_rsa)
        (repo / ".gitignore").write_text("/leak\n")
        return repo, secret, "leak/id_rsa"
    elif how == "hard link":
        os.link(outside / "id_rsa", repo / "leak")
    commit(repo)
    return repo, secret, "leak"


@pytest.mark.parametrize("how", ["absolute", "relative", "into .git", "linked directory"])
def test_the_packer_refuses_a_symlink_out_of_the_tree_naming_it(tmp_path: Path, how: str) -> None:
    repo, _, name = _leaky_repo(tmp_path, how)
    with pytest.raises(RemoteError) as err:
        pack_workdir(repo)
    said = str(err.value)
    assert f"{repo / name} is " in said and "symlink" in said, said
    assert "remove the link" in said and "git rm" in said, said


def test_the_packer_refuses_a_hard_link_to_a_file_outside(tmp_path: Path) -> None:
    repo, _, name = _leaky_repo(tmp_path, "hard link")
    with pytest.raises(RemoteError, match="hard link to a file outside the work tree") as err:
        pack_workdir(repo)
    assert str(repo / name) in str(err.value)


def test_a_symlink_inside_the_tree_is_packed_as_a_copy_of_its_target(tmp_path: Path) -> None:
    """Ray unpacks with zipfile, which restores no links: the link's entry is its target's
    bytes (the tree's own), a regular file; hard links all inside the tree are fine too."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "data").mkdir()
    (repo / "data" / "real.txt").write_text("inside bytes\n")
    (repo / "alias.txt").symlink_to(Path("data") / "real.txt")
    (repo / "dirlink").symlink_to("data")
    os.link(repo / "data" / "real.txt", repo / "twin.txt")
    commit(repo)
    package = pack_workdir(repo)
    with zipfile.ZipFile(BytesIO(package.data)) as zf:
        assert zf.read("alias.txt") == b"inside bytes\n"
        mode = zf.getinfo("alias.txt").external_attr >> 16
        assert mode & 0o170000 == 0o100000  # a regular file
        assert zf.read("twin.txt") == b"inside bytes\n"
        assert "dirlink" not in zf.namelist()


@pytest.mark.ray_head
@pytest.mark.xdist_group("ray")
def test_remote_submit_refuses_the_leaky_repository_before_uploading(
    cli: Cli, home: Path, ray: RayHead, tmp_path: Path
) -> None:
    repo, secret, _ = _leaky_repo(tmp_path, "absolute")
    out = cli("remote", "submit", "--cwd", str(repo), "--type", "shell", "--", "cat leak")
    assert out.returncode == 1, out
    line = out.stderr.strip()
    assert "\n" not in line and f"{repo / 'leak'} is a symlink to " in line, line
    assert "git rm leak" in line, line
    assert secret not in out.stdout + out.stderr
    assert not files_holding(home, secret)


# --------------------------------------------------------------------------- the token


def test_a_token_over_http_off_the_machine_is_refused_before_any_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No socket connects: the refusal comes first, and names the address and both fixes."""
    connects: list[object] = []

    def connect(self: socket.socket, address: object) -> None:
        connects.append(address)
        raise OSError("no connection may be made in this test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    with pytest.raises(RayError) as err:
        RayJobs(FAR, "tok-123").version()
    said = str(err.value)
    assert FAR in said and "https://" in said and "--insecure" in said, said
    assert "tok-123" not in said
    assert connects == []
    # Loopback, https and --insecure are let through (constructed: no call made here).
    for address in ("http://127.0.0.1:8265", "http://localhost:8265", "http://[::1]:8265"):
        RayJobs(address, "tok-123").close()
    RayJobs("https://10.1.2.3:8265", "tok-123").close()
    RayJobs(FAR, "tok-123", insecure=True).close()
    RayJobs(FAR, None).close()  # (no token: nothing to leak)


def test_remote_submit_and_run_refuse_a_token_over_http_naming_insecure(
    cli: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`remote submit` and `run --backend ray` with $SHOAL_RAY_TOKEN to a far http address:
    one line naming the address, https and --insecure (from a network namespace without
    routes, where any connection attempt would fail with another error); with --insecure
    the same commands go on to connect (and so fail to reach it)."""
    monkeypatch.setenv("SHOAL_RAY_TOKEN", "tok-abc")
    spec = git_repo(tmp_path / "repo", {"ci.toml": '[[task]]\nid = "a"\nrun = "true"\n'})
    shoal = [sys.executable, "-m", "shoal"]
    env = {**os.environ, "SHOAL_HOME": str(home)}
    submit = [*shoal, "remote", "submit", "--ray", FAR, "--cwd", str(spec)]
    run = [*shoal, "run", str(spec / "ci.toml"), "--backend", "ray", "--ray", FAR]
    shell = ["--type", "shell", "--", "true"]
    for what, argv, insecure in (
        ("submit", [*submit, *shell], [*submit, "--insecure", *shell]),
        ("run", run, [*run, "--insecure"]),
    ):
        out = subprocess.run(offline(argv), capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode != 0, (what, out)
        said = out.stderr.strip()
        assert "\n" not in said and f"over http to {FAR}" in said, (what, said)
        assert "https://" in said and "--insecure" in said and "tok-abc" not in said, said
        out = subprocess.run(offline(insecure), capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode != 0 and "over http" not in out.stderr, (what, out.stderr)
        assert f"the Ray cluster at {FAR}" in out.stderr, (what, out.stderr)


# --------------------------------------------------------------------------- the job's env


@pytest.mark.ray_head
@pytest.mark.xdist_group("ray")
def test_an_api_key_reaches_a_ray_job_only_when_named(
    cli: Cli, home: Path, ray: RayHead, tmp_path: Path
) -> None:
    """The leader and the CLI have $ANTHROPIC_API_KEY: an agent job submitted without naming
    it has no such variable in the runtime_env Ray shows; with `--env ANTHROPIC_API_KEY` (its
    value taken from the CLI's environment) it has, and the submit says once that Ray shows
    job environments; the key's value is in no file under SHOAL_HOME."""
    key = marker()
    repo = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    with leader(cli, {"ANTHROPIC_API_KEY": key}):
        plain = submit(cli, repo, "say hello", env={"ANTHROPIC_API_KEY": key})
        env = wait_until(lambda: job_env(ray.address, plain) or None, what="the first job")
        assert "ANTHROPIC_API_KEY" not in env and key not in json.dumps(env), env
        out = cli(
            "remote", "submit", "--cwd", str(repo), "--env", "ANTHROPIC_API_KEY", "say hello",
            env={"ANTHROPIC_API_KEY": key},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        named = out.stdout.strip()
        notes = [line for line in out.stderr.splitlines() if "Ray shows" in line]
        assert len(notes) == 1 and ray.address in notes[0], out.stderr
        assert "ANTHROPIC_API_KEY" in notes[0] and key not in out.stderr
        env = wait_until(lambda: job_env(ray.address, named) or None, what="the second job")
        assert env.get("ANTHROPIC_API_KEY") == key, env
        for task_id in (plain, named):
            ended(home, task_id)
        assert not files_holding(home, key)


@pytest.mark.ray_head
@pytest.mark.xdist_group("ray")
def test_an_agent_whose_key_is_not_named_is_refused_before_anything_is_submitted(
    cli: Cli, home: Path, ray: RayHead, tmp_path: Path
) -> None:
    """The key is in the CLI's environment, but not named: one line naming `--env KEY`,
    and the cluster gets no job."""
    repo = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    before = json.loads(urllib.request.urlopen(f"{ray.address}/api/jobs/", timeout=10).read())
    out = cli(
        "remote", "submit", "--cwd", str(repo), "--model", "anthropic:claude-x", "review",
        env={"ANTHROPIC_API_KEY": marker()},
    )  # fmt: skip
    assert out.returncode != 0 and out.stdout == "", out
    line = out.stderr.strip()
    assert "\n" not in line and "pass --env ANTHROPIC_API_KEY " in line, line
    after = json.loads(urllib.request.urlopen(f"{ray.address}/api/jobs/", timeout=10).read())
    assert len(after) == len(before)
    assert not (home / "sessions").exists() or not tasks(home)


@pytest.mark.ray_head
@pytest.mark.xdist_group("ray")
def test_env_values_and_the_token_are_never_written_under_shoal_home(
    cli: Cli, home: Path, ray: RayHead, tmp_path: Path
) -> None:
    """`--env K=VALUE` and $SHOAL_RAY_TOKEN (to the loopback head over http: allowed): the
    job gets K (it prints a digest of it), and after the run neither value is in any file
    under SHOAL_HOME (state, history, sidecars, output, events), nor after `down`."""
    value, token = marker(), marker()
    repo = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    digest = hashlib.sha256(value.encode()).hexdigest()
    with leader(cli, {"SHOAL_RAY_TOKEN": token}):
        task_id = submit(
            cli, repo, "--env", f"K={value}", "--type", "shell", "--",
            'printf %s "$K" | sha256sum',
            env={"SHOAL_RAY_TOKEN": token},
        )  # fmt: skip
        final = ended(home, task_id)
        assert final["status"] == "completed", final
        assert not files_holding(home, value) and not files_holding(home, token)
        assert final["remote_task_metadata"]["env_names"] == ["K"]
        assert digest in Path(final["output_file"]).read_text()
    assert not files_holding(home, value) and not files_holding(home, token)


# --------------------------------------------------------------------------- tmux


def _worker_pid(home: Path, team: str, name: str) -> int | None:
    status = home / "teams" / team / "status" / f"{name}.json"
    try:
        pid = json.loads(status.read_text()).get("pid")
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return pid if isinstance(pid, int) else None


@pytest.mark.tmux
@pytest.mark.parametrize("forked", [True, False], ids=["forked", "new-interpreter"])
def test_a_tmux_teammate_gets_its_secrets_off_every_command_line(
    cli: Cli, home: Path, tmux_socket: str, tmp_path: Path, forked: bool
) -> None:
    """A leader with $SHOAL_RAY_TOKEN, $ANTHROPIC_API_KEY and $SHOAL_DEPLOY_KEY spawns a tmux
    teammate (forked onto its pane, or a new interpreter): no process's command line holds a
    value (the tmux server keeps its first client's for good), the teammate's command sees
    every one (it writes their digests), and the file that carried them is gone."""
    team = "t"
    values = {n: marker() for n in ("SHOAL_RAY_TOKEN", "ANTHROPIC_API_KEY", "SHOAL_DEPLOY_KEY")}
    env = {**values, "SHOAL_FORKSERVER": "1" if forked else "0"}
    out_file = tmp_path / "digests.txt"
    script = "; ".join(f'printf "%s\\n" "${n}" | sha256sum >> {out_file}' for n in values)
    up = cli("up", "--team", team, "-d", "-q", env=env)
    assert up.returncode == 0, up.stderr
    try:
        spawned = cli(
            "spawn", "--team", team, "--backend", "tmux", "--agent", "exec",
            "--cmd", f"sh -c '{script}'", "--prompt", "go", "ana",
            env=env,
        )  # fmt: skip
        assert spawned.returncode == 0, spawned.stderr
        wait_until(
            lambda: out_file.exists() and len(out_file.read_text().splitlines()) == 3,
            timeout=30,
            what="the teammate's command to write the digests",
        )
        expected = [hashlib.sha256(f"{v}\n".encode()).hexdigest() for v in values.values()]
        got = [line.split()[0] for line in out_file.read_text().splitlines()]
        assert got == expected
        assert command_lines_holding(*values.values()) == []
        folder = home / "teams" / team / SECRETS_DIR
        wait_until(lambda: not any(folder.iterdir()), what="the pane's secrets file to go")
        assert _worker_pid(home, team, "ana") is not None
        for value in values.values():
            assert not files_holding(home, value)
    finally:
        cli("down", "--team", team, timeout=120)
    assert command_lines_holding(*values.values()) == []


@pytest.mark.tmux
def test_a_pane_command_of_one_argument_gets_its_spec_secrets(
    home: Path, tmux_socket: str, tmp_path: Path
) -> None:
    """The backend itself: a spec's own secret variable (an agent's --env, say) reaches a
    pane whose command is a lone program (run through the shell as `exec PROGRAM`) and one
    of several arguments; neither value is on any command line, both panes see theirs."""
    values = {"DEPLOY_TOKEN": marker(), "DB_PASSWORD": marker()}
    program = tmp_path / "report"
    out = tmp_path / "out"
    program.write_text(f'#!/bin/sh\nprintf %s "$DEPLOY_TOKEN" > {out}.one\nexec sleep 600\n')
    program.chmod(0o755)
    two = [
        sys.executable, "-c",
        f"import os, time; open({str(out) + '.two'!r}, 'w').write(os.environ['DB_PASSWORD']); "
        "time.sleep(600)",
    ]  # fmt: skip
    backend = TmuxBackend(socket_name=tmux_socket)
    try:
        for name, argv, env in (
            ("one", [str(program)], {"DEPLOY_TOKEN": values["DEPLOY_TOKEN"], "PLAIN": "p"}),
            ("two", two, {"DB_PASSWORD": values["DB_PASSWORD"]}),
        ):
            backend.spawn(
                SpawnSpec(team="alpha", name=name, argv=argv, cwd=str(tmp_path), home=home, env=env)
            )
        wait_until(lambda: Path(f"{out}.one").exists() and Path(f"{out}.two").exists())
        wait_until(lambda: Path(f"{out}.one").read_text() == values["DEPLOY_TOKEN"])
        wait_until(lambda: Path(f"{out}.two").read_text() == values["DB_PASSWORD"])
        assert command_lines_holding(*values.values()) == []
        assert command_lines_holding("PLAIN=p")  # (a plain variable still goes with -e)
    finally:
        backend.close("alpha")


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


@pytest.mark.ray_head
@pytest.mark.xdist_group("ray")
def test_a_restarted_leader_has_no_env_value_and_names_the_env_a_new_job_needs(
    cli: Cli, home: Path, ray: RayHead, tmp_path: Path
) -> None:
    """An ultraplan submitted with `--env K=VALUE` asks a question; its leader is killed
    (kill -9) and started again: the value was in the old leader's memory only, so answering
    (which submits a new job) is refused with one line naming `--env K`, and the task still
    waits for its answer, unchanged."""
    from shoal.core.paths import Layout
    from shoal.orchestrator.liveness import leader_alive

    value = marker()
    repo = git_repo(tmp_path / "repo", {"plan.toml": PLAN_SCRIPT})
    with leader(cli, {}):
        task_id = submit(
            cli, repo, "--env", f"K={value}", "--type", "ultraplan",
            "--model", "scripted:plan.toml", "db?",
        )  # fmt: skip

        def asking() -> dict[str, Any] | None:
            task = tasks(home).get(task_id)
            return task if task and task.get("ultraplan_phase") == "needs_input" else None

        wait_until(asking, timeout=JOB_S, interval=0.1, what="the question")
        alive = leader_alive(Layout(home), "default")
        assert alive is not None
        os.kill(alive[0], 9)
        wait_until(lambda: leader_alive(Layout(home), "default") is None, what="the leader's end")
        restarted = cli("up", "-d", "-q", env=FAST)
        assert restarted.returncode == 0, restarted.stderr
        out = cli("approve", task_id, "--feedback", "postgres")
        assert out.returncode != 0, out
        line = out.stderr.strip()
        assert "\n" not in line and "needs --env K," in line and "--env K" in line, line
        assert "restarted" in line and value not in line, line
        task = tasks(home)[task_id]
        assert task["status"] == "running" and task["ultraplan_phase"] == "needs_input"
        assert task["session_id"] == task_id  # (no continuation job was made)
    assert not files_holding(home, value)
