"""`shoal run SPEC --backend ray`: every shell task of a spec as a job on a real Ray head.

The head is the session's loopback one (tests/ray_cluster.py); each test's spec lives in a git
repository of its own in tmp_path (the run packs and uploads it), and the run is a real
`python -m shoal run` process.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import Cli
from tests.ray_cluster import RayHead

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
