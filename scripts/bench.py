"""shoal's side-by-side benchmark: shoal beside baselines measured in the same run.

Run it from the repository root::

    python scripts/bench.py                 # every section, full size (a few minutes)
    python scripts/bench.py --quick         # smaller runs (well under a minute a section)
    python scripts/bench.py --only mailbox  # some sections only (comma-separated)
    python scripts/bench.py --json out.json # also write the results as JSON
    python scripts/bench.py --list          # the sections there are

Each section prints one table: measurement, shoal, baseline, ratio (shoal/baseline, with the
direction that is better), target, and PASS/MISS against the target. The machine may be shared
and noisy, so every ratio compares numbers taken in the same run, and throughput trials are
repeated (best of N, shoal and baseline alternating).

Everything runs in a temporary SHOAL_HOME with real processes (multiprocessing's forkserver:
each child is a fork of a clean single-threaded server that has imported shoal). CPU time per
message (all threads of a process) is reported beside wall-clock rates, since it is much less
disturbed by other load on the machine. Set SHOAL_BENCH_PROFILE=DIR to run every child
under cProfile and dump `DIR/{function}-{pid}.prof` files for `python -m pstats` (or run the
whole thing under `py-spy record --subprocesses`). A throughput trial stops timing after
`--cap` seconds; what is left on disk then is counted as unhandled, not lost.

Adding a section: write `def my_section(cfg: Config) -> SectionResult` and decorate it with
`@section("name", "title")`; it then shows up in `--list` and `--only`.
"""

# shoal ships no py.typed marker yet, so a bare `mypy scripts/bench.py` (which finds shoal through
# the editable install) would refuse to analyse it; with `mypy` (files = src, scripts) or
# MYPYPATH=src the shoal imports are fully type-checked.
from __future__ import annotations

import argparse
import contextlib
import cProfile
import fcntl
import functools
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from shoal.mailbox.schema import AnyMessage

# Children come from a fork server that has imported shoal already: every child is a fresh fork
# of a clean, single-threaded process (no inherited watcher threads or locks), without paying
# for a new interpreter and the imports each time. Baseline children run no shoal code.
CTX = mp.get_context("forkserver")
PRELOAD = [
    "__main__",
    "shoal.mailbox.inbox",
    "shoal.mailbox.router",
    "shoal.teams.store",
    "json",
    "fcntl",
]
TEAM_LEAD = "team-lead"
RECEIVER = "bob"
PROFILE_ENV = "SHOAL_BENCH_PROFILE"

Better = Literal["lower", "higher"]


class BenchError(RuntimeError):
    """A benchmark could not run (a child died, timed out, or misbehaved)."""


# ------------------------------------------------------------------------------------------
# results and the section registry
# ------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One measurement: shoal's value beside the baseline's, and the target it is held to.

    `passed` is None when the row has no target (informational).
    """

    measurement: str
    unit: str
    shoal: float | None
    baseline: float | None
    better: Better
    target: str = "-"
    passed: bool | None = None

    @property
    def ratio(self) -> float | None:
        if self.shoal is None or self.baseline is None or self.baseline == 0:
            return None
        return self.shoal / self.baseline

    def to_json(self) -> dict[str, Any]:
        return {
            "measurement": self.measurement,
            "unit": self.unit,
            "shoal": self.shoal,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "better": self.better,
            "target": self.target,
            "result": result_word(self.passed),
        }


@dataclass
class SectionResult:
    """What a section returns: its rows, and footnotes (what the baseline is, findings)."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Config:
    """Run-wide settings handed to every section."""

    quick: bool
    workdir: Path
    repeats: int  # trials of each throughput measurement (best is reported)
    cap_s: float  # a throughput trial stops timing after this long (the rest counted, not lost)

    @property
    def home(self) -> Path:
        """This section's SHOAL_HOME (also in the environment while the section runs)."""
        return self.workdir / "home"


SectionFn = Callable[[Config], SectionResult]


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: SectionFn


SECTIONS: dict[str, Section] = {}


def section(name: str, title: str) -> Callable[[SectionFn], SectionFn]:
    """Register a benchmark section under `name` (used by --only and --list)."""

    def register(fn: SectionFn) -> SectionFn:
        if name in SECTIONS:
            raise ValueError(f"section {name!r} registered twice")
        SECTIONS[name] = Section(name, title, fn)
        return fn

    return register


def result_word(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "MISS")


# ------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.3f} ms"
    if unit == "us":
        return f"{value:.1f} us"
    if unit in ("msg/s", "upd/s"):
        return f"{value:,.0f} {unit}"
    if unit == "count":
        return f"{value:.0f}"
    return f"{value:.3g} {unit}"


def fmt_ratio(row: Row) -> str:
    ratio = row.ratio
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x ({row.better} better)"


