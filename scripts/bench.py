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

Everything runs in a temporary SHOAL_HOME with real processes (multiprocessing, spawn start
method, so each child is a fresh interpreter). Set SHOAL_BENCH_PROFILE=DIR to run every child
under cProfile and dump `DIR/{function}-{pid}.prof` files for `python -m pstats`.

Adding a section: write `def my_section(cfg: Config) -> SectionResult` and decorate it with
`@section("name", "title")`; it then shows up in `--list` and `--only`.
"""

# shoal ships no py.typed marker yet, so a bare `mypy scripts/bench.py` (which finds shoal through
# the editable install) would refuse to analyse it; with `mypy` (files = src, scripts) or
# MYPYPATH=src the shoal imports are fully type-checked.
# mypy: disable-error-code="import-untyped"
from __future__ import annotations

import argparse
import contextlib
import cProfile
import fcntl
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
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

CTX = mp.get_context("spawn")
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
    repeats: int


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
    rank = max(1, min(len(sorted_values), round(pct / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


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


def _extra(message: AnyMessage) -> dict[str, Any]:
    return message.data.model_extra or {}


def shoal_latency_receiver(home: str, team: str, conn: Connection) -> None:
    """Handle messages with `Inbox.process`, recording receipt time - send time per message."""
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
    deadline = time.monotonic() + 600
    while not stop and time.monotonic() < deadline:
        inbox.process(handler, timeout=1.0)
    conn.send(("done", latencies, inbox.quarantined))
    inbox.close()


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
    start = time.monotonic()
    if mode == "send":
        for i in range(n):
            send(directory, to=RECEIVER, sender=TEAM_LEAD, data={"seq": i}, durable=durable)
    else:
        for i in range(n):
            msg = make_message(sender=TEAM_LEAD, to=RECEIVER, data={"seq": i})
            maildir.deliver(encode(msg), durable=durable)
    conn.send(time.monotonic() - start)


def shoal_receiver(
    home: str, team: str, n: int, durable: bool, go: MpEvent, conn: Connection
) -> None:
    """Handle (and ack) `n` messages with `Inbox.process`; reports end time and seqs seen."""
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
    deadline = time.monotonic() + 600
    while handled < n and time.monotonic() < deadline:
        if inbox.process(handler, timeout=5.0) is not None:
            handled += 1
    end = time.monotonic()
    left = len(maildir.pending()) + len(maildir.claimed())
    conn.send(("done", end, sorted(seen), handled, left, inbox.quarantined))
    inbox.close()


def shoal_team_updater(home: str, team: str, k: int, go: MpEvent, conn: Connection) -> None:
    """`k` increments of the team file's description through `Teams.update`."""
    from shoal.core.paths import Layout
    from shoal.teams.models import TeamFile
    from shoal.teams.store import Teams

    teams = Teams(Layout(home))

    def bump(tf: TeamFile) -> TeamFile:
        return tf.model_copy(update={"description": str(int(tf.description or 0) + 1)})

    conn.send("ready")
    go.wait()
    for _ in range(k):
        teams.update(team, bump)
    conn.send(time.monotonic())


# ------------------------------------------------------------------------------------------
# mailbox section: baselines (plain Python, no shoal code)
# ------------------------------------------------------------------------------------------


