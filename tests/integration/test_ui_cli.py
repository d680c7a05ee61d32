"""`shoal pill`, `shoal ps --watch`, `shoal ui` and the tmux status line, as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.core.tasks import TaskStatus
from shoal.core.taskupdates import update_task
from shoal.ui.tmux import install_tmux_status, tmux_status_hint
from tests.conftest import Cli, require_tmux
from tests.polling import poll, wait_until
from tests.unit.test_ui_fixtures import TASK_IDS, build_swarm

COLOR_CODE = re.compile(rb"\x1b\[[0-9;]*3[0-9]m|\x1b\[9[0-7]m")


def test_pill(cli: Cli, layout: Layout) -> None:
    build_swarm(layout)
    out = cli("pill", "--team", "demo")
    assert (out.returncode, out.stdout, out.stderr) == (0, "7 background tasks\n", "")
    out = cli("--home", str(layout.home), "--team", "demo", "pill")
    assert out.stdout == "7 background tasks\n"
    out = cli("pill", "--team", "demo", "--json")
    assert out.returncode == 0 and '"label": "7 background tasks"' in out.stdout
    assert "status-right" in cli("pill", "--help").stdout
    detail = cli("pill", "--team", "demo", "--detail")  # (the fast path)
    assert detail.returncode == 0 and detail.stdout.count(",") >= 1, detail
    assert "background tasks" not in detail.stdout
    detailed = cli("pill", "--team", "demo", "--detail", "--json")  # (through click)
    assert json.loads(detailed.stdout)["label"] == detail.stdout.strip()


def test_pill_is_empty_when_nothing_runs(cli: Cli) -> None:
    assert cli("team", "create", "quiet").returncode == 0
    out = cli("pill", "--team", "quiet")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_pill_errors(cli: Cli, layout: Layout) -> None:
    out = cli("pill")
    assert out.returncode == 1  # not found, as for any command
    assert cli("ps").returncode == 1
    assert out.stderr == (
        "shoal: error: no team 'default' (start its leader with `shoal up --team default`)\n"
    )
    build_swarm(layout)
    out = cli("pill", "--team", "nope")
    assert out.returncode == 1
    assert out.stderr == (
        "shoal: error: no team 'nope' (start its leader with `shoal up --team nope`; teams on "
        "disk: demo (pass --team NAME or set SHOAL_TEAM))\n"
    )
    out = cli("pill")  # (the default team is `default`, never "the only team on disk")
    assert out.returncode == 1 and "no team 'default'" in out.stderr and "demo" in out.stderr


def test_pill_fast_path_skips_click_and_pydantic(cli: Cli, layout: Layout) -> None:
    build_swarm(layout)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "shoal", "pill", "--team", "demo"],
        capture_output=True,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(layout.home)},
        check=True,
    )
    assert out.stdout == "7 background tasks\n"
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()}
    assert "shoal.ui.pill_fast" in imported
    assert not imported & {"click", "pydantic", "rich", "psutil", "watchdog", "shoal.cli.common"}


def _write_completed(layout: Layout, task_id: str) -> None:
    from shoal.teams.session import Session

    session = Session(layout, "01fixturesession")
    state = session.read_state()
    task = state.tasks[task_id]
    done = update_task(task, status=TaskStatus.COMPLETED, end_time=task.start_time + 1)
    session.write_state(state.model_copy(update={"tasks": {**state.tasks, task_id: done}}))


def test_ps_watch_prints_plain_blocks_when_piped(layout: Layout) -> None:
    build_swarm(layout)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "ps", "--watch", "--team", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SHOAL_HOME": str(layout.home)},
    )
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    seen = b""

    def read() -> bytes:
        nonlocal seen
        seen += proc.stdout.read() or b""  # type: ignore[union-attr]
        return seen

    try:
        wait_until(lambda: b"mmcpmon01" in read(), timeout=30)
        assert not COLOR_CODE.search(seen)
        assert seen.startswith(b"team demo  session 01fixturesession")
        _write_completed(layout, TASK_IDS["shell"])
        wait_until(lambda: read().count(b"TASKS") == 2, timeout=30)
        assert b"\xe2\x9c\x94 bshell001  shell     completed" in seen.split(b"\n\n")[-1]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # (a failed test leaves nothing running)
            proc.communicate()
            raise
    assert proc.returncode == 130, err


def _run_in_pty(argv: list[str], env: dict[str, str], until: bytes) -> bytes:
    """Run `argv` on a pseudo-terminal until its output contains `until`; the output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""

    def done() -> bool:
        nonlocal out
        if until in out:
            return True
        ready, _, _ = select.select([master], [], [], 0.5)  # paces the polling
        if ready:
            try:
                out += os.read(master, 65536)
            except OSError:
                return True  # the terminal is gone: nothing more will come
        return until in out

    try:
        poll(done, 30, interval=0)  # the caller checks what came
    finally:
        _interrupt_and_drain(proc, master)
    return out


def _interrupt_and_drain(proc: subprocess.Popen[bytes], master: int) -> None:
    """SIGINT `proc` and keep draining its terminal while it exits (its last redraw must not
    block on a full pty buffer); then close the terminal."""
    proc.send_signal(signal.SIGINT)

    def exited() -> bool:
        if proc.poll() is not None:
            return True
        ready, _, _ = select.select([master], [], [], 0.1)  # paces the polling
        if ready:
            with contextlib.suppress(OSError):
                os.read(master, 65536)
        return False

    try:
        poll(exited, 30, interval=0)  # proc.wait below fails if it is still running
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()  # (a failed test leaves nothing running)
            proc.wait()
        os.close(master)


