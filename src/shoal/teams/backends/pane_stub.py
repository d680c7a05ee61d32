"""The process of a tmux teammate's pane: it hands its terminal to a worker the fork server forks.

A new interpreter that imports shoal costs about half a second of CPU; 16 panes started at
once paid that 16 times. So a pane runs this small script instead (`python -S -I`: the
standard library only, no site-packages, started in a few milliseconds). It connects to the
leader's fork server (the abstract unix socket named in argv[1]), passes its standard input,
output and error (the pane's terminal) with SCM_RIGHTS along with the worker's command line,
working directory and environment, and the server forks the worker onto that terminal.

From the outside this process is the teammate: it is the pane's pid, the member's pid in the
team file (the worker joins with `SHOAL_PANE_PID`), and it ends with the worker's exit code.
Signals it gets (Ctrl-C in the pane, tmux's HUP, `shoal`'s TERM) go on to the worker's process
group, and if this process is killed outright its connection closes and the server hangs up
the worker. When the server is gone (the leader exited) the worker goes on, and this process
waits for it on a pidfd. When the server cannot be reached at all, the worker runs as this
process's child, a new interpreter as before, so a pane always gets its teammate.

Stdlib only, and no import of shoal: this file is run by path, not as part of the package.
"""

import array
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys

# Signals passed on to the worker's process group.
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
CONNECT_TIMEOUT_S = 10.0


def _forward_to(pid: int) -> None:
    """Pass the signals a pane's process gets on to process group `pid` (a worker in a
    session of its own)."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)


def _hang_up_with_me() -> None:
    """In the fallback's child: HUP when this stub dies (as the server would send it)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGHUP)


def _direct(argv: list[str], why: str) -> int:
    """Run the worker as a child of this stub, a new interpreter (the pane keeps its
    teammate), in a session of its own as a forked one is; its exit code."""
    print(f"shoal: {why}; starting the teammate as a new interpreter", file=sys.stderr)
    sys.stderr.flush()
    env = dict(os.environ)
    env["SHOAL_PANE_PID"] = str(os.getpid())
    try:
        child = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_hang_up_with_me)
    except OSError as exc:
        print(f"shoal: cannot start {argv[0]}: {exc}", file=sys.stderr)
        return 127
    _forward_to(child.pid)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    return code if code >= 0 else 128 - code


def _request(sock: socket.socket, argv: list[str]) -> dict[str, object]:
    """Send the spawn request with our terminal; the server's answer."""
    env = dict(os.environ)
    env["SHOAL_PANE_PID"] = str(os.getpid())
    line = json.dumps({"op": "spawn_tty", "argv": argv, "cwd": os.getcwd(), "env": env})
    fds = array.array("i", [0, 1, 2])
    sock.sendmsg([line.encode() + b"\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the fork server closed the connection")
        answer += chunk
    reply = json.loads(answer)
    if not isinstance(reply, dict):
        raise ConnectionError(f"unexpected answer {reply!r}")
    return reply


def _wait_without_server(pid: int) -> int:
    """The server is gone: wait for the worker to end (its code is not known here)."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return 0
    try:
        while True:
            try:
                select.select([fd], [], [])
                return 0
            except InterruptedError:
                continue
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: pane_stub ADDRESS ARGV...", file=sys.stderr)
        return 2
    address = b"\0" + bytes.fromhex(argv[1])
    command = argv[2:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(address)
        reply = _request(sock, command)
    except (OSError, ValueError) as exc:
        sock.close()
        return _direct(command, f"no fork server ({exc})")
    pid = reply.get("pid")
    if not isinstance(pid, int):
        sock.close()
        return _direct(command, f"the fork server refused: {reply.get('error')}")
    _forward_to(pid)
    sock.settimeout(None)
    buf = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            return _wait_without_server(pid)
        buf += chunk
        if b"\n" in buf:
            line = buf.split(b"\n", 1)[0]
            code = json.loads(line).get("exit")
            if not isinstance(code, int):
                return 1
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
