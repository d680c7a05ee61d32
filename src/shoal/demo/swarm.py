"""`shoal demo`: a lead and three scripted teammates survey the current directory.

Offline and read-only on your files: the teammates claim tasks with dependencies from the
shared list, run real commands (find, awk, sort, grep) on the current directory, write what
they find into the team's scratchpad, tell each other when they finish, and report back. The
lead prints a summary; the team, its processes and panes are gone at the end.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.events import Event, MessageReceived, TeammateReady
from shoal.core.paths import Layout
from shoal.orchestrator.leader import Leader
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList

DEMO_TIMEOUT_S = 50.0
TEAMMATES = ("ana", "ben", "cai")

SCRIPT = """\
# The demo teammates' brain: run the task's command, tell a teammate, report the result.
# (The pause only lets you watch the panes; the work is the command.)
[[step]]
when = "task"
sleep = 0.5

[[step]]
when = "task"
run = "{meta_run}"

[[step]]
when = "task"
send = "{meta_tell}"
text = "{name} finished task {task_id}: {subject}"

[[step]]
when = "task"
result = "{subject}: done by {name}"

[[step]]
when = "message"
result = "{name} noted: {prompt}"
"""


def _tasks(scratch: Path) -> list[dict[str, Any]]:
    files = scratch / "files.txt"
    out = scratch
    q = f"'{files}'"
    return [
        {
            "key": "inventory",
            "subject": "List the files of this directory",
            "run": f"find . -type f -not -path '*/.*' -not -path '*/node_modules/*' "
            f"| head -n 5000 > {q}; wc -l < {q}",
            "after": [],
        },
        {
            "key": "extensions",
            "subject": "Count files per extension",
            "run": f"awk -F/ '{{print $NF}}' {q} | awk -F. 'NF>1{{print $NF}}' | sort | uniq -c "
            f"| sort -rn | head -n 8 > '{out / 'extensions.txt'}'",
            "after": ["inventory"],
        },
        {
            "key": "largest",
            "subject": "Find the largest files",
            "run": f"tr '\\n' '\\0' < {q} | xargs -0 -r du -k 2>/dev/null | sort -rn | head -n 5 "
            f"> '{out / 'largest.txt'}'",
            "after": ["inventory"],
        },
        {
            "key": "markers",
            "subject": "Count TODO and FIXME markers",
            "run": f"tr '\\n' '\\0' < {q} | xargs -0 -r grep -I -c -E 'TODO|FIXME' 2>/dev/null "
            f"| grep -v ':0$' | sort -t: -k2 -rn | head -n 5 > '{out / 'markers.txt'}'; true",
            "after": ["inventory"],
        },
        {
            "key": "report",
            "subject": "Write the report",
            "run": f"cd '{out}' && {{ echo '## files per extension'; cat extensions.txt; "
            f"echo '## largest files (KiB)'; cat largest.txt; "
            f"echo '## TODO/FIXME markers'; cat markers.txt; }} > report.txt; "
            f"wc -l < report.txt",
            "after": ["extensions", "largest", "markers"],
        },
    ]


@dataclass
class DemoResult:
    """What the demo did, for the summary."""

    team: str
    backend: str
    why: str
    done_by: dict[str, str] = field(default_factory=dict)
    report: str = ""
    messages: int = 0
    seconds: float = 0.0
    killed: list[str] = field(default_factory=list)


def run_demo(
    layout: Layout,
    *,
    backend: str = "auto",
    cwd: str,
    say: Callable[[str], None] = print,
    timeout: float = DEMO_TIMEOUT_S,
    why: str | None = None,
) -> DemoResult:
    """Run the demo in `cwd`; raises ShoalError if it cannot finish in `timeout` seconds."""
    started = time.monotonic()
    teams = Teams(layout)
    team = teams.create("demo", "shoal demo", unique=True).name
    events: list[Event] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if isinstance(event, TeammateReady):
            say(f"  {event.name} is ready")
        elif isinstance(event, MessageReceived) and event.kind == "task_notification":
            say(f"  {event.message.get('summary') or event.message['from']}")

    result = DemoResult(team=team, backend="", why="")
    with demo_leader(layout, team, on_event=on_event) as leader:
        scratch = layout.ensure(layout.scratchpad_dir(team))
        script = scratch / "teammate.toml"
        script.write_text(SCRIPT)
        for name in TEAMMATES:
            ready = threading.Event()
            answer: dict[str, Any] = {}

            def done(
                res: dict[str, Any] | None,
                err: ShoalError | None,
                answer: dict[str, Any] = answer,
                ready: threading.Event = ready,
            ) -> None:
                answer["result"], answer["error"] = res, err
                ready.set()

            spec = {
                "name": name,
                "agent": "scripted",
                "script": str(script),
                "backend": backend,
                "cwd": cwd,
            }
            leader.call(partial(leader.swarm.spawn, spec, done)).result(30)
            if not ready.wait(30):
                raise ShoalError(f"teammate {name} did not become ready")
            if answer["error"] is not None:
                raise answer["error"]
            result.backend = answer["result"]["backend"]
            result.why = why or answer["result"]["why"]
        tasklist = TaskList(teams, team)
        ids: dict[str, int] = {}
        for i, spec in enumerate(_tasks(scratch)):
            item = tasklist.add(
                spec["subject"],
                description=spec["subject"],
                blocked_by=[ids[k] for k in spec["after"]],
                metadata={"run": spec["run"], "tell": TEAMMATES[(i + 1) % len(TEAMMATES)]},
            )
            ids[spec["key"]] = item.id
        say(f"team {team}: {len(ids)} tasks with dependencies in the shared list")
        say(f"teammates run with backend {result.backend} ({result.why})")
        if result.backend == "tmux":
            say(f"  watch them: shoal attach --team {team}")
        # Given up after `timeout` s in which no task moved (a slow machine is no failure).
        deadline = time.monotonic() + timeout
        last: tuple[object, ...] = ()
        while time.monotonic() < deadline:
            items = tasklist.list()
            if all(t.status == "completed" for t in items):
                break
            now = tuple((t.id, t.status, t.owner) for t in items)
            if now != last:
                last, deadline = now, time.monotonic() + timeout
            time.sleep(0.1)
        else:
            raise ShoalError(
                f"the demo made no progress for {timeout:g}s; see `shoal task list --team {team}`"
            )
        for item in tasklist.list():
            result.done_by[item.subject] = item.owner or "?"
        with contextlib.suppress(OSError):
            result.report = (scratch / "report.txt").read_text()
        result.messages = sum(1 for e in events if isinstance(e, MessageReceived))
    result.seconds = time.monotonic() - started
    return result


@contextlib.contextmanager
def demo_leader(
    layout: Layout, team: str, on_event: Callable[[Event], None] | None = None
) -> Iterator[Leader]:
    """A leader of `team` running on a thread of this process; at the end it shuts down
    (every task and teammate with it) and the team is deleted."""
    leader = Leader(layout, team, on_event=on_event).start()
    stop = threading.Event()
    loop = threading.Thread(target=leader.run, args=(stop,), name="shoal-demo-leader")
    loop.start()
    try:
        yield leader
    finally:
        stop.set()
        leader.wake()
        loop.join(30)
        leader.shutdown()
        with contextlib.suppress(ShoalError):
            Teams(layout).delete(team, force=True)


def tmux_available() -> bool:
    """Whether a tmux binary is on PATH."""
    return shutil.which("tmux") is not None
