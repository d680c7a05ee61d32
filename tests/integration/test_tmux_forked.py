"""tmux teammates forked onto their panes: each pane runs the small stub
(teams/backends/pane_stub.py), which hands its terminal to a worker the leader's fork server
forks. Real tmux servers (one socket per test), real leaders and workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from shoal.core.forkserver import ForkClient
from shoal.core.procs import is_alive
from shoal.teams.backends.tmux import PANE_STUB
from tests.conftest import Cli
from tests.polling import wait_until

pytestmark = pytest.mark.tmux

TEAM = "t"


def tmux(sock: str, *args: str) -> str:
    out = subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def panes(sock: str) -> dict[str, dict[str, str]]:
    """Pane id -> pid, dead, dead status, member (as the leader's panes have them)."""
    fmt = (
        "#{pane_id} #{pane_pid} #{pane_dead} #{pane_dead_status} #{pane_dead_signal} "
        "#{@shoal_member}"
    )
    out: dict[str, dict[str, str]] = {}
    for line in tmux(sock, "list-panes", "-a", "-F", fmt).splitlines():
        pane_id, pid, dead, *rest = line.split(" ")
        status, dead_signal, member = [*rest, "", "", ""][:3]
        out[pane_id] = {
            "pid": pid,
            "dead": dead,
            "status": status,
            "signal": dead_signal,
            "member": member,
        }
    return out


def on_screen(sock: str, pane_id: str, text: str) -> bool:
    """Whether `text` is on the pane's screen or in its history."""
    return text in tmux(sock, "capture-pane", "-p", "-S", "-", "-t", pane_id)


def member(home: Path, name: str) -> dict[str, object]:
    team = json.loads((home / "teams" / TEAM / "team.json").read_text())
    return next(m for m in team["members"] if m["name"] == name)


def worker_pid(home: Path, name: str) -> int | None:
    """The worker process of teammate `name` (its own status file names it)."""
    status = home / "teams" / TEAM / "status" / f"{name}.json"
    try:
        pid = json.loads(status.read_text()).get("pid")
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return pid if isinstance(pid, int) else None


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def comm_of_or_empty(pid: int) -> str:
    try:
        return comm_of(pid)
    except OSError:
        return ""


def comm_of(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode()


def start(cli: Cli, *names: str) -> None:
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    spawned = cli("spawn", "--team", TEAM, "--backend", "tmux", *names)
    assert spawned.returncode == 0, spawned.stderr


def test_a_tmux_teammate_runs_forked_on_its_panes_terminal(
    cli: Cli, home: Path, tmux_socket: str
) -> None:
    start(cli, "ana", "bo")
    by_member = {p["member"]: (pane_id, p) for pane_id, p in panes(tmux_socket).items()}
    for name in ("ana", "bo"):
        pane_id, pane = by_member[name]
        stub = int(pane["pid"])
        assert str(PANE_STUB) in comm_of(stub)  # the pane runs the stub...
        record = member(home, name)
        assert record["pid"] == stub and record["pane_id"] == pane_id  # ...which is the member
        worker = wait_until(partial(worker_pid, home, name), what=f"{name}'s status file")
        assert worker != stub and is_alive(worker, None)
        assert "fork server" in comm_of(parent_of(worker))  # forked, not a new interpreter
        assert f"worker --team {TEAM} --name {name}" in comm_of(worker)  # (its own ps line)
        # The worker writes to the pane: its console line is on the pane's screen.
        wait_until(
            partial(on_screen, tmux_socket, pane_id, f"ready    {name} of team {TEAM}"),
            what=f"{name}'s console on its pane",
        )
    sent = cli("send", "--team", TEAM, "ana", "hello")
    assert sent.returncode == 0, sent.stderr
    down = cli("down", "--team", TEAM)
    assert down.returncode == 0, down.stderr
    workers = [worker_pid(home, n) for n in ("ana", "bo")]
    wait_until(
        lambda: not any(is_alive(w, None) for w in workers if w),
        what="the workers to end with the team",
    )


def test_a_killed_pane_stub_hangs_up_its_worker(cli: Cli, home: Path, tmux_socket: str) -> None:
    start(cli, "ana")
    stub = member(home, "ana")["pid"]
    assert isinstance(stub, int)
    worker = wait_until(lambda: worker_pid(home, "ana"), what="ana's status file")
    os.kill(stub, signal.SIGKILL)
    wait_until(lambda: not is_alive(worker, None), timeout=20, what="the worker to be hung up")
    # The leader sees its teammate gone, as when a pane's process is killed.
    wait_until(
        lambda: any(
            r["status"] in ("failed", "completed", "killed")
            for r in json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
        ),
        timeout=20,
        what="the teammate's task to end",
    )
    cli("down", "--team", TEAM)


@pytest.fixture
def fork_client() -> Iterator[ForkClient]:
    """A fork server of this test's own (as a leader has one)."""
    client = ForkClient(["shoal.cli.entry"])
    try:
        yield client
    finally:
        client.close()


def pane_session(sock: str, tmp_path: Path, command: list[str]) -> None:
    """A tmux server on `sock` whose one pane runs `command` from the start (early output of
    a window made later can be lost to its first resize), kept when it exits."""
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\n")
    tmux(sock, "-f", str(conf), "new-session", "-d", "-s", "x", "-x", "120", "-y", "20", *command)


def pane_exit_code(sock: str) -> int:
    """The exit code of the pane's process once it has ended: tmux's `#{pane_dead_status}`,
    or, while tmux has not reaped it yet (under load it can be slow to), the code the kernel
    keeps for the zombie (/proc/PID/stat's last field)."""

    def code() -> int | None:
        pane = next(iter(panes(sock).values()))
        if pane["dead"] != "1":
            return None
        if pane["status"]:
            return int(pane["status"])
        try:
            with open(f"/proc/{pane['pid']}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return None  # (reaped just now: tmux has the status on the next look)
        if fields[0] != "Z":
            return None
        status = int(fields[-1])
        return status >> 8 if status & 0x7F == 0 else 128 + (status & 0x7F)

    return wait_until(lambda: (c,) if (c := code()) is not None else None, timeout=20,
                      what="the pane's process to end")[0]  # fmt: skip


def test_the_stub_ends_with_the_forked_commands_code(
    fork_client: ForkClient, tmux_socket: str, tmp_path: Path
) -> None:
    address = fork_client.ensure_started()
    argv = [sys.executable, "-m", "http.server", "--no-such-option"]  # (argparse: exit 2)
    pane_session(tmux_socket, tmp_path, [sys.executable, "-S", "-I", str(PANE_STUB), address,
                                         *argv])  # fmt: skip
    assert pane_exit_code(tmux_socket) == 2
    screen = tmux(tmux_socket, "capture-pane", "-p", "-S", "-", "-t", "x:0")
    assert "unrecognized arguments: --no-such-option" in screen  # (its stderr is the pane)


def test_the_stub_passes_signals_on_to_the_forked_command(
    fork_client: ForkClient, tmux_socket: str, tmp_path: Path
) -> None:
    address = fork_client.ensure_started()
    argv = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"]
    pane_session(tmux_socket, tmp_path, [sys.executable, "-S", "-I", str(PANE_STUB), address,
                                         *argv])  # fmt: skip
    stub = int(next(iter(panes(tmux_socket).values()))["pid"])
    server = wait_until(
        lambda: next(
            (
                int(p)
                for p in os.listdir("/proc")
                if p.isdigit()
                and comm_of_or_empty(int(p)).startswith(f"{sys.executable} -m http.server 0")
            ),
            None,
        ),
        what="the forked command",
    )
    assert server != stub and "fork server" in comm_of(parent_of(server))
    os.kill(stub, signal.SIGTERM)
    assert pane_exit_code(tmux_socket) == 143  # (the command died of the TERM: 128+15)
    wait_until(lambda: not is_alive(server, None), what="the forked command to be gone")


def test_tmux_teammates_outlive_a_killed_leader_and_are_taken_back(
    cli: Cli, home: Path, tmux_socket: str
) -> None:
    start(cli, "ana")
    stub = member(home, "ana")["pid"]
    assert isinstance(stub, int)
    worker = wait_until(lambda: worker_pid(home, "ana"), what="ana's status file")
    leader = member(home, "team-lead")["pid"]
    assert isinstance(leader, int)
    os.kill(leader, signal.SIGKILL)
    wait_until(lambda: not is_alive(leader, None), what="the leader to die")
    time.sleep(1.0)  # (the fork server goes with its leader; the pane and its worker stay)
    assert is_alive(stub, None) and is_alive(worker, None)
    up = cli("up", "--team", TEAM, "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    rows = json.loads(cli("ps", "--team", TEAM, "--json").stdout)
    assert [r["status"] for r in rows if r.get("type") == "in_process_teammate"] == ["running"]
    sent = cli("send", "--team", TEAM, "ana", "still there?")
    assert sent.returncode == 0, sent.stderr
    down = cli("down", "--team", TEAM)
    assert down.returncode == 0, down.stderr
    wait_until(
        lambda: not is_alive(worker, None) and not is_alive(stub, None),
        timeout=20,
        what="the adopted teammate to end with the team",
    )


def test_without_a_fork_server_the_stub_starts_the_command_itself(
    tmux_socket: str, tmp_path: Path
) -> None:
    """An address nobody listens on: the pane still gets its command, as a new interpreter,
    and says why."""
    nobody = b"shoal-fork-nobody-listens".hex()
    command = [sys.executable, "-S", "-I", str(PANE_STUB), nobody, sys.executable, "-c",
               "import time; time.sleep(1); print('the command ran')"]  # fmt: skip
    pane_session(tmux_socket, tmp_path, command)
    assert pane_exit_code(tmux_socket) == 0
    screen = tmux(tmux_socket, "capture-pane", "-p", "-S", "-", "-t", "x:0")
    assert "no fork server" in screen and "starting the teammate as a new interpreter" in screen
    assert "the command ran" in screen


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root")
def test_the_fork_server_answers_no_other_user(fork_client: ForkClient) -> None:
    """A peer of another uid is not answered (SO_PEERCRED): it can fork nothing."""
    address = fork_client.ensure_started()
    code = (
        "import os, socket, array, json, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
        f"s.connect(b'\\0' + bytes.fromhex({address!r}))\n"
        "req = {'op': 'spawn_tty', 'argv': [sys.executable, '-m', 'shoal', 'worker'],"
        " 'cwd': '/', 'env': {}}\n"
        "try:\n"
        "    s.sendmsg([json.dumps(req).encode() + b'\\n'],"
        " [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [0, 1, 2]))])\n"
        "    print(repr(s.recv(100)))\n"
        "except (BrokenPipeError, ConnectionResetError):\n    print('reset')\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    # Closed without an answer (or reset, the request unread): nothing was forked.
    assert out.stdout.strip() in ("b''", "reset")
