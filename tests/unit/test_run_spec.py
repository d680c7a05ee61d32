"""`shoal run` without processes: the spec parser, the scheduler over a stand-in executor, the
report formats and the progress printer."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.cli.run_sinks import TextProgress
from shoal.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageError
from shoal.core.events import RunEvent
from shoal.orchestrator.batch import (
    AGENTS_UNAVAILABLE,
    BatchRun,
    Finished,
    Refused,
    RunStatus,
    ShellRequest,
    Started,
    check_agents,
)
from shoal.orchestrator.batch.checker import SpecLocator
from shoal.orchestrator.batch.parse import parse_spec, parse_spec_text
from shoal.orchestrator.batch.report import (
    JOBLOG_HEADER,
    JoblogWriter,
    junit_xml,
    plan_resume,
    read_joblog,
)
from shoal.orchestrator.batch.spec import (
    HaltPolicy,
    Spec,
    SpecError,
    format_duration,
    parse_duration,
    parse_halt,
    team_from_path,
)

SPEC_PATH = Path("/project/ci/spec.toml")


def spec_of(text: str) -> Spec:
    return parse_spec_text(text, SPEC_PATH, display="spec.toml")


def errors_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec_of(text)
    assert info.value.exit_code == EXIT_USAGE
    return [i.render("spec.toml") for i in info.value.issues]


# --------------------------------------------------------------------------- the spec


FULL = """
[run]
team = "ci"
jobs = 3
backend = "tmux"
halt = "soon,fail=2"
timeout = "5m"
retries = 1
env = { CI = "1" }

[[member]]
name = "alice"
agent = "scripted"
prompt = "You review code."
plan_mode = true

[[member]]
name = "bob"
agent = "exec"
command = "claude -p {prompt}"
worktree = true

[[task]]
id = "build"
run = "make -j4"
cwd = "src"
timeout = 90

[[task]]
id = "test"
run = ["pytest", "-x", "tests dir"]
after = ["build"]
retries = 0
env = { PORT = 8080 }

[[task]]
id = "review"
prompt = "Review the diff."
assign = "alice"
after = "test"
"""


def test_a_full_spec_parses_with_defaults_applied() -> None:
    spec = spec_of(FULL)
    s = spec.settings
    assert (s.team, s.jobs, s.backend, s.halt.text, s.timeout, s.retries) == (
        "ci",
        3,
        "tmux",
        "soon,fail=2",
        300.0,
        1,
    )
    alice, bob = spec.members
    assert alice.agent == "scripted" and alice.plan_mode and alice.prompt == "You review code."
    assert bob.command == ("claude", "-p", "{prompt}") and bob.worktree
    build, test, review = spec.tasks
    assert build.cwd == "/project/ci/src" and build.timeout == 90 and build.timeout_label == "1m30s"
    assert build.argv == ["make -j4"] and build.retries == 1
    assert test.argv == ["pytest", "-x", "tests dir"] and test.command_line == (
        "pytest -x 'tests dir'"
    )
    assert test.env == {"CI": "1", "PORT": "8080"} and test.retries == 0
    assert test.cwd == "/project/ci" and test.timeout_label == "5m"
    assert review.is_agent and review.assign == "alice" and review.after == ("test",)
    assert [t.id for t in spec.agent_tasks] == ["review"]
    assert spec.team_name() == "ci" and [t.seq for t in spec.tasks] == [1, 2, 3]
    # 1-based line of the [[task]] header = 0-based index of the id line below it
    assert build.line == FULL.splitlines().index('id = "build"')


def test_every_error_is_reported_at_once_with_its_line() -> None:
    text = """\
[run]
jbos = 2
halt = "sometimes"

[[member]]
name = "alice"

[[member]]
name = "alice"

[[task]]
id = "a"
run = "true"
after = ["b"]

[[task]]
id = "b"
run = "true"
after = ["a", "ghost"]
timeout = "5 fortnights"

[[task]]
id = "c"

[[task]]
id = "d"
run = "x"
prompt = "y"
assign = "alice"

