"""`shoal up` and `shoal down`: run a team's leader, and stop it with all it owns."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from shoal.cli.common import DURATION, common_options, get_env, json_option, print_json
from shoal.core.errors import EXIT_INTERRUPTED, ShoalError
from shoal.core.events import (
    Event,
)
from shoal.core.paths import Layout


def _event_line(event: Event) -> str | None:
    """The line a foreground leader prints for an event (None: not shown)."""
    from shoal.ui.event_lines import event_line

    return event_line(event.to_record(), leader_view=True)


@click.command()
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Run at most this many tasks at once (0: no limit).",
)
@click.option("--detach", "-d", is_flag=True, help="Run the leader in the background.")
@click.option("--quiet", "-q", is_flag=True, help="Do not print task events.")
@click.option(
    "--no-board",
    "board_off",
    is_flag=True,
    help="Print events as lines even on a terminal (no live board).",
)
@click.option(
    "--tmux-status",
    is_flag=True,
    help="Inside tmux: put the task pill in front of status-right (`shoal down` restores it).",
)
@common_options
def up(jobs: int, detach: bool, quiet: bool, board_off: bool, tmux_status: bool) -> None:
    """Start the team's leader (creating the team if needed; default team 'default').

    The leader owns the team's background tasks. Run again after a crash, it resumes the last
    session: tasks still running are adopted, tasks that ended get their recorded exit code.
    """
    env = get_env(click.get_current_context())
    layout = env.layout
    team = env.team()
    if detach:
        _detach(layout, team, jobs, quiet)
        _tmux_status(layout, team, tmux_status)
        return
    from shoal.orchestrator.batch.workflow_kind import install as install_workflows
    from shoal.orchestrator.cleanup import CleanupRegistry
    from shoal.orchestrator.leader import Leader
    from shoal.orchestrator.liveness import leader_alive

    running = leader_alive(layout, team)
    if running is not None:
        raise ShoalError(f"a leader already runs for team {team!r} (pid {running[0]})")

    # On a terminal the lead's pane shows the live board; elsewhere, one line per event.
    use_board = sys.stdout.isatty() and not quiet and not board_off

    def show(event: Event) -> None:
        if quiet or use_board:
            return
        line = _event_line(event)
        if line:
            click.echo(line)

    leader = Leader(layout, team, jobs=jobs, on_event=None if quiet or use_board else show)
    install_workflows(leader)  # (before start: a resumed session's workflows go on)
    cleanup = CleanupRegistry()
    interrupted: list[int] = []

    def on_signal(signum: int) -> None:
        interrupted.append(signum)
        leader.request_stop()

    cleanup.install_signals(on_signal)
    leader.start()
    cleanup.register("leader", leader.shutdown)
    click.echo(
        f"leader of team {team} running (session {leader.session.id}, pid {os.getpid()});"
        " stop it with `shoal down`",
        err=True,
    )
    for note in leader.notes:
        click.echo(f"note: {note}", err=True)
    if _tmux_status(layout, team, tmux_status):
        cleanup.register("tmux-status", lambda: _restore_tmux_status(layout, team))
    if use_board:
        from shoal.ui.board import start_board
        from shoal.ui.source import FileSource

        board = start_board(FileSource(layout, team), events=5)

        def stop_board() -> None:
            board.stop()
            board.join(2)

        cleanup.register("board", stop_board)
    try:
        leader.run()
    finally:
        cleanup.run_all()
    if signal.SIGINT in interrupted:
        sys.exit(EXIT_INTERRUPTED)  # Ctrl-C; `shoal down` and SIGTERM are a normal stop


def _tmux_status(layout: Layout, team: str, install: bool) -> bool:
    """With --tmux-status inside tmux, put the pill in front of the server's status-right
    (True when it is there); without it, inside tmux on a terminal, say how. Asks nothing."""
    from shoal.ui.tmux import install_tmux_status, tmux_status_hint

    hint = tmux_status_hint(layout.home, team)
    if not install:
        if hint is not None and sys.stderr.isatty():
            click.echo("(`shoal up --tmux-status` shows the task pill in tmux's status line)",
                       err=True)  # fmt: skip
        return False
    if hint is None:
        click.echo("shoal: warning: --tmux-status: not inside tmux ($TMUX is unset)", err=True)
        return False
    try:
        install_tmux_status(hint, saved=_status_record(layout, team))
    except ShoalError as exc:
        click.echo(f"shoal: warning: {exc}", err=True)
        return False
    click.echo(f"the task pill of team {team} is in tmux's status line", err=True)
    return True


def _status_record(layout: Layout, team: str) -> Path:
    """Where `up --tmux-status` keeps the status-right it prepended to."""
    return layout.team_dir(team) / "tmux-status.json"


def _restore_tmux_status(layout: Layout, team: str) -> None:
    """Put tmux's status-right back as `up --tmux-status` found it (a warning if it cannot)."""
    from shoal.ui.tmux import restore_tmux_status

    try:
        restore_tmux_status(_status_record(layout, team))
    except ShoalError as exc:
        click.echo(f"shoal: warning: {exc}", err=True)


def _detach(layout: Layout, team: str, jobs: int, quiet: bool) -> None:
    from shoal.orchestrator.detach import start_detached

    started = start_detached(layout, team, jobs=jobs, quiet=quiet)
    click.echo(
        f"leader of team {team} running in the background (pid {started.pid});"
        f" log: {started.log_path}"
    )
    for note in started.notes:
        click.echo(f"note: {note}", err=True)


@click.command()
@click.option(
    "--timeout",
    type=DURATION,
    default=30.0,
    show_default=True,
    help="How long to wait for the leader before killing it (90, 1.5s, 5m).",
)
@json_option
@common_options
def down(timeout: float, as_json: bool) -> None:
    """Stop the team's leader and everything it owns; no process is left behind."""
    from shoal.orchestrator.down import bring_down

    env = get_env(click.get_current_context())
    report = bring_down(env.layout, env.team(), timeout=timeout)
    _restore_tmux_status(env.layout, report.team)
    for warning in report.warnings:
        click.echo(f"shoal: warning: {warning}", err=True)
    if as_json:
        print_json(
            {
                "team": report.team,
                "leader_pid": report.leader_pid,
                "killed_orphans": report.killed_orphans,
            }
        )
        return
    if report.leader_pid is None and not report.killed_orphans:
        click.echo(f"no leader was running for team {report.team}")
    if report.leader_pid is not None:
        click.echo(f"stopped the leader of team {report.team} (pid {report.leader_pid})")
    if report.killed_orphans:
        click.echo(
            f"killed {len(report.killed_orphans)} task(s) left by a crashed leader: "
            + " ".join(report.killed_orphans)
        )
