"""`shoal send` and `shoal inbox`: write to and read from member inboxes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from shoal.cli.common import (
    DURATION,
    common_options,
    complete_member,
    get_env,
    json_option,
    parse_json_arg,
    print_json,
    print_json_line,
)
from shoal.core.errors import EXIT_INTERRUPTED, ConflictError, NotFoundError, UsageError
from shoal.core.names import validate_name
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import send as route_send
from shoal.mailbox.schema import KINDS, AnyMessage
from shoal.mailbox.store import Maildir
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams


@click.command()
@click.argument("to", shell_complete=complete_member)
@click.argument("text", required=False)
@click.option("--from", "sender", default=LEAD_NAME, show_default=True, help="Sender name.")
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default="text",
    show_default=True,
    help="Message kind (its --data is validated per kind).",
)
@click.option("--data", "data_json", default=None, metavar="JSON", help="Kind-specific payload.")
@click.option("--summary", default=None, help="One-line summary shown in previews.")
@click.option("--durable", is_flag=True, help="fsync the message before returning.")
@json_option
@common_options
def send(
    to: str,
    text: str | None,
    sender: str,
    kind: str,
    data_json: str | None,
    summary: str | None,
    durable: bool,
    as_json: bool,
) -> None:
    """Send TEXT to TO (a member, '*' for all alive members, an agent task id, uds:PATH or
    bridge:SESSION).

    To a running agent task the text is queued for its next tool round; to a finished one it
    starts a new task continuing its conversation (its id is printed).

    TEXT '-' reads the text from standard input.

    Prints the message id once the message is in every recipient's inbox.
    """
    env = get_env(click.get_current_context())
    data = parse_json_arg(data_json, "--data") if data_json is not None else None
    if data is not None and not isinstance(data, dict):
        raise UsageError("--data must be a JSON object")
    if text == "-":
        text = sys.stdin.read()
        if not text.strip():  # (a pipe whose writer failed, most likely: nothing is sent)
            raise UsageError("nothing to send: standard input was empty; nothing was sent")
    elif text is not None and not text.strip() and data is None:
        raise UsageError("nothing to send: TEXT is empty; nothing was sent")
    if text is None and data is None:
        raise UsageError("nothing to send: give TEXT or --data")
    team = env.team()
    teams = Teams(env.layout)
    if _is_agent_task(to) and teams.read(team).member(to) is None:
        _send_to_agent(env.layout, team, to, text or "", as_json)
        return
    if not to.startswith(("uds:", "bridge:")) and teams.read(team).member(sender) is None:
        # (a socket or bridge peer is outside the team: its sender is its own business)
        raise NotFoundError(
            f"no member {sender!r} in team {team!r} to send from; nothing was sent "
            f"(see `shoal team show {team}`)"
        )
    result = route_send(
        teams.directory(team),
        to=to,
        sender=sender,
        kind=kind,
        text=text,
        summary=summary,
        data=data,
        durable=durable,
    )
    if as_json:
        print_json({"id": result.id, "team": team, "to": to, "recipients": result.recipients})
    else:
        click.echo(result.id)


def _is_agent_task(to: str) -> bool:
    """True for what looks like a local_agent task id (a member of that name wins)."""
    from shoal.core.tasks import TASK_ID_PATTERN, TASK_ID_PREFIXES, TaskType

    return bool(TASK_ID_PATTERN.fullmatch(to)) and to[0] == TASK_ID_PREFIXES[TaskType.LOCAL_AGENT]


def _send_to_agent(layout: Any, team: str, task_id: str, text: str, as_json: bool) -> None:
    """Queue `text` for a running agent, or resume a finished one with it (via the leader);
    prints the id of the task that gets it."""
    from shoal.channel.client import call

    if not text.strip():
        raise UsageError("nothing to send: an agent takes TEXT; nothing was sent")
    answer = call(layout, team, "agent_send", {"task_id": task_id, "text": text})
    if as_json:
        print_json({**answer, "team": team, "to": task_id})
    else:
        click.echo(answer["task_id"])


def _message_json(msg: AnyMessage) -> dict[str, Any]:
    return msg.model_dump(mode="json", by_alias=True)


def _message_text(msg: AnyMessage) -> str:
    head = f"{msg.sent_at} {msg.from_} -> {msg.to} [{msg.kind}]"
    body = msg.text if msg.text is not None else (msg.summary or "")
    data = msg.data.model_dump(mode="json")
    extra = f" {data}" if data else ""
    return f"{head} {body}{extra}".rstrip()


class _BadNotices:
    """Says on stderr, one line each, which messages the inbox moved to `bad/` (unreadable or
    invalid files) while this command read it: they are not lost, but not shown either."""

    def __init__(self, maildir: Maildir) -> None:
        self.maildir = maildir
        self.seen = {name for name, _ in maildir.bad_messages()}

    def report(self) -> None:
        for name, reason in self.maildir.bad_messages():
            if name in self.seen:
                continue
            self.seen.add(name)
            why = "; ".join(line.strip() for line in reason.splitlines() if line.strip())
            click.echo(
                f"shoal: warning: bad message {name} moved to {self.maildir.bad}: {why}",
                err=True,
            )


@click.command()
@click.argument("name")
@click.option("--follow", "-f", is_flag=True, help="Keep printing messages as they arrive.")
@click.option("--peek", is_flag=True, help="Show waiting messages without consuming them.")
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="With --follow: stop after DURATION (90, 1.5s, 5m) without a message.",
)
@click.option(
    "--listen",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="SOCKET",
    help="Also accept messages for NAME on this unix socket (peers send to uds:SOCKET); "
    "implies --follow.",
)
@json_option
@common_options
def inbox(
    name: str,
    follow: bool,
    peek: bool,
    timeout: float | None,
    listen: str | None,
    as_json: bool,
) -> None:
    """Print (and consume) the messages waiting in NAME's inbox, in priority order.

    With --json: a JSON array, or one JSON object per line with --follow.
    """
    env = get_env(click.get_current_context())
    team = env.team()
    teams = Teams(env.layout)
    validate_name(name, "member name")
    if teams.read(team).member(name) is None:
        raise NotFoundError(f"no member {name!r} in team {team!r} (see `shoal team show {team}`)")
    directory = teams.directory(team)
    box = Inbox(Maildir.open(directory.inbox(name)), lead=LEAD_NAME)
    bad = _BadNotices(box.maildir)
    if peek:
        if follow or listen:
            raise UsageError("--peek does not go with --follow or --listen")
        msgs = box.peek()
        if as_json:
            print_json([_message_json(m) for m in msgs])
        else:
            for m in msgs:
                click.echo(_message_text(m))
        bad.report()
        return
    if name == LEAD_NAME:
        from shoal.orchestrator.liveness import leader_alive

        if leader_alive(env.layout, team) is not None:
            raise ConflictError(
                f"the leader of team {team!r} reads {LEAD_NAME}'s inbox (its control channel); "
                "use --peek to look without taking, or `shoal events` for what it received"
            )
    if not follow and not listen:
        taken = []
        while (delivery := box.receive(timeout=0)) is not None:
            taken.append(delivery)
        if as_json:
            print_json([_message_json(d.message) for d in taken])
        else:
            for d in taken:
                click.echo(_message_text(d.message))
        sys.stdout.flush()
        for d in taken:  # acked once printed: a failed print leaves them to be read again
            box.ack(d)
        bad.report()
        return
    listener = None
    if listen:
        from shoal.mailbox.uds import UdsListener

        try:
            listener = UdsListener(Path(listen), box.maildir).start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    try:
        with box:
            for m in box.iterate(timeout=timeout):
                bad.report()  # (those found on the way to this one)
                if as_json:
                    print_json_line(_message_json(m))
                else:
                    click.echo(_message_text(m))
                    sys.stdout.flush()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if listener is not None:
            listener.close()
        bad.report()