def pipe_latency_receiver(conn: Connection) -> None:
    """One-way multiprocessing.Pipe: record receipt time - send time of each object."""
    latencies: list[tuple[int, int]] = []
    conn.send(("ready", "pipe"))
    while True:
        obj = conn.recv()
        now = time.time_ns()
        if obj is None:
            break
        if obj["seq"] >= 0:
            latencies.append((obj["seq"], now - obj["t"]))
    conn.send(("done", latencies))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bare_sender(root: str, n: int, durable: bool, go: MpEvent, conn: Connection) -> None:
    """The maildir delivery syscalls in a bare loop: O_EXCL in tmp/, write, close, link, unlink."""
    tmp, new = os.path.join(root, "tmp"), os.path.join(root, "new")
    pid, host = os.getpid(), socket.gethostname()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    conn.send("ready")
    go.wait()
    start = time.monotonic()
    for i in range(n):
        name = f"{time.time_ns()}.{pid}_{i}.{host}"
        body = {
            "v": 1, "id": f"{i:026d}", "from": TEAM_LEAD, "to": RECEIVER, "kind": "text",
            "sent_at": "2026-01-01T00:00:00.000000Z", "text": None, "summary": None,
            "data": {"seq": i}, "reply_to": None,
        }  # fmt: skip
        data = json.dumps(body).encode()
        tmp_path = os.path.join(tmp, name)
        fd = os.open(tmp_path, flags, 0o600)
        os.write(fd, data)
        if durable:
            os.fsync(fd)
        os.close(fd)
        os.link(tmp_path, os.path.join(new, name))
        os.unlink(tmp_path)
        if durable:
            _fsync_dir(new)
    conn.send(time.monotonic() - start)


def bare_receiver(root: str, n: int, durable: bool, go: MpEvent, conn: Connection) -> None:
    """The maildir receive syscalls in a bare loop: listdir new/, read, rename to cur/, log, unlink.

    An empty new/ is polled again after 0.5 ms (no inotify: the simplest thing that works).
    """
    new, cur = os.path.join(root, "new"), os.path.join(root, "cur")
    log = os.path.join(root, "handled.log")
    seen: set[int] = set()
    handled = 0
    conn.send(("ready", "listdir poll 0.5 ms"))
    go.wait()
    while handled < n:
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
    left = len(os.listdir(new)) + len(os.listdir(cur))
    conn.send(("done", end, sorted(seen), handled, left, 0))


def json_flock_updater(path: str, k: int, go: MpEvent, conn: Connection) -> None:
    """`k` read-modify-writes of a plain JSON file under fcntl.flock, written by os.replace."""
    lock_path = path + ".lock"
    tmp = f"{path}.{os.getpid()}.tmp"
    conn.send("ready")
    go.wait()
    for _ in range(k):
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
    conn.send(time.monotonic())


# ------------------------------------------------------------------------------------------
# mailbox section: the measurements
# ------------------------------------------------------------------------------------------


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    lost: int
    count: int


def summarize_latency(samples: list[tuple[int, int]], n: int) -> Latency:
    got = {seq for seq, _ in samples}
    lost = len(set(range(n)) - got) + max(0, len(samples) - len(got))  # duplicates count too
    values = sorted(ns / 1e6 for _, ns in samples)
    return Latency(percentile(values, 50), percentile(values, 99), lost, len(samples))


def measure_shoal_latency(home: Path, n: int, rate: float, warmup: int) -> dict[str, Any]:
    """Paced sends from this process to a receiver process; via `send()` and via deliver."""
    from shoal.core.paths import Layout
    from shoal.mailbox.router import make_message, send
    from shoal.mailbox.schema import encode
    from shoal.mailbox.store import Maildir
    from shoal.teams.store import Teams

    team = "lat"
    inbox_dir = make_team(home, team)
    directory = Teams(Layout(home)).directory(team)
    maildir = Maildir.open(inbox_dir)
    with children() as kids:
        rx = spawn(shoal_latency_receiver, str(home), team)
        kids.append(rx)
        _, mode = rx.expect(60)
        send(
            directory,
            to=RECEIVER,
            sender=TEAM_LEAD,
            data={"phase": "ping", "seq": 0, "t": time.time_ns()},
        )
        _, ping_ns = rx.expect(10)
        for i in paced(warmup, rate):
            send(
                directory,
                to=RECEIVER,
                sender=TEAM_LEAD,
                data={"phase": "warm", "seq": i, "t": time.time_ns()},
            )
        for i in paced(n, rate):
            send(
                directory,
                to=RECEIVER,
                sender=TEAM_LEAD,
                text="latency",
                data={"phase": "send", "seq": i, "t": time.time_ns()},
            )
        time.sleep(0.2)
        for i in paced(n, rate):
            t = time.time_ns()
            msg = make_message(
                sender=TEAM_LEAD,
                to=RECEIVER,
                text="latency",
                data={"phase": "deliver", "seq": i, "t": t},
            )
            maildir.deliver(encode(msg))
        send(directory, to=RECEIVER, sender=TEAM_LEAD, data={"stop": True})
        _, lat, quarantined = rx.expect(120)
        rx.finish()
    return {
        "mode": mode,
        "ping_ms": ping_ns / 1e6,
        "send": summarize_latency(lat.get("send", []), n),
        "deliver": summarize_latency(lat.get("deliver", []), n),
        "quarantined": quarantined,
    }


