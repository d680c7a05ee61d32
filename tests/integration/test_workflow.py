"""`shoal workflow SPEC`: a spec run by the team's real leader as one `w...` task, its steps
real shell processes; one notification, the report, ps, stop, and a kill -9 of the leader."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Cli
from tests.polling import wait_until

FAST = {"SHOAL_KILL_GRACE": "1"}


@pytest.fixture
def leader(cli: Cli) -> Iterator[Cli]:
    """A detached leader of team `default`, brought down at the end."""
    up = cli("up", "-d", "-q", env=FAST)
    assert up.returncode == 0, up.stderr
    yield cli
    cli("down", timeout=60)


def _tasks(cli: Cli) -> dict[str, dict[str, Any]]:
    out = cli("ps", "--all", "--json")
    assert out.returncode == 0, out.stderr
    return {t["id"]: t for t in json.loads(out.stdout)}


def _task(cli: Cli, task_id: str) -> dict[str, Any]:
    return _tasks(cli)[task_id]


def _events(cli: Cli) -> list[dict[str, Any]]:
    out = cli("events", "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _start(cli: Cli, spec: Path) -> str:
    out = cli("workflow", str(spec))
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    assert task_id.startswith("w") and len(task_id) == 9, task_id
    return task_id


def _kill_leader(cli: Cli) -> None:
    """kill -9 the team's leader and wait until it is gone."""
    team = json.loads(cli("team", "show", "--json").stdout)
    lead_pid = next(m["pid"] for m in team["members"] if m["name"] == "team-lead")
    os.kill(lead_pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(lead_pid) or
               psutil.Process(lead_pid).status() == "zombie", timeout=30)  # fmt: skip


def _ended(cli: Cli, task_id: str) -> dict[str, Any] | None:
    task = _task(cli, task_id)
    return task if task["status"] in ("completed", "failed", "killed") else None