def render_table(title: str, result: SectionResult) -> str:
    header = ("measurement", "shoal", "baseline", "ratio shoal/baseline", "target", "result")
    body = [
        (
            r.measurement,
            fmt_value(r.shoal, r.unit),
            fmt_value(r.baseline, r.unit),
            fmt_ratio(r),
            r.target,
            result_word(r.passed),
        )
        for r in result.rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    right = {1, 2, 3}

    def line(cells: Sequence[str]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    out = [f"== {title} ==", line(header), rule, *(line(b) for b in body)]
    out.extend(f"  * {note}" for note in result.notes)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------
# child processes
# ------------------------------------------------------------------------------------------

ChildFn = Callable[..., None]


def _child_entry(fn: ChildFn, args: tuple[Any, ...], conn: Connection) -> None:
    """Trampoline run in every child: optionally under cProfile (SHOAL_BENCH_PROFILE=DIR)."""
    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        fn(*args, conn)
        return
    prof = cProfile.Profile()
    try:
        prof.runcall(fn, *args, conn)
    finally:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(os.path.join(profile_dir, f"{fn.__name__}-{os.getpid()}.prof"))


@dataclass
class Child:
    """A child process and the parent's end of its duplex pipe."""

    name: str
    proc: BaseProcess
    conn: Connection

    def expect(self, timeout: float) -> Any:
        """The next object the child sends; BenchError if it dies or stays silent."""
        if not self.conn.poll(timeout):
            raise BenchError(f"{self.name}: no answer within {timeout:.0f}s")
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise BenchError(f"{self.name}: exited early (code {self.proc.exitcode})") from None

    def finish(self, timeout: float = 30.0) -> None:
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            raise BenchError(f"{self.name}: did not exit; killed")
        self.conn.close()


def spawn(fn: ChildFn, *args: Any) -> Child:
    """Start `fn(*args, conn)` in a fresh interpreter; `conn` is the child's pipe end."""
    parent, child = CTX.Pipe(duplex=True)
    proc = CTX.Process(target=_child_entry, args=(fn, args, child), daemon=True, name=fn.__name__)
    proc.start()
    child.close()
    return Child(fn.__name__, proc, parent)


@contextlib.contextmanager
def children() -> Iterator[list[Child]]:
    """Collects children and kills any still alive on the way out (errors included)."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for c in started:
            if c.proc.is_alive():
                c.proc.kill()
                c.proc.join(5)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    rank = math.ceil(pct / 100.0 * len(sorted_values) - 1e-9)
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def paced(n: int, rate: float) -> Iterator[int]:
    """Yield 0..n-1 at `rate` per second (open loop: a late sender catches up, no drift)."""
    interval = 1.0 / rate
    start = time.perf_counter()
    for i in range(n):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


# ------------------------------------------------------------------------------------------
# mailbox section: shoal side (children import shoal lazily so baselines run no shoal code)
# ------------------------------------------------------------------------------------------


def make_team(home: Path, team: str) -> Path:
    """Create `team` with member `bob` under `home`; returns bob's inbox directory."""
    from shoal.core.paths import Layout
    from shoal.teams.store import Teams

    layout = Layout(home)
    teams = Teams(layout)
    teams.create(team)
    teams.join(team, RECEIVER, pid=os.getpid())
    inbox: Path = layout.inbox_dir(team, RECEIVER)
    return inbox


def shoal_fill(inbox: Path, seqs: range, durable: bool = False) -> None:
    """Deliver one message per seq into `inbox` from this process (make_message + deliver)."""
    from shoal.mailbox.router import make_message
    from shoal.mailbox.schema import encode
    from shoal.mailbox.store import Maildir

    maildir = Maildir.open(inbox)
    for i in seqs:
        maildir.deliver(encode(make_message(sender=TEAM_LEAD, to=RECEIVER, data={"seq": i})),
                        durable=durable)  # fmt: skip


def _extra(message: AnyMessage) -> dict[str, Any]:
    return message.data.model_extra or {}


# Children do not close their Inbox: the process exits right after, and unscheduling while the
# watchdog emitter thread is mid-read can make watchdog log a spurious error line.


def shoal_latency_receiver(home: str, team: str, poll: bool, conn: Connection) -> None:
    """Handle messages with `Inbox.process`, recording receipt time - send time per message
    (`poll`: as a member that could get no inotify instance, i.e. SHOAL_WATCHER=poll)."""
    if poll:
        os.environ["SHOAL_WATCHER"] = "poll"
    from shoal.core.paths import Layout
    from shoal.mailbox.inbox import Inbox
    from shoal.mailbox.store import Maildir

    layout = Layout(home)
    inbox = Inbox(
        Maildir.open(layout.inbox_dir(team, RECEIVER)), lead=TEAM_LEAD, durable=False
    ).start()
    latencies: dict[str, list[tuple[int, int]]] = {}
    stop = False

    def handler(message: AnyMessage) -> None:
        nonlocal stop
        now = time.time_ns()
        extra = _extra(message)
        if extra.get("stop"):
            stop = True
            return
        phase = str(extra["phase"])
        latencies.setdefault(phase, []).append((int(extra["seq"]), now - int(extra["t"])))
        if phase == "ping":
            conn.send(("pong", now - int(extra["t"])))

    conn.send(("ready", inbox.watcher_mode))
    cpu = time.process_time()  # all threads of this process (watcher threads included)
    handled = 0
    deadline = time.monotonic() + 600
    while not stop and time.monotonic() < deadline:
        handled += inbox.process(handler, timeout=1.0) is not None
    cpu_us = (time.process_time() - cpu) / max(handled, 1) * 1e6
    conn.send(("done", latencies, inbox.quarantined, cpu_us))


def shoal_sender(
    home: str, team: str, n: int, mode: str, durable: bool, go: MpEvent, conn: Connection
) -> None:
    """Send `n` messages to bob as fast as possible, via `send()` or make_message+deliver."""
    from shoal.core.paths import Layout
    from shoal.mailbox.router import make_message, send
    from shoal.mailbox.schema import encode
    from shoal.mailbox.store import Maildir
    from shoal.teams.store import Teams

    layout = Layout(home)
    directory = Teams(layout).directory(team)  # resolved once
    maildir = Maildir.open(layout.inbox_dir(team, RECEIVER))  # opened once
    conn.send("ready")
    go.wait()
    start, cpu = time.monotonic(), time.process_time()
    if mode == "send":
        for i in range(n):
            send(directory, to=RECEIVER, sender=TEAM_LEAD, data={"seq": i}, durable=durable)
    else:
        for i in range(n):
            msg = make_message(sender=TEAM_LEAD, to=RECEIVER, data={"seq": i})
            maildir.deliver(encode(msg), durable=durable)
    conn.send((time.monotonic() - start, (time.process_time() - cpu) / n * 1e6))


def shoal_receiver(
    home: str, team: str, n: int, durable: bool, cap_s: float, go: MpEvent, conn: Connection
) -> None:
    """Handle (and ack) up to `n` messages with `Inbox.process` within `cap_s` of the go.

    Reports the time of the last ack, the seqs handled, and how many files are still on disk.
    """
    from shoal.core.paths import Layout
    from shoal.mailbox.inbox import Inbox
    from shoal.mailbox.store import Maildir

    layout = Layout(home)
    maildir = Maildir.open(layout.inbox_dir(team, RECEIVER))
    inbox = Inbox(maildir, lead=TEAM_LEAD, durable=durable).start()
    seen: set[int] = set()
    handled = 0

    def handler(message: AnyMessage) -> None:
        seen.add(int(_extra(message)["seq"]))

    # The parent left one warm-up message (seq -1): handling it proves the inbox works.
    if inbox.process(handler, timeout=30) is None:
        raise BenchError("warm-up message never arrived")
    seen.clear()
    conn.send(("ready", inbox.watcher_mode))
    go.wait()
    cpu = time.process_time()  # all threads of this process (watcher threads included)
    deadline = time.monotonic() + cap_s
    end = time.monotonic()
    while handled < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if inbox.process(handler, timeout=min(remaining, 5.0)) is not None:
            handled += 1
            end = time.monotonic()
    cpu_us = (time.process_time() - cpu) / max(handled, 1) * 1e6
    conn.send(("done", end, sorted(seen), handled, cpu_us))


def shoal_team_updater(home: str, team: str, k: int, go: MpEvent, conn: Connection) -> None:
    """One warm-up and then `k` timed increments of the team description via `Teams.update`."""
    from shoal.core.paths import Layout
    from shoal.teams.models import TeamFile
    from shoal.teams.store import Teams

    teams = Teams(Layout(home))

    def bump(tf: TeamFile) -> TeamFile:
        return tf.model_copy(update={"description": str(int(tf.description or 0) + 1)})

    teams.update(team, bump)
    conn.send("ready")
    go.wait()
    waits = []
    for _ in range(k):
        t = time.monotonic()
        teams.update(team, bump)
        waits.append(time.monotonic() - t)
    conn.send((time.monotonic(), waits))


# ------------------------------------------------------------------------------------------
# mailbox section: baselines (plain Python, no shoal code)
# ------------------------------------------------------------------------------------------


def pipe_latency_receiver(conn: Connection) -> None:
    """One-way multiprocessing.Pipe: record receipt time - send time of each object."""
    latencies: list[tuple[int, int]] = []
    conn.send(("ready", "pipe"))
    cpu = time.process_time()
    handled = 0
    while True:
        obj = conn.recv()
        now = time.time_ns()
        if obj is None:
            break
        handled += 1
        if obj["seq"] >= 0:
            latencies.append((obj["seq"], now - obj["t"]))
    cpu_us = (time.process_time() - cpu) / max(handled, 1) * 1e6
    conn.send(("done", latencies, cpu_us))


def make_bare_maildir(root: Path) -> Path:
    for sub in ("tmp", "new", "cur"):
        (root / sub).mkdir(parents=True, mode=0o700)
    return root


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_HOST = socket.gethostname()
_bare_seq = 0


def bare_deliver(root: str, data: dict[str, Any], durable: bool = False) -> None:
    """Deliver one message file with the maildir syscalls and nothing else: O_EXCL in tmp/,
    write, (fsync), close, link into new/, unlink tmp/, (fsync new/). The body is built with
    the json module in the on-disk message format, so shoal's reader accepts it too."""
    global _bare_seq
    _bare_seq += 1
    name = f"{time.time_ns()}.{os.getpid()}_{_bare_seq}.{_HOST}"
    body = {
        "v": 1, "id": f"{os.getpid()}-{_bare_seq:020d}", "from": TEAM_LEAD, "to": RECEIVER,
        "kind": "text", "sent_at": "2026-01-01T00:00:00.000000Z", "text": None,
        "summary": None, "data": data, "reply_to": None,
    }  # fmt: skip
    raw = json.dumps(body).encode()
    tmp_path = os.path.join(root, "tmp", name)
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.write(fd, raw)
    if durable:
        os.fsync(fd)
    os.close(fd)
    new = os.path.join(root, "new")
    os.link(tmp_path, os.path.join(new, name))
    os.unlink(tmp_path)
    if durable:
        _fsync_dir(new)


def bare_fill(root: str, seqs: range, durable: bool = False) -> None:
    """The maildir delivery syscalls in a bare loop (see bare_deliver)."""
    for i in seqs:
        bare_deliver(root, {"seq": i}, durable)


def bare_sender(root: str, n: int, durable: bool, go: MpEvent, conn: Connection) -> None:
    conn.send("ready")
    go.wait()
    start, cpu = time.monotonic(), time.process_time()
    bare_fill(root, range(n), durable)
    conn.send((time.monotonic() - start, (time.process_time() - cpu) / n * 1e6))


def bare_receiver(
    root: str, n: int, durable: bool, cap_s: float, go: MpEvent, conn: Connection
) -> None:
    """The maildir receive syscalls in a bare loop: listdir new/, read, rename to cur/, log, unlink.

    An empty new/ is polled again after 0.5 ms (no inotify: the simplest thing that works).
    """
    new, cur = os.path.join(root, "new"), os.path.join(root, "cur")
    log = os.path.join(root, "handled.log")
    seen: set[int] = set()
    handled = 0
    conn.send(("ready", "listdir poll 0.5 ms"))
    go.wait()
    cpu = time.process_time()
    deadline = time.monotonic() + cap_s
    end = time.monotonic()
    while handled < n and time.monotonic() < deadline:
        names = os.listdir(new)
        if not names:
            time.sleep(0.0005)
            continue
        names.sort()
        for name in names:
            src = os.path.join(new, name)
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                raw = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
            obj = json.loads(raw)
            dst = os.path.join(cur, name)
            os.rename(src, dst)
            lfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(lfd, obj["id"].encode() + b"\n")
                if durable:
                    os.fsync(lfd)
            finally:
                os.close(lfd)
            os.unlink(dst)
            seen.add(obj["data"]["seq"])
            handled += 1
            end = time.monotonic()
    cpu_us = (time.process_time() - cpu) / max(handled, 1) * 1e6
    conn.send(("done", end, sorted(seen), handled, cpu_us))


def json_flock_updater(path: str, k: int, go: MpEvent, conn: Connection) -> None:
    """Read-modify-write of a plain JSON file under fcntl.flock, written by os.replace."""
    lock_path = path + ".lock"
    tmp = f"{path}.{os.getpid()}.tmp"

    def bump() -> None:
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(path, "rb") as fh:
                    doc = json.load(fh)
                doc["description"] = str(int(doc["description"] or 0) + 1)
                with open(tmp, "w") as fh:
                    json.dump(doc, fh, indent=2)
                os.replace(tmp, path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    bump()
    conn.send("ready")
    go.wait()
    waits = []
    for _ in range(k):
        t = time.monotonic()
        bump()
        waits.append(time.monotonic() - t)
    conn.send((time.monotonic(), waits))


# ------------------------------------------------------------------------------------------
# mailbox section: the measurements
# ------------------------------------------------------------------------------------------


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    lost: int
    count: int
    call_p50_ms: float  # how long the sender's call itself took (part of the latency)


def summarize_latency(samples: list[tuple[int, int]], n: int, calls: list[int]) -> Latency:
    got = {seq for seq, _ in samples}
    lost = len(set(range(n)) - got) + max(0, len(samples) - len(got))  # duplicates count too
    values = sorted(ns / 1e6 for _, ns in samples)
    call = percentile(sorted(ns / 1e6 for ns in calls), 50)
    return Latency(percentile(values, 50), percentile(values, 99), lost, len(samples), call)


LATENCY_PHASES = ("send", "deliver", "bare")


def shoal_idle_member(home: str, team: str, seconds: float, poll: bool, conn: Connection) -> None:
    """A member's inbox started and then idle for `seconds`: the CPU (all threads) it used."""
    if poll:
        os.environ["SHOAL_WATCHER"] = "poll"
    from shoal.core.paths import Layout
    from shoal.mailbox.inbox import Inbox
    from shoal.mailbox.store import Maildir

    inbox = Inbox(
        Maildir.open(Layout(home).inbox_dir(team, RECEIVER)), lead=TEAM_LEAD, durable=False
    ).start()
    time.sleep(1.0)  # (start-up settles)
    cpu = time.process_time()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        inbox.process(lambda m: None, timeout=left)
    conn.send(("done", inbox.watcher_mode, time.process_time() - cpu))


def measure_idle_member(home: Path, seconds: float, poll: bool) -> tuple[str, float]:
    """(watcher mode, CPU %) of one idle member's process."""
    team = "idle-poll" if poll else "idle-inotify"
    make_team(home, team)
    with children() as kids:
        rx = spawn(shoal_idle_member, str(home), team, seconds, poll)
        kids.append(rx)
        _, mode, cpu = rx.expect(seconds + 60)
        rx.finish()
    return mode, cpu / seconds * 100


def measure_shoal_latency(
    home: Path, n: int, rate: float, warmup: int, poll: bool = False
) -> dict[str, Any]:
    """Paced sends from this process to a receiver process, round robin: `send()`,
    make_message+deliver, and a bare-syscall delivery (no shoal on the sending side)."""
    from shoal.core.paths import Layout
    from shoal.mailbox.router import make_message, send
    from shoal.mailbox.schema import encode
    from shoal.mailbox.store import Maildir
    from shoal.teams.store import Teams

    team = "lat-poll" if poll else "lat"
    inbox_dir = make_team(home, team)
    directory = Teams(Layout(home)).directory(team)  # resolved once
    maildir = Maildir.open(inbox_dir)
    with children() as kids:
        rx = spawn(shoal_latency_receiver, str(home), team, poll)
        kids.append(rx)
        _, mode = rx.expect(60)
        ping = {"phase": "ping", "seq": 0, "t": time.time_ns()}
        send(directory, to=RECEIVER, sender=TEAM_LEAD, data=ping)
        _, ping_ns = rx.expect(10)
        for i in paced(warmup, rate):
            warm = {"phase": "warm", "seq": i, "t": time.time_ns()}
            send(directory, to=RECEIVER, sender=TEAM_LEAD, data=warm)
        # The ways of sending take turns message by message, so all see the same noise.
        calls: dict[str, list[int]] = {p: [] for p in LATENCY_PHASES}
        for i in paced(len(LATENCY_PHASES) * n, rate):
            phase = LATENCY_PHASES[i % len(LATENCY_PHASES)]
            t = time.time_ns()
            data = {"phase": phase, "seq": i // len(LATENCY_PHASES), "t": t}
            if phase == "send":
                send(directory, to=RECEIVER, sender=TEAM_LEAD, text="latency", data=data)
            elif phase == "deliver":
                msg = make_message(sender=TEAM_LEAD, to=RECEIVER, text="latency", data=data)
                maildir.deliver(encode(msg))
            else:
                bare_deliver(str(inbox_dir), data)
            calls[phase].append(time.time_ns() - t)
        send(directory, to=RECEIVER, sender=TEAM_LEAD, data={"stop": True})
        _, lat, quarantined, cpu_us = rx.expect(120)
        rx.finish()
    out: dict[str, Any] = {
        "mode": mode,
        "ping_ms": ping_ns / 1e6,
        "quarantined": quarantined,
        "rx_cpu_us": cpu_us,
    }
    for phase in LATENCY_PHASES:
        out[phase] = summarize_latency(lat.get(phase, []), n, calls[phase])
    return out


def measure_pipe_latency(n: int, rate: float, warmup: int) -> tuple[Latency, float]:
    """The baseline: a one-way Pipe at the same pace; also the child's CPU us per message."""
    with children() as kids:
        rx = spawn(pipe_latency_receiver)
        kids.append(rx)
        rx.expect(60)
        for i in paced(warmup, rate):
            rx.conn.send({"seq": -1 - i, "t": time.time_ns()})
        calls = []
        for i in paced(n, rate):
            t = time.time_ns()
            rx.conn.send({"seq": i, "t": t})
            calls.append(time.time_ns() - t)
        rx.conn.send(None)
        _, lat, cpu_us = rx.expect(60)
        rx.finish()
    return summarize_latency(lat, n, calls), float(cpu_us)


@dataclass
class Throughput:
    rate: float  # handled and acked per second, from the go to the last ack
    sender_rate: float | None  # sends per second in the sender alone (None: no sender)
    lost: int  # neither handled nor still on disk, or handled twice
    unhandled: int  # still on disk when the time cap ran out (not lost)
    receiver_mode: str
    receiver_cpu_us: float  # CPU time (all threads) of the receiver process per message
    sender_cpu_us: float | None  # CPU time of the sender process per message


def leftover(root: Path) -> tuple[list[int], int]:
    """Seqs of the message files still waiting in a maildir's new/ and cur/ (read with the json
    module), and how many files went to bad/."""
    waiting = []
    for sub in ("new", "cur"):
        for name in os.listdir(root / sub):
            if not name.startswith("."):
                with open(root / sub / name, "rb") as fh:
                    waiting.append(int(json.load(fh)["data"]["seq"]))
    try:
        bad = sum(1 for name in os.listdir(root / "bad") if not name.endswith(".error"))
    except FileNotFoundError:
        bad = 0
    return waiting, bad


def _receiver_result(rx: Child, n: int, t0: float, root: Path) -> tuple[float, int, int, float]:
    """(rate, lost, unhandled, cpu us/msg) from a receiver's report and what is left on disk.

    Call once nothing sends any more. Lost: a seq neither handled nor waiting on disk, handled
    twice, handled and still waiting, or quarantined in bad/. Unhandled: still waiting (the
    receiver ran out of time).
    """
    _, end, seen, handled, cpu_us = rx.expect(900)
    left, bad = leftover(root)
    want = set(range(n))
    unique = set(seen) & want
    lost = len(want - unique - set(left)) + (handled - len(unique)) + len(unique & set(left))
    lost += bad
    rate = handled / (end - t0) if end > t0 else 0.0
    return rate, lost, len(left), float(cpu_us)


def run_pair(
    sender: tuple[ChildFn, tuple[Any, ...]],
    receiver: tuple[ChildFn, tuple[Any, ...]],
    n: int,
    root: Path,
    prepare: Callable[[], None] | None = None,
) -> Throughput:
    """Start a receiver and a sender process, release both at once, time n deliveries+acks
    into the maildir at `root`."""
    go = CTX.Event()
    with children() as kids:
        rx = spawn(receiver[0], *receiver[1], go)
        kids.append(rx)
        if prepare is not None:
            prepare()
        tx = spawn(sender[0], *sender[1], go)
        kids.append(tx)
        _, mode = rx.expect(60)
        tx.expect(60)
        time.sleep(0.1)  # let both settle into their wait
        t0 = time.monotonic()
        go.set()
        send_elapsed, send_cpu = tx.expect(900)
        rate, lost, left, rx_cpu = _receiver_result(rx, n, t0, root)
        tx.finish()
        rx.finish()
    return Throughput(rate, n / send_elapsed, lost, left, mode, rx_cpu, send_cpu)


def run_drain(
    receiver: tuple[ChildFn, tuple[Any, ...]],
    n: int,
    root: Path,
    fill: Callable[[], None],
    prepare: Callable[[], None] | None = None,
) -> Throughput:
    """Start a receiver, fill its maildir at `root` with n messages, time how fast it drains."""
    go = CTX.Event()
    with children() as kids:
        rx = spawn(receiver[0], *receiver[1], go)
        kids.append(rx)
        if prepare is not None:
            prepare()
        _, mode = rx.expect(60)
        fill()
        time.sleep(0.1)
        t0 = time.monotonic()
        go.set()
        rate, lost, left, rx_cpu = _receiver_result(rx, n, t0, root)
        rx.finish()
    return Throughput(rate, None, lost, left, mode, rx_cpu, None)


VARIANTS = ("send", "deliver", "bare")


def measure_throughput(cfg: Config, tag: str, n: int, durable: bool) -> dict[str, list[Throughput]]:
    """shoal `send()`, make_message+deliver and the bare loop, alternating, cfg.repeats times."""
    home = cfg.home
    out: dict[str, list[Throughput]] = {v: [] for v in VARIANTS}
    for rep in range(cfg.repeats):
        for variant in VARIANTS:
            if variant == "bare":
                root = make_bare_maildir(cfg.workdir / f"bare-{tag}-{rep}")
                out["bare"].append(
                    run_pair(
                        (bare_sender, (str(root), n, durable)),
                        (bare_receiver, (str(root), n, durable, cfg.cap_s)),
                        n,
                        root,
                    )
                )
                continue
            team = f"tp-{tag}-{variant}-{rep}"
            inbox = make_team(home, team)
            out[variant].append(
                run_pair(
                    (shoal_sender, (str(home), team, n, variant, durable)),
                    (shoal_receiver, (str(home), team, n, durable, cfg.cap_s)),
                    n,
                    inbox,
                    prepare=functools.partial(shoal_fill, inbox, range(-1, 0)),
                )
            )
    return out


def measure_drain(cfg: Config, n: int) -> dict[str, Throughput]:
    """Receiver alone draining a backlog of n messages: shoal Inbox.process vs the bare loop."""
    home = cfg.home
    inbox = make_team(home, "drain")
    root = make_bare_maildir(cfg.workdir / "bare-drain")
    shoal = run_drain(
        (shoal_receiver, (str(home), "drain", n, False, cfg.cap_s)),
        n,
        inbox,
        fill=lambda: shoal_fill(inbox, range(n)),
        prepare=lambda: shoal_fill(inbox, range(-1, 0)),
    )
    bare = run_drain(
        (bare_receiver, (str(root), n, False, cfg.cap_s)),
        n,
        root,
        fill=lambda: bare_fill(str(root), range(n)),
    )
    return {"shoal": shoal, "bare": bare}


@dataclass
class Updates:
    rate: float
    final: int
    p99_wait_ms: float
    max_wait_ms: float


def measure_team_updates(cfg: Config, procs: int, k: int) -> dict[str, Updates]:
    """`procs` processes x `k` increments: shoal Teams.update vs flock + json + os.replace."""
    from shoal.core.paths import Layout
    from shoal.teams.store import Teams

    home = cfg.home
    team = "upd"
    teams = Teams(Layout(home))
    teams.create(team, description="0")
    plain = cfg.workdir / "plain-team.json"
    plain.write_bytes(teams.layout.team_file(team).read_bytes())  # same document, same size
    plain.chmod(0o600)

    def run(fn: ChildFn, args: tuple[Any, ...]) -> tuple[float, list[float]]:
        go = CTX.Event()
        with children() as kids:
            for _ in range(procs):
                kids.append(spawn(fn, *args, go))
            for c in kids:
                c.expect(60)
            time.sleep(0.1)
            t0 = time.monotonic()
            go.set()
            results = [c.expect(600) for c in kids]
            for c in kids:
                c.finish()
        end = max(float(r[0]) for r in results)
        waits = sorted(w * 1e3 for r in results for w in r[1])
        return procs * k / (end - t0), waits

    s_rate, s_waits = run(shoal_team_updater, (str(home), team, k))
    b_rate, b_waits = run(json_flock_updater, (str(plain), k))
    with open(plain, "rb") as fh:
        b_final = int(json.load(fh)["description"])
    return {
        "shoal": Updates(s_rate, int(teams.read(team).description), percentile(s_waits, 99),
                         s_waits[-1]),
        "baseline": Updates(b_rate, b_final, percentile(b_waits, 99), b_waits[-1]),
    }  # fmt: skip


def best(trials: list[Throughput]) -> Throughput:
    return max(trials, key=lambda t: t.rate)


def min_cpu(trials: list[Throughput], sender: bool = False) -> float | None:
    """The lowest CPU us/msg over trials (of the sender, or of the receiver)."""
    values = [t.sender_cpu_us if sender else t.receiver_cpu_us for t in trials]
    present = [v for v in values if v is not None]
    return min(present) if present else None


@section("mailbox", "mailbox: maildir latency, throughput and team-file updates")
def mailbox_section(cfg: Config) -> SectionResult:
    res = SectionResult()
    rows, notes = res.rows, res.notes
    home = cfg.home
    lower = "make_message+deliver [lower-level]"

    # 1. send -> handler latency at a fixed pace, against a one-way Pipe
    rate, n_lat, warmup = 500.0, (600 if cfg.quick else 2000), 50
    lat = measure_shoal_latency(home, n_lat, rate, warmup)
    pipe, pipe_cpu_us = measure_pipe_latency(n_lat, rate, warmup)
    for key, label in (("send", "send()"), ("deliver", lower)):
        s: Latency = lat[key]
        rows.append(Row(f"latency p50 @{rate:.0f}/s, {label}", "ms", s.p50_ms, pipe.p50_ms,
                        "lower", "<= 1 ms", s.p50_ms <= 1.0))  # fmt: skip
        rows.append(Row(f"latency p99 @{rate:.0f}/s, {label}", "ms", s.p99_ms, pipe.p99_ms,
                        "lower", "<= 10 ms", s.p99_ms <= 10.0))  # fmt: skip
    bare_lat: Latency = lat["bare"]
    rows.append(Row("  [info] latency p50, bare-syscall file -> shoal Inbox", "ms",
                    bare_lat.p50_ms, pipe.p50_ms, "lower"))  # fmt: skip
    for key, label in (("send", "send()"), ("deliver", "make_message+deliver")):
        rows.append(Row(f"  [info] sender-side call p50, {label} vs bare syscalls", "ms",
                        lat[key].call_p50_ms, bare_lat.call_p50_ms, "lower"))  # fmt: skip
    rows.append(Row("  [info] receiver CPU per message, shoal Inbox vs Pipe child", "us",
                    lat["rx_cpu_us"], pipe_cpu_us, "lower"))  # fmt: skip
    lat_lost = sum(lat[p].lost for p in LATENCY_PHASES) + lat["quarantined"]
    total = len(LATENCY_PHASES) * n_lat
    rows.append(Row(f"lost, latency runs ({total} msgs)", "count", lat_lost, pipe.lost,
                    "lower", "== 0", lat_lost == 0))  # fmt: skip
    notes.append(
        f"latency: {n_lat} msgs per variant, the variants taking turns in one stream paced at "
        f"{rate:.0f}/s (after {warmup} warm-up) from the bench process; the receiver process "
        f"runs Inbox.process, watcher={lat['mode']} (first ping {lat['ping_ms']:.2f} ms). "
        "Baseline: one-way multiprocessing.Pipe at the same pace, the child records receipt "
        "time - send time. The sender-side call is part of the latency (the timestamp is taken "
        "before it); 'bare syscalls' is the same file delivery without shoal (json + O_EXCL + "
        "link), read by the same shoal Inbox, which separates sender and receiver costs."
    )

    # 1b. a member that got no inotify instance (Linux allows 128 per user): it polls
    plat = measure_shoal_latency(home, n_lat // 2, rate, warmup, poll=True)
    ps: Latency = plat["send"]
    rows.append(Row(f"polling member: latency p50 @{rate:.0f}/s, send()", "ms", ps.p50_ms,
                    pipe.p50_ms, "lower", "-", None))  # fmt: skip
    rows.append(Row(f"polling member: latency p99 @{rate:.0f}/s, send()", "ms", ps.p99_ms,
                    pipe.p99_ms, "lower", "< 50 ms", ps.p99_ms < 50.0))  # fmt: skip
    p_lost = sum(plat[p].lost for p in LATENCY_PHASES) + plat["quarantined"]
    rows.append(Row(f"lost, polling member ({len(LATENCY_PHASES) * (n_lat // 2)} msgs)", "count",
                    p_lost, 0, "lower", "== 0", p_lost == 0))  # fmt: skip
    idle_s = 5.0 if cfg.quick else 15.0
    for poll in (True, False):
        mode, cpu = measure_idle_member(home, idle_s, poll)
        target = ("< 0.1 %", cpu < 0.1) if poll else ("-", None)
        rows.append(Row(f"idle member's CPU, watcher={mode}", "%", cpu, None, "lower",
                        *target))  # fmt: skip
    notes.append(
        f"polling member: the receiver runs with SHOAL_WATCHER=poll (watcher={plat['mode']}), "
        f"{n_lat // 2} msgs per variant at the same pace; idle CPU over {idle_s:g} s, all "
        "threads of the member's process"
    )

    # 2./3. one sender -> one receiver, plain and durable, against the bare syscall loop
    sizes = {"plain": 4000 if cfg.quick else 20000, "durable": 400 if cfg.quick else 3000}
    for tag, durable in (("plain", False), ("durable", True)):
        n = sizes[tag]
        tp = measure_throughput(cfg, tag, n, durable)
        bare = best(tp["bare"])
        sfx = " durable" if durable else ""
        for key, label in (("send", "send()"), ("deliver", lower)):
            b = best(tp[key])
            rows.append(Row(f"1->1{sfx} handled+acked/s, {label}", "msg/s", b.rate, bare.rate,
                            "higher", "ratio >= 0.50", b.rate >= 0.5 * bare.rate))  # fmt: skip
        bare_tx_cpu = min_cpu(tp["bare"], sender=True)
        for key, label in (("send", "send()"), ("deliver", "make_message+deliver")):
            rows.append(Row(f"  [info] 1->1{sfx} sender CPU/msg, {label}", "us",
                            min_cpu(tp[key], sender=True), bare_tx_cpu, "lower"))  # fmt: skip
        rows.append(Row(f"  [info] 1->1{sfx} receiver CPU/msg, Inbox.process", "us",
                        min_cpu(tp["send"] + tp["deliver"]), min_cpu(tp["bare"]),
                        "lower"))  # fmt: skip
        lost = sum(t.lost for k in ("send", "deliver") for t in tp[k])
        bare_lost = sum(t.lost for t in tp["bare"])
        runs = 2 * cfg.repeats
        rows.append(Row(f"lost{sfx} ({n} msgs x {runs} runs)", "count", lost, bare_lost,
                        "lower", "== 0", lost == 0))  # fmt: skip
        capped = {k: [t.unhandled for t in tp[k] if t.unhandled] for k in VARIANTS}
        notes.append(
            f"1->1{sfx}: {n} msgs; sender and receiver processes released together; "
            f"rate = handled / (release -> last ack), best of {cfg.repeats}. Baseline: the "
            f"same syscalls in a bare loop{' with the same fsyncs' if durable else ''}; its "
            "receiver polls listdir every 0.5 ms when new/ is empty."
        )
        if any(capped.values()):
            notes.append(
                f"1->1{sfx}: hit the {cfg.cap_s:g} s cap with messages still unhandled "
                f"(on disk, not lost): {capped}"
            )

    # receiver alone, draining a backlog (where the 1->1 time goes when the receiver lags)
    n_drain = 2000 if cfg.quick else 5000
    drain = measure_drain(cfg, n_drain)
    rows.append(Row(f"  [info] receiver alone draining {n_drain} queued", "msg/s",
                    drain["shoal"].rate, drain["bare"].rate, "higher"))  # fmt: skip
    rows.append(Row("  [info] receiver CPU/msg while draining", "us",
                    drain["shoal"].receiver_cpu_us, drain["bare"].receiver_cpu_us,
                    "lower"))  # fmt: skip
    d_lost = drain["shoal"].lost
    rows.append(Row(f"lost, drain ({n_drain} msgs)", "count", d_lost, drain["bare"].lost,
                    "lower", "== 0", d_lost == 0))  # fmt: skip
    if drain["shoal"].unhandled:
        notes.append(f"drain: hit the {cfg.cap_s:g} s cap with "
                     f"{drain['shoal'].unhandled} messages still queued (not lost)")  # fmt: skip

    # 4. contended team-file updates
    procs, k = 8, (50 if cfg.quick else 150)
    upd = measure_team_updates(cfg, procs, k)
    su, bu = upd["shoal"], upd["baseline"]
    rows.append(Row(f"team-file updates/s, {procs} procs x {k} [no target]", "upd/s", su.rate,
                    bu.rate, "higher"))  # fmt: skip
    rows.append(Row("  [info] single update wait p99", "ms", su.p99_wait_ms, bu.p99_wait_ms,
                    "lower"))  # fmt: skip
    rows.append(Row("  [info] single update wait max", "ms", su.max_wait_ms, bu.max_wait_ms,
                    "lower"))  # fmt: skip
    want = procs * (k + 1)
    rows.append(Row(f"lost increments ({want})", "count", want - su.final, want - bu.final,
                    "lower", "== 0", su.final == want))  # fmt: skip
    notes.append(
        f"team file: {procs} processes, each 1 warm-up + {k} timed increments. shoal: "
        "Teams.update (flock + pydantic + orjson + atomic replace). Baseline: fcntl.flock "
        "(blocking) + json.load / json.dump(indent=2) + os.replace on a copy of the same file."
    )
    return res


# ------------------------------------------------------------------------------------------
# the leader (issue: task framework) and swarms
# ------------------------------------------------------------------------------------------


def _cli_env(home: Path) -> dict[str, str]:
    """The environment of shoal's CLI calls: bytecode caching on, as after any normal install
    (PYTHONDONTWRITEBYTECODE would make every call compile shoal's modules afresh)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "SHOAL_HOME": str(home)}


def _shoal_cli(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `python -m shoal ARGS` against `home`; BenchError on failure."""
    out = subprocess.run(
        [sys.executable, "-m", "shoal", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_cli_env(home),
    )
    if out.returncode != 0:
        raise BenchError(f"shoal {' '.join(args[:3])}...: {out.stderr.strip()[-400:]}")
    return out


def _timed(argv: list[str], stdin_path: Path, **kw: Any) -> float:
    """Wall-clock seconds of `argv` fed `stdin_path` on its standard input."""
    with open(stdin_path, "rb") as stdin:
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdin=stdin, **kw)
        return time.perf_counter() - t0


def _leader_pid(home: Path, team: str) -> int:
    from shoal.core.paths import Layout
    from shoal.orchestrator.liveness import leader_alive

    alive = leader_alive(Layout(home), team)
    if alive is None:
        raise BenchError(f"no leader running for {team}")
    return alive[0]


def _leader_span(home: Path, ids: list[str]) -> float:
    """Seconds from the first start to the last end of tasks `ids`, as the leader recorded."""
    from shoal.core.paths import Layout
    from shoal.teams.session import current_session

    session = current_session(Layout(home), "bench")
    if session is None:
        raise BenchError("the bench team has no session")
    records = {**session.history(), **session.read_tasks_raw()}
    mine = [records[i] for i in ids if i in records]
    if len(mine) != len(ids) or not all(r.get("end_time") for r in mine):
        raise BenchError("not every task of the batch has finished")
    return float(max(r["end_time"] for r in mine)) - float(min(r["start_time"] for r in mine))


def _cpu_percent(pids: list[int], seconds: float) -> float:
    """CPU used by `pids` (all their threads) over `seconds`, in percent of one core. Read from
    /proc/PID/task/TID/schedstat (nanoseconds) where there is one: the 10 ms ticks of
    cpu_times cannot tell 0.1 % from 0.3 % of fifty quiet processes."""
    import psutil

    def ns(pid: int) -> int:
        out = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                out += int(fh.read().split()[0])
        return out

    def total() -> float:
        s = 0.0
        for pid in pids:
            try:
                s += ns(pid) / 1e9
            except (OSError, ValueError, IndexError):
                with contextlib.suppress(psutil.Error):
                    t = psutil.Process(pid).cpu_times()
                    s += t.user + t.system
        return s

    before = total()
    time.sleep(seconds)
    return (total() - before) / seconds * 100


def _against_xargs_and_parallel(
    cfg: Config, result: SectionResult, what: str, shoal_s: float, cmds: Path
) -> None:
    """Rows of shoal's best time for the commands in `cmds` beside `xargs -P2` (target: within
    2x) and GNU parallel `-j2 --joblog` (target: faster), each timed on the same commands."""
    xargs_s = min(
        _timed(["xargs", "-P2", "-I{}", "sh", "-c", "{}"], stdin_path=cmds)
        for _ in range(cfg.repeats)
    )
    result.rows.append(
        Row(f"{what} vs xargs -P2", "s", shoal_s, xargs_s, "lower", "<= 2x", shoal_s <= 2 * xargs_s)
    )
    parallel = shutil.which("parallel")
    if parallel is None:
        result.notes.append("GNU parallel is not installed (apt-get install parallel)")
        return
    par_s = min(
        _timed(
            [parallel, "-j2", "--joblog", str(cfg.workdir / "parallel.joblog")],
            stdin_path=cmds,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(cfg.repeats)
    )
    result.rows.append(
        Row(
            f"{what} vs GNU parallel -j2 --joblog",
            "s",
            shoal_s,
            par_s,
            "lower",
            "< 1x",
            shoal_s < par_s,
        )
    )


@section("leader", "leader: background shell tasks")
def bench_leader(cfg: Config) -> SectionResult:
    n = 300 if cfg.quick else 1000
    home = cfg.workdir / "leader-home"
    result = SectionResult()
    cmds = cfg.workdir / "cmds.txt"
    cmds.write_text("true\n" * n)
    _shoal_cli(home, "up", "--team", "bench", "--jobs", "2", "--detach", "--quiet")
    try:
        shoal_s: list[tuple[float, float, float]] = []  # (total, sh call, leader's span)
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            ids = _shoal_cli(home, "sh", "--team", "bench", "--batch", str(cmds)).stdout.split()
            t1 = time.perf_counter()
            _shoal_cli(home, "wait", "--team", "bench")
            shoal_s.append((time.perf_counter() - t0, t1 - t0, _leader_span(home, ids)))
        total, sh_call, span = min(shoal_s)
        _against_xargs_and_parallel(cfg, result, f"{n} `true` tasks at --jobs 2", total, cmds)
        result.rows.append(Row("  of which the `sh --batch` call", "s", sh_call, None, "lower"))
        result.rows.append(
            Row("  the leader's span (first start to last end)", "s", span, None, "lower")
        )
        result.notes.append(
            "shoal's time includes two CLI calls (sh --batch, wait) and the "
            "leader's state, event and history writes for every task"
        )
        # One task from the shell, end to end: `shoal sh --foreground -- true` returns when it
        # has ended, with its exit code (a CLI start, a control round trip, the task).
        single = []
        for _ in range(5):
            t0 = time.perf_counter()
            _shoal_cli(home, "sh", "--team", "bench", "--foreground", "--", "true")
            single.append(time.perf_counter() - t0)
        parallel = shutil.which("parallel")
        base_argv = [parallel, "-j1", ":::", "true"] if parallel else ["/bin/sh", "-c", "true"]
        base_s = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run(base_argv, check=True, capture_output=True)
            base_s.append(time.perf_counter() - t0)
        base_name = "GNU parallel, one job" if parallel else "sh -c true"
        result.rows.append(
            Row(
                f"one `shoal sh --foreground -- true`, end to end vs {base_name} (median of 5)",
                "s",
                statistics.median(single),
                statistics.median(base_s),
                "lower",
                "<= 1.5x",
                statistics.median(single) <= 1.5 * statistics.median(base_s),
            )
        )
        # The leader idle with 50 sleeping tasks.
        sleepers = cfg.workdir / "sleep.txt"
        sleepers.write_text("sleep 300\n" * 50)
        _shoal_cli(home, "sh", "--team", "bench", "--batch", str(sleepers))
        pid = _leader_pid(home, "bench")
        time.sleep(2)
        cpu = _cpu_percent([pid], 5 if cfg.quick else 10)
        result.rows.append(
            Row("leader CPU, 50 tasks sleeping", "%", cpu, None, "lower", "< 1%", cpu < 1.0)
        )
    finally:
        _shoal_cli(home, "down", "--team", "bench")
    # One full tick with 1,000 tracked (running) tasks, measured in-process.
    from shoal.core.config import Limits
    from shoal.core.paths import Layout
    from shoal.orchestrator.leader import Leader

    leader = Leader(Layout(cfg.workdir / "tick-home"), "tick", limits=Limits()).start()
    try:
        leader.submit([leader.make_shell_task(["sleep 300"]) for _ in range(1000)])
        leader.tick()  # start times read, first output deltas
        samples = []
        for _ in range(20):
            t0 = time.perf_counter()
            leader.tick()
            samples.append((time.perf_counter() - t0) * 1000)
        files = [t.output_file for t in leader.registry.get_all_tasks()]
        base = []
        for _ in range(20):
            t0 = time.perf_counter()
            for f in files:
                os.stat(f)
            base.append((time.perf_counter() - t0) * 1000)
        tick = statistics.median(samples)
        result.rows.append(
            Row(
                "one tick, 1,000 running tasks (median of 20)",
                "ms",
                tick,
                statistics.median(base),
                "lower",
                "< 5 ms",
                tick < 5.0,
            )
        )
        result.notes.append("the tick's baseline is one bare os.stat of each output file")
    finally:
        leader.shutdown()
    return result


@section("run", "shoal run: a batch spec")
def bench_run(cfg: Config) -> SectionResult:
    n = 300 if cfg.quick else 1000
    result = SectionResult()
    spec = cfg.workdir / "bench-run.toml"
    spec.write_text(
        '[run]\nteam = "benchrun"\njobs = 2\n\n'
        + "".join(f'[[task]]\nid = "t{i}"\nrun = "true"\n\n' for i in range(n))
    )
    cmds = cfg.workdir / "run-cmds.txt"
    cmds.write_text("true\n" * n)
    home = cfg.workdir / "run-home"
    joblog = cfg.workdir / "run.joblog"
    shoal_s = []
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        _shoal_cli(home, "run", str(spec), "--jobs", "2", "--joblog", str(joblog))
        shoal_s.append(time.perf_counter() - t0)
    _against_xargs_and_parallel(
        cfg, result, f"{n}-task spec at --jobs 2 (with --joblog)", min(shoal_s), cmds
    )
    result.notes.append(
        "shoal's time is the whole `shoal run` process: start-up, its own "
        "leader, the joblog, the run record and the report"
    )
    return result


def _bare_pythons(n: int) -> float:
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(n)]
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def _pysuite_spec(path: Path, suite: Path, shards: int) -> Path:
    """A spec running the generated suite as `shards` matrix shards, each with its JUnit."""
    path.write_text(
        f"""[run]
jobs = {shards}
env = {{ PYTEST_DISABLE_PLUGIN_AUTOLOAD = "1", SUITE_SHARDS = "{shards}" }}

[[task]]
id = "tests"
matrix = {{ shard = {list(range(1, shards + 1))} }}
cwd = "{suite}"
env = {{ SUITE_SHARD = "{{shard}}" }}
run = ["{sys.executable}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "--junitxml={path.parent}/reports-{shards}/{{shard}}.xml"]
junit = "{path.parent}/reports-{shards}/{{shard}}.xml"

[[task]]
id = "lint"
run = "true"
"""
    )
    return path


@section(
    "kinds", "task kinds: a 100-step workflow beside the same spec run, dream and monitor start"
)
def bench_kinds(cfg: Config) -> SectionResult:
    """The kinds the other sections leave out, each from the CLI call to its first result."""
    result = SectionResult()
    n = 100
    home = cfg.workdir / "kinds-home"
    spec = cfg.workdir / "kinds-steps.toml"
    spec.write_text(
        "[run]\njobs = 2\n\n"
        + "".join(f'[[task]]\nid = "s{i}"\nrun = "true"\n\n' for i in range(n))
    )
    bare = min(_bare_pythons(1) for _ in range(5))
    run_s = []
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        _shoal_cli(home, "run", str(spec), "--jobs", "2")
        run_s.append(time.perf_counter() - t0)
    _shoal_cli(home, "up", "--team", "kinds", "--jobs", "2", "--detach", "--quiet")
    try:
        flow_s = []
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            wid = _shoal_cli(home, "workflow", "--team", "kinds", str(spec)).stdout.split()[0]
            _shoal_cli(home, "wait", "--team", "kinds", wid)
            flow_s.append(time.perf_counter() - t0)
        result.rows.append(
            Row(
                f"workflow of {n} `true` steps, vs the spec as `shoal run`",
                "s",
                min(flow_s),
                min(run_s),
                "lower",
            )
        )
        dream_s = []
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            did = _shoal_cli(home, "dream", "--team", "kinds").stdout.split()[0]
            _shoal_cli(home, "wait", "--team", "kinds", did)
            dream_s.append(time.perf_counter() - t0)
        result.rows.append(
            Row(
                "dream (scripted model, no sessions) start to end, vs `python -c pass`",
                "s",
                min(dream_s),
                bare,
                "lower",
            )
        )
        config = cfg.workdir / "kinds-mcp.json"
        server = {
            "command": sys.executable,
            "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        }
        config.write_text(json.dumps({"mcpServers": {"time": server}}))
        monitor_s = []
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            mid = _shoal_cli(
                home,
                "monitor",
                "--team",
                "kinds",
                "time",
                "--config",
                str(config),
                "--tool",
                "get_current_time",
                "--args",
                '{"timezone": "UTC"}',
                "--every",
                "60",
            ).stdout.split()[0]
            deadline = time.monotonic() + 60
            while "tool-result" not in _shoal_cli(home, "logs", "--team", "kinds", mid).stdout:
                if time.monotonic() > deadline:
                    raise BenchError("the monitor gave no tool result within 60 s")
                time.sleep(0.01)
            monitor_s.append(time.perf_counter() - t0)
            _shoal_cli(home, "stop", "--team", "kinds", mid)
        result.rows.append(
            Row(
                "monitor: CLI call to its first tool result, vs `python -c pass`",
                "s",
                min(monitor_s),
                bare,
                "lower",
            )
        )
    finally:
        _shoal_cli(home, "down", "--team", "kinds")
    result.notes.append(
        "the workflow runs in a long-lived leader (one `workflow` and one `wait` call); "
        "the spec row is a whole `shoal run` process with its own leader; the monitor row "
        "polls `shoal logs`, so it includes up to one CLI call of latency"
    )
    return result


@section("pysuite", "shoal run: a generated pytest suite sharded 2 and 4 ways")
def bench_pysuite(cfg: Config) -> SectionResult:
    """A generated pytest suite (tests/support/pysuite.py; attrs-sized: 1,400 tests in 40
    files) sharded N=2 and N=4 through `shoal run` with a JUnit report per shard, beside the
    same shard commands under GNU parallel and the whole suite under pytest-xdist `-n N`;
    and shoal's fixed start-up: `shoal run` of one `true` task."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.pysuite import write_suite

    result = SectionResult()
    files, per_file = (10, 30) if cfg.quick else (40, 35)
    suite = write_suite(cfg.workdir / "pysuite", files, per_file)
    home = cfg.workdir / "pysuite-home"
    env = {**_cli_env(home), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]

    def timed(argv: list[str], **kw: Any) -> float:
        t0 = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, env=kw.pop("env", env), **kw)
        took = time.perf_counter() - t0
        if out.returncode != 0:
            raise BenchError(f"{' '.join(argv[:4])}...: exit {out.returncode}: {out.stdout[-300:]}")
        return took

    serial = min(timed(pytest_argv, cwd=suite.root) for _ in range(cfg.repeats))
    parallel = shutil.which("parallel")
    for shards in (2, 4):
        spec = _pysuite_spec(cfg.workdir / f"pysuite-{shards}.toml", suite.root, shards)
        shoal_s = min(
            timed([sys.executable, "-m", "shoal", "--home", str(home), "run", str(spec), "-q"])
            for _ in range(cfg.repeats)
        )
        xdist_s = min(
            timed([*pytest_argv, "-p", "xdist.plugin", "-n", str(shards)], cwd=suite.root)
            for _ in range(cfg.repeats)
        )
        what = f"{len(suite.node_ids)} tests, {shards} shards"
        result.rows.append(
            Row(f"{what}: shoal run vs pytest-xdist -n {shards}", "s", shoal_s, xdist_s, "lower")
        )
        if parallel is not None:
            cmds = cfg.workdir / f"pysuite-{shards}.cmds"
            cmds.write_text(
                "".join(
                    f"cd {suite.root} && SUITE_SHARD={n} SUITE_SHARDS={shards} "
                    f"{' '.join(pytest_argv)} --junitxml={cfg.workdir}/par-{shards}-{n}.xml\n"
                    for n in range(1, shards + 1)
                )
                + "true\n"
            )
            par_s = min(
                _timed(
                    [parallel, f"-j{shards}", "--joblog", str(cmds) + ".log"],
                    cmds,
                    env=env,
                    stdout=subprocess.DEVNULL,
                )
                for _ in range(cfg.repeats)
            )
            result.rows.append(
                Row(f"{what}: shoal run vs GNU parallel -j{shards}", "s", shoal_s, par_s, "lower")
            )
    result.notes.append(
        f"serial pytest of the whole suite: {serial:.2f} s; GNU parallel runs the same shard "
        "commands (and a `true` for the lint task) with --joblog"
        + ("" if parallel is not None else " — not installed (apt-get install parallel)")
    )
    one = cfg.workdir / "one-task.toml"
    one.write_text('[[task]]\nid = "t"\nrun = "true"\n')
    startup = min(
        timed([sys.executable, "-m", "shoal", "--home", str(home), "run", str(one), "-q"])
        for _ in range(max(3, cfg.repeats))
    )
    bare = min(timed([sys.executable, "-c", "pass"]) for _ in range(max(3, cfg.repeats)))
    result.rows.append(
        Row(
            "fixed start-up: shoal run of one `true` vs python -c pass",
            "s",
            startup,
            bare,
            "lower",
            "<= 0.3 s",
            startup <= 0.3,
        )
    )
    return result


@section("swarm", "swarm: teammates ready, memory, idle CPU")
def bench_swarm(cfg: Config) -> SectionResult:
    import psutil

    result = SectionResult()
    home = cfg.workdir / "swarm-home"
    sizes = {
        "process": 40 if cfg.quick else 150,
        "tmux": 4 if cfg.quick else 16,
        "in-process": 200 if cfg.quick else 1000,
    }
    for backend, n in sizes.items():
        team = f"sw-{backend.replace('-', '')}"
        # The baseline first, on a machine without this section's teammates running.
        base = _bare_pythons(n)
        env_extra = {"SHOAL_TMUX_SOCKET": f"shoal-bench-{os.getpid()}"}
        os.environ.update(env_extra)
        _shoal_cli(home, "up", "--team", team, "--detach", "--quiet")
        try:
            pid = _leader_pid(home, team)
            rss0 = psutil.Process(pid).memory_info().rss
            names = [f"m{i}" for i in range(n)]
            t0 = time.perf_counter()
            _shoal_cli(home, "spawn", "--team", team, "--backend", backend, *names)
            ready = time.perf_counter() - t0
            target = "< 2 s" if backend == "in-process" else "all ready"
            passed = ready < 2.0 if backend == "in-process" else True
            result.rows.append(
                Row(
                    f"{n} {backend} teammates ready vs {n} `python -c pass`",
                    "s",
                    ready,
                    base,
                    "lower",
                    target,
                    passed,
                )
            )
            if backend == "in-process":
                rss = (psutil.Process(pid).memory_info().rss - rss0) / n / 1024 / 1024
                result.rows.append(
                    Row(
                        "RSS per in-process teammate",
                        "MiB",
                        rss,
                        None,
                        "lower",
                        "< 1 MiB",
                        rss < 1.0,
                    )
                )
            # Reachable: every one answers a message.
            from shoal.core.paths import Layout
            from shoal.mailbox.router import send
            from shoal.teams.store import Teams

            teams = Teams(Layout(home))
            directory = teams.directory(team)
            for name in names:
                send(directory, to=name, sender="team-lead", text="ping")
            deadline = time.monotonic() + 120
            answered = 0
            while time.monotonic() < deadline:
                answered = sum(
                    1
                    for nm in names
                    if (teams.read_status(team, nm) or {}).get("last_result") == "done: ping"
                )
                if answered == n:
                    break
                time.sleep(0.2)
            result.rows.append(
                Row(
                    f"{backend} teammates that answered a message",
                    "count",
                    answered,
                    n,
                    "higher",
                    f"= {n}",
                    answered == n,
                )
            )
            if backend == "process":
                polling = sum(
                    1
                    for nm in names
                    if (teams.read_status(team, nm) or {}).get("watcher") == "polling"
                )
                limit = Path("/proc/sys/fs/inotify/max_user_instances").read_text().strip()
                result.notes.append(
                    f"{polling} of {n} process teammates fell back to polling (no inotify "
                    f"instance left; the limit is {limit} per user, shared with every process)"
                )
        finally:
            _shoal_cli(home, "down", "--team", team, timeout=300)
    # The whole team idle: the leader and 50 process teammates with nothing to do.
    _shoal_cli(home, "up", "--team", "idle", "--detach", "--quiet")
    try:
        from shoal.core.paths import Layout
        from shoal.teams.store import Teams

        _shoal_cli(
            home, "spawn", "--team", "idle", "--backend", "process", *[f"i{k}" for k in range(50)]
        )
        time.sleep(3)  # let start-up settle
        members = Teams(Layout(home)).read("idle").members
        pids = [m.pid for m in members if m.pid]
        # The leader's fork server counts too (shoal's own process, idle here).
        pids += [
            c.pid
            for c in psutil.Process(_leader_pid(home, "idle")).children()
            if "fork server" in " ".join(c.cmdline())
        ]
        cpu = _cpu_percent(pids, 5 if cfg.quick else 15)
        result.rows.append(
            Row(
                "leader + 50 idle process teammates (+ fork server), CPU",
                "%",
                cpu,
                None,
                "lower",
                "< 0.3%",
                cpu < 0.3,
            )
        )
    finally:
        _shoal_cli(home, "down", "--team", "idle", timeout=300)
    return result


# ------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------


def machine_info(workdir: Path) -> dict[str, Any]:
    fs = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["df", "-T", str(workdir)], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        if len(out) > 1:
            fs = out[1].split()[1]
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "workdir_fs": fs,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--only", metavar="SECTION[,SECTION]", help="run only these sections")
    parser.add_argument("--quick", action="store_true", help="smaller, faster runs")
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write results here")
    parser.add_argument("--repeats", type=int, help="throughput trials (default 2 quick, 3 full)")
    parser.add_argument(
        "--cap", type=float, help="seconds a throughput trial may run (default 10 quick, 30 full)"
    )
    parser.add_argument(
        "--tmpdir", type=Path, help="where the temporary SHOAL_HOME goes (default: system temp)"
    )
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary SHOAL_HOME")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when any measurement misses its target"
    )
    return parser.parse_args(argv)


def select(only: str | None) -> list[Section]:
    if not only:
        return list(SECTIONS.values())
    names = list(dict.fromkeys(n.strip() for n in only.split(",") if n.strip()))
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(
            f"bench.py: unknown section(s) {', '.join(unknown)}; "
            f"known: {', '.join(SECTIONS)} (see --list)"
        )
    return [SECTIONS[n] for n in names]


def _round_script(rounds: int) -> Any:
    """A FunctionModel that calls Read `rounds` times, then answers (no network)."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    def answer(messages: list[Any], _info: Any) -> ModelResponse:
        done = sum(1 for m in messages if getattr(m, "kind", "") == "response")
        if done < rounds:
            return ModelResponse(parts=[ToolCallPart("Read", {"file_path": "f.txt"})])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(answer)


async def _shoal_rounds(work: Path, rounds: int, tag: str, *, attach: bool = False) -> float:
    from shoal.workers.agent.attachments import Attacher, owned_tasks_file
    from shoal.workers.agent.loop import AgentLoop
    from shoal.workers.agent.progress import Output
    from shoal.workers.agent.tool_calls import make_tools
    from shoal.workers.agent.tools import Workspace
    from shoal.workers.agent.transcript import Transcript

    def no_leader(op: str, args: dict[str, Any]) -> Any:
        raise BenchError(f"an agent with no background task asked its leader ({op})")

    loop = AgentLoop(
        _round_script(rounds),
        instructions="",
        tools=make_tools(Workspace(cwd=work, mode="bypassPermissions"), ["Read"]),
        transcript=Transcript(work / f"{tag}.jsonl"),
        output=Output(work / f"{tag}.output"),
        # (as a runner has it: no task started for it, so one stat a round and no call)
        attach=Attacher(no_leader, "a00000000", owned_tasks_file(work, tag)) if attach else None,
    )
    t0 = time.perf_counter()
    outcome = await loop.run("go")
    if outcome.status != "completed":
        raise BenchError(f"agent bench run failed: {outcome.error}")
    return time.perf_counter() - t0


async def _bare_rounds(work: Path, rounds: int) -> float:
    from pydantic_ai import Agent

    agent: Agent[None, str] = Agent(_round_script(rounds))

    @agent.tool_plain(name="Read")
    def read(file_path: str) -> str:
        return (work / file_path).read_text()

    from pydantic_ai.usage import UsageLimits

    t0 = time.perf_counter()
    await agent.run("go", usage_limits=UsageLimits(request_limit=None))
    return time.perf_counter() - t0


@section("agent", "agents: loop overhead, 100 in-process agents, time to the first request")
def bench_agent(cfg: Config) -> SectionResult:
    import asyncio

    import psutil

    result = SectionResult()
    work = cfg.workdir / "agent-work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "f.txt").write_text("one line\n")
    rounds = 50 if cfg.quick else 200
    # (alternated, best of each: on a shared machine the load moves between trials)
    plain, attached, bare = [], [], []
    for i in range(cfg.repeats):
        plain.append(asyncio.run(_shoal_rounds(work, rounds, f"r{i}")))
        attached.append(asyncio.run(_shoal_rounds(work, rounds, f"t{i}", attach=True)))
        bare.append(asyncio.run(_bare_rounds(work, rounds)))
    shoal_t, attach_t, bare_t = min(plain), min(attached), min(bare)
    result.rows.append(
        Row(f"time per tool round ({rounds} rounds of Read)", "ms", shoal_t / rounds * 1000,
            bare_t / rounds * 1000, "lower", "<= 3x", shoal_t / bare_t <= 3)
    )  # fmt: skip
    result.rows.append(
        Row(f"time per tool round, attachments on, no background task ({rounds} rounds)", "ms",
            attach_t / rounds * 1000, bare_t / rounds * 1000, "lower", "<= 3x",
            attach_t / bare_t <= 3)
    )  # fmt: skip
    result.notes.append(
        "the baseline is a bare pydantic-ai Agent.run of the same FunctionModel script; shoal "
        "adds the transcript append per node, the readable output and progress (and, with "
        "attachments on, a stat of the agent's task list before each request)"
    )
    # 100 concurrent agents on one event loop.
    n, per = 100, 10
    proc = psutil.Process()
    before = proc.memory_info().rss

    async def many() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(_shoal_rounds(work, per, f"m{i}") for i in range(n)))
        return time.perf_counter() - t0

    elapsed = asyncio.run(many())
    per_agent = (proc.memory_info().rss - before) / n / (1 << 20)
    result.rows.append(
        Row(f"{n} concurrent in-process agents, tool rounds/s", "rounds/s",
            n * per / elapsed, None, "higher")
    )  # fmt: skip
    result.rows.append(
        Row("RSS per in-process agent", "MiB", max(per_agent, 0.0), None, "lower", "< 2 MiB",
            per_agent < 2)
    )  # fmt: skip
    # From `shoal agent` to the first model request (the output file's "> prompt" line is
    # written just before it), with a leader running.
    home = cfg.workdir / "agent-home"
    _shoal_cli(home, "up", "--team", "bench", "--detach", "--quiet")
    try:
        for backend in ("in-process", "process"):
            times = []
            for _ in range(cfg.repeats):
                t0 = time.perf_counter()
                record = json.loads(_shoal_cli(
                    home, "agent", "--team", "bench", "--backend", backend,
                    "--permission-mode", "bypassPermissions", "--json", "hi",
                ).stdout)  # fmt: skip
                output = Path(record["output_file"])
                while not output.exists() or b"> " not in output.read_bytes():
                    time.sleep(0.002)
                times.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            python_s = time.perf_counter() - t1
            result.rows.append(
                Row(f"`shoal agent` to the first model request, {backend}", "ms",
                    min(times) * 1000, python_s * 1000, "lower", "< 300 ms",
                    min(times) < 0.3)
            )  # fmt: skip
        _shoal_cli(home, "wait", "--team", "bench")
        # A round through a real leader: with no background task, with one open but quiet
        # (stats only), and with one that prints every 20 ms (a control round trip and a
        # block nearly every round).
        n = 60 if cfg.quick else 200
        best = {"none": 1e9, "quiet": 1e9, "chatty": 1e9}
        for _ in range(cfg.repeats):  # (alternated, as above)
            for kind in best:
                best[kind] = min(best[kind], _leader_rounds(home, work, n, kind))
        for kind, target, limit in (("quiet", "< +2 ms", 0.002), ("chatty", "< +10 ms", 0.010)):
            result.rows.append(
                Row(f"time per tool round of a leader's agent, one {kind} background task "
                    f"open ({n})", "ms", best[kind] * 1000, best["none"] * 1000, "lower",
                    target, best[kind] - best["none"] < limit)
            )  # fmt: skip
    finally:
        _shoal_cli(home, "down", "--team", "bench")
    result.notes.append("the first-request baseline is one bare `python -c pass`")
    result.notes.append(
        "the open-task baseline is the same in-process agent of the same leader with no "
        "background task (Read rounds, the scripted model)"
    )
    return result


def _leader_rounds(home: Path, work: Path, rounds: int, background: str) -> float:
    """Seconds per tool round of an in-process agent of the running leader: `rounds` rounds
    of Read after a first turn that starts a `background` task ("none": runs `true`), timed
    from the transcript's own timestamps (the agent's start is left out)."""
    import datetime

    first = {
        "none": 'args = { command = "true" }',
        "quiet": 'args = { command = "sleep 600", run_in_background = true }',
        "chatty": 'args = { command = "while :; do echo tick; sleep 0.02; done", '
        "run_in_background = true }",
    }[background]
    read = '[[turn]]\n[[turn.call]]\ntool = "Read"\nargs = { file_path = "f.txt" }\n'
    script = work / f"rounds-{background}.toml"
    script.write_text(f'[[turn]]\n[[turn.call]]\ntool = "Bash"\n{first}\n' + read * rounds)
    record = json.loads(_shoal_cli(
        home, "agent", "--team", "bench", "--backend", "in-process", "--model",
        f"scripted:{script}", "--cwd", str(work), "--permission-mode", "bypassPermissions",
        "--json", "go",
    ).stdout)  # fmt: skip
    _shoal_cli(home, "wait", "--team", "bench", record["id"])
    stamps = []
    for line in Path(record["transcript"]).read_text().splitlines():
        message = json.loads(line).get("message") or {}
        if message.get("kind") == "response":
            stamps.append(datetime.datetime.fromisoformat(message["timestamp"]).timestamp())
    if len(stamps) < rounds + 2:
        raise BenchError(f"agent {record['id']} answered {len(stamps)} of {rounds + 2} requests")
    # (from the response that started the task to the last one: `rounds` rounds of Read)
    return (stamps[-1] - stamps[1]) / rounds


@section("sandbox", "the command sandbox: one Bash `true` call, confined and not")
def bench_sandbox(cfg: Config) -> SectionResult:
    """A worker's Bash tool call of `true` (lease `src/**`, no network) through the Landlock
    sandbox, beside the same call unconfined, alternating, median of each; and, where
    bubblewrap is installed, the same command under `bwrap` for comparison."""
    import asyncio

    from shoal.core import sandbox
    from shoal.workers.agent.foreground import run_foreground
    from shoal.workers.agent.tool_args import BashArgs
    from shoal.workers.agent.tools import Workspace

    result = SectionResult()
    work = cfg.workdir / "sandbox-work"
    (work / "src").mkdir(parents=True, exist_ok=True)
    tmp = cfg.workdir / "sandbox-tmp"
    tmp.mkdir(exist_ok=True)
    if sandbox.abi() < 1:
        result.notes.append("this kernel offers no Landlock: nothing to measure")
        return result
    policy = sandbox.agent_policy(work, "bypassPermissions", ["src/**"], tmp=tmp, network=False)
    boxed = Workspace(cwd=work, mode="bypassPermissions", sandbox=policy)
    bare = Workspace(cwd=work, mode="bypassPermissions")
    call = BashArgs(command="true")
    n = 30 if cfg.quick else 150

    async def timed(ws: Workspace) -> float:
        t0 = time.perf_counter()
        await ws.bash(call)
        return time.perf_counter() - t0

    async def trials() -> tuple[list[float], list[float]]:
        confined, unconfined = [], []
        for _ in range(n):
            confined.append(await timed(boxed))
            unconfined.append(await timed(bare))
        return confined, unconfined

    confined, unconfined = asyncio.run(trials())
    c_ms, u_ms = statistics.median(confined) * 1000, statistics.median(unconfined) * 1000
    result.rows.append(
        Row(f"Bash `true`, Landlock-confined vs not (median of {n})", "ms", c_ms, u_ms,
            "lower", "<= +5 ms", c_ms - u_ms <= 5)
    )  # fmt: skip
    result.notes.append(f"Landlock adds {c_ms - u_ms:.2f} ms per call (ABI {sandbox.abi()})")
    bwrap = shutil.which("bwrap")
    if bwrap is not None:
        argv = (f"{bwrap} --ro-bind / / --dev /dev --bind {work}/src {work}/src --bind {tmp} {tmp} "
                "--unshare-net --die-with-parent -- /bin/true")  # fmt: skip

        async def wrapped() -> tuple[list[float], list[float]]:
            boxed_t, bare_t = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                await run_foreground(argv, work, {}, 30)
                boxed_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await run_foreground("/bin/true", work, {}, 30)
                bare_t.append(time.perf_counter() - t0)
            return boxed_t, bare_t

        b_t, plain = asyncio.run(wrapped())
        b_ms, p_ms = statistics.median(b_t) * 1000, statistics.median(plain) * 1000
        result.rows.append(
            Row("the same command under bubblewrap vs not", "ms", b_ms, p_ms, "lower",
                "<= +5 ms", b_ms - p_ms <= 5)
        )  # fmt: skip
        result.notes.append(f"bubblewrap adds {b_ms - p_ms:.2f} ms per call")
    else:
        result.notes.append("bubblewrap is not installed: no comparison row")
    return result


def _coordinator_script(n: int, worker_command: str) -> str:
    """A scripted coordinator that starts `n` read-only workers in one turn."""
    calls = "".join(
        f'[[turn.call]]\ntool = "Agent"\nargs = {{ description = "w{i}", prompt = "Work {i}" }}\n'
        for i in range(n)
    )
    worker = (
        '[[worker]]\nfinal = "done"\n[[worker.turn]]\n[[worker.turn.call]]\ntool = "Bash"\n'
        f"args = {{ command = {json.dumps(worker_command)} }}\n"
    )
    return f'final = "noted"\n\n[[turn]]\n{calls}\n[[turn]]\ntext = "waiting"\n\n{worker}'


def _start_coordinator(home: Path, script: Path, work: Path) -> dict[str, Any]:
    """Start an in-process coordinator on `script` in `work`; its task record."""
    rec: dict[str, Any] = json.loads(_shoal_cli(
        home, "agent", "--team", "bench", "--coordinator", "--backend", "in-process",
        "--permission-mode", "bypassPermissions", "--model", f"scripted:{script}",
        "--cwd", str(work), "--json", "go",
    ).stdout)  # fmt: skip
    return rec


def _first_request(output: Path) -> bool:
    try:
        return b"> " in output.read_bytes()
    except FileNotFoundError:
        return False


@section("ray", "Ray: remote tasks and batch runs on a loopback cluster")
def bench_ray(cfg: Config) -> SectionResult:
    """A trivial job submitted and waited for, by shoal and by `ray job submit`; a spec of
    trivial tasks on the cluster and on this machine (the cluster's overhead, measured)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.ray_cluster import RAY, RayHead

    result = SectionResult()
    n = 20 if cfg.quick else 100
    trials = 3 if cfg.quick else 5
    repo = cfg.workdir / "ray-repo"
    repo.mkdir()
    spec = repo / "ci.toml"
    spec.write_text("".join(f'[[task]]\nid = "t{i}"\nrun = "true"\n\n' for i in range(n)))
    git = ["git", "-C", str(repo), "-c", "user.email=b@b", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "bench"], check=True)
    home = cfg.workdir / "ray-home"
    head = RayHead()
    try:
        env = {**os.environ, "RAY_ADDRESS": head.address}
        _shoal_cli(home, "up", "--detach", "--quiet")
        try:
            shoal_s, ray_s = [], []
            for _ in range(trials):
                t0 = time.perf_counter()
                task = _shoal_cli(
                    home, "remote", "submit", "--ray", head.address, "--cwd", str(repo),
                    "--type", "shell", "--", "true",
                ).stdout.strip()  # fmt: skip
                _shoal_cli(home, "wait", task)
                shoal_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                subprocess.run(
                    [RAY, "job", "submit", "--address", head.address,
                     "--working-dir", str(repo), "--", "true"],
                    check=True, capture_output=True, env=env, cwd=repo,
                )  # fmt: skip
                ray_s.append(time.perf_counter() - t0)
        finally:
            with contextlib.suppress(BenchError):
                _shoal_cli(home, "down")
        result.rows.append(
            Row(
                "one trivial job: submit -> completed (median) vs `ray job submit`",
                "s",
                statistics.median(shoal_s),
                statistics.median(ray_s),
                "lower",
                "<= 1.5x",
                statistics.median(shoal_s) <= 1.5 * statistics.median(ray_s),
            )
        )
        t0 = time.perf_counter()
        _shoal_cli(home, "run", str(spec), "--backend", "ray", "--ray", head.address,
                   "--jobs", "8", timeout=1800)  # fmt: skip
        on_ray = time.perf_counter() - t0
        t0 = time.perf_counter()
        _shoal_cli(home, "run", str(spec), "--jobs", "8", timeout=600)
        local = time.perf_counter() - t0
        result.rows.append(
            Row(
                f"{n} trivial tasks, --jobs 8: on the cluster vs on this machine",
                "s",
                on_ray,
                local,
                "lower",
                "-",
                None,
            )
        )
    finally:
        head.stop()
    result.notes.append(
        "`ray job submit` waits for the job and prints its logs, as `remote submit` + `wait` "
        "does; both start a fresh CLI process per trial. A Ray job costs a job-supervisor "
        "actor (a fresh Python worker process) on the cluster: the batch row is that cost, "
        "paid per task, on a one-node loopback cluster sharing this machine's cores"
    )
    return result


@section("coordinator", "coordinator mode: dispatch overhead, notifications into one coordinator")
def bench_coordinator(cfg: Config) -> SectionResult:
    import re

    result = SectionResult()
    home = cfg.workdir / "coordinator-home"
    work = cfg.workdir / "coordinator-work"
    work.mkdir(parents=True, exist_ok=True)
    _shoal_cli(home, "up", "--team", "bench", "--detach", "--quiet")
    try:
        # Dispatch: from the coordinator's Agent call to each worker's first model request.
        n = 10
        script = work / "dispatch.toml"
        script.write_text(_coordinator_script(n, "true"))
        rec = _start_coordinator(home, script, work)
        coordinator_out = Path(rec["output_file"])
        t_call = None
        deadline = time.monotonic() + 120
        while t_call is None and time.monotonic() < deadline:
            if coordinator_out.exists() and b"Agent(" in coordinator_out.read_bytes():
                t_call = time.perf_counter()
            time.sleep(0.001)
        tasks_dir = coordinator_out.parent
        firsts: dict[str, float] = {}
        while len(firsts) < n and time.monotonic() < deadline:
            for out in tasks_dir.glob("*.output"):
                if out != coordinator_out and out.name not in firsts and _first_request(out):
                    firsts[out.name] = time.perf_counter()
            time.sleep(0.001)
        _shoal_cli(home, "wait", "--team", "bench", rec["id"], "--timeout", "120")
        if t_call is None or len(firsts) < n:
            raise BenchError("the dispatch run did not start its workers")
        lat = sorted(t - t_call for t in firsts.values())
        result.rows.append(
            Row(f"Agent call -> worker's first model request ({n} at once), mean", "ms",
                sum(lat) / n * 1000, None, "lower")
        )  # fmt: skip
        result.rows.append(
            Row(f"Agent call -> worker's first model request ({n} at once), last", "ms",
                lat[-1] * 1000, None, "lower")
        )  # fmt: skip
        # 50 workers ending at once: every end into the transcript, none twice.
        n = 50
        gate = work / "go"
        script = work / "fanin.toml"
        script.write_text(_coordinator_script(n, f"until [ -e {gate} ]; do sleep 0.05; done"))
        rec = _start_coordinator(home, script, work)
        out = Path(rec["output_file"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = out.read_text() if out.exists() else ""
            if f"waiting for {n} worker(s)" in text:
                break
            time.sleep(0.01)
        t0 = time.perf_counter()
        gate.touch()
        _shoal_cli(home, "wait", "--team", "bench", rec["id"], "--timeout", "300")
        elapsed = time.perf_counter() - t0
        final = next(
            t for t in json.loads(_shoal_cli(home, "ps", "--team", "bench", "--all", "--json")
                                  .stdout) if t["id"] == rec["id"]
        )  # fmt: skip
        from shoal.workers.agent.progress import prompt_texts
        from shoal.workers.agent.transcript import Transcript

        ids: list[str] = []
        for text in prompt_texts(Transcript.load(Path(final["transcript"])).messages):
            ids += re.findall(r"<task-notification>\s*<task-id>([^<]+)<", text)
        ok = len(ids) == n == len(set(ids))
        result.rows.append(
            Row(f"{n} workers ending at once -> all in the coordinator's transcript", "ends/s",
                n / elapsed, None, "higher", "all, once", ok)
        )  # fmt: skip
        result.notes.append(
            f"fan-in: {len(set(ids))} distinct ends of {n} in the transcript, {len(ids)} in all "
            f"(the time includes the workers' own ends, {elapsed:.2f}s from the gate)"
        )
    finally:
        _shoal_cli(home, "down", "--team", "bench")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in SECTIONS.values():
            print(f"{s.name:12} {s.title}")
        return 0
    chosen = select(args.only)
    CTX.set_forkserver_preload(PRELOAD)
    repeats = args.repeats or (2 if args.quick else 3)
    cap_s = args.cap or (10.0 if args.quick else 30.0)
    workdir = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=args.tmpdir))
    info = machine_info(workdir)
    print(
        f"shoal bench ({'quick' if args.quick else 'full'}): python {info['python']}, "
        f"{info['cpus']} cpus, load {info['loadavg'][0]:.2f}, workdir {workdir} "
        f"({info['workdir_fs']})\n"
    )
    report: dict[str, Any] = {
        "quick": args.quick,
        "repeats": repeats,
        "cap_s": cap_s,
        "machine": info,
        "sections": {},
    }
    missed = 0
    failed = 0
    saved_home = os.environ.get("SHOAL_HOME")
    try:
        for sec in chosen:
            t0 = time.monotonic()
            secdir = workdir / sec.name
            secdir.mkdir(mode=0o700)
            cfg = Config(args.quick, secdir, repeats, cap_s)
            os.environ["SHOAL_HOME"] = str(cfg.home)  # children inherit it, so nothing strays
            try:
                result = sec.run(cfg)
            except BenchError as exc:
                failed += 1
                print(f"== {sec.title} ==\nERROR: {exc}\n", flush=True)
                report["sections"][sec.name] = {"title": sec.title, "error": str(exc)}
                continue
            elapsed = time.monotonic() - t0
            print(render_table(sec.title, result))
            load = os.getloadavg()[0]
            print(f"  ({elapsed:.1f} s; load average now {load:.2f})\n", flush=True)
            missed += sum(1 for r in result.rows if r.passed is False)
            report["sections"][sec.name] = {
                "title": sec.title,
                "seconds": elapsed,
                "loadavg_after": load,
                "rows": [r.to_json() for r in result.rows],
                "notes": result.notes,
            }
    finally:
        if saved_home is None:
            os.environ.pop("SHOAL_HOME", None)
        else:
            os.environ["SHOAL_HOME"] = saved_home
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    if failed:
        return 2
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