def measure_pipe_latency(n: int, rate: float, warmup: int) -> Latency:
    with children() as kids:
        rx = spawn(pipe_latency_receiver)
        kids.append(rx)
        rx.expect(60)
        for i in paced(warmup, rate):
            rx.conn.send({"seq": -1 - i, "t": time.time_ns()})
        for i in paced(n, rate):
            rx.conn.send({"seq": i, "t": time.time_ns()})
        rx.conn.send(None)
        _, lat = rx.expect(60)
        rx.finish()
    return summarize_latency(lat, n)


@dataclass
class Throughput:
    rate: float  # delivered and acked per second, from go to the last ack
    sender_rate: float  # sends per second in the sender alone
    lost: int
    receiver_mode: str


def run_pair(
    sender: tuple[ChildFn, tuple[Any, ...]],
    receiver: tuple[ChildFn, tuple[Any, ...]],
    n: int,
    prepare: Callable[[], None] | None = None,
) -> Throughput:
    """Start a receiver and a sender process, release both at once, time n deliveries+acks."""
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
        send_elapsed = float(tx.expect(600))
        _, end, seen, handled, left, quarantined = rx.expect(600)
        tx.finish()
        rx.finish()
    lost = n - len(set(seen) & set(range(n)))
    if left or quarantined or handled != n:
        lost = max(lost, 1)
    return Throughput(n / (end - t0), n / send_elapsed, lost, mode)


def measure_throughput(
    cfg: Config, tag: str, n: int, durable: bool, repeats: int
) -> dict[str, list[Throughput]]:
    """shoal `send()`, make_message+deliver and the bare loop, alternating, `repeats` times."""
    from shoal.mailbox.router import make_message
    from shoal.mailbox.schema import encode
    from shoal.mailbox.store import Maildir

    home = cfg.workdir / "home"
    out: dict[str, list[Throughput]] = {"send": [], "deliver": [], "bare": []}
    for rep in range(repeats):
        for variant in ("send", "deliver", "bare"):
            if variant == "bare":
                root = cfg.workdir / f"bare-{tag}-{rep}"
                for sub in ("tmp", "new", "cur"):
                    (root / sub).mkdir(parents=True, mode=0o700)
                out["bare"].append(
                    run_pair(
                        (bare_sender, (str(root), n, durable)),
                        (bare_receiver, (str(root), n, durable)),
                        n,
                    )
                )
                continue
            team = f"tp-{tag}-{variant}-{rep}"
            inbox_dir = make_team(home, team)

            def warm(inbox_dir: Path = inbox_dir) -> None:
                msg = make_message(sender=TEAM_LEAD, to=RECEIVER, data={"seq": -1})
                Maildir.open(inbox_dir).deliver(encode(msg))

            out[variant].append(
                run_pair(
                    (shoal_sender, (str(home), team, n, variant, durable)),
                    (shoal_receiver, (str(home), team, n, durable)),
                    n,
                    prepare=warm,
                )
            )
    return out


