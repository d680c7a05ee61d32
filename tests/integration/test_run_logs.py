"""`shoal run`'s log for CI and for people: failed tasks' last lines inline, `--output tag|group`,
`--results DIR`, the run's own team (deleted at the end), the summary of an interrupt, and the
live display on a real terminal (a tmux pane and a pty)."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.orchestrator.liveness import leader_alive
from shoal.teams.store import Teams
from tests.conftest import Cli
from tests.integration.test_run import FAST, report_of, run, start_run, write_spec
from tests.polling import wait_until

LONG_FAIL = """\
[[task]]
id = "noisy"
run = "seq 1 80; exit 3"
"""


def frame(out: str, name: str) -> list[str]:
    """The lines of `name`'s failure frame in `out`, header and closing line included."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"--- {name}: "))
    end = lines.index(f"--- end of {name} ---", start)
    return lines[start : end + 1]


def read_until(proc: subprocess.Popen[str], wanted: str, seen: list[str]) -> None:
    """Read `proc`'s stdout lines into `seen` until one equals `wanted`."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, f"stdout ended before {wanted!r}; got {seen}"
        seen.append(line.rstrip("\n"))
        if seen[-1] == wanted:
            return


# ------------------------------------------------------------------ failures in the log


def test_a_failed_task_shows_its_last_lines_framed(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, LONG_FAIL)
    out = run(cli, spec)
    assert out.returncode == 1, out.stderr
    lines = frame(out.stdout, "noisy")
    path = re.search(r"output: (\S+\.output)", out.stdout)
    assert path is not None
    assert lines[0] == (f"--- noisy: FAILED (exit code 3): last 50 line(s) of {path.group(1)} ---")
    assert lines[1:-1] == [str(i) for i in range(31, 81)]
    # The frame comes after the task's FAILED line and before the summary.
    text = out.stdout
    assert text.index("FAILED    noisy") < text.index("--- noisy:") < text.index("FAILED: ")

    few = run(cli, spec, "--failure-lines", "2")
    assert frame(few.stdout, "noisy")[1:-1] == ["79", "80"]
    none = run(cli, spec, "--failure-lines", "0")
    assert none.returncode == 1 and "--- noisy" not in none.stdout
    assert "FAILED    noisy" in none.stdout


def test_bad_failure_lines_are_usage_errors(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "a"\nrun = "touch @D/ran"\n')
    for bad in ("-1", "ten", "1.5", ""):
        out = run(cli, spec, "--failure-lines", bad)
        assert out.returncode == 2, (bad, out.stderr)
        assert "--failure-lines" in out.stderr
    out = run(cli, spec, "--output", "sideways")
    assert out.returncode == 2 and "--output" in out.stderr
    out = run(cli, spec, "--output", "tag", "--output-format", "stream-json")
    assert out.returncode == 2 and "cannot go with --output-format stream-json" in out.stderr
    assert not (tmp_path / "ran").exists()
    assert os.listdir(home) == []


def test_a_timed_out_task_is_framed_too(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "slow"
        run = "echo before; sleep 30"
        timeout = "300ms"
        """,
    )
    out = run(cli, spec)
    assert out.returncode == 124
    lines = frame(out.stdout, "slow")
    assert lines[0].startswith("--- slow: TIMED OUT (timed out after 300ms): last ")
    assert lines[1] == "before"  # (then what the shell said of its killed child, if anything)


# ------------------------------------------------------------------ --output tag / group


def test_output_tag_streams_every_line_with_its_task_name(
    home: Path, tmp_path: Path, stopper: list[subprocess.Popen[str]]
) -> None:
    gate = tmp_path / "gate"
    spec = write_spec(
        tmp_path,
        f"""\
        [run]
        jobs = 2

        [[task]]
        id = "waits"
        run = "echo first; while [ ! -f {gate} ]; do sleep 0.02; done; printf 'no newline'"

        [[task]]
        id = "other"
        run = "echo 'x y'; echo; exit 1"
        """,
    )
    proc = start_run(home, spec, "--output", "tag", "--failure-lines", "0")
    stopper.append(proc)
    seen: list[str] = []
    # "first" is shown while its task still waits for the gate: the file is followed.
    read_until(proc, "waits\tfirst", seen)
    assert proc.poll() is None and not gate.exists()
    gate.touch()
    out, err = proc.communicate(timeout=60)
    lines = seen + out.splitlines()
    assert proc.returncode == 1, out + err
    assert "waits\tno newline" in lines  # a last line without a newline is shown at the end
    assert lines.index("other\tx y") + 1 == lines.index("other\t")  # an empty line keeps its tag
    assert lines.index("other\t") < next(
        i for i, line in enumerate(lines) if "FAILED    other" in line
    )


