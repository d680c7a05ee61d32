"""The wrapper log: every shell task of a directory records its pid and exit code as lines of
one shared file (`wrapper.log`), so a task creates no file but its output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shoal.core.errors import TaskError
from shoal.workers import shell
from tests.polling import wait_until


def _ended(proc: shell.ShellProcess) -> bool:
    return not proc.poll()


def test_a_task_creates_no_file_but_its_output(tmp_path: Path) -> None:
    procs = [shell.start(["-c", f"exit {i}"], tmp_path / f"t{i}.output") for i in range(3)]
    wait_until(lambda: all(_ended(p) for p in procs))
    assert sorted(os.listdir(tmp_path)) == ["t0.output", "t1.output", "t2.output", "wrapper.log"]
    for i, proc in enumerate(procs):
        out = tmp_path / f"t{i}.output"
        assert shell.recorded_pid(out) == proc.pid
        assert shell.recorded_exit(out) == i == proc.returncode()


def test_concurrent_wrappers_never_tear_each_others_lines(tmp_path: Path) -> None:
    """Sixty wrappers started at once append their starts and ends to one log: every line is
    whole, and every task's record is its own."""
    n = 60
    procs = [shell.start(["-c", f"exit {i % 7}"], tmp_path / f"c{i}.output") for i in range(n)]
    wait_until(lambda: all(_ended(p) for p in procs), timeout=60)
    lines = (tmp_path / shell.WRAPPER_LOG).read_text().splitlines()
    assert len(lines) == 2 * n
    assert all(len(line.split(" ")) == 3 for line in lines), lines
    for i, proc in enumerate(procs):
        record = shell.read_wrapper_log(tmp_path / shell.WRAPPER_LOG, f"c{i}")
        assert record == shell.WrapperRecord(pid=proc.pid, code=i % 7)


def test_the_reader_takes_only_whole_lines_and_skips_garbage(tmp_path: Path) -> None:
    log = tmp_path / shell.WRAPPER_LOG
    log.write_bytes(b"a p 10\nnot a record\nb x notanumber\na x 3\nc p 1")  # c: still written
    assert shell.read_wrapper_log(log, "a") == shell.WrapperRecord(pid=10, code=3)
    assert shell.read_wrapper_log(log, "b") == shell.WrapperRecord()
    assert shell.read_wrapper_log(log, "c") == shell.WrapperRecord()
    with open(log, "ab") as fh:
        fh.write(b"2\nc x 0\nkey with spaces p 5\n")
    assert shell.read_wrapper_log(log, "c") == shell.WrapperRecord(pid=12, code=0)
    assert shell.read_wrapper_log(log, "key with spaces").pid == 5


def test_a_replaced_log_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / shell.WRAPPER_LOG
    log.write_text("a p 10\na x 1\n")
    assert shell.read_wrapper_log(log, "a").code == 1
    replacement = tmp_path / "new.log"
    replacement.write_text("a p 11\n")
    os.replace(replacement, log)
    assert shell.read_wrapper_log(log, "a") == shell.WrapperRecord(pid=11)
    log.unlink()
    assert shell.read_wrapper_log(log, "a") == shell.WrapperRecord()


def test_a_restart_in_place_voids_what_the_earlier_run_recorded(tmp_path: Path) -> None:
    out = tmp_path / "r.output"
    first = shell.start(["-c", "exit 4"], out)
    wait_until(lambda: _ended(first))
    assert shell.recorded_exit(out) == 4
    shell.void_records(out)
    assert shell.recorded_exit(out) is None and shell.recorded_pid(out) is None
    out.unlink()
    second = shell.start(["-c", "true"], out)
    wait_until(lambda: _ended(second))
    assert shell.recorded_exit(out) == 0 and shell.recorded_pid(out) == second.pid


def test_a_session_of_an_earlier_version_is_still_read(tmp_path: Path) -> None:
    """Before the log, the wrapper wrote `{id}.pid` and `{id}.exit` beside the output; a
    leader resumed across an upgrade still finds what they say, and adopts the task's process
    (it carries the exit file's path in its command line, not the log's)."""
    out = tmp_path / "old.output"
    out.write_text("")
    exit_file = tmp_path / "old.exit"
    old = subprocess.Popen(["sh", "-c", "sleep 300", "shoal", str(exit_file)])
    try:
        (tmp_path / "old.pid").write_text(f"{old.pid}\n")
        assert shell.recorded_pid(out) == old.pid
        started, proc = shell.locate(None, None, out)
        assert started and proc is not None and proc.pid == old.pid
        exit_file.write_text("9\n")
        assert shell.recorded_exit(out) == 9
        shell.void_records(out)  # (a restart in place removes them)
        assert not exit_file.exists() and not (tmp_path / "old.pid").exists()
    finally:
        old.kill()
        old.wait()


def test_an_output_file_name_with_a_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="newline"):
        shell.start(["-c", "true"], tmp_path / "a\nb.output")
    assert os.listdir(tmp_path) == []


def test_a_teammate_command_logs_to_a_file_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "m.cmd-1.exit"
    log.write_text("stale\n")  # (an old one is removed)
    argv = shell.wrapped_argv(["-c", "exit 6"], log, str(tmp_path))
    proc = subprocess.run(argv, check=False)
    assert proc.returncode == 6
    assert shell.recorded_command_exit(log) == 6
    assert log.stat().st_mode & 0o777 == 0o600