[[task]]
id = "e"
prompt = "no one to do it"
colour = "red"
"""
    errors = errors_of(text)
    expected = [
        'spec.toml:2: [run]: unknown key "jbos" (did you mean "jobs"?)',
        'spec.toml:3: [run]: bad halt value "sometimes"',
        'spec.toml:9: member "alice" is declared twice (first at line 6)',
        'spec.toml:14: task "a": dependency cycle a -> b -> a',
        'spec.toml:19: task "b": after names unknown task "ghost"',
        'spec.toml:20: task "b": timeout: bad duration "5 fortnights"',
        'spec.toml:22: task "c": needs run (a shell command) or prompt',
        'spec.toml:28: task "d": give run (a shell command) or prompt, not both',
        'spec.toml:33: task "e": a prompt needs assign',
        'spec.toml:34: task "e": unknown key "colour"',
    ]
    assert len(errors) == len(expected), "\n".join(errors)
    for line, want in zip(errors, expected, strict=True):
        assert line.startswith(want), (line, want)


RESOURCES = """
[run]
num_cpus = 0.5
resources = { disk_a = 1 }

[[task]]
id = "plain"
run = "true"

[[task]]
id = "big"
run = "true"
num_cpus = 2
num_gpus = 1
resources = { disk_b = 0.5 }
"""


def test_ray_resources_are_read_with_the_run_defaults() -> None:
    """num_cpus, num_gpus and resources of a task; a task without them takes [run]'s, and
    its resources table adds to [run]'s."""
    plain, big = spec_of(RESOURCES).tasks
    assert (plain.num_cpus, plain.num_gpus, dict(plain.resources)) == (0.5, None, {"disk_a": 1})
    assert (big.num_cpus, big.num_gpus) == (2.0, 1.0)
    assert dict(big.resources) == {"disk_a": 1.0, "disk_b": 0.5}


def test_bad_ray_resources_are_spec_errors() -> None:
    text = """\
[[member]]
name = "alice"

[[task]]
id = "a"
run = "true"
num_cpus = -1
num_gpus = "one"
resources = { CPU = 2, "bad name" = 1, disk = true }

[[task]]
id = "b"
prompt = "p"
assign = "alice"
num_cpus = 1
"""
    errors = errors_of(text)
    expected = [
        'spec.toml:7: task "a": num_cpus must be a number >= 0, not -1',
        "spec.toml:8: task \"a\": num_gpus must be a number >= 0, not 'one'",
        'spec.toml:9: task "a": resources: use num_cpus for CPU',
        'spec.toml:9: task "a": resources: "bad name" is not a name',
        'spec.toml:9: task "a": resources: disk must be a number >= 0, not True',
        'spec.toml:15: task "b": num_cpus is for run tasks',
    ]
    assert len(errors) == len(expected), "\n".join(errors)
    for line, want in zip(sorted(errors), sorted(expected), strict=True):
        assert line.startswith(want), (line, want)


def test_a_task_no_node_can_hold_is_refused_naming_it_and_the_cluster() -> None:
    """A resource no node has, and amounts no one node has together (a job runs on one
    node), are refused with the task, what it asks and each node's resources."""
    from shoal.orchestrator.batch.ray_backend import check_placement
    from shoal.workers.remote.ray_jobs import NodeInfo

    nodes = [
        NodeInfo("head", "10.0.0.1", {"CPU": 4.0, "memory": 1e9, "node:10.0.0.1": 1.0}),
        NodeInfo("gpu", "10.0.0.2", {"CPU": 1.0, "GPU": 1.0}),
    ]
    fits = spec_of(
        '[[task]]\nid = "a"\nrun = "true"\nnum_cpus = 4\n'
        '[[task]]\nid = "b"\nrun = "true"\nnum_gpus = 1\n'
    )
    check_placement(fits, nodes, "http://h:8265")
    bad = spec_of(
        '[[task]]\nid = "tpu"\nrun = "true"\nresources = { tpu = 1 }\n'
        '[[task]]\nid = "both"\nrun = "true"\nnum_cpus = 4\nnum_gpus = 1\n'
    )
    with pytest.raises(UsageError) as info:
        check_placement(bad, nodes, "http://h:8265")
    lines = str(info.value).splitlines()
    assert lines == [
        '--backend ray: task "tpu" asks for tpu=1: resource tpu, which no node of the cluster has',
        'task "both" asks for CPU=4, GPU=1: more than any one node of the cluster has',
        "the cluster at http://h:8265 has head: CPU=4; gpu: CPU=1, GPU=1; nothing was started",
    ]


