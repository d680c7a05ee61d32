"""The CLI contract, command by command: every click command of `shoal` (walked from the main
group, subcommands too) has a --help that exits 0, refuses an unknown option with exit 2 and
one `shoal: error: no such option` line, takes --home and --team, and takes its times as
durations (`90`, `1.5s`, `5m`). Then what holds without a leader: bare `shoal` is its help,
typos of `sh`'s options are refused before anything is asked of a leader, and the commands
pueue's users type exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from shoal.core.errors import EXIT_USAGE
from tests.conftest import Cli

# One process runs every check, in-process through `shoal.cli.main.main` (what the console
# script runs), so walking some sixty commands twice stays fast.
WALKER = r"""
import contextlib, io, json, sys
import click
from shoal.cli.common import Duration
from shoal.cli.main import cli, main

def walk(cmd, path):
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from walk(cmd.get_command(ctx, name), path + [name])

def run(argv):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["shoal", *argv]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()

rows = []
for path, cmd in walk(cli, []):
    if cmd.hidden:
        continue
    opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
    timed = [
        p.name for p in cmd.params
        if isinstance(p, click.Option) and any(w in (p.name or "") for w in (
            "timeout", "delay", "every", "idle", "seconds"))
    ]
    rows.append({
        "path": path,
        "help": run([*path, "--help"]),
        "bogus": run([*path, "--no-such-option-xyz"]),
        "options": sorted(opts),
        "untyped_times": [
            n for n in timed
            if not isinstance(next(p for p in cmd.params if p.name == n).type, Duration)
        ],
    })
print(json.dumps(rows))
"""


def walk_commands(home: Path) -> list[dict[str, Any]]:
    """Every visible command's checks, as the walker process found them."""
    out = subprocess.run(
        [sys.executable, "-c", WALKER],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SHOAL_HOME": str(home)},
    )
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def test_every_command_keeps_the_contract(home: Path) -> None:
    rows = walk_commands(home)
    paths = {" ".join(r["path"]) for r in rows}
    assert {"", "sh", "ps", "logs", "follow", "stop", "wait", "task add", "group add"} <= paths
    assert len(rows) > 50
    problems: list[str] = []
    for row in rows:
        path = " ".join(row["path"])
        name = f"shoal {path}".strip()
        code, out, err = row["help"]
        if code != 0 or not out.startswith(f"Usage: {name} ") or err:
            problems.append(f"{name} --help: exit {code}, {(out or err)[:80]!r}")
        if "…" in out:
            problems.append(f"{name} --help cuts a description with …")
        code, out, err = row["bogus"]
        said = f"shoal: error: no such option --no-such-option-xyz (see `{name} --help`)\n"
        if code != EXIT_USAGE or err != said or out:
            problems.append(f"{name} --no-such-option-xyz: exit {code}, {err!r}")
        if path and not {"--home", "--team"} <= set(row["options"]):
            problems.append(f"{name} lacks --home or --team")
        if row["untyped_times"]:
            problems.append(f"{name}: {row['untyped_times']} are not durations")
    assert not problems, "\n".join(problems)


def test_bare_shoal_prints_its_help_and_exits_0(cli: Cli) -> None:
    out = cli()
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.startswith("Usage: shoal ")
    sections = [line for line in out.stdout.splitlines() if line and not line[0].isspace()]
    for section in ("Background tasks:", "Swarms:", "CI batch runs:", "Agents:", "Advanced:"):
        assert section in sections, out.stdout
    # Internal commands are at the end, core ones first.
    text = out.stdout
    assert text.index("\n  sh ") < text.index("\n  spawn ") < text.index("\n  worker ")
    assert "…" not in text
    assert cli("--help").stdout == out.stdout


def test_sh_refuses_an_unknown_option_before_asking_a_leader(cli: Cli) -> None:
    for argv, near in (
        (["sh", "--timout", "5", "--", "echo", "hi"], "--timeout"),
        (["sh", "--retry", "2", "--", "echo", "hi"], "--retries"),
        (["add", "--timout", "5", "--", "echo", "hi"], "--timeout"),
    ):
        out = cli(*argv)  # (no leader runs: the typo is what is said)
        assert out.returncode == EXIT_USAGE, out.stderr
        assert out.stderr.startswith(f"shoal: error: no such option {argv[1]}, did you mean {near}")
        assert "leader" not in out.stderr and out.stdout == ""


def test_times_are_durations_everywhere(cli: Cli) -> None:
    for argv in (
        ["wait", "--timeout", "5x"],
        ["sh", "--timeout", "5x", "--", "true"],
        ["inbox", "bob", "--timeout", "soon"],
        ["down", "--timeout", "never"],
    ):
        out = cli(*argv)
        assert out.returncode == EXIT_USAGE and "bad duration" in out.stderr, (argv, out.stderr)
    # A good one gets past the parser (then there is no team to act on).
    out = cli("wait", "--timeout", "5m")
    assert out.returncode == 1 and "not a valid float" not in out.stderr
    assert "no team 'default'" in out.stderr


def test_pueue_words_are_commands_and_other_words_get_the_right_hint(cli: Cli) -> None:
    for word, usage in (
        ("status", "Usage: shoal status [OPTIONS]"),
        ("add", "Usage: shoal add [OPTIONS] [COMMAND]..."),
        ("kill", "Usage: shoal kill [OPTIONS] [TASK_IDS]..."),
        ("log", "Usage: shoal log [OPTIONS] [TASK_IDS]..."),
        ("follow", "Usage: shoal follow [OPTIONS] [TASK_ID]"),
        ("remove", "Usage: shoal remove [OPTIONS] [TASK_IDS]..."),
    ):
        out = cli(word, "--help")
        assert out.returncode == 0 and out.stdout.startswith(usage), (word, out.stdout[:80])
    start = cli("start")
    assert start.returncode == EXIT_USAGE
    assert "did you mean 'resume'" in start.stderr and "'up'" in start.stderr
    assert "restart" not in start.stderr
    typo = cli("folow")
    assert typo.returncode == EXIT_USAGE and "did you mean 'follow'" in typo.stderr


def test_team_list_counts_one_member_in_the_singular(cli: Cli) -> None:
    assert cli("team", "create", "solo").returncode == 0  # (its lead is its one member)
    listed = cli("team", "list")
    assert listed.returncode == 0 and "solo\t1 member, " in listed.stdout, listed.stdout
    assert cli("team", "join", "solo", "ana", "--pid", "1").returncode == 0
    assert "solo\t2 members, " in cli("team", "list").stdout
