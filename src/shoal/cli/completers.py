"""The shell completers that fill in team names, member names and task ids from SHOAL_HOME
(`shoal completion SHELL` prints the script that calls them).

click drives completion (`_SHOAL_COMPLETE={shell}_complete shoal ...` runs the command line
parser and asks these functions); they read files only and never fail (a completer that
cannot read a file offers nothing).
"""

from __future__ import annotations

import os
from typing import Any

import click
from click.shell_completion import CompletionItem

from shoal.core.names import DEFAULT_TEAM


def _given(ctx: click.Context, name: str) -> str | None:
    """--home or --team as the command line gave them so far (the Env the options fill)."""
    return getattr(ctx.find_root().obj, name, None)


def _layout(ctx: click.Context) -> Any:
    from shoal.core.paths import Layout

    return Layout(_given(ctx, "home_arg"))


def _team(ctx: click.Context) -> str:
    return _given(ctx, "team_arg") or os.environ.get("SHOAL_TEAM") or DEFAULT_TEAM


def complete_team(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Team names under SHOAL_HOME."""
    try:
        from shoal.teams.store import Teams

        names = Teams(_layout(ctx)).names()
    except Exception:  # (completion offers nothing rather than a traceback in the shell)
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_member(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Member names of the team the command line names (else the default team)."""
    try:
        from shoal.teams.store import Teams

        team = Teams(_layout(ctx)).read(_team(ctx))
        names = [m.name for m in team.members]
    except Exception:
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_task_id(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Task ids of the team's current session, live and finished, with their descriptions."""
    try:
        from shoal.teams.session import current_session

        session = current_session(_layout(ctx), _team(ctx))
        if session is None:
            return []
        tasks = {**session.history(), **session.read_tasks_raw()}
    except Exception:
        return []
    return [
        CompletionItem(task_id, help=f"{t.get('status', '')} {t.get('description', '')}".strip())
        for task_id, t in sorted(tasks.items())
        if task_id.startswith(incomplete)
    ]