def test_output_group_prints_each_task_whole_and_uninterleaved(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    # The two tasks take turns writing (each waits for the other's marker), so their lines
    # are interleaved in time; group mode still shows each task's output in one block.
    d = tmp_path
    spec = write_spec(
        tmp_path,
        f"""\
        [run]
        jobs = 2

        [[task]]
        id = "a"
        run = "echo a1; touch {d}/A1; while [ ! -f {d}/B1 ]; do sleep 0.02; done; echo a2"

        [[task]]
        id = "b"
        run = "while [ ! -f {d}/A1 ]; do sleep 0.02; done; echo b1; touch {d}/B1; echo b2"
        """,
    )
    out = run(cli, spec, "--output", "group")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("a", "b"):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"--- {name}: ok: "))
        assert lines[start + 1 : start + 4] == [f"{name}1", f"{name}2", f"--- end of {name} ---"]


# ------------------------------------------------------------------ --results DIR


def test_results_dir_gets_one_file_per_task(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        """\
        [[task]]
        id = "build.linux"
        run = "echo built; echo warning >&2"

        [[task]]
        id = "Lint"
        run = "echo upper"

        [[task]]
        id = "lint"
        run = "echo lower; exit 2"

        [[task]]
        id = "after-lint"
        run = "echo never"
        after = ["lint"]
        """,
    )
    results = tmp_path / "artifacts" / "logs"  # (made, parents too)
    out = run(cli, spec, "--results", str(results), "--report", str(tmp_path / "r.json"))
    assert out.returncode == 1, out.stderr
    files = sorted(p.name for p in results.iterdir() if p.name != "build.linux.out")
    assert (results / "build.linux.out").is_file()
    # Lint and lint would be one file on a case-insensitive filesystem: both get a hash.
    assert len(files) == 2 and all(re.fullmatch(r"[Ll]int-[0-9a-f]{8}\.out", f) for f in files)
    assert (results / "build.linux.out").read_text() == "built\nwarning\n"
    _, tasks = report_of(tmp_path / "r.json")
    for task_id in ("Lint", "lint"):
        (copy,) = [results / f for f in files if f.startswith(task_id + "-")]
        assert copy.read_bytes() == Path(tasks[task_id]["output_file"]).read_bytes()
    assert f"results: {results}" in out.stdout


