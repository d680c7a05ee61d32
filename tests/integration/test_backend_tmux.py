"""The tmux backend against real tmux: one private server socket per test, reaped afterwards.

The tests look at tmux directly (`tmux -L SOCKET ...` through subprocess) rather than through
the backend, so what they check is what a user would see.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pty
import select
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from shoal.core.errors import InvalidNameError, ShoalError, UsageError
from shoal.teams.backends.base import BackendUnavailable, Handle, SpawnSpec, choose
from shoal.teams.backends.tmux import TmuxBackend, is_tmux_colour, socket_name
from shoal.teams.colors import PALETTE
from tests.conftest import Cli
from tests.polling import wait_until

pytestmark = pytest.mark.tmux

SLEEP_SCRIPT = "import time; time.sleep(600)"
SLEEP = [sys.executable, "-c", SLEEP_SCRIPT]
EXIT3 = [sys.executable, "-c", "raise SystemExit(3)"]
EXIT3_LATER = [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"]
TEAM = "alpha"


def tmux(socket: str, *args: str, path: bool = False) -> subprocess.CompletedProcess[str]:
    """Run tmux against a test server (`-L name`, or `-S path` when `path`)."""
    where = ["-S", socket] if path else ["-L", socket]
    return subprocess.run(
        ["tmux", *where, *args], capture_output=True, text=True, timeout=30, check=False
    )


def lines(socket: str, *args: str, path: bool = False) -> list[str]:
    res = tmux(socket, *args, path=path)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def reap(socket: str) -> None:
    """Kill a test server and remove its socket file (tmux leaves it behind)."""
    tmux(socket, "kill-server")
    tmpdir = os.environ.get("TMUX_TMPDIR") or "/tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(tmpdir, f"tmux-{os.getuid()}", socket))


def server_running(socket: str) -> bool:
    return tmux(socket, "list-sessions").returncode == 0


def runs_sleep(pid: int | None) -> bool:
    """Process `pid` runs the sleeping stand-in worker (tmux reports a pane's pid as it forks;
    the exec into the worker follows at once)."""
    return pid is not None and SLEEP_SCRIPT in psutil.Process(pid).cmdline()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as if from a plain terminal, even when the test runner itself is inside tmux."""
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)


@pytest.fixture
def sock() -> Iterator[str]:
    """A private tmux socket name for this test; its server is killed at teardown."""
    name = f"shoal-test-{uuid.uuid4().hex[:12]}"
    yield name
    reap(name)


