"""Child processes of the reliability tests: `python crash_children.py ROLE ARGS...`.

Each role is a real shoal client (sender, receiver, team-file writer or reader) that the tests
start, freeze or kill -9. `zygote` is a small fork server: it imports shoal once and forks a
child per request, so a test can start and kill hundreds of senders in seconds instead of
paying a full interpreter start for each.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from shoal.core.paths import Layout
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import send
from shoal.mailbox.schema import AnyMessage
from shoal.mailbox.store import Maildir
from shoal.teams.models import TeamFile
from shoal.teams.store import Teams

APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
# Text lengths a sender picks from: mostly small, some large so a kill can land mid-write.
TEXT_SIZES = (0, 10, 100, 1_000, 10_000, 300_000)


def _append_line(fd: int, line: str) -> None:
    # One unbuffered O_APPEND write per line: nothing waits in a user-space buffer, so a
    # SIGKILL right after it cannot lose the line (the page cache survives the process).
    os.write(fd, line.encode() + b"\n")


def _touch(path: str) -> None:
    Path(path).write_text("ok\n")


def sender(home: str, team: str, to: str, log_path: str, seed: str) -> None:
    """Send forever; log the id of every send that returned (until killed)."""
    directory = Teams(Layout(home)).directory(team)
    rng = random.Random(int(seed))
    log = os.open(log_path, APPEND, 0o600)
    while True:
        size = rng.choice(TEXT_SIZES)
        result = send(directory, to=to, sender="team-lead", text="x" * size)
        _append_line(log, result.id)


def receiver(
    home: str,
    team: str,
    member: str,
    effects: str,
    mode: str,
    kill_at: str,
    started: str,
    done: str,
) -> None:
    """Handle everything in the inbox; in `claim`/`handled` mode kill -9 self on message `kill_at`.

    claim:   SIGKILL right after the claim (new -> cur), before the effect.
    handled: SIGKILL inside `Inbox.ack`, after the handled-log append, before the unlink.
    random:  no self-kill (the test kills this process at random moments).
    Writes `started` once it watches the inbox, `done` and exits once the inbox is empty.
    """
    box = Inbox(Maildir.open(Layout(home).inbox_dir(team, member)), lead="team-lead").start()
    _touch(started)
    out = os.open(effects, APPEND, 0o600)
    stop_at = int(kill_at)
    handled = 0

    def effect(message: AnyMessage) -> None:
        _append_line(out, message.id)
        os.fsync(out)  # a durable effect, as a real handler would make it before the ack

    if mode == "handled":
        real_mark = box.maildir.mark_handled

        def mark_then_die(message_id: str, *, durable: bool = False) -> None:
            real_mark(message_id, durable=durable)
            if handled == stop_at:
                os.kill(os.getpid(), signal.SIGKILL)

        box.maildir.mark_handled = mark_then_die  # type: ignore[method-assign]

    while True:
        delivery = box.receive(timeout=0)
        if delivery is None:
            break
        handled += 1
        if mode == "claim" and handled == stop_at:
            os.kill(os.getpid(), signal.SIGKILL)
        assert box.run_handler(effect, delivery), f"handler failed on {delivery.name}"
    box.close()
    _touch(done)


class _OverflowSeen(logging.Handler):
    """Writes a marker file when watchdog reports that the kernel's inotify queue overflowed."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            _touch(self.marker)


def overflow_receiver(
    home: str, team: str, members: str, effects: str, watching: str, overflow: str
) -> None:
    """Watch several inboxes (one process, one inotify instance), logging every message id."""
    logging.getLogger("watchdog.observers.inotify_c").addHandler(_OverflowSeen(overflow))
    layout = Layout(home)
    out = os.open(effects, APPEND, 0o600)

    def effect(message: AnyMessage) -> None:
        _append_line(out, message.id)

    def loop(box: Inbox) -> None:
        while True:
            box.process(effect)  # no timeout: woken by the watcher only

    for name in members.split(","):
        box = Inbox(Maildir.open(layout.inbox_dir(team, name)), lead="team-lead").start()
        threading.Thread(target=loop, args=(box,), daemon=True).start()
    _touch(watching)
    while True:
        signal.pause()


def counter(home: str, team: str, increments: str, log_path: str) -> None:
    """Increment the counter kept in the team file's description; log each value written."""
    teams = Teams(Layout(home))
    log = os.open(log_path, APPEND, 0o600)

    def bump(tf: TeamFile) -> TeamFile:
        return tf.model_copy(update={"description": str(int(tf.description or "0") + 1)})

    for _ in range(int(increments)):
        new = teams.update(team, bump)
        _append_line(log, new.description)


def reader(home: str, team: str, stop: str, result: str) -> None:
    """Read the team file in a loop until `stop` exists; record failures and backward steps."""
    teams = Teams(Layout(home))
    reads, last = 0, 0
    failures: list[str] = []
    backwards: list[tuple[int, int]] = []
    while not os.path.exists(stop):
        try:
            value = int(teams.read(team).description or "0")
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            continue
        reads += 1
        if value < last:
            backwards.append((last, value))
        last = value
    Path(result).write_text(
        json.dumps({"reads": reads, "failures": failures[:20], "backwards": backwards[:20]})
    )


ROLES: dict[str, Callable[..., None]] = {
    "sender": sender,
    "receiver": receiver,
    "overflow_receiver": overflow_receiver,
    "counter": counter,
    "reader": reader,
}


def _run_forked(request: dict[str, object]) -> None:
    """Body of a forked child: run the role, record any error, never return."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ROLES[str(request["role"])](*map(str, request["args"]))  # type: ignore[call-overload]
        code = 0
    except BaseException:
        Path(str(request["err"])).write_text(traceback.format_exc())
    finally:
        os._exit(code)


def zygote() -> None:
    """Fork server: one JSON request per stdin line, the child's pid per stdout line."""
    # Children are reaped by the kernel; the test watches them through pidfds.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_forked(request)
        out.write(f"{pid}\n".encode())
        out.flush()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "zygote":
        zygote()
    else:
        ROLES[role](*args)