def test_the_error_message_lists_every_problem_under_one_heading() -> None:
    with pytest.raises(SpecError) as info:
        spec_of('[[task]]\nid = "a"\nrun = "x"\nafter = "zz"\n[[task]]\nid = "a"\nrun = "y"\n')
    lines = str(info.value).splitlines()
    assert lines[0] == "spec.toml: 2 errors in the spec; nothing was started"
    assert lines[1] == 'spec.toml:4: task "a": after names unknown task "zz"'
    assert lines[2] == 'spec.toml:6: task id "a" is used twice (first at line 2)'


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[[task]]\nid = 'a'\nrun = 'x'\n[run]\njobs = -1\n", "jobs must be a whole number >= 0"),
        ("[[task]]\nid = 'a'\nrun = 'x'\n[run]\nbackend = 'ssh'\n", 'unknown backend "ssh"'),
        ("[[task]]\nid = 'a'\nrun = 'x'\n[run]\nteam = 'Bad Team'\n", "invalid team name"),
        ("[[member]]\nname = 'Bob'\n[[task]]\nid = 'a'\nrun = 'x'\n", "invalid member name"),
        ("[[member]]\nname = 'team-lead'\n[[task]]\nid = 'a'\nrun='x'\n", "the run's own lead"),
        ("[[member]]\nname = 'e'\nagent = 'exec'\n[[task]]\nid='a'\nrun='x'\n", "needs command"),
        ("[[member]]\nname = 'e'\nagent = 'x'\n[[task]]\nid='a'\nrun='x'\n", 'unknown agent "x"'),
        ("[[member]]\nname = 's'\ncommand = 'c'\n[[task]]\nid='a'\nrun='x'\n", "exec agents"),
        ("[[member]]\nname = 's'\nscript = 'no.txt'\n[[task]]\nid='a'\nrun='x'\n", "not exist"),
        ("[[task]]\nid = 'a'\nrun = 'x'\nassign = 'z'\n", "assign goes with prompt"),
        ("[[task]]\nid = 'a'\nprompt = 'p'\nassign = 'z'\n", 'unknown member "z"'),
        ("[[task]]\nid = 'a b'\nrun = 'x'\n", "bad id 'a b'"),
        ("[[task]]\nrun = 'x'\n", "needs an id"),
        ("[[task]]\nid = 'a'\nrun = ''\n", "must be a command line"),
        ("[[task]]\nid = 'a'\nrun = 'x'\nafter = 'a'\n", "lists itself in after"),
        ("[[task]]\nid = 'a'\nrun = 'x'\ntimeout = 0\n", "more than zero"),
        ("[[task]]\nid = 'a'\nrun = 'x'\ntimeout = true\n", "not a bool"),
        ("[[task]]\nid = 'a'\nrun = 'x'\nretries = 1.5\n", "retries must be a whole number"),
        ("[[task]]\nid = 'a'\nrun = 'x'\nenv = { 'A-B' = '1' }\n", "is not a variable name"),
        ("[[task]]\nid = 'a'\nrun = 'x'\nenv = { A = [1] }\n", "string or a number"),
        ("[task]\nid = 'a'\n", "[[task]] tables"),
        ("[[run]]\njobs = 1\n", "[run] must be a table"),
        ("[run]\njobs = 1\n", "no [[task]] in the spec"),
        ("[jobs]\n", 'unknown key "jobs"'),
    ],
)
def test_single_errors(text: str, fragment: str) -> None:
    assert any(fragment in e for e in errors_of(text)), errors_of(text)


def test_invalid_toml_is_reported_with_its_line() -> None:
    errors = errors_of('[[task]]\nid = "a"\nrun = "unterminated\n')
    assert len(errors) == 1 and errors[0].startswith("spec.toml:3: not valid TOML:")


def test_an_unreadable_spec_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        parse_spec(tmp_path / "missing.toml")


def test_paths_are_relative_to_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "brain.txt").write_text('[[step]]\nresult = "ok"\n')
    path = tmp_path / "spec.toml"
    path.write_text(
        "[run]\ncwd = 'work'\n[[member]]\nname = 'm'\nscript = 'brain.txt'\n"
        "[[task]]\nid = 'a'\nrun = 'x'\n[[task]]\nid = 'b'\nrun = 'y'\ncwd = '/abs'\n"
    )
    spec = parse_spec(path)
    assert spec.members[0].script == str(tmp_path / "brain.txt")
    assert [t.cwd for t in spec.tasks] == [str(tmp_path / "work"), "/abs"]