def test_an_unwritable_results_dir_is_refused_before_anything_starts(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "a"\nrun = "touch @D/ran"\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = run(cli, spec, "--results", str(blocker / "sub"))
    assert out.returncode == 2
    assert f"--results {blocker / 'sub'}: cannot create the directory" in out.stderr
    out = run(cli, spec, "--results", str(blocker))
    assert out.returncode == 2 and f"'--results': Directory '{blocker}' is a file" in out.stderr
    assert not (tmp_path / "ran").exists()
    assert Teams(Layout(home)).names() == []


# ------------------------------------------------------------------ the run's own team


def test_the_run_works_in_its_own_team_and_deletes_it(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, '[[task]]\nid = "a"\nrun = "echo $SHOAL_RUN_TASK"\n', "CI Build.toml"
    )
    out = run(cli, spec, "--report", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    assert "team run-ci-build," in out.stdout
    summary, _ = report_of(tmp_path / "r.json")
    assert summary["team"] == "run-ci-build"
    assert Teams(Layout(home)).names() == []
    assert not (home / "teams" / "run-ci-build").exists()
    # A later command aimed at no team is not confused by what the run left behind.
    assert list((home / "runs" / "run-ci-build").glob("*.json"))  # the record stays

    kept = run(cli, spec, "--keep-team")
    assert kept.returncode == 0 and Teams(Layout(home)).names() == ["run-ci-build"]
    again = run(cli, spec)  # (a kept team is taken over by the next run, and deleted)
    assert again.returncode == 0, again.stderr
    assert Teams(Layout(home)).names() == []

    named = run(cli, spec, "--team", "mine")
    assert named.returncode == 0 and Teams(Layout(home)).names() == ["mine"]


def test_two_specs_at_once_run_in_two_teams(
    home: Path, tmp_path: Path, stopper: list[subprocess.Popen[str]]
) -> None:
    gate = tmp_path / "gate"
    procs = {}
    for name in ("one", "two"):
        spec = write_spec(
            tmp_path,
            f"""\
            [[task]]
            id = "t"
            run = "touch {tmp_path}/started-{name}; while [ ! -f {gate} ]; do sleep 0.02; done"
            """,
            f"{name}.toml",
        )
        procs[name] = start_run(home, spec)
        stopper.append(procs[name])
    wait_until(lambda: all((tmp_path / f"started-{n}").exists() for n in procs))
    layout = Layout(home)
    assert Teams(layout).names() == ["run-one", "run-two"]
    assert leader_alive(layout, "run-one") and leader_alive(layout, "run-two")
    gate.touch()
    for proc in procs.values():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
    assert Teams(layout).names() == []


# ------------------------------------------------------------------ interrupt summary


def test_an_interrupt_says_once_how_many_tasks_never_started(
    home: Path, tmp_path: Path, stopper: list[subprocess.Popen[str]]
) -> None:
    later = "\n".join(
        f'[[task]]\nid = "later{i}"\nrun = "true"\nafter = ["gate"]\n' for i in range(7)
    )
    spec = write_spec(
        tmp_path,
        f"""\
        [[task]]
        id = "gate"
        run = "touch {tmp_path}/started; sleep 300"

        {later}""",
    )
    proc = start_run(home, spec)
    stopper.append(proc)
    wait_until(lambda: (tmp_path / "started").exists())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert out.count("not started") == 1, out
    assert "7 task(s) not started: interrupted (SIGINT)" in out
    progress = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert not any("later3" in ln for ln in progress), out  # (the end's table lists them)
    assert "--- gate" not in out  # killed by the interrupt: not a failure of its own
    assert "interrupted: 1 killed, 7 skipped of 8" in out


# ------------------------------------------------------------------ on a terminal


def test_piped_output_has_no_control_codes(cli: Cli, home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, LONG_FAIL)
    out = run(cli, spec, "--output", "tag")
    assert out.returncode == 1
    assert "\x1b" not in out.stdout and "\r" not in out.stdout


def screen(sock: str, target: str) -> str:
    return subprocess.run(
        ["tmux", "-L", sock, "capture-pane", "-p", "-t", target],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.tmux
def test_a_terminal_shows_a_live_bar_with_the_running_tasks(
    home: Path, tmp_path: Path, tmux_socket: str
) -> None:
    gate, done = tmp_path / "gate", tmp_path / "exit-code"
    tasks = "\n".join(
        f'[[task]]\nid = "{name}"\nrun = "while [ ! -f {gate} ]; do sleep 0.02; done"\n'
        for name in ("alpha", "beta", "gamma")
    )
    spec = write_spec(tmp_path, f'[run]\njobs = 2\n\n[[task]]\nid = "quick"\nrun = "true"\n{tasks}')
    env = {**FAST, "SHOAL_HOME": str(home), "TERM": "xterm-256color", "NO_COLOR": ""}
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "shoal", "run"]
    # The pane runs the command itself; it stays open afterwards so its last screen is seen.
    # The exit code is written to a side file and renamed, so it is never seen half-written.
    command = (
        f"{shlex.join([*argv, str(spec)])}; echo $? > {done}.part; mv {done}.part {done}; "
        "exec sleep 600"
    )
    pane = f"run-{uuid.uuid4().hex[:8]}"
    new = ["new-session", "-d", "-s", pane, "-x", "120", "-y", "30", "sh", "-c", command]
    subprocess.run(["tmux", "-L", tmux_socket, *new], check=True)

    def live() -> bool:
        text = screen(tmux_socket, pane)
        return "━" in text and "1/4" in text and "2 running: " in text

    wait_until(live, what="the live display with two running tasks")
    text = screen(tmux_socket, pane)
    running = re.search(r"2 running: (\w+), (\w+)", text)
    assert running is not None and set(running.groups()) <= {"alpha", "beta", "gamma"}, text
    assert "1 ok, 0 failed, 0 skipped" in text and "ETA " in text
    gate.touch()
    wait_until(done.exists, what="the run's end")
    assert done.read_text().strip() == "0"
    final = screen(tmux_socket, pane)
    assert "ok: all 4 task(s) succeeded" in final
    assert "━" not in final and "running:" not in final  # the display went away at the end


def run_on_pty(home: Path, spec: Path, env: dict[str, str]) -> bytes:
    """Run `shoal run SPEC` with stdout on a pseudo-terminal; everything it wrote, raw."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "run", str(spec)],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "SHOAL_HOME": str(home), "TERM": "xterm-256color", **FAST, **env},
    )
    os.close(slave)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, "no output for 60 s"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(master)
        proc.wait(60)
    return data


def test_no_color_on_a_terminal_keeps_the_display_without_colours(
    home: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, '[[task]]\nid = "a"\nrun = "sleep 0.5"\n')
    sgr_colour = re.compile(rb"\x1b\[[0-9;]*(3[0-9]|9[0-7])[0-9;]*m")
    coloured = run_on_pty(home, spec, {"NO_COLOR": ""})
    plain = run_on_pty(home, spec, {"NO_COLOR": "1"})
    assert b"ok: all 1 task(s) succeeded" in coloured and b"ok: all 1 task(s)" in plain
    assert sgr_colour.search(coloured), coloured[-500:]
    assert b"\xe2\x94\x81" in plain  # (the bar, "━", is there all the same)
    assert not sgr_colour.search(plain), plain[-500:]
