"""The mailbox under kill -9 and SIGSTOP: nothing accepted is lost, nothing is handled twice.

Real processes throughout: senders and receivers are forked from a pre-imported fork server
(`crash_children.py zygote`) so that hundreds of them can be started and killed in seconds;
the frozen receiver is a fresh interpreter.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.mailbox.router import send
from shoal.mailbox.schema import decode
from shoal.mailbox.store import Maildir
from shoal.teams.store import Teams
from tests.polling import wait_until
from tests.reliability.crash_children import TEXT_SIZES
from tests.reliability.crashkit import Child, Processes, process_state, read_lines

pytestmark = pytest.mark.reliability

SENDER_SLOTS = 4
SENDER_KILLS = 240
RECEIVED_MESSAGES = 300
OVERFLOW_INBOXES = 20


def _new_seed() -> int:
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"random seed {seed}")  # shown with a failure: it replays the test's random choices
    return seed


def _count_lines(path: Path) -> int:
    """Lines in an effects file (every line is a 26-character ULID and a newline)."""
    try:
        return os.stat(path).st_size // 27
    except FileNotFoundError:
        return 0


def _started_or_gone(started: Path, child: Child) -> bool:
    """The receiver wrote its `started` file, or has already exited."""
    return started.exists() or child.wait(0)


def _effects_or_gone(effects: Path, target: int, child: Child) -> bool:
    """`effects` holds at least `target` lines, or the receiver has already exited."""
    return _count_lines(effects) >= target or child.wait(0)


def _logged_or_gone(log: Path, child: Child) -> bool:
    """The sender logged at least one returned send, or has already exited."""
    return bool(read_lines(log)) or child.wait(0)


def _some(counts: dict[str, int]) -> dict[str, int]:
    """A few entries of a large mapping, for a readable failure message."""
    return dict(list(counts.items())[:5])


def test_senders_killed_mid_send_leave_only_whole_messages(
    bob_team: Teams, home: Path, procs: Processes, tmp_path: Path
) -> None:
    """4 senders at a time, each SIGKILLed 0-40 ms after its first send returns, 240 kills.

    Every send that returned (its id is in the sender's log) is in new/ exactly once; every
    file in new/ decodes (no partial message is ever visible); ids in new/ that no log names
    are allowed (killed after the link, before the log line); and the janitor clears tmp/ of
    every file the dead writers left behind.
    """
    rng = random.Random(_new_seed())
    inbox = Maildir.open(bob_team.layout.inbox_dir("t", "bob"))
    logs = tmp_path / "sent"
    logs.mkdir()
    zygote = procs.zygote()

    running: list[tuple[Child, Path]] = []
    spawned = kills = 0
    while kills < SENDER_KILLS:
        while len(running) < SENDER_SLOTS and spawned < SENDER_KILLS:
            log = logs / f"{spawned}.log"
            child = zygote.spawn("sender", home, "t", "bob", log, rng.randrange(2**32))
            spawned += 1
            running.append((child, log))
        child, log = running.pop(0)
        # The kill's clock starts at the sender's first returned send, not at its spawn: on a
        # loaded machine a fork can take longer than any fixed delay, and a sender killed before
        # it sent anything tests nothing.
        wait_until(
            functools.partial(_logged_or_gone, log, child),
            timeout=30,
            interval=0.001,
            what=f"sender {child.pid} to log its first send",
        )
        # This delay is where the kill lands (the point of the test), not a wait for a state.
        time.sleep(rng.uniform(0.0, 0.04))
        assert not child.wait(0), f"sender {child.pid} exited by itself:\n{child.error()}"
        child.kill()
        child.close()
        kills += 1

    logged = [line for log in logs.iterdir() for line in read_lines(log)]
    assert len(logged) >= SENDER_KILLS, "a sender was killed before its first send returned"
    assert len(set(logged)) == len(logged), "a send returned the same id twice"

    ids_in_new: Counter[str] = Counter()
    for name in inbox.pending():
        message = decode(inbox.read("new", name))  # a partial file would fail here
        assert message.text is not None and set(message.text) <= {"x"}, name
        assert len(message.text) in TEXT_SIZES, f"{name} holds a truncated text"
        ids_in_new[message.id] += 1
    twice = {i: n for i, n in ids_in_new.items() if n > 1}
    assert not twice, f"{len(twice)} ids delivered more than once: {_some(twice)}"
    lost = set(logged) - set(ids_in_new)
    assert not lost, f"{len(lost)} sends returned but are not in new/: {sorted(lost)[:5]}"

    left_in_tmp = os.listdir(inbox.tmp)
    assert left_in_tmp, "no kill landed inside a delivery; the test exercised nothing"
    removed = inbox.janitor(orphan_after=0)
    assert sorted(removed) == sorted(left_in_tmp)
    assert os.listdir(inbox.tmp) == [], "the janitor left dead writers' files in tmp/"
    linked = set(removed) & set(inbox.pending())  # killed between the link and the unlink
    print(
        f"{kills} kills, {len(logged)} logged sends, {len(ids_in_new)} messages in new/, "
        f"{len(removed)} orphaned tmp files removed ({len(linked)} already linked into new/)"
    )


@pytest.mark.parametrize("mode", ["claim", "handled", "random"])
def test_receiver_killed_between_claim_and_ack(
    mode: str, bob_team: Teams, home: Path, procs: Processes, tmp_path: Path
) -> None:
    """300 messages; the receiver is SIGKILLed and restarted until every message is handled.

    The effect of a message is its id appended to an effects file, then the message is acked
    (`Inbox.run_handler`: handled-log append, then unlink from cur/). Kill points:

    - claim: the receiver kills itself on its k-th message (k random in 1..12) right after the
      claim (new -> cur), before the effect. Asserted: every id's effect exactly once.
    - handled: it kills itself inside `Inbox.ack` on its k-th message, after the handled-log
      append and before the unlink. Asserted: every id's effect exactly once (the restart
      must ack it from the log without running the handler again).
    - random: the test SIGKILLs it at random points (see the loop). A kill between the
      effect and the handled-log append can legitimately apply an effect twice (they are
      separate writes; no library can make them one step for an arbitrary effect), so here
      only "at least once, nothing lost, at most one extra effect per kill" is asserted.

    In every mode the handled log ends holding each id exactly once (the handler never runs
    for a message already recorded as handled), and new/, cur/ and bad/ end empty. The
    effect is an O_APPEND write plus fsync of the effects file.
    """
    rng = random.Random(_new_seed())
    directory = bob_team.directory("t")
    sent = [
        send(directory, to="bob", sender="team-lead", text=f"m{i}").id
        for i in range(RECEIVED_MESSAGES)
    ]
    effects = tmp_path / "effects"
    zygote = procs.zygote()

    runs = kills = 0
    while True:
        runs += 1
        assert runs <= 1000, "the receiver makes no progress across restarts"
        started, done = tmp_path / f"started-{runs}", tmp_path / f"done-{runs}"
        kill_at = rng.randint(1, 12)
        child = zygote.spawn("receiver", home, "t", "bob", effects, mode, kill_at, started, done)
        if mode == "random":
            # Where the kill lands is the point of this mode: a quarter of the kills within
            # 20 ms of the start (recovery, first scan), the rest after a random number of
            # effects, polled finely enough to land anywhere in the claim/effect/ack cycle.
            target = _count_lines(effects) + rng.randint(1, 15)
            wait_until(
                functools.partial(_started_or_gone, started, child), 30, 0.002, what="a start"
            )
            if rng.random() < 0.25:
                child.wait(rng.uniform(0.0, 0.02))
            else:
                wait_until(
                    functools.partial(_effects_or_gone, effects, target, child),
                    30,
                    0.0005,
                    what=f"{target} effects",
                )
                child.wait(rng.uniform(0.0, 0.001))  # jitter: anywhere in the next cycle
            if not child.wait(0):
                child.kill()
                kills += 1
        else:
            assert child.wait(60), f"receiver {child.pid} neither finished nor killed itself"
        child.close()
        assert not child.error(), child.error()
        if done.exists():
            break
    if mode != "random":
        kills = runs - 1

    counts = Counter(read_lines(effects))
    assert set(counts) - set(sent) == set(), "effects of messages never sent"
    lost = set(sent) - set(counts)
    assert not lost, f"{len(lost)} messages never handled (kills: {kills})"
    extra = {i: n for i, n in counts.items() if n > 1}
    assert kills >= 10, f"only {kills} kills happened; the test did not exercise crashes"
    if mode == "random":
        assert sum(n - 1 for n in extra.values()) <= kills
    else:
        assert not extra, f"{len(extra)} effects applied twice after {kills} kills: {_some(extra)}"

    box = Maildir.open(bob_team.layout.inbox_dir("t", "bob"))
    # The handler never runs for a message already recorded as handled: even the repeats of
    # the random mode are ids the log holds once (killed between effect and log append).
    assert Counter(read_lines(box.handled_log)) == Counter(sent)
    assert box.pending() == []
    assert box.claimed() == []
    assert os.listdir(box.bad) == []
    print(f"{mode}: {runs} runs, {kills} kills, {sum(n - 1 for n in extra.values())} repeats")


def test_receiver_frozen_through_inotify_overflow_gets_everything(
    home: Path, procs: Processes, tmp_path: Path
) -> None:
    """A receiver is SIGSTOPped while more messages arrive than its inotify queue can hold.

    One receiver process watches 20 inboxes through its one inotify instance (one kernel
    queue of `fs.inotify.max_queued_events` events) and handles each with
    `Inbox.process()` without a timeout, so only its watcher can wake it. It proves it is
    watching by handling a warm-up message per inbox; then it is stopped. The test delivers
    max_queued_events + 2000 messages across 19 inboxes (each delivery is at least one event,
    so the queue overflows; the receiver records watchdog's overflow report and the test
    asserts it came), then 200 more to the 20th inbox, whose events are therefore all
    dropped: only the overflow handling or the reconcile scan can find them. After SIGCONT
    every message is handled, none twice, and every inbox ends empty.

    The flood is spread over 19 inboxes rather than sent to one because draining a single
    inbox with a backlog of n costs O(n^2) in `Inbox.receive` (every call lists, sorts and
    re-walks all of new/): ~18k messages in one inbox take about four minutes.
    """
    layout = Layout(home)
    teams = Teams(layout)
    teams.create("t")
    members = [f"m{i:02d}" for i in range(OVERFLOW_INBOXES)]
    for name in members:
        teams.join("t", name, pid=os.getpid())
    flooded, late = members[:-1], members[-1]
    queue = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    flood = queue + 2000

    effects = tmp_path / "effects"
    watching = tmp_path / "watching"
    overflow = tmp_path / "overflow"
    receiver = procs.start(
        "overflow_receiver", home, "t", ",".join(members), effects, watching, overflow
    )
    wait_until(
        lambda: watching.exists() or receiver.poll() is not None, 60, 0.02, what="receiver to watch"
    )
    assert receiver.poll() is None, procs.stderr_of(receiver)

    directory = teams.directory("t")
    warm_up = {send(directory, to=name, sender="team-lead", text="warm-up").id for name in members}
    wait_until(lambda: set(read_lines(effects)) == warm_up, 60, 0.02, what="warm-up messages")

    receiver.send_signal(signal.SIGSTOP)
    wait_until(lambda: process_state(receiver.pid) == "T", 10, 0.02, what="receiver to stop")
    sent = [
        send(directory, to=flooded[i % len(flooded)], sender="team-lead", text=f"n{i}").id
        for i in range(flood)
    ]
    sent += [send(directory, to=late, sender="team-lead", text=f"late{i}").id for i in range(200)]
    assert len(read_lines(effects)) == len(warm_up), "a stopped receiver handled messages"
    receiver.send_signal(signal.SIGCONT)

    expected = len(warm_up) + len(sent)
    started = time.monotonic()
    wait_until(
        lambda: len(read_lines(effects)) >= expected or receiver.poll() is not None,
        180,
        interval=0.2,
        what=f"{expected} effects",
    )
    assert receiver.poll() is None, procs.stderr_of(receiver)
    drained = time.monotonic() - started

    boxes = [Maildir.open(layout.inbox_dir("t", name)) for name in members]
    wait_until(
        lambda: all(not b.pending() and not b.claimed() for b in boxes),
        30,
        0.02,
        what="empty inboxes",
    )
    counts = Counter(read_lines(effects))
    assert set(counts) == warm_up | set(sent)
    twice = {i: n for i, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} handled more than once: {_some(twice)}"
    assert all(os.listdir(b.bad) == [] for b in boxes)
    assert overflow.exists(), (
        f"the inotify queue ({queue} events) never overflowed, so this test proved nothing; "
        "send more messages"
    )
    print(f"{len(sent)} messages drained in {drained:.1f}s after SIGCONT")