def test_three_steps_one_failing(leader: Cli, tmp_path: Path) -> None:
    """a, then b (fails), c on its own: one notification with the counts, the report where it
    says and right, the steps under the workflow in ps, and no step notified on its own."""
    spec = tmp_path / "ci.toml"
    spec.write_text(
        "[run]\njobs = 2\n"
        '[[task]]\nid = "a"\nrun = "echo a >> marks"\n'
        '[[task]]\nid = "b"\nrun = "echo b >> marks; exit 3"\nafter = ["a"]\n'
        '[[task]]\nid = "c"\nrun = "echo c >> marks"\n'
    )
    task_id = _start(leader, spec)
    done = wait_until(lambda: _ended(leader, task_id), timeout=60, what="the workflow's end")
    assert done["status"] == "failed"
    assert done["counts"]["succeeded"] == 2 and done["counts"]["failed"] == 1
    assert done["total_steps"] == 3 and done["completed_steps"] == 3
    assert sorted((tmp_path / "marks").read_text().split()) == ["a", "b", "c"]

    notes = [e for e in _events(leader) if e.get("subtype") == "task_notification"]
    assert [n["task_id"] for n in notes] == [task_id], notes
    assert "3 steps: 2 succeeded, 1 failed" in notes[0]["summary"]
    report_path = Path(done["report_file"])
    assert str(report_path) in notes[0]["notification"]
    report = json.loads(report_path.read_text())
    assert report["status"] == "failed" and report["exit_code"] == 1
    assert report["workflow_id"] == task_id and report["spec"] == str(spec)
    assert report["counts"]["total"] == 3 and report["counts"]["failed"] == 1
    verdicts = {t["id"]: (t["status"], t["reason"]) for t in report["tasks"]}
    assert verdicts == {
        "a": ("succeeded", None),
        "b": ("failed", "exit code 3"),
        "c": ("succeeded", None),
    }

    steps = [t for t in _tasks(leader).values() if t.get("workflow_id") == task_id]
    assert len(steps) == 3 and {s["id"] for s in steps} == set(done["steps"])
    assert all(s["type"] == "local_bash" for s in steps)
    table = leader("ps", "--all").stdout.splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith(task_id))
    under = table[at + 1 : at + 4]
    assert {line.split()[0] for line in under} == set(done["steps"]), table
    assert all("└ [" in line for line in under), table


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_agent_steps_run_on_members_that_join_the_team(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    """A shell step, then a scripted member's turn, then a shell step that needs its work:
    the member joins the team listed under the workflow, its turn is a step, the one
    notification counts all three, and the member is gone at the end."""
    (tmp_path / "review.toml").write_text(
        '[[step]]\nwhen = "task"\nrun = "cat built.txt && echo {name} > reviewed.txt"\n'
    )
    spec = tmp_path / "mixed.toml"
    spec.write_text(
        f'[run]\nbackend = "{backend}"\n'
        '[[member]]\nname = "reviewer"\nscript = "review.toml"\n'
        '[[task]]\nid = "build"\nrun = "echo built > built.txt"\n'
        '[[task]]\nid = "review"\nprompt = "Review the build."\nassign = "reviewer"\n'
        'after = ["build"]\n'
        '[[task]]\nid = "ship"\nrun = "test -f reviewed.txt"\nafter = ["review"]\n'
    )
    task_id = _start(leader, spec)
    done = wait_until(lambda: _ended(leader, task_id), timeout=90, what="the workflow's end")
    assert done["status"] == "completed", done
    assert (tmp_path / "reviewed.txt").read_text() == "reviewer\n"
    assert done["counts"]["succeeded"] == 3, done
    report = json.loads(Path(done["report_file"]).read_text())
    assert report["backend"] == backend
    assert [t["status"] for t in report["tasks"]] == ["succeeded"] * 3
    member = [t for t in _tasks(leader).values() if t.get("workflow_id") == task_id
              and t["type"] == "in_process_teammate"]  # fmt: skip
    assert [m["description"] for m in member] == ["teammate reviewer"], member
    notes = [e for e in _events(leader) if e.get("subtype") == "task_notification"]
    assert [n["task_id"] for n in notes] == [task_id], notes  # (the member's end is not news)

    def gone() -> bool:
        team = json.loads(leader("team", "show", "--json").stdout)
        return [m["state"] for m in team["members"] if m["name"] == "reviewer"] == ["dead"]

    assert wait_until(gone, timeout=30, what="the member's end")
    log = Path(done["output_file"]).read_text()
    assert f"members reviewer join team default as {backend}" in log, log


def test_a_member_name_taken_fails_the_workflow_with_nothing_run(
    leader: Cli, tmp_path: Path
) -> None:
    spawned = leader("spawn", "reviewer", "--backend", "in-process")
    assert spawned.returncode == 0, spawned.stderr
    spec = tmp_path / "taken.toml"
    spec.write_text(
        '[run]\nbackend = "in-process"\n[[member]]\nname = "reviewer"\n'
        '[[task]]\nid = "build"\nrun = "echo built > built.txt"\n'
        '[[task]]\nid = "review"\nprompt = "look"\nassign = "reviewer"\n'
    )
    task_id = _start(leader, spec)
    done = wait_until(lambda: _ended(leader, task_id), timeout=60, what="the workflow's end")
    assert done["status"] == "failed", done
    assert "teammate 'reviewer' is already running in team 'default'" in done["error"], done
    assert not (tmp_path / "built.txt").exists()  # nothing of it ran
    team = json.loads(leader("team", "show", "--json").stdout)
    (mine,) = [m for m in team["members"] if m["name"] == "reviewer"]
    assert mine["is_active"], mine  # the user's teammate is left alone


def test_stop_stops_the_running_steps(leader: Cli, tmp_path: Path) -> None:
    """`stop` of the workflow kills its running steps; nothing after them starts."""
    spec = tmp_path / "slow.toml"
    spec.write_text(
        '[[task]]\nid = "slow"\nrun = "echo $$ > pid; exec sleep 300"\n'
        '[[task]]\nid = "after"\nrun = "touch ran"\nafter = ["slow"]\n'
    )
    task_id = _start(leader, spec)
    pid_file = tmp_path / "pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30)
    pid = int(pid_file.read_text())
    assert psutil.pid_exists(pid)
    out = leader("stop", task_id, env=FAST)
    assert out.returncode == 0, out.stderr
    done = wait_until(lambda: _ended(leader, task_id), timeout=30, what="the workflow killed")
    assert done["status"] == "killed"
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
               timeout=30, what="the step's process gone")  # fmt: skip
    steps = [t for t in _tasks(leader).values() if t.get("workflow_id") == task_id]
    assert [s["status"] for s in steps] == ["killed"]
    assert not (tmp_path / "ran").exists()
    report = json.loads(Path(done["report_file"]).read_text())
    assert report["status"] == "interrupted"
    assert {t["id"]: t["status"] for t in report["tasks"]} == {
        "slow": "killed",
        "after": "skipped",
    }


