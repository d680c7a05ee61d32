"""`shoal task ...`: the team's shared task list (add, list, get, update, claim)."""

from __future__ import annotations

import sys
from typing import Any

import click

from shoal.cli.common import common_options, get_env, json_option, parse_json_arg, print_json
from shoal.core.errors import EXIT_FAILED, UsageError
from shoal.core.names import validate_name
from shoal.teams.store import Teams
from shoal.teams.taskitems import STATUSES, UNSET, UPDATE_STATUSES, ClaimRefused, TaskItem, Unset
from shoal.teams.tasklist import TaskList

TASK_ID = click.IntRange(min=1)


def _tasklist() -> TaskList:
    env = get_env(click.get_current_context())
    return TaskList(Teams(env.layout), env.team())


def _metadata(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    data = parse_json_arg(value, "--metadata")
    if not isinstance(data, dict):
        raise UsageError("--metadata must be a JSON object")
    return data


def _warn_undelivered(tl: TaskList, item: TaskItem) -> None:
    """The update stands; say loudly that its owner was not told."""
    if tl.last_notify_error is not None:
        click.echo(
            f"shoal: warning: task {item.id} is assigned to {item.owner}, but the "
            f"task_assignment message was not delivered: {tl.last_notify_error}",
            err=True,
        )


def _ids(ids: Any) -> str:
    return ", ".join(str(i) for i in ids) or "-"


def _describe(item: TaskItem, open_blockers: list[int]) -> None:
    click.echo(f"task {item.id}: {item.subject}")
    rows: list[tuple[str, str]] = [("status", item.status), ("owner", item.owner or "-")]
    if item.active_form:
        rows.append(("active form", item.active_form))
    blocked = _ids(item.blocked_by)
    if item.blocked_by:
        blocked += f" (open: {_ids(open_blockers)})"
    rows += [("blocked by", blocked), ("blocks", _ids(item.blocks))]
    if item.description:
        rows.append(("description", item.description))
    if item.metadata:
        rows.append(("metadata", str(item.metadata)))
    rows += [("created", item.created_at or "-"), ("updated", item.updated_at or "-")]
    for key, value in rows:
        click.echo(f"  {key + ':':<13}{value}")


@click.group()
@common_options
def task() -> None:
    """The team's shared task list: add, list, get, update and claim items."""


@task.command("add")
@click.argument("subject")
@click.option("--description", "-d", default="", help="What has to be done.")
@click.option("--active-form", default=None, help="Shown while in progress, e.g. 'Writing docs'.")
@click.option(
    "--blocked-by", type=TASK_ID, multiple=True, metavar="ID", help="A task that must finish first."
)
@click.option("--owner", default=None, metavar="NAME", help="Assign it to this member.")
@click.option(
    "--from", "assigned_by", default=None, metavar="NAME", help="Who assigns it (default lead)."
)
@click.option(
    "--run",
    "run_command",
    default=None,
    metavar="CMD",
    help="The shell command a scripted teammate runs when it claims the task (metadata.run).",
)
@click.option("--metadata", "metadata_json", default=None, metavar="JSON", help="Free-form data.")
@json_option
@common_options
def add(
    subject: str,
    description: str,
    active_form: str | None,
    blocked_by: tuple[int, ...],
    owner: str | None,
    assigned_by: str | None,
    run_command: str | None,
    metadata_json: str | None,
    as_json: bool,
) -> None:
    """Add a task with SUBJECT; prints its id.

    A teammate claims the first unblocked, unowned task. A scripted teammate (`shoal spawn
    NAME`) does the work by running the task's command, given with `--run CMD` (kept as
    `metadata.run`), in its working directory, and reports its output back; without one it
    only reports the task done. An agent teammate reads SUBJECT and `--description` as its
    instructions.

    \b
    Example:
      shoal task add build --run 'make'
      shoal task add test --run 'make test' --blocked-by 1
    """
    metadata = _metadata(metadata_json)
    if run_command is not None:
        if not run_command.strip():
            raise UsageError("--run needs a command")
        if metadata is not None and "run" in metadata:
            raise UsageError('give the command once: --run or a "run" key in --metadata')
        metadata = {**(metadata or {}), "run": run_command}
    tl = _tasklist()
    item = tl.add(
        subject,
        description=description,
        active_form=active_form,
        blocked_by=blocked_by,
        owner=owner,
        assigned_by=assigned_by,
        metadata=metadata,
    )
    if as_json:
        print_json(item.model_dump(mode="json"))
    else:
        click.echo(item.id)
    _warn_undelivered(tl, item)


@task.command("list")
@click.option("--status", type=click.Choice(STATUSES), default=None, help="Only this status.")
@click.option("--owner", default=None, metavar="NAME", help="Only tasks this member owns.")
@json_option
@common_options
def list_(status: str | None, owner: str | None, as_json: bool) -> None:
    """List the tasks; a corrupt file is reported on stderr (exit 1) and the rest still listed."""
    if owner is not None:
        validate_name(owner, "member name")
    snap = _tasklist().snapshot()
    items = [
        t
        for t in snap.sorted()
        if (status is None or t.status == status) and (owner is None or t.owner == owner)
    ]
    if as_json:
        print_json([t.model_dump(mode="json") for t in items])
    elif not items and not snap.errors:
        click.echo("no tasks (add one with `shoal task add SUBJECT`)")
    elif items:
        click.echo(f"{'ID':>4}  {'STATUS':<11}  {'OWNER':<16}  {'BLOCKED BY':<10}  SUBJECT")
        for t in items:
            click.echo(
                f"{t.id:>4}  {t.status:<11}  {t.owner or '-':<16}  "
                f"{_ids(snap.open_blockers(t)):<10}  {t.subject}"
            )
    for task_id in sorted(snap.errors):
        click.echo(f"shoal: error: {snap.errors[task_id]}", err=True)
    if snap.errors:
        sys.exit(EXIT_FAILED)


@task.command("get")
@click.argument("task_id", type=TASK_ID, metavar="ID")
@json_option
@common_options
def get(task_id: int, as_json: bool) -> None:
    """Show task ID."""
    tl = _tasklist()
    item = tl.get(task_id)
    if as_json:
        print_json(item.model_dump(mode="json"))
        return
    _describe(item, tl.open_blockers(item) if item.blocked_by else [])


@task.command("update")
@click.argument("task_id", type=TASK_ID, metavar="ID")
@click.option("--status", type=click.Choice(UPDATE_STATUSES), default=None, help="New status.")
@click.option("--owner", default=None, metavar="NAME", help="Assign it to this member.")
@click.option("--no-owner", is_flag=True, help="Clear the owner.")
@click.option("--subject", default=None, help="New subject.")
@click.option("--description", "-d", default=None, help="New description.")
@click.option("--active-form", default=None, help="New active form.")
@click.option(
    "--blocked-by", type=TASK_ID, multiple=True, metavar="ID", help="Add a blocker of this task."
)
@click.option("--blocks", type=TASK_ID, multiple=True, metavar="ID", help="Add a task it blocks.")
@click.option("--metadata", "metadata_json", default=None, metavar="JSON", help="Merged in.")
@click.option(
    "--from", "assigned_by", default=None, metavar="NAME", help="Who assigns it (default lead)."
)
@json_option
@common_options
def update(
    task_id: int,
    status: str | None,
    owner: str | None,
    no_owner: bool,
    subject: str | None,
    description: str | None,
    active_form: str | None,
    blocked_by: tuple[int, ...],
    blocks: tuple[int, ...],
    metadata_json: str | None,
    assigned_by: str | None,
    as_json: bool,
) -> None:
    """Change task ID; `--status deleted` deletes it."""
    if owner is not None and no_owner:
        raise UsageError("give --owner NAME or --no-owner, not both")
    new_owner: str | Unset | None = owner if owner is not None else (None if no_owner else UNSET)
    metadata = _metadata(metadata_json)
    nothing = (status, subject, description, active_form, metadata) == (None,) * 5
    if nothing and new_owner is UNSET and not blocked_by and not blocks:
        raise UsageError(
            f"nothing to change in task {task_id}: give --status, --owner, --no-owner, --subject, "
            "--description, --active-form, --blocked-by, --blocks or --metadata"
        )
    tl = _tasklist()
    item = tl.update(
        task_id,
        status=status,
        owner=new_owner,
        subject=subject,
        description=description,
        active_form=UNSET if active_form is None else active_form,
        metadata=metadata,
        add_blocked_by=blocked_by,
        add_blocks=blocks,
        assigned_by=assigned_by,
    )
    if status == "deleted":
        if as_json:
            print_json({"deleted": task_id})
        else:
            click.echo(f"deleted task {task_id}")
        return
    if as_json:
        print_json(item.model_dump(mode="json"))
    else:
        click.echo(f"updated task {item.id}: {item.status}, owner {item.owner or '-'}")
    _warn_undelivered(tl, item)


@task.command("claim")
@click.argument("task_id", type=TASK_ID, metavar="ID")
@click.option("--as", "name", required=True, metavar="NAME", help="The member claiming it.")
@json_option
@common_options
def claim(task_id: int, name: str, as_json: bool) -> None:
    """Claim task ID as member NAME: it becomes NAME's and in progress.

    Refused (exit 1) when it is already_resolved, already_claimed, blocked, or NAME is
    agent_busy with another task.
    """
    try:
        item = _tasklist().claim(task_id, name)
    except ClaimRefused as exc:
        if not as_json:
            raise
        print_json(exc.to_json())
        sys.exit(EXIT_FAILED)
    if as_json:
        print_json(item.model_dump(mode="json"))
    else:
        click.echo(f"claimed task {item.id} as {name}: {item.subject}")
