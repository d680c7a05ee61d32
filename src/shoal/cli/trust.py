"""`shoal trust [DIR]`: let a project's files that run code or widen what agents may do be used
(`.shoal/mcp.json`, `.mcp.json`, `.shoal/agents/`, `.claude/agents/`); and the one question
the commands that load them may ask on a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import UsageError

TRUST_HELP = (
    "Trust this directory's project files (.shoal/mcp.json, .shoal/agents/, ...) for this run "
    "only, without recording it and without asking (for CI)."
)


def trust_option(func: Any) -> Any:
    """`--trust` for a command that loads project files."""
    return click.option("--trust", "trust_run", is_flag=True, help=TRUST_HELP)(func)


def settle(home: Path, directory: Path, sources: Iterable[str], trust_run: bool) -> bool:
    """Whether this run trusts `directory` without a record (`--trust`). Else, on a terminal
    (standard input and standard error both), an untrusted project with such files is asked
    about once: yes records it, as `shoal trust` does. Off a terminal nothing is asked (the
    run goes without the files and says so)."""
    if trust_run:
        return True
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    from shoal.core import trust

    view = trust.view(home, directory)
    if view.trusted:
        return False
    files = [f.path for f in view.project.select(sources) if f.data is not None]
    if not files:
        return False
    click.echo(f"{view.root} has files that run code or widen what agents may do:", err=True)
    for path in files:
        click.echo(f"  {path}", err=True)
    for script in view.project.run_by(sources):
        click.echo(f"  {script.path} (its MCP servers run it)", err=True)
    if view.changed:
        click.echo(f"changed since it was trusted: {', '.join(view.changed)}", err=True)
    if click.confirm("Trust this folder?", default=False, err=True):
        trust.record(home, view.project)
        click.echo(f"shoal: trusted {view.root} (undo: shoal trust --revoke DIR)", err=True)
    return False


def _entry_json(path: str, entry: Any, status: str) -> dict[str, Any]:
    return {"path": path, "status": status, **entry.model_dump()}


@click.command()
@click.argument(
    "directory", required=False, type=click.Path(exists=True, file_okay=False), metavar="[DIR]"
)
@click.option("--list", "listing", is_flag=True, help="List the trusted directories.")
@click.option(
    "--revoke",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Forget a trusted directory: its files are left out again.",
)
@json_option
@common_options
def trust(directory: str | None, listing: bool, revoke: str | None, as_json: bool) -> None:
    """Trust a project directory: its agents may use its MCP servers and agent definitions.

    DIR (default: here) holds the MCP servers (.shoal/mcp.json, and .mcp.json for
    `shoal monitor`) and agent definitions (.shoal/agents/, .claude/agents/).

    Records DIR's real path and a digest of those files (and of the files inside DIR that
    those MCP servers run, named by a server's command or arguments) in
    SHOAL_HOME/trust.json and prints the files it covered. A file changed, added or removed
    afterwards makes DIR untrusted again (run this again). Symlinks among them are never
    followed, trusted or not.

    An agent in an untrusted DIR runs without them and says so once, with this command.
    On a terminal, `shoal agent`, `shoal chat` and `shoal monitor` ask first; elsewhere
    nothing asks, and `--trust` on those commands trusts DIR for one run without recording
    it (for CI). Definitions in SHOAL_HOME/agents/ and a `--mcp-config FILE` (or monitor's
    `--config FILE`) given on the command line need no trust.
    """
    from shoal.core import trust as store

    home = get_env(click.get_current_context()).layout.home
    if sum((listing, revoke is not None, directory is not None)) > 1:
        raise UsageError("give one of DIR, --list and --revoke DIR")
    if listing:
        _list(home, as_json)
        return
    if revoke is not None:
        removed = store.revoke(home, Path(revoke))
        if as_json:
            print_json({"path": removed, "revoked": True})
        else:
            click.echo(f"revoked {removed}: its project files are left out again")
        return
    project = store.scan(Path(directory or os.getcwd()), home)
    refused = [
        {"path": f.path, "why": f.refused}
        for f in project.files
        if f.data is None and f.used_by is None
    ]
    used = [f.path for f in project.files if f.data is not None]
    if not project.files:
        if as_json:
            print_json({"path": str(project.root), "recorded": False, "files": []})
        else:
            click.echo(
                f"nothing to trust in {project.root}: it has no .shoal/mcp.json, .mcp.json, "
                ".shoal/agents/ or .claude/agents/ (nothing recorded)"
            )
        return
    entry = store.record(home, project)
    if as_json:
        print_json(
            {"path": str(project.root), "recorded": True, **entry.model_dump(), "refused": refused}
        )
        return
    click.echo(f"trusted {project.root} ({len(used)} file(s), {entry.digest[:19]}…):")
    for f in project.files:
        if f.data is not None:
            click.echo(f"  {f.path}" + (f" (run by {f.used_by})" if f.used_by else ""))
        elif f.used_by is not None:
            click.echo(f"  partly covered: {f.path} (run by {f.used_by}): {f.refused}")
    for item in refused:
        click.echo(f"  never used: {item['path']}: {item['why']}")


def _list(home: Path, as_json: bool) -> None:
    from shoal.core import trust as store

    rows = []
    for path, entry in sorted(store.load_store(home).projects.items()):
        if not os.path.isdir(path):
            status = "missing"
        elif store.scan(Path(path), home).digest == entry.digest:
            status = "trusted"
        else:
            status = "changed (untrusted until `shoal trust DIR` again)"
        rows.append(_entry_json(path, entry, status))
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no trusted directories (see `shoal trust --help`)")
    for row in rows:
        click.echo(f"{row['path']}  {row['status']}  since {row['trusted_at']}")
        click.echo(f"  {', '.join(row['files']) or '(no files)'}")