@pytest.fixture
def make_spec(home: Path, tmp_path: Path) -> Callable[..., SpawnSpec]:
    def make(
        name: str,
        argv: list[str] | None = None,
        color: str = "blue",
        team: str = TEAM,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> SpawnSpec:
        return SpawnSpec(
            team=team,
            name=name,
            argv=SLEEP if argv is None else argv,
            cwd=str(tmp_path) if cwd is None else cwd,
            home=home,
            color=color,
            env=env or {},
        )

    return make


@pytest.fixture
def backend(outside: None, sock: str) -> Iterator[TmuxBackend]:
    b = TmuxBackend(socket_name=sock)
    yield b
    b.close(TEAM)


def panes(sock: str, path: bool = False) -> dict[str, dict[str, str]]:
    """pane id -> facts about it, as tmux reports them."""
    fmt = "\t".join(
        "#{" + f + "}"
        for f in (
            "pane_id",
            "pane_pid",
            "pane_dead",
            "pane_title",
            "window_name",
            "window_id",
            "session_name",
        )
    )
    out: dict[str, dict[str, str]] = {}
    for line in lines(sock, "list-panes", "-a", "-F", fmt, path=path):
        pane, pid, dead, title, window, window_id, session = line.split("\t")
        out[pane] = {
            "pid": pid,
            "dead": dead,
            "title": title,
            "window": window,
            "window_id": window_id,
            "session": session,
        }
    return out


# -- availability and choice -------------------------------------------------------------


def test_available_reports_the_tmux_version() -> None:
    ok, why = TmuxBackend().available()
    assert ok and why.startswith("tmux ")


def test_tmux_absent_is_a_clear_error_and_never_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make_spec: Callable[..., SpawnSpec]
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("TMUX", raising=False)
    assert TmuxBackend().available() == (False, "tmux is not installed (apt-get install tmux)")
    with pytest.raises(BackendUnavailable) as err:
        choose("tmux")
    assert "tmux is not installed" in str(err.value)
    # Spawning anyway fails the same way (the worker command itself is an absolute path).
    with pytest.raises(BackendUnavailable, match="tmux is not installed"):
        TmuxBackend(socket_name="shoal-test-never").spawn(make_spec("alice"))


def test_auto_inside_tmux_chooses_tmux_and_says_why() -> None:
    backend, why = choose("auto", {"TMUX": "/tmp/tmux-1/default,1,0"})
    assert isinstance(backend, TmuxBackend)
    assert "inside tmux" in why


# -- outside tmux: a dedicated server ------------------------------------------------------


def test_panes_run_the_worker_from_creation_with_titles_and_colours(
    backend: TmuxBackend, sock: str, make_spec: Callable[..., SpawnSpec], tmp_path: Path
) -> None:
    alice = backend.spawn(make_spec("alice", color="orange", env={"SHOAL_MARK": "a1"}))
    bob = backend.spawn(make_spec("bob", color="colour33"))

    seen = panes(sock)
    socket_path = lines(sock, "display", "-p", "#{socket_path}")[0]
    assert {seen[h.pane_id or ""]["title"] for h in (alice, bob)} == {"alice", "bob"}
    for handle, colour in ((alice, "orange"), (bob, "colour33")):
        assert handle.backend == "tmux" and handle.pane_id in seen
        facts = seen[handle.pane_id or ""]
        assert facts["session"] == f"shoal-{TEAM}" and facts["window"] == TEAM
        assert handle.window == f"{socket_path}:{facts['window_id']}"
        # The border styles expand #{@shoal_color} for each pane (tmux 3.3 keeps border
        # styles per window); test_borders_are_drawn_in_the_members_colours sees the result.
        pane_colour = lines(sock, "show-options", "-pv", "-t", handle.pane_id or "", "@shoal_color")
        assert pane_colour == [colour]
        # The pane's own process is the worker: created running it, not typed into a shell.
        assert handle.pid == int(facts["pid"])
        proc = psutil.Process(handle.pid)
        wait_until(functools.partial(runs_sleep, handle.pid))
        assert proc.cwd() == str(tmp_path)
        assert backend.is_alive(handle)
    environ = psutil.Process(alice.pid).environ()
    assert environ["SHOAL_MARK"] == "a1"  # the spec's variables
    assert environ["SHOAL_HOME"] == os.environ["SHOAL_HOME"]  # and ours the worker needs
    window = f"shoal-{TEAM}:={TEAM}"
    assert lines(sock, "show-options", "-wv", "-t", window, "pane-border-status") == ["top"]
    for option in ("pane-border-style", "pane-active-border-style"):
        assert "fg=#{@shoal_color}" in lines(sock, "show-options", "-wv", "-t", window, option)[0]
    assert backend.dead_panes(TEAM) == []


def test_a_one_word_command_is_still_the_panes_own_process(
    backend: TmuxBackend, make_spec: Callable[..., SpawnSpec]
) -> None:
    # One argument goes through tmux's `default-shell -c`; `exec` keeps the pid the worker's.
    handle = backend.spawn(make_spec("reader", ["cat"]))
    assert handle.pid is not None
    cat = os.path.realpath(shutil.which("cat") or "")
    # The shell execs cat in place (the same pid), a moment after tmux reports the pane.
    wait_until(lambda: psutil.Process(handle.pid).exe() == cat)
    assert backend.is_alive(handle)


def test_a_worker_that_exits_is_detected_as_a_dead_pane(
    backend: TmuxBackend, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    # The first pane of a window dies at once: remain-on-exit must already be on.
    quitter = backend.spawn(make_spec("quitter", EXIT3))
    stayer = backend.spawn(make_spec("stayer"))
    wait_until(lambda: not backend.is_alive(quitter))
    assert backend.is_alive(stayer)
    assert panes(sock)[quitter.pane_id or ""]["dead"] == "1"  # still visible, as dead
    # tmux marks the pane dead when its terminal closes and learns the status on SIGCHLD a
    # moment later ("?" until then); under load tmux 3.3 now and then never learns it, and
    # then "?" is the honest answer.
    assert backend.dead_panes(TEAM)[0] in {
        f"{quitter.pane_id} quitter (exit 3)",
        f"{quitter.pane_id} quitter (exit ?)",
    }
    assert len(backend.dead_panes(TEAM)) == 1
    late = backend.spawn(make_spec("late", EXIT3_LATER))  # a split pane dies too
    wait_until(lambda: len(backend.dead_panes(TEAM)) == 2)
    assert backend.dead_panes(TEAM)[1] in {
        f"{late.pane_id} late (exit 3)",
        f"{late.pane_id} late (exit ?)",
    }
    assert not backend.is_alive(late)


def test_panes_past_the_cap_overflow_into_new_windows(
    outside: None, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    backend = TmuxBackend(socket_name=sock, panes_per_window=2)
    handles = [backend.spawn(make_spec(n)) for n in ("a1", "a2", "a3", "a4", "a5")]
    counts = lines(sock, "list-windows", "-a", "-F", "#{window_name} #{window_panes}")
    assert counts == [f"{TEAM} 2", f"{TEAM}-2 2", f"{TEAM}-3 1"]
    assert len({h.pane_id for h in handles}) == 5
    backend.close(TEAM)
    assert not server_running(sock)


def test_concurrent_spawns_from_threads_are_serialised(
    outside: None, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    results: list[Handle] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def spawn(name: str) -> None:
        try:
            start.wait()
            results.append(TmuxBackend(socket_name=sock, panes_per_window=2).spawn(make_spec(name)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=spawn, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len({h.pane_id for h in results}) == 4
    # Unserialised, two creators would both see room (or no window) and overshoot the cap.
    counts = lines(sock, "list-windows", "-a", "-F", "#{window_name} #{window_panes}")
    assert sorted(counts) == [f"{TEAM} 2", f"{TEAM}-2 2"]
    TmuxBackend(socket_name=sock).close(TEAM)


def test_concurrent_spawns_from_processes_are_serialised(
    outside: None, sock: str, home: Path, tmp_path: Path
) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from shoal.teams.backends.base import SpawnSpec\n"
        "from shoal.teams.backends.tmux import TmuxBackend\n"
        "sock, home, cwd, name = sys.argv[1:5]\n"
        "spec = SpawnSpec(team='alpha', name=name, cwd=cwd, home=Path(home),\n"
        f"                argv={SLEEP!r})\n"
        "print(TmuxBackend(socket_name=sock, panes_per_window=2).spawn(spec).pane_id)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, sock, str(home), str(tmp_path), f"p{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert len({out.strip() for out, _ in outputs}) == 4
    counts = lines(sock, "list-windows", "-a", "-F", "#{window_name} #{window_panes}")
    assert sorted(counts) == [f"{TEAM} 2", f"{TEAM}-2 2"]
    assert (home / "teams" / TEAM / "tmux.lock").exists()
    TmuxBackend(socket_name=sock).close(TEAM)
    assert not server_running(sock)


def test_kill_removes_the_pane_and_its_process(
    backend: TmuxBackend, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    alice = backend.spawn(make_spec("alice"))
    bob = backend.spawn(make_spec("bob"))
    assert alice.pid is not None
    backend.kill(alice)
    assert gone(alice.pid)
    assert alice.pane_id not in panes(sock)
    assert not backend.is_alive(alice)
    assert backend.is_alive(bob)
    backend.kill(alice)  # already gone: nothing to do, no error
    backend.kill(bob)  # the last pane: its window, session and server go with it
    wait_until(lambda: not server_running(sock))
    backend.kill(bob)  # the server is gone too: still no error
    assert not backend.is_alive(bob)


def test_close_leaves_no_pane_no_process_and_no_server(
    outside: None, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    backend = TmuxBackend(socket_name=sock, panes_per_window=2)
    handles = [backend.spawn(make_spec(n)) for n in ("a1", "a2", "a3")]
    dead = backend.spawn(make_spec("dead", EXIT3))
    wait_until(lambda: not backend.is_alive(dead))
    pids = [h.pid for h in handles if h.pid is not None]
    assert len(pids) == 3 and all(not gone(pid) for pid in pids)
    backend.close(TEAM)
    assert all(gone(pid) for pid in pids)
    assert not server_running(sock)
    assert tmux(sock, "ls").returncode != 0
    assert backend.team_panes(TEAM) == []
    backend.close(TEAM)  # closing again is harmless


def test_an_old_handle_never_finds_a_new_pane_with_the_same_id(
    backend: TmuxBackend, make_spec: Callable[..., SpawnSpec]
) -> None:
    old = backend.spawn(make_spec("alice"))
    backend.close(TEAM)
    new = backend.spawn(make_spec("bob"))  # a new server numbers its panes from %0 again
    assert new.pane_id == old.pane_id and new.window == old.window
    assert not backend.is_alive(old)
    backend.kill(old)
    assert backend.is_alive(new)


def test_close_keeps_the_server_while_another_team_has_windows(
    outside: None, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    backend = TmuxBackend(socket_name=sock)
    mine = backend.spawn(make_spec("alice"))
    theirs = backend.spawn(make_spec("bob", team="beta"))
    backend.close(TEAM)
    assert mine.pid is not None and gone(mine.pid)
    assert backend.is_alive(theirs)
    assert [p["window"] for p in panes(sock).values()] == ["beta"]
    backend.close("beta")
    assert not server_running(sock)


def test_bad_input_creates_nothing(
    backend: TmuxBackend, sock: str, make_spec: Callable[..., SpawnSpec], tmp_path: Path
) -> None:
    with pytest.raises(ShoalError, match="does not exist"):
        backend.spawn(make_spec("alice", cwd=str(tmp_path / "missing")))
    with pytest.raises(ShoalError, match="not found"):
        backend.spawn(make_spec("alice", ["no-such-program-shoal", "x"]))
    assert not server_running(sock)
    with pytest.raises(UsageError, match=r"member 'alice' of team 'alpha' has colour 'bleu'"):
        backend.spawn(make_spec("alice", color="bleu"))
    with pytest.raises(InvalidNameError):
        backend.spawn(make_spec("Alice"))
    with pytest.raises(UsageError, match="at least 1"):
        TmuxBackend(socket_name=sock, panes_per_window=0)
    assert not server_running(sock)


def test_every_palette_colour_is_a_tmux_colour() -> None:
    assert all(is_tmux_colour(c) for c in PALETTE)
    assert is_tmux_colour("#00ff7f") and is_tmux_colour("colour255")
    assert not is_tmux_colour("colour256") and not is_tmux_colour("not-a-colour")


def test_borders_are_drawn_in_the_members_colours(
    backend: TmuxBackend, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    backend.spawn(make_spec("alice", color="colour160"))
    backend.spawn(make_spec("bob", color="colour33"))
    # xterm-256color draws colourN as ESC[38;5;Nm: both borders, each in its member's colour,
    # titled with the member's name (the wait fails the test if any of it never shows).
    expected = (b"38;5;160m", b"38;5;33m", b" alice ", b" bob ")
    screen = _attached_screen(sock, f"shoal-{TEAM}", *expected)
    assert all(part in screen for part in expected)


def test_attach_command_targets_the_dedicated_server(
    backend: TmuxBackend, sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    with pytest.raises(ShoalError, match="has no tmux window; spawn teammates with --backend"):
        backend.attach_command(TEAM)
    handle = backend.spawn(make_spec("alice"))
    argv = backend.attach_command(TEAM)
    window = (handle.window or "").rpartition(":")[2]
    assert argv[1:5] == ["-L", sock, "attach-session", "-t"]
    assert argv[5].endswith(f":{window}")
    assert socket_name(TEAM) == f"shoal-{TEAM}"


# -- inside tmux: a dedicated window in the user's session ----------------------------------


@pytest.fixture
def user_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A separate 'user' tmux server with a session `work` holding the user's own windows
    (one named like the team), and $TMUX pointing at it. Yields (socket path, session id)."""
    name = f"shoal-user-{uuid.uuid4().hex[:12]}"
    lines(name, "new-session", "-d", "-s", "work", "-n", "editor", "-x", "160", "-y", "50")
    lines(name, "new-window", "-d", "-t", "work:", "-n", TEAM)  # the user's, not shoal's
    path, pid, session = lines(name, "display", "-p", "-t", "work", "#{socket_path} #{pid} #S")[
        0
    ].split()
    assert session == "work"
    session_id = lines(name, "display", "-p", "-t", "work", "#{session_id}")[0]
    monkeypatch.setenv("TMUX", f"{path},{pid},{session_id.lstrip('$')}")
    monkeypatch.delenv("TMUX_PANE", raising=False)
    yield path, session_id
    reap(name)


def test_inside_tmux_spawns_into_a_dedicated_window_of_the_current_session(
    user_server: tuple[str, str], sock: str, make_spec: Callable[..., SpawnSpec]
) -> None:
    path, session_id = user_server
    before = lines(path, "list-windows", "-a", "-F", "#{window_id} #{window_panes}", path=True)
    backend = TmuxBackend(socket_name=sock)
    alice = backend.spawn(make_spec("alice", color="green"))
    bob = backend.spawn(make_spec("bob", color="colour70"))

    for handle in (alice, bob):
        assert (handle.window or "").startswith(f"{path}:")
        assert backend.is_alive(handle)
        wait_until(functools.partial(runs_sleep, handle.pid))
    seen = panes(path, path=True)
    assert seen[alice.pane_id or ""]["window_id"] == seen[bob.pane_id or ""]["window_id"]
    shoal_window = seen[alice.pane_id or ""]["window_id"]
    assert {seen[h.pane_id or ""]["title"] for h in (alice, bob)} == {"alice", "bob"}
    assert seen[alice.pane_id or ""]["session"] == "work"
    # The user's own windows (one of them named like the team) were not touched.
    after = lines(path, "list-windows", "-a", "-F", "#{window_id} #{window_panes}", path=True)
    assert set(before) <= set(after)
    assert len(after) == len(before) + 1 and f"{shoal_window} 2" in after
    assert not server_running(sock)  # no dedicated server inside tmux

    argv = backend.attach_command(TEAM)
    assert argv[1:] == ["-S", path, "select-window", "-t", shoal_window]

    backend.close(TEAM)
    assert alice.pid is not None and bob.pid is not None
    assert gone(alice.pid) and gone(bob.pid)
    assert lines(path, "list-windows", "-a", "-F", "#{window_id} #{window_panes}", path=True) == (
        before
    )
    assert session_id in lines(path, "list-sessions", "-F", "#{session_id}", path=True)


def test_inside_tmux_attach_switches_client_when_the_window_is_in_another_session(
    user_server: tuple[str, str],
    sock: str,
    make_spec: Callable[..., SpawnSpec],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = user_server
    backend = TmuxBackend(socket_name=sock)
    handle = backend.spawn(make_spec("alice"))
    other = lines(path, "new-session", "-d", "-s", "other", "-P", "-F", "#{session_id}", path=True)
    monkeypatch.setenv("TMUX", f"{path},1,{other[0].lstrip('$')}")
    argv = backend.attach_command(TEAM)
    assert argv[3:] == ["switch-client", "-t", (handle.window or "").rpartition(":")[2]]
    backend.close(TEAM)


# -- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli_team(outside: None) -> Iterator[str]:
    """A team name unique to this test: `shoal attach` uses the real socket `shoal-{team}`."""
    team = f"t{uuid.uuid4().hex[:10]}"
    yield team
    reap(socket_name(team))


def test_cli_attach_without_a_window_is_a_clear_error(cli: Cli, cli_team: str) -> None:
    res = cli("attach", "--team", cli_team)
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"shoal: error: team {cli_team!r} has no tmux window; spawn teammates with --backend tmux"
    )


def test_cli_attach_hands_the_terminal_to_tmux(
    cli: Cli, cli_team: str, make_spec: Callable[..., SpawnSpec], home: Path
) -> None:
    backend = TmuxBackend()
    backend.spawn(make_spec("alice", team=cli_team))
    sock = socket_name(cli_team)
    printed = cli("attach", "--team", cli_team, "--print")
    assert printed.returncode == 0, printed.stderr
    assert f"-L {sock} attach-session -t" in printed.stdout

    # A real terminal: `shoal attach` execs the tmux client, which shows up as attached.
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "attach", "--team", cli_team],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "SHOAL_HOME": str(home), "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(terminal)
    drained = threading.Thread(target=_drain, args=(controller,), daemon=True)
    drained.start()
    try:
        wait_until(lambda: lines(sock, "list-clients", "-F", "#{client_session}") != [])
        assert lines(sock, "list-clients", "-F", "#{client_session}") == [f"shoal-{cli_team}"]
        # The same process, exec'd into the tmux client.
        assert psutil.Process(proc.pid).exe() == os.path.realpath(shutil.which("tmux") or "")
        lines(sock, "detach-client", "-s", f"shoal-{cli_team}")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    backend.close(cli_team)
    assert not server_running(sock)


def _attached_screen(sock: str, session: str, *expected: bytes) -> bytes:
    """What a real tmux client attached to `session` draws, read until all of `expected`
    has shown (the client may draw in several writes)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        ["tmux", "-L", sock, "attach-session", "-t", session],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    os.close(terminal)
    screen = bytearray()

    def drawn() -> bool:
        ready, _, _ = select.select([controller], [], [], 0.05)
        if ready:
            with contextlib.suppress(OSError):
                screen.extend(os.read(controller, 65536))
        return all(part in screen for part in expected)

    try:
        wait_until(drawn)
    finally:
        tmux(sock, "detach-client", "-s", session)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(controller)
    return bytes(screen)


def _drain(fd: int) -> None:
    """Read (and drop) what the tmux client draws, so it never blocks on a full pty."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
