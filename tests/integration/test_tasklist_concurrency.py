"""The task list under real concurrent processes: one lock makes ids unique and claims atomic."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList

TEAM = "alpha"

# Each child imports everything, says "ready", waits for the go line on stdin (a barrier, so
# the racing part really overlaps), then prints one JSON result.
CHILD = """
import json, sys
from shoal.core.paths import Layout
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from shoal.teams.taskitems import ClaimRefused

mode, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
tl = TaskList(Teams(Layout()), "alpha")
print("ready", flush=True)
sys.stdin.readline()
if mode == "add":
    print(json.dumps([tl.add(f"{name} {i}").id for i in range(count)]))
elif mode == "claim":
    try:
        print(json.dumps({"ok": True, "owner": tl.claim(count, name).owner}))
    except ClaimRefused as exc:
        print(json.dumps(exc.to_json()))
elif mode == "claim_next":
    got = []
    while (item := tl.claim_next(name)) is not None:
        got.append(item.id)
        tl.update(item.id, status="completed")
    print(json.dumps(got))
"""


def race(*argvs: list[str]) -> list[Any]:
    """Start one child per argv, release them together, return their JSON results in order."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == "ready\n", proc.communicate()[1]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            results.append(json.loads(out))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_concurrent_adds_get_distinct_ids(teams: Teams) -> None:
    teams.create(TEAM)
    results = race(*[["add", f"p{n}", "50"] for n in range(4)])
    ids = [i for batch in results for i in batch]
    assert len(ids) == 200
    assert sorted(ids) == list(range(1, 201))
    for batch in results:
        assert batch == sorted(batch)  # each process sees its own ids increase
    tl = TaskList(teams, TEAM)
    items, errors = tl.list_with_errors()
    assert errors == [] and [t.id for t in items] == list(range(1, 201))
    assert Counter(t.subject.split()[0] for t in items) == {f"p{n}": 50 for n in range(4)}
    assert (teams.layout.tasklist_dir(TEAM) / ".highwatermark").read_text().strip() == "200"


def test_racing_claims_have_exactly_one_winner(teams: Teams) -> None:
    teams.create(TEAM)
    names = [f"w{n}" for n in range(8)]
    for name in names:
        teams.join(TEAM, name)
    tl = TaskList(teams, TEAM)
    tl.add("contested")
    results = race(*[["claim", name, "1"] for name in names])
    winners = [names[i] for i, r in enumerate(results) if r["ok"]]
    assert len(winners) == 1
    losers = [r for r in results if not r["ok"]]
    assert len(losers) == 7
    assert all(r["reason"] == "already_claimed" and r["task_id"] == 1 for r in losers)
    assert all(r["detail"] == winners[0] for r in losers)
    item = tl.get(1)
    assert (item.owner, item.status) == (winners[0], "in_progress")


def test_racing_claim_next_hands_out_each_task_once(teams: Teams) -> None:
    teams.create(TEAM)
    names = [f"w{n}" for n in range(6)]
    for name in names:
        teams.join(TEAM, name)
    tl = TaskList(teams, TEAM)
    for i in range(30):
        tl.add(f"job {i}")
    results = race(*[["claim_next", name, "0"] for name in names])
    done = [i for batch in results for i in batch]
    assert sorted(done) == list(range(1, 31))
    assert all(t.status == "completed" for t in tl.list())