def measure_team_updates(cfg: Config, procs: int, k: int) -> dict[str, tuple[float, int]]:
    """`procs` processes x `k` increments: shoal Teams.update vs flock + json + os.replace."""
    from shoal.core.paths import Layout
    from shoal.teams.store import Teams

    home = cfg.workdir / "home"
    team = "upd"
    teams = Teams(Layout(home))
    teams.create(team, description="0")
    plain = cfg.workdir / "plain-team.json"
    plain.write_bytes(teams.layout.team_file(team).read_bytes())  # same document, same size
    plain.chmod(0o600)

    def run(fn: ChildFn, args: tuple[Any, ...]) -> float:
        go = CTX.Event()
        with children() as kids:
            for _ in range(procs):
                kids.append(spawn(fn, *args, go))
            for c in kids:
                c.expect(60)
            time.sleep(0.1)
            t0 = time.monotonic()
            go.set()
            end = max(float(c.expect(600)) for c in kids)
            for c in kids:
                c.finish()
        return procs * k / (end - t0)

    shoal_rate = run(shoal_team_updater, (str(home), team, k))
    base_rate = run(json_flock_updater, (str(plain), k))
    shoal_final = int(teams.read(team).description)
    with open(plain, "rb") as fh:
        base_final = int(json.load(fh)["description"])
    return {"shoal": (shoal_rate, shoal_final), "baseline": (base_rate, base_final)}


def best(trials: list[Throughput]) -> Throughput:
    return max(trials, key=lambda t: t.rate)


@section("mailbox", "mailbox: maildir latency, throughput and team-file updates")
def mailbox_section(cfg: Config) -> SectionResult:
    res = SectionResult()
    rows = res.rows
    home = cfg.workdir / "home"
    os.environ["SHOAL_HOME"] = str(home)  # children inherit it; every call passes it too

    # 1. latency at a fixed pace
    rate, n_lat, warmup = 500.0, (500 if cfg.quick else 2000), 50
    lat = measure_shoal_latency(home, n_lat, rate, warmup)
    pipe = measure_pipe_latency(n_lat, rate, warmup)
    for key, label in (("send", "send()"), ("deliver", "make_message+deliver [lower-level]")):
        s: Latency = lat[key]
        rows.append(
            Row(
                f"latency p50, {label} @{rate:.0f}/s",
                "ms",
                s.p50_ms,
                pipe.p50_ms,
                "lower",
                "<= 1 ms",
                s.p50_ms <= 1.0,
            )
        )
        rows.append(
            Row(
                f"latency p99, {label} @{rate:.0f}/s",
                "ms",
                s.p99_ms,
                pipe.p99_ms,
                "lower",
                "<= 10 ms",
                s.p99_ms <= 10.0,
            )
        )
    lat_lost = lat["send"].lost + lat["deliver"].lost + lat["quarantined"]
    rows.append(
        Row(
            f"lost, latency runs ({2 * n_lat} msgs)",
            "count",
            lat_lost,
            pipe.lost,
            "lower",
            "== 0",
            lat_lost == 0,
        )
    )
    res.notes.append(
        f"latency: {n_lat} msgs per variant paced at {rate:.0f}/s after {warmup} warm-up; "
        f"receiver watcher={lat['mode']}, first ping {lat['ping_ms']:.2f} ms; baseline = "
        "one-way multiprocessing.Pipe at the same pace, child records receipt-send time."
    )

    # 2./3. one sender -> one receiver throughput, plain and durable
    for durable in (False, True):
        n = (5000 if cfg.quick else 20000) if not durable else (1000 if cfg.quick else 4000)
        tag = "durable" if durable else "plain"
        tp = measure_throughput(cfg, tag, n, durable, cfg.repeats)
        bare = best(tp["bare"])
        suffix = ", durable" if durable else ""
        for key, label in (("send", "send()"), ("deliver", "make_message+deliver [lower-level]")):
            b = best(tp[key])
            rows.append(
                Row(
                    f"1->1 delivered+acked/s{suffix}, {label}",
                    "msg/s",
                    b.rate,
                    bare.rate,
                    "higher",
                    "ratio >= 0.50",
                    b.rate >= 0.5 * bare.rate,
                )
            )
        for key, label in (("send", "send()"), ("deliver", "make_message+deliver")):
            b = best(tp[key])
            rows.append(
                Row(
                    f"  sender alone/s{suffix}, {label} [info]",
                    "msg/s",
                    b.sender_rate,
                    bare.sender_rate,
                    "higher",
                )
            )
        lost = sum(t.lost for k in ("send", "deliver") for t in tp[k])
        bare_lost = sum(t.lost for t in tp["bare"])
        rows.append(
            Row(
                f"lost{suffix} ({n} msgs x {cfg.repeats} x 2 variants)",
                "count",
                lost,
                bare_lost,
                "lower",
                "== 0",
                lost == 0,
            )
        )
        res.notes.append(
            f"throughput{suffix}: {n} msgs, sender and receiver processes released together, "
            f"best of {cfg.repeats}; rate = n / (release -> last ack). Baseline = bare loop of "
            "the same syscalls"
            + (" with the same fsyncs" if durable else "")
            + f" (receiver polls listdir every 0.5 ms when empty); shoal receiver watcher="
            f"{best(tp['send']).receiver_mode}."
        )

    # 4. contended team-file updates
    procs, k = 8, (25 if cfg.quick else 100)
    upd = measure_team_updates(cfg, procs, k)
    (s_rate, s_final), (b_rate, b_final) = upd["shoal"], upd["baseline"]
    rows.append(
        Row(
            f"team-file updates/s, {procs} procs x {k} [no target]",
            "upd/s",
            s_rate,
            b_rate,
            "higher",
        )
    )
    want = procs * k
    rows.append(
        Row(
            f"lost increments ({want})",
            "count",
            want - s_final,
            want - b_final,
            "lower",
            "== 0",
            s_final == want,
        )
    )
    res.notes.append(
        "team file: Teams.update (filelock + pydantic + orjson + atomic replace) vs "
        "fcntl.flock + json.load/json.dump(indent=2) + os.replace on a copy of the same file."
    )
    return res


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
    parser.add_argument("--repeats", type=int, help="throughput trials (default 1 quick, 3 full)")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary SHOAL_HOME")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when any measurement misses its target"
    )
    return parser.parse_args(argv)