def test_ps_watch_on_a_terminal(layout: Layout) -> None:
    build_swarm(layout)
    env = {**os.environ, "SHOAL_HOME": str(layout.home), "COLUMNS": "140", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    argv = [sys.executable, "-m", "shoal", "ps", "--watch", "--team", "demo"]
    out = _run_in_pty(argv, env, b"mmcpmon01")
    assert b"mmcpmon01" in out and COLOR_CODE.search(out)
    assert b"MEMBERS" not in out  # the rich board, not plain lines
    out = _run_in_pty(argv, {**env, "NO_COLOR": "1"}, b"mmcpmon01")
    assert b"MEMBERS" in out and not COLOR_CODE.search(out)


def test_ps_watch_refuses_json(cli: Cli, layout: Layout) -> None:
    build_swarm(layout)
    out = cli("ps", "--watch", "--json", "--team", "demo")
    assert out.returncode == 2 and "--watch shows the live board" in out.stderr


def test_ui_needs_a_terminal(cli: Cli, layout: Layout) -> None:
    build_swarm(layout)
    out = cli("ui", "--team", "demo")
    assert out.returncode == 2
    assert "`shoal ui` needs a terminal" in out.stderr


@pytest.fixture
def tmux_socket(tmp_path: Path) -> Iterator[str]:
    """A tmux server of our own (its own socket), killed at teardown."""
    require_tmux()  # for a test that uses this fixture without the tmux marker
    sock = str(tmp_path / "tmux.sock")
    subprocess.run(
        ["tmux", "-S", sock, "-f", "/dev/null", "new-session", "-d", "-s", "t"], check=True
    )
    try:
        yield sock
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], check=False, capture_output=True)


@pytest.mark.tmux
def test_tmux_status_line_shows_the_pill(layout: Layout, tmux_socket: str) -> None:
    build_swarm(layout)
    hint = tmux_status_hint(layout.home, "demo", env={"TMUX": f"{tmux_socket},1,0"})
    assert hint is not None
    install_tmux_status(hint)
    shown = subprocess.run(
        ["tmux", "-S", tmux_socket, "show-options", "-gv", "status-right"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert shown.startswith(hint.status_right)  # (in front of what was there)
    # What tmux runs every status-interval prints the pill.
    command = hint.status_right[2:-1].replace("##", "#")
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
    assert out.stdout == "7 background tasks\n"


def _answer_in_pty(
    argv: list[str], env: dict[str, str], prompt: bytes, answer: bytes, until: bytes
) -> tuple[subprocess.Popen[bytes], int, bytes]:
    """Start `argv` on a pseudo-terminal, answer `prompt` with `answer`, read until `until`;
    the process (still running, or not), the terminal's master fd and the output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    answered = False

    def done() -> bool:
        nonlocal out, answered
        if until in out:
            return True
        if not answered and prompt in out:
            os.write(master, answer)
            answered = True
        ready, _, _ = select.select([master], [], [], 0.2)  # paces the polling
        if ready:
            try:
                out += os.read(master, 65536)
            except OSError:
                return True  # the terminal is gone: nothing more will come
        return False

    poll(done, 30, interval=0)  # the caller checks what came
    return proc, master, out


def _status_right(sock: str) -> str:
    return subprocess.run(
        ["tmux", "-S", sock, "show-options", "-gv", "status-right"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.rstrip("\n")


@pytest.mark.tmux
def test_up_inside_tmux_asks_nothing_and_tmux_status_keeps_the_users_status_right(
    cli: Cli, layout: Layout, tmux_socket: str
) -> None:
    env = {**os.environ, "SHOAL_HOME": str(layout.home), "TMUX": f"{tmux_socket},1,0"}
    mine = "#[fg=green]%H:%M %d-%b"
    subprocess.run(["tmux", "-S", tmux_socket, "set-option", "-g", "status-right", mine],
                   check=True)  # fmt: skip
    # On a terminal, in the foreground: no question; a task sent at once runs.
    argv = [sys.executable, "-m", "shoal", "up", "--no-board", "--team", "tf"]
    proc, master, out = _answer_in_pty(argv, env, b"\x00never", b"", b"status line)")
    try:
        assert b"running (session" in out and b"--tmux-status" in out, out
        assert b"[y/N]" not in out
        task = cli("sh", "--team", "tf", "--", "true").stdout.strip()
        assert cli("wait", "--team", "tf", "--timeout", "20", task).returncode == 0
        assert _status_right(tmux_socket) == mine
    finally:
        _interrupt_and_drain(proc, master)
    # --tmux-status puts the pill in front of what was there, once; `down` restores it.
    for _ in range(2):
        up = subprocess.run([sys.executable, "-m", "shoal", "up", "--detach", "--team", "tm",
                             "--tmux-status"], env=env, capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
        assert up.returncode in (0, 1), up.stderr  # (the second: a leader already runs)
    shown = _status_right(tmux_socket)
    assert shown.endswith(" " + mine) and shown.count("pill") == 1 and "tm" in shown, shown
    assert cli("down", "--team", "tm").returncode == 0
    assert _status_right(tmux_socket) == mine
    assert not (layout.home / "teams" / "tm" / "tmux-status.json").exists()


def test_tmux_status_outside_tmux_is_a_warning(cli: Cli, layout: Layout) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    up = subprocess.run([sys.executable, "-m", "shoal", "--home", str(layout.home), "up",
                         "--detach", "--team", "nt", "--tmux-status"], env=env,
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    try:
        assert up.returncode == 0 and "not inside tmux" in up.stderr, up.stderr
    finally:
        cli("down", "--team", "nt")
