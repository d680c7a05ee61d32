"""`shoal run SPEC --backend ray`: every shell task of a spec as a job on a real Ray head.

The head is the session's loopback one (tests/ray_cluster.py); each test's spec lives in a git
repository of its own in tmp_path (the run packs and uploads it), and the run is a real
`python -m shoal run` process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import Cli
from tests.polling import wait_until
from tests.ray_cluster import HEAD_RESOURCE, RayHead, RayWorkerNode

pytestmark = [pytest.mark.ray_head, pytest.mark.xdist_group("ray")]


def _repo(path: Path, spec: str, files: dict[str, str] | None = None) -> Path:
    """A git repository at `path` holding `ci.toml` (and `files`), committed once."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "ci.toml").write_text(spec)
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "spec"], check=True)
    return path / "ci.toml"


def _joblog(path: Path) -> list[list[str]]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("Seq\tHost\tStarttime"), lines[0]
    return [line.split("\t") for line in lines[1:]]


def _report(path: Path) -> dict[str, Any]:
    data = orjson.loads(path.read_bytes())
    assert isinstance(data, dict)
    return data


def test_twenty_tasks_one_failing_reports_joblog_and_dependencies(
    ray_head: RayHead, cli: Cli, tmp_path: Path
) -> None:
    """20 tasks (a Ray job each), `t13` exits 7 and `after13` depends on it: the run exits 1,
    18 succeed, t13 failed with its exit code, after13 skipped; every joblog line's host is
    the node's address; the JSON report and JUnit say the same; a task's output is its
    command's."""
    tasks = [
        f'[[task]]\nid = "t{i}"\nrun = "echo out-{i}; cat data/in.txt"\n'
        for i in range(19)
        if i != 13
    ]
    tasks.append('[[task]]\nid = "t13"\nrun = "echo failing; exit 7"\n')
    tasks.append('[[task]]\nid = "after13"\nrun = "echo never"\nafter = ["t13"]\n')
    spec = _repo(tmp_path / "repo", "[run]\njobs = 8\n\n" + "\n".join(tasks), {"data/in.txt": "x"})
    joblog, report, junit = tmp_path / "jl", tmp_path / "r.json", tmp_path / "j.xml"
    done = cli(
        "run", str(spec), "--backend", "ray", "--ray", ray_head.address,
        "--joblog", str(joblog), "--report", str(report), "--junit", str(junit),
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    data = _report(report)
    by_id = {t["id"]: t for t in data["tasks"]}
    assert by_id["t13"]["status"] == "failed" and by_id["t13"]["exit_code"] == 7
    assert by_id["after13"]["status"] == "skipped"
    succeeded = [t for t in data["tasks"] if t["status"] == "succeeded"]
    assert len(succeeded) == 18
    rows = _joblog(joblog)
    assert len(rows) == 19  # (the skipped task never ran)
    assert {row[1] for row in rows} == {"127.0.0.1"}
    assert {row[6] for row in rows} == {"0", "7"}
    last = by_id["t5"]["attempt_log"][-1]
    assert Path(last["output_file"]).read_text() == "out-5\nx"
    assert last["host"] == "127.0.0.1"
    assert 'failures="1"' in junit.read_text()


def test_jobs_caps_jobs_in_flight_and_retries_and_timeouts_hold(
    ray_head: RayHead, cli: Cli, tmp_path: Path
) -> None:
    """--jobs 2 over six 1 s jobs: never more than 2 overlap (from the joblog's times); a
    flaky task succeeds on its retry (a marker file in the shared tmp dir); a task past its
    timeout is stopped on the cluster and reported timed out."""
    marker = tmp_path / "flaky-ran-once"
    spec_text = "\n".join(
        [f'[[task]]\nid = "s{i}"\nrun = "sleep 1"\n' for i in range(6)]
        + [
            f'[[task]]\nid = "flaky"\nretries = 1\nrun = "test -e {marker} || '
            f'{{ touch {marker}; exit 3; }}"\n',
            '[[task]]\nid = "slow"\ntimeout = "2s"\nrun = "sleep 120"\n',
        ]
    )
    spec = _repo(tmp_path / "repo", spec_text)
    joblog, report = tmp_path / "jl", tmp_path / "r.json"
    done = cli(
        "run", str(spec), "--backend", "ray", "--ray", ray_head.address, "--jobs", "2",
        "--joblog", str(joblog), "--report", str(report), timeout=600,
    )  # fmt: skip
    assert done.returncode == 124, done.stdout + done.stderr
    by_id = {t["id"]: t for t in _report(report)["tasks"]}
    assert by_id["flaky"]["status"] == "succeeded"
    assert by_id["flaky"]["attempts"] == 2
    assert by_id["slow"]["status"] == "timed_out"
    spans = [(float(r[2]), float(r[2]) + float(r[3])) for r in _joblog(joblog)]
    for start, _ in spans:
        overlapping = sum(1 for s, e in spans if s <= start < e)
        assert overlapping <= 2, f"{overlapping} jobs in flight at {start}: {spans}"


def test_resume_runs_only_what_did_not_succeed(ray_head: RayHead, cli: Cli, tmp_path: Path) -> None:
    """A run with one failing task, fixed by a file the job reads from the shared tmp dir,
    then `--resume`: only the failed task runs again (one new joblog line), and it passes."""
    gate = tmp_path / "gate"
    spec = _repo(
        tmp_path / "repo",
        f'[[task]]\nid = "ok"\nrun = "echo ok"\n\n[[task]]\nid = "gated"\nrun = "test -e {gate}"\n',
    )
    joblog = tmp_path / "jl"
    base = ["run", str(spec), "--backend", "ray", "--ray", ray_head.address]
    first = cli(*base, "--joblog", str(joblog), timeout=300)
    assert first.returncode == 1, first.stdout + first.stderr
    assert len(_joblog(joblog)) == 2
    gate.write_text("")
    second = cli(*base, "--joblog", str(joblog), "--resume", timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    rows = _joblog(joblog)
    assert len(rows) == 3 and rows[-1][-1] == f"test -e {gate}"


def test_bad_inputs_start_nothing(ray_head: RayHead, cli: Cli, tmp_path: Path) -> None:
    """Each refusal is one clear line, and no team, task or job is left: a spec outside a git
    repository; a repository without a commit; a task with a per-task junit report; an
    unreachable address; no address at all."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "ci.toml").write_text('[[task]]\nid = "a"\nrun = "true"\n')
    out = cli("run", str(plain / "ci.toml"), "--backend", "ray", "--ray", ray_head.address)
    assert out.returncode != 0 and "not in a git repository" in out.stderr, out.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "ci.toml").write_text('[[task]]\nid = "a"\nrun = "true"\n')
    subprocess.run(["git", "-C", str(empty), "init", "-q"], check=True)
    out = cli("run", str(empty / "ci.toml"), "--backend", "ray", "--ray", ray_head.address)
    assert out.returncode != 0 and "no commit" in out.stderr, out.stderr

    spec = _repo(tmp_path / "junit", '[[task]]\nid = "a"\nrun = "true"\njunit = "r.xml"\n')
    out = cli("run", str(spec), "--backend", "ray", "--ray", ray_head.address)
    assert out.returncode == 2 and "junit" in out.stderr, out.stderr

    spec = _repo(tmp_path / "ok", '[[task]]\nid = "a"\nrun = "true"\n')
    out = cli("run", str(spec), "--backend", "ray", "--ray", "127.0.0.1:1")
    assert out.returncode != 0 and "127.0.0.1:1" in out.stderr, out.stderr
    out = cli("run", str(spec), "--backend", "ray", env={"SHOAL_RAY_ADDRESS": ""})
    assert out.returncode != 0 and "SHOAL_RAY_ADDRESS" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    teams = cli("team", "list", "--json")
    assert teams.returncode == 0 and orjson.loads(teams.stdout) == [], teams.stdout


def _load(address: str) -> dict[str, Any]:
    """The cluster's resource usage and pending demand (the dashboard's cluster status)."""
    with urllib.request.urlopen(f"{address}/api/cluster_status", timeout=10) as response:
        report: dict[str, Any] = orjson.loads(response.read())["data"]["clusterStatus"]
    return dict(report["loadMetricsReport"])


def test_resources_reach_ray_and_a_task_no_node_can_hold_starts_nothing(
    ray_head: RayHead, cli: Cli, tmp_path: Path
) -> None:
    """A spec with a task asking for a GPU and one asking for a resource no node has is
    refused (exit 2) before anything starts, naming both tasks and the cluster's resources,
    and leaves no team; a task's num_cpus and custom resources (the node's own
    `node:127.0.0.1`), else the `[run]` default, are what its Ray job's entrypoint holds on
    the node (the cluster's usage shows them, and a task that would not fit beside waits)."""
    bad = _repo(
        tmp_path / "bad",
        '[[task]]\nid = "gpu"\nrun = "true"\nnum_gpus = 1\n\n'
        '[[task]]\nid = "tpu"\nrun = "true"\nresources = { tpu = 2 }\n',
    )
    out = cli("run", str(bad), "--backend", "ray", "--ray", ray_head.address)
    assert out.returncode == 2, out.stdout + out.stderr
    assert 'task "gpu" asks for GPU=1: resource GPU, which no node' in out.stderr, out.stderr
    assert 'task "tpu" asks for tpu=2: resource tpu' in out.stderr, out.stderr
    assert f"the cluster at {ray_head.address} has 127.0.0.1: CPU=4, {HEAD_RESOURCE}=1;" in (
        out.stderr + ";"
    ), out.stderr
    assert "nothing was started" in out.stderr
    teams = cli("team", "list", "--json")
    assert teams.returncode == 0 and orjson.loads(teams.stdout) == [], teams.stdout

    # A gated task holding 3 of the head's 4 CPUs ([run]'s default) and half of its
    # `node:127.0.0.1`, beside one asking for 2 CPUs: while the first runs, the cluster
    # counts what it holds, and the second waits for CPUs (Ray's demand, not --jobs).
    gate = tmp_path / "gate"
    spec = _repo(
        tmp_path / "ok",
        "[run]\njobs = 2\nnum_cpus = 3\n\n"
        f'[[task]]\nid = "held"\nrun = "touch {tmp_path}/held.on; '
        f'while [ ! -e {gate} ]; do sleep 0.05; done"\n'
        'resources = { "node:127.0.0.1" = 0.5 }\n\n'
        '[[task]]\nid = "second"\nrun = "echo second"\nnum_cpus = 2\n',
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec), "--backend", "ray",
         "--ray", ray_head.address],
        env={**os.environ, "SHOAL_HOME": str(cli.home)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: (tmp_path / "held.on").exists(), timeout=120, what="held to run")

        def holding() -> bool:
            load = _load(ray_head.address)
            return (
                load["usage"].get("CPU", [0])[0] >= 3
                and load["usage"].get("node:127.0.0.1", [0])[0] >= 0.5
                and [{"CPU": 2.0}, 1] in load["resourceDemand"]
            )

        load = lambda: f"the cluster's load: {_load(ray_head.address)}"  # noqa: E731
        wait_until(holding, timeout=60, what=load)
        gate.touch()
        assert run.wait(timeout=120) == 0, run.stdout.read() if run.stdout else ""
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_each_task_works_in_its_own_copy_removed_after_it_unless_kept(
    ray_head: RayHead, cli: Cli, tmp_path: Path
) -> None:
    """A task writes a file beside the committed ones and one in a subdirectory; the task
    after it (same run, same package) sees neither, and the copies are gone from the node.
    With --keep-workdirs the task's copy stays, named on its output's last line, holding
    what it wrote."""
    spec = _repo(
        tmp_path / "repo",
        '[[task]]\nid = "writer"\nrun = "echo leaked > leak.txt; echo x >> sub/data.txt"\n\n'
        '[[task]]\nid = "reader"\nafter = ["writer"]\n'
        'run = "test ! -e leak.txt && cat sub/data.txt && pwd"\n',
        {"sub/data.txt": "committed\n"},
    )
    report = tmp_path / "r.json"
    done = cli(
        "run", str(spec), "--backend", "ray", "--ray", ray_head.address,
        "--report", str(report), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    by_id = {t["id"]: t for t in _report(report)["tasks"]}
    said = Path(by_id["reader"]["attempt_log"][-1]["output_file"]).read_text().splitlines()
    assert said[0] == "committed", said
    where = Path(said[1])
    assert where.name == "work" and where.parent.name.startswith("shoal-task-"), where
    assert not where.parent.exists()

    kept = cli(
        "run", str(spec), "--backend", "ray", "--ray", ray_head.address, "--keep-workdirs",
        "--report", str(report), timeout=300,
    )  # fmt: skip
    assert kept.returncode == 0, kept.stdout + kept.stderr
    by_id = {t["id"]: t for t in _report(report)["tasks"]}
    last = Path(by_id["writer"]["attempt_log"][-1]["output_file"]).read_text().splitlines()[-1]
    assert last.startswith("shoal: kept the working copy of this task: "), last
    copy = Path(last.rsplit(": ", 1)[1])
    try:
        assert (copy / "work" / "leak.txt").read_text() == "leaked\n"
        assert (copy / "work" / "sub" / "data.txt").read_text() == "committed\nx\n"
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    for task in by_id.values():  # (the reader's copy is kept too)
        line = Path(task["attempt_log"][-1]["output_file"]).read_text().splitlines()[-1]
        shutil.rmtree(line.rsplit(": ", 1)[1], ignore_errors=True)


def test_a_task_lands_on_the_node_that_has_its_resource(
    ray_head: RayHead, cli: Cli, tmp_path: Path
) -> None:
    """A second node joined to the head (`ray start --address`, named shoal-b, with its own
    custom resource): of a spec whose tasks each require one node's resource, each runs on
    that node, and the joblog's host column and the report's `attempt_log[].host` name it
    (Ray's node name: the head's is its address)."""
    node = RayWorkerNode(ray_head, "shoal-b", "shoal_b")
    try:
        spec = _repo(
            tmp_path / "repo",
            "[run]\njobs = 4\n\n"
            + "".join(
                f'[[task]]\nid = "{where}{i}"\nrun = "echo {where}{i}"\n'
                f"resources = {{ {resource} = 0.1 }}\n\n"
                for where, resource in (("head", HEAD_RESOURCE), ("b", "shoal_b"))
                for i in range(2)
            ),
        )
        joblog, report = tmp_path / "jl", tmp_path / "r.json"
        done = cli(
            "run", str(spec), "--backend", "ray", "--ray", ray_head.address,
            "--joblog", str(joblog), "--report", str(report), timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        hosts = {row[-1].split()[-1]: row[1] for row in _joblog(joblog)}
        assert hosts == {
            "head0": "127.0.0.1", "head1": "127.0.0.1", "b0": "shoal-b", "b1": "shoal-b"
        }, hosts  # fmt: skip
        by_id = {t["id"]: t["attempt_log"][-1]["host"] for t in _report(report)["tasks"]}
        assert by_id == hosts, by_id
    finally:
        node.stop()