def test_a_killed_leader_resumed_continues_the_workflow(cli: Cli, tmp_path: Path) -> None:
    """kill -9 of the leader while step b runs; `up -d` again: the workflow goes on, a is not
    run again, b (still running) is taken back, c runs once b ends."""
    up = cli("up", "-d", "-q", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        spec = tmp_path / "long.toml"
        go = tmp_path / "go"
        spec.write_text(
            '[[task]]\nid = "a"\nrun = "echo a >> marks"\n'
            '[[task]]\nid = "b"\nafter = ["a"]\n'
            f'run = "echo b-start >> marks; while [ ! -e {go} ]; do sleep 0.05; done; '
            'echo b >> marks"\n'
            '[[task]]\nid = "c"\nrun = "echo c >> marks"\nafter = ["b"]\n'
        )
        marks = tmp_path / "marks"
        task_id = _start(cli, spec)
        wait_until(lambda: marks.exists() and "b-start" in marks.read_text(), timeout=30)
        _kill_leader(cli)
        assert _task(cli, task_id)["status"] == "running"  # (as the dead leader left it)
        again = cli("up", "-d", "-q", env=FAST)
        assert again.returncode == 0, again.stderr
        go.touch()
        done = wait_until(lambda: _ended(cli, task_id), timeout=60, what="the workflow's end")
        assert done["status"] == "completed", done
        assert marks.read_text().split() == ["a", "b-start", "b", "c"]
        report = json.loads(Path(done["report_file"]).read_text())
        assert report["status"] == "succeeded" and report["counts"]["succeeded"] == 3
        assert report["resumed_from"] == report["run_id"]
        by_id = {t["id"]: t for t in report["tasks"]}
        assert by_id["a"]["resumed"] is True and by_id["c"]["resumed"] is False
        notes = [e for e in _events(cli) if e.get("subtype") == "task_notification"]
        assert [n["task_id"] for n in notes] == [task_id]
    finally:
        cli("down", timeout=60)


def test_a_run_leader_that_resumes_the_session_stops_its_workflow_once(
    cli: Cli, tmp_path: Path
) -> None:
    """The team's leader is killed mid-workflow; `shoal run --team default` resumes that
    session and, as with any task an earlier leader left running, stops the workflow: it ends
    killed (not "cannot run local_workflow tasks"), rebuilt once, its running step killed, its
    report written, and, stopped on request, not notified."""
    up = cli("up", "-d", "-q", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        marks = tmp_path / "marks"
        flow = tmp_path / "flow.toml"
        flow.write_text(
            '[[task]]\nid = "a"\nrun = "echo a >> marks"\n'
            '[[task]]\nid = "b"\nafter = ["a"]\nrun = "echo b-start >> marks; sleep 600"\n'
            '[[task]]\nid = "c"\nrun = "echo c >> marks"\nafter = ["b"]\n'
        )
        task_id = _start(cli, flow)
        wait_until(lambda: marks.exists() and "b-start" in marks.read_text(), timeout=30)
        _kill_leader(cli)
        other = tmp_path / "other.toml"
        other.write_text('[[task]]\nid = "one"\nrun = "true"\n')
        ran = cli("run", str(other), "--team", "default", timeout=120, env=FAST)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "stopped 2 task(s) left running by an earlier leader of team default: " in (
            ran.stdout + ran.stderr
        )
        done = _ended(cli, task_id)
        assert done is not None and done["status"] == "killed", done
        assert marks.read_text().split() == ["a", "b-start"]
        report = json.loads(Path(done["report_file"]).read_text())
        assert {t["id"]: t["status"] for t in report["tasks"]} == {
            "a": "succeeded",
            "b": "killed",
            "c": "skipped",
        }
        log = Path(done["output_file"]).read_text()
        assert log.count("continued by a resumed leader") == 1, log
        notes = [e for e in _events(cli) if e.get("subtype") == "task_notification"]
        assert task_id not in [n["task_id"] for n in notes], notes  # (stopped on request)
    finally:
        cli("down", timeout=60)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[run]\njbos = 2\n[[task]]\nid = "a"\nrun = "true"\n', ':2: [run]: unknown key "jbos"'),
        ('[[task]]\nid = "a"\nrun = "true"\nafter = ["nope"]\n', ':4: task "a": after names'),
        (
            '[[task]]\nid = "a"\nrun = "true"\n[[task]]\nid = "a"\nrun = "x"\n',
            ':5: task id "a" is used twice',
        ),
        ("[[task]\n", ":1: not valid TOML"),
        (
            '[[task]]\nid = "a"\nprompt = "review"\nassign = "r"\n',
            ':4: task "a": assign names unknown member "r"',
        ),
    ],
)
def test_a_bad_spec_starts_nothing(leader: Cli, tmp_path: Path, text: str, expected: str) -> None:
    """Every spec error `shoal run` reports: file:line, exit 2, no task and no step."""
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    out = leader("workflow", str(spec))
    assert out.returncode == 2, out.stderr
    assert "nothing was started" in out.stderr
    assert f"{spec}{expected}" in out.stderr, out.stderr
    assert _tasks(leader) == {}


def test_a_missing_spec_and_no_leader(cli: Cli, tmp_path: Path) -> None:
    """A spec that is not there: exit 2 naming it; a good spec without a leader: exit 1 and
    the hint to start one, nothing written."""
    out = cli("workflow", str(tmp_path / "missing.toml"))
    assert out.returncode == 2 and "missing.toml: 1 error" in out.stderr, out.stderr
    spec = tmp_path / "ok.toml"
    spec.write_text('[[task]]\nid = "a"\nrun = "touch ran"\n')
    out = cli("workflow", str(spec))
    assert out.returncode == 1 and "shoal up" in out.stderr, out.stderr
    assert not (tmp_path / "ran").exists()