def test_the_locator_understands_sub_tables_and_multiline_strings() -> None:
    text = """\
[[task]]
id = "a"
run = '''
[[task]]
id = "fake"
'''
[task.env]
FOO = "1"

[[task]]
"id" = "b"
run = "x"
"""
    loc = SpecLocator(text)
    assert loc.line(("task", 0)) == 1
    assert loc.line(("task", 0), "env") == 7
    assert loc.line(("task", 1), "id") == 11
    assert loc.line(("task", 1), "nope") == 10
    assert loc.line(("task", 2)) is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (5, 5.0),
        (0.5, 0.5),
        ("90", 90.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 1M 30S ", 90.0),
    ],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "5 minutes", "m5", "-1s", "0", 0, -3, True, None, [5]])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.5, "500ms"), (1, "1s"), (1.5, "1.5s"), (90, "1m30s"), (300, "5m"), (3661, "1h1m1s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=10**6))
def test_format_then_parse_round_trips_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_halt_policies() -> None:
    assert parse_halt("never") == HaltPolicy()
    now = parse_halt("now,fail=2")
    assert (now.when, now.on, now.threshold(10), now.text) == ("now", "fail", 2, "now,fail=2")
    assert not now.triggered(1, 5, 10) and now.triggered(2, 0, 10)
    soon = parse_halt("soon,success=1")
    assert soon.triggered(0, 1, 10) and not soon.triggered(5, 0, 10)
    pct = parse_halt("now,fail=25%")
    assert pct.threshold(10) == 3 and pct.threshold(1) == 1 and pct.text == "now,fail=25%"
    # GNU parallel's short forms.
    assert parse_halt("0") == HaltPolicy()
    assert parse_halt("1") == parse_halt("soon,fail=1") and parse_halt("1").text == "soon,fail=1"
    assert parse_halt("2") == parse_halt("now,fail=1")
    for bad in ("sometimes", "now", "now,fail=0", "soon,fail=1.5", "now,fail=200%", "", 3, "4"):
        with pytest.raises(ValueError, match="bad halt value"):
            parse_halt(bad)


@pytest.mark.parametrize(
    ("name", "team"),
    [("ci.toml", "ci"), ("CI Build.toml", "ci-build"), ("2024.toml", "run-2024"), ("_.t", "run")],
)
def test_team_from_the_file_name(name: str, team: str) -> None:
    assert team_from_path(Path(name)) == team


def test_agent_tasks_are_refused_without_teammates() -> None:
    spec = spec_of(FULL)
    with pytest.raises(SpecError) as info:
        check_agents(spec, None)
    text = str(info.value)
    assert AGENTS_UNAVAILABLE in text
    line = FULL.splitlines().index('id = "review"')
    assert f'spec.toml:{line}: task "review"' in text and 'member "alice"' in text
    check_agents(spec_of("[[task]]\nid = 'a'\nrun = 'true'\n"), None)  # shell only: fine


# --------------------------------------------------------------------------- the scheduler


class FakeShell:
    """A ShellExecutor that records what the scheduler asks; tests report back by hand."""

    def __init__(self, refuse: set[str] | None = None) -> None:
        self.submitted: list[tuple[str, ShellRequest]] = []
        self.stopped: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.started: set[str] = set()
        self.refuse = refuse or set()
        self._n = 0

    def submit(self, requests: Sequence[ShellRequest]) -> list[str | Refused]:
        out: list[str | Refused] = []
        for req in requests:
            task_id = req.env["SHOAL_RUN_TASK"]
            if task_id in self.refuse:
                out.append(Refused("working directory '/gone' does not exist"))
                continue
            self._n += 1
            handle = f"h{self._n}"
            self.submitted.append((handle, req))
            out.append(handle)
        return out

    def stop(self, handle: str, reason: str) -> None:
        self.stopped.append((handle, reason))

    def cancel(self, handle: str, reason: str) -> bool:
        if handle in self.started:
            return False
        self.cancelled.append(handle)
        return True

    # helpers for tests
    def ids(self) -> list[str]:
        return [req.env["SHOAL_RUN_TASK"] for _, req in self.submitted]

    def handle_of(self, task_id: str, attempt: int = 1) -> str:
        for handle, req in self.submitted:
            env = req.env
            if env["SHOAL_RUN_TASK"] == task_id and env["SHOAL_RUN_ATTEMPT"] == str(attempt):
                return handle
        raise KeyError(task_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_run(
    text: str, *, jobs: int = 4, halt: str = "never", **kw: Any
) -> tuple[BatchRun, FakeShell, list[RunEvent], Clock]:
    events: list[RunEvent] = []
    shell = FakeShell(kw.pop("refuse", None))
    clock = Clock()
    run = BatchRun(
        spec_of(text),
        shell=shell,
        jobs=jobs,
        halt=parse_halt(halt),
        emit=events.append,
        clock=clock,
        wall=clock,
        **kw,
    )
    run.begin()
    run.tick()
    return run, shell, events, clock


def start(run: BatchRun, shell: FakeShell, task_id: str, attempt: int = 1) -> str:
    handle = shell.handle_of(task_id, attempt)
    shell.started.add(handle)
    run.feed(Started(handle, run._wall()))
    return handle


def end(
    run: BatchRun,
    shell: FakeShell,
    task_id: str,
    status: str = "completed",
    code: int | None = 0,
    attempt: int = 1,
) -> None:
    handle = shell.handle_of(task_id, attempt)
    if handle not in shell.started:
        start(run, shell, task_id, attempt)
    run.feed(Finished(handle, status, exit_code=code, ended_at=run._wall(), ran=True))
    run.tick()


def statuses(run: BatchRun) -> dict[str, str]:
    return {k: v.status.value for k, v in run.tasks.items()}


CHAIN = """
[[task]]
id = "a"
run = "a"
[[task]]
id = "b"
run = "b"
after = ["a"]
[[task]]
id = "c"
run = "c"
after = ["b"]
[[task]]
id = "d"
run = "d"
[[task]]
id = "e"
run = "e"
after = ["a", "d"]
"""


def test_dependencies_gate_starts_and_success_releases_dependents() -> None:
    run, shell, _events, _ = make_run(CHAIN)
    assert shell.ids() == ["a", "d"]
    end(run, shell, "a")
    assert shell.ids() == ["a", "d", "b"]  # e still waits for d
    end(run, shell, "d")
    assert shell.ids() == ["a", "d", "b", "e"]
    end(run, shell, "b")
    end(run, shell, "c")
    end(run, shell, "e")
    assert run.done and run.exit_code() == EXIT_OK and run.status() == "succeeded"
    assert set(statuses(run).values()) == {"succeeded"}


def test_a_failure_skips_its_dependents_transitively() -> None:
    run, shell, events, _ = make_run(CHAIN)
    end(run, shell, "a", "failed", 2)
    assert statuses(run) == {
        "a": "failed",
        "b": "skipped",
        "c": "skipped",
        "d": "queued",
        "e": "skipped",
    }
    assert run.tasks["b"].reason == 'dependency "a" failed'
    assert run.tasks["c"].reason == 'dependency "b" was skipped'
    assert run.tasks["a"].reason == "exit code 2"
    skipped = [e["id"] for e in events if e["subtype"] == "task_skipped"]
    assert sorted(skipped) == ["b", "c", "e"]
    end(run, shell, "d")
    assert run.done and run.exit_code() == EXIT_FAILED and shell.ids() == ["a", "d"]
    assert run.counts()["skipped"] == 3 and run.failures == 1


def test_a_failed_attempt_is_retried_as_a_new_attempt() -> None:
    run, shell, events, _ = make_run("[[task]]\nid = 'f'\nrun = 'x'\nretries = 2\n")
    end(run, shell, "f", "failed", 1)
    assert shell.ids() == ["f", "f"] and shell.submitted[1][1].env["SHOAL_RUN_ATTEMPT"] == "2"
    assert [e["subtype"] for e in events].count("task_retrying") == 1
    end(run, shell, "f", "completed", 0, attempt=2)
    task = run.tasks["f"]
    assert task.status == RunStatus.SUCCEEDED and len(task.attempts) == 2
    report = task.to_json()
    assert report["attempts"] == 2 and report["attempt_log"][0]["status"] == "failed"


def test_retries_run_out() -> None:
    run, shell, _, _ = make_run("[[task]]\nid = 'f'\nrun = 'x'\nretries = 1\n")
    end(run, shell, "f", "failed", 1)
    end(run, shell, "f", "failed", 3, attempt=2)
    assert run.tasks["f"].status == RunStatus.FAILED and run.tasks["f"].reason == "exit code 3"
    assert run.exit_code() == EXIT_FAILED and len(shell.submitted) == 2


def test_a_refused_attempt_fails_with_the_reason() -> None:
    run, _, _, _ = make_run("[[task]]\nid = 'r'\nrun = 'x'\n", refuse={"r"})
    assert run.tasks["r"].status == RunStatus.FAILED
    assert "does not exist" in (run.tasks["r"].reason or "")
    assert run.done and run.tasks["r"].to_json()["attempts"] == 1


def test_a_timeout_stops_the_attempt_and_counts_as_timed_out() -> None:
    run, shell, events, clock = make_run(
        "[[task]]\nid = 't'\nrun = 'sleep 9'\ntimeout = '2s'\nretries = 1\n"
        "[[task]]\nid = 'n'\nrun = 'x'\ntimeout = 1.5\n"
    )
    start(run, shell, "t")
    start(run, shell, "n")
    assert run.next_deadline() == pytest.approx(clock.now + 1.5)
    clock.now += 1.9
    run.tick()
    assert shell.stopped == [(shell.handle_of("n"), "timed out after 1.5s")]
    clock.now += 0.2
    run.tick()
    run.tick()  # asked once only
    assert shell.stopped[1] == (shell.handle_of("t"), "timed out after 2s")
    assert len(shell.stopped) == 2
    for task_id in ("n", "t"):
        run.feed(Finished(shell.handle_of(task_id), "killed", exit_code=143, ended_at=clock.now))
    run.tick()
    assert run.tasks["n"].status == RunStatus.TIMED_OUT
    assert run.tasks["n"].reason == "timed out after 1.5s"
    assert run.tasks["t"].status == RunStatus.PENDING or run.tasks["t"].status == RunStatus.QUEUED
    assert shell.ids().count("t") == 2  # retried
    assert any(e["subtype"] == "task_timed_out" for e in events)


def test_a_killed_task_is_not_retried_and_counts_as_failed() -> None:
    run, shell, _, _ = make_run("[[task]]\nid = 'k'\nrun = 'x'\nretries = 3\n")
    start(run, shell, "k")
    run.feed(Finished(shell.handle_of("k"), "killed", exit_code=143, error="stopped on request"))
    assert run.tasks["k"].status == RunStatus.KILLED and run.failures == 1
    assert run.tasks["k"].reason == "killed: stopped on request" and len(shell.submitted) == 1


SIX = "".join(f"[[task]]\nid = 't{i}'\nrun = 'x'\n" for i in range(6))
FORTY = "".join(f"[[task]]\nid = 'u{i}'\nrun = 'x'\n" for i in range(40))


def test_job_slots_and_prefetch_bound_what_is_handed_out() -> None:
    run, shell, _, _ = make_run(FORTY, jobs=1)
    assert len(shell.submitted) == 17  # 1 slot + a prefetch of 16
    for i in range(7):
        end(run, shell, f"u{i}")
    assert len(shell.submitted) == 17  # refills come in batches of half the prefetch
    end(run, shell, "u7")
    assert len(shell.submitted) == 25
    _, shell, _, _ = make_run(FORTY, jobs=0)
    assert len(shell.submitted) == 40  # no limit
    _, shell, _, _ = make_run(FORTY, jobs=2, halt="soon,fail=1")
    assert len(shell.submitted) == 2  # a halt policy hands out only what can start now


def test_halt_now_kills_running_and_skips_the_rest() -> None:
    run, shell, events, _ = make_run(SIX, jobs=3, halt="now,fail=1")
    assert shell.ids() == ["t0", "t1", "t2"]
    start(run, shell, "t1")
    start(run, shell, "t2")
    end(run, shell, "t0", "failed", 1)
    assert sorted(h for h, _ in shell.stopped) == sorted([shell.handle_of("t1"), "h3"])
    assert all(reason.startswith("killed: halt now,fail=1") for _, reason in shell.stopped)
    assert [statuses(run)[t] for t in ("t3", "t4", "t5")] == ["skipped"] * 3
    assert run.tasks["t3"].reason == "not started: halt now,fail=1: 1 task failed"
    for task_id in ("t1", "t2"):
        run.feed(Finished(shell.handle_of(task_id), "killed", exit_code=143))
    assert statuses(run)["t1"] == "killed" and run.done
    assert run.failures == 1 and run.exit_code() == EXIT_FAILED
    assert next(e for e in events if e["subtype"] == "halted")["killing"] == 2


def test_halt_soon_lets_running_tasks_finish_and_drops_queued_ones() -> None:
    run, shell, _, _ = make_run(SIX, jobs=2, halt="soon,fail=1")
    start(run, shell, "t1")
    end(run, shell, "t0", "failed", 1)
    assert shell.stopped == [] and shell.ids() == ["t0", "t1"]
    assert not run.done
    end(run, shell, "t1")
    assert statuses(run)["t1"] == "succeeded" and run.done
    assert [statuses(run)[f"t{i}"] for i in range(2, 6)] == ["skipped"] * 4


def test_halt_cancels_attempts_still_waiting_for_a_slot() -> None:
    run, shell, _, _ = make_run(SIX, jobs=2, halt="soon,fail=1")
    end(run, shell, "t0", "failed", 1)  # t1 was handed out but never started
    assert shell.cancelled == [shell.handle_of("t1")]
    run.feed(Finished(shell.handle_of("t1"), "killed", exit_code=137, ran=False))
    assert statuses(run)["t1"] == "skipped" and run.done
    assert run.tasks["t1"].to_json()["attempts"] == 0


def test_a_pending_retry_keeps_its_failure_when_the_run_halts() -> None:
    run, shell, _, _ = make_run(
        "[[task]]\nid = 'r'\nrun = 'x'\nretries = 5\n[[task]]\nid = 'x'\nrun = 'y'\n"
        "[[task]]\nid = 'y'\nrun = 'z'\n",
        jobs=2,
        halt="now,fail=1",
    )
    for task_id in ("r", "x"):  # both end before the next tick: r waits for its retry
        start(run, shell, task_id)
    for task_id in ("r", "x"):
        run.feed(Finished(shell.handle_of(task_id), "failed", exit_code=1))
    assert statuses(run) == {"r": "failed", "x": "failed", "y": "skipped"}
    assert run.tasks["r"].reason == "exit code 1" and len(shell.submitted) == 2


def test_success_halt_exits_zero_without_failures() -> None:
    run, shell, _, _ = make_run(SIX, jobs=1, halt="now,success=1")
    end(run, shell, "t0")
    assert run.done and run.exit_code() == EXIT_OK and run.halted


def test_interrupt_skips_waiting_tasks_and_the_abandoned_ones_are_killed() -> None:
    run, shell, events, _ = make_run(CHAIN, jobs=1)
    start(run, shell, "a")
    run.interrupt("SIGINT")
    run.interrupt("SIGTERM")  # once only
    assert statuses(run)["b"] == "skipped" and "interrupted (SIGINT)" in (
        run.tasks["b"].reason or ""
    )
    run.abandon()  # the leader shut down without reporting the ends
    assert statuses(run)["a"] == "killed" and statuses(run)["d"] == "skipped"
    assert run.tasks["a"].reason == "killed: interrupted (SIGINT)"
    assert run.done and run.exit_code() == EXIT_INTERRUPTED and run.status() == "interrupted"
    assert [e["subtype"] for e in events].count("interrupted") == 1


def test_resume_carries_unchanged_successes_and_reruns_the_rest() -> None:
    spec = spec_of(CHAIN)
    previous = {
        "tasks": [
            {"id": t.id, "status": "succeeded", "fingerprint": t.fingerprint, "attempts": 1}
            for t in spec.tasks
        ]
    }
    previous["tasks"][1]["status"] = "failed"  # b failed: b, c (after b) run again
    assert sorted(plan_resume(spec, previous)) == ["a", "d", "e"]
    changed = spec_of(CHAIN.replace('run = "d"', 'run = "d2"'))
    assert sorted(plan_resume(changed, previous)) == ["a"]  # d changed: d and e run again
    run, shell, _, _ = make_run(CHAIN, carried=plan_resume(spec, previous))
    assert shell.ids() == ["b"]
    assert run.tasks["a"].to_json()["resumed"] is True
    end(run, shell, "b")
    end(run, shell, "c")
    assert run.done and run.exit_code() == EXIT_OK and run.counts()["resumed"] == 3


# --------------------------------------------------------------------------- report formats


def test_junit_has_one_testcase_per_task(tmp_path: Path) -> None:
    out = tmp_path / "x.output"
    out.write_bytes(b"line 1\nbad \x1b[31mcolour\x00 & <xml>\nlast line\n")
    report = {
        "spec": "/p/spec.toml",
        "team": "ci",
        "duration_s": 1.5,
        "started_at": "2026-01-01T00:00:00.000Z",
        "counts": {"failed": 1, "timed_out": 1, "killed": 1, "skipped": 1},
        "tasks": [
            {"id": "ok", "status": "succeeded", "duration_s": 0.1},
            {
                "id": "bad",
                "status": "failed",
                "exit_code": 2,
                "attempts": 2,
                "output_file": str(out),
            },
            {"id": "slow", "status": "timed_out", "reason": "timed out after 1s"},
            {"id": "gone", "status": "killed", "reason": "killed: interrupted (SIGINT)"},
            {"id": "never", "status": "skipped", "reason": 'dependency "bad" failed'},
        ],
    }
    root = ET.fromstring(junit_xml(report))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "5" and suite.get("failures") == "2"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["ok", "bad", "slow", "gone", "never"]
    assert len(list(cases["ok"])) == 0
    failure = cases["bad"].find("failure")
    assert failure is not None and failure.get("message") == "exit code 2 (after 2 attempts)"
    assert "last line" in (failure.text or "") and "& <xml>" in (failure.text or "")
    slow = cases["slow"].find("failure")
    assert slow is not None and "timed out" in (slow.get("message") or "")
    assert cases["gone"].find("error") is not None
    skipped = cases["never"].find("skipped")
    assert skipped is not None and skipped.get("message") == 'dependency "bad" failed'


def test_joblog_is_gnu_parallels_format(tmp_path: Path) -> None:
    path = tmp_path / "jobs.log"
    log = JoblogWriter(path)
    log.write(seq=1, started_at=100.0, ended_at=100.25, exit_code=0, killed=False, command="true")
    log.write(
        seq=2, started_at=101.0, ended_at=102.0, exit_code=143, killed=True, command="a\tb\nc"
    )
    log.close()
    text = path.read_text()
    assert text.startswith(JOBLOG_HEADER)
    rows = read_joblog(path)
    assert rows[0] == {
        "Seq": "1",
        "Host": ":",
        "Starttime": "   100.000",
        "JobRuntime": "     0.250",
        "Send": "0",
        "Receive": "0",
        "Exitval": "0",
        "Signal": "0",
        "Command": "true",
    }
    assert (rows[1]["Exitval"], rows[1]["Signal"], rows[1]["Command"]) == ("143", "15", "a b c")
    again = JoblogWriter(path, append=True)
    again.close()
    assert path.read_text() == text  # appending adds no second header


# --------------------------------------------------------------------------- progress output


def test_text_progress_prints_a_line_per_finished_task() -> None:
    out, err = io.StringIO(), io.StringIO()
    show = TextProgress(out, err, live=False, failure_lines=0)  # (the frame: test_run_logs.py)
    show({"type": "run", "subtype": "run_started", "spec": "s.toml", "team": "t", "jobs": 2,
          "halt": "never", "total": 2, "resumed": 0})  # fmt: skip
    show({"type": "run", "subtype": "task_started", "id": "a", "attempt": 1})
    show({"type": "run", "subtype": "task_finished", "id": "a", "status": "failed",
          "attempts": 1, "exit_code": 1, "duration_s": 0.5, "output_file": "/o",
          "reason": "exit code 1"})  # fmt: skip
    show({"type": "run", "subtype": "task_skipped", "id": "b", "reason": 'dependency "a" failed'})
    show({"type": "result", "subtype": "failed", "exit_code": 1, "duration_s": 1.0,
          "counts": {"total": 2, "succeeded": 0, "failed": 1, "timed_out": 0, "killed": 0,
                     "skipped": 1}, "files": {"record": "/r.json"}})  # fmt: skip
    lines = out.getvalue().splitlines()
    assert lines[1] == "[1/2] FAILED    a  exit code 1 (0.50s); output: /o"
    assert lines[2] == '[2/2] skipped   b  dependency "a" failed'
    assert lines[3] == "FAILED: 1 failed, 1 skipped of 2 in 1s (exit 1)"
    assert "\r" not in out.getvalue()