def select(only: str | None) -> list[Section]:
    if not only:
        return list(SECTIONS.values())
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(
            f"bench.py: unknown section(s) {', '.join(unknown)}; "
            f"known: {', '.join(SECTIONS)} (see --list)"
        )
    return [SECTIONS[n] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in SECTIONS.values():
            print(f"{s.name:12} {s.title}")
        return 0
    chosen = select(args.only)
    repeats = args.repeats or (1 if args.quick else 3)
    workdir = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    info = machine_info(workdir)
    print(
        f"shoal bench ({'quick' if args.quick else 'full'}): python {info['python']}, "
        f"{info['cpus']} cpus, load {info['loadavg'][0]:.2f}, workdir {workdir} "
        f"({info['workdir_fs']})\n"
    )
    report: dict[str, Any] = {
        "quick": args.quick,
        "repeats": repeats,
        "machine": info,
        "sections": {},
    }
    missed = 0
    failed = 0
    try:
        for sec in chosen:
            t0 = time.monotonic()
            secdir = workdir / sec.name
            secdir.mkdir(mode=0o700)
            try:
                result = sec.run(Config(args.quick, secdir, repeats))
            except BenchError as exc:
                failed += 1
                print(f"== {sec.title} ==\nERROR: {exc}\n", flush=True)
                report["sections"][sec.name] = {"title": sec.title, "error": str(exc)}
                continue
            elapsed = time.monotonic() - t0
            print(render_table(sec.title, result))
            print(f"  ({elapsed:.1f} s)\n", flush=True)
            missed += sum(1 for r in result.rows if r.passed is False)
            report["sections"][sec.name] = {
                "title": sec.title,
                "seconds": elapsed,
                "rows": [r.to_json() for r in result.rows],
                "notes": result.notes,
            }
    finally:
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
