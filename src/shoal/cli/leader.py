"""`shoal up` and `shoal down`: run a team's leader, and stop it with all it owns."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import datetime

import click

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import EXIT_INTERRUPTED, ShoalError
from shoal.core.events import (
    Event,
    MessageReceived,
    Note,
    TaskStalled,
    TaskStarted,
    TaskTerminated,
)
from shoal.core.paths import Layout


def _event_line(event: Event) -> str | None:
    """The line a foreground leader prints for an event (None: not shown)."""
    stamp = datetime.fromtimestamp(event.ts or time.time()).strftime("%H:%M:%S")
    if isinstance(event, TaskStarted):
        return f"{stamp} started   {event.task_id}  {event.description}"
    if isinstance(event, TaskTerminated):
        return f"{stamp} {event.status:<9} {event.task_id}  {event.summary}"
    if isinstance(event, TaskStalled):
        return f"{stamp} waiting?  {event.task_id}  last line: {event.prompt}"
    if isinstance(event, Note):
        return f"{stamp} note      {event.text}"
    if isinstance(event, MessageReceived):
        msg = event.message
        return (
            f"{stamp} message   from {msg.get('from')} [{msg.get('kind')}] {msg.get('text') or ''}"
        )
    return None


def _default_team(layout: Layout, explicit: str | None) -> str:
    from shoal.teams.store import Teams

    env = get_env(click.get_current_context())
    if explicit:
        return explicit
    try:
        return env.team()
    except ShoalError:
        if not Teams(layout).names():
            return "default"
        raise


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
@common_options
def up(jobs: int, detach: bool, quiet: bool, board_off: bool) -> None:
    """Start the team's leader (creating the team if needed; default team 'default').

    The leader owns the team's background tasks. Run again after a crash, it resumes the last
    session: tasks still running are adopted, tasks that ended get their recorded exit code.
    """
    env = get_env(click.get_current_context())
    layout = env.layout
    team = _default_team(layout, env.team_arg)
    if detach:
        _detach(layout, team, jobs, quiet)
        _offer_tmux_status(layout, team)  # (this process only asks; the leader runs on)
        return
    from shoal.orchestrator.cleanup import CleanupRegistry
    from shoal.orchestrator.leader import Leader
    from shoal.orchestrator.liveness import leader_alive

    running = leader_alive(layout, team)
    if running is not None:  # (before any question: it would be asked in vain)
        raise ShoalError(f"a leader already runs for team {team!r} (pid {running[0]})")
    # Asked before the leader starts: no task can be left waiting on the answer.
    _offer_tmux_status(layout, team)

    # On a terminal the lead's pane shows the live board; elsewhere, one line per event.
    use_board = sys.stdout.isatty() and not quiet and not board_off

    def show(event: Event) -> None:
        if quiet or use_board:
            return
        line = _event_line(event)
        if line:
            click.echo(line)

    leader = Leader(layout, team, jobs=jobs, on_event=None if quiet or use_board else show)
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


def _offer_tmux_status(layout: Layout, team: str) -> None:
    """Inside tmux, on a terminal: offer to show the task pill in tmux's status line."""
    if not (os.environ.get("TMUX") and sys.stdin.isatty()):
        return
    from shoal.ui.tmux import install_tmux_status, tmux_status_hint

    hint = tmux_status_hint(layout.home, team)
    if hint is None:
        return
    if click.confirm("Show shoal's task pill in this tmux server's status line?", default=False):
        try:
            install_tmux_status(hint)
        except ShoalError as exc:
            click.echo(f"shoal: warning: {exc}", err=True)
    else:
        click.echo(f"(to do it later: {hint.command})", err=True)


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
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds to wait for the leader before killing it.",
)
@json_option
@common_options
def down(timeout: float, as_json: bool) -> None:
    """Stop the team's leader and everything it owns; no process is left behind."""
    from shoal.orchestrator.down import bring_down

    env = get_env(click.get_current_context())
    report = bring_down(env.layout, env.team(), timeout=timeout)
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
