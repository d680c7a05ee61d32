"""What every command shares: --home/--team/--json options, team resolution, output, errors."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import orjson

from shoal.core.errors import EXIT_USAGE, UsageError
from shoal.core.names import DEFAULT_TEAM
from shoal.core.paths import Layout

F = TypeVar("F", bound=Callable[..., Any])


class Env:
    """The resolved context of one invocation: which home, which team, output mode."""

    def __init__(self, home: str | None = None, team: str | None = None) -> None:
        self.home_arg = home
        self.team_arg = team

    @functools.cached_property
    def layout(self) -> Layout:
        """The home's layout, checked once: a home another user can write in is refused."""
        return Layout(self.home_arg).check()

    def team(self, explicit: str | None = None) -> str:
        """The team to act on: explicit, --team, $SHOAL_TEAM, else `default` (never "the only
        team on disk": a team left by a batch run must not become the one commands act on)."""
        return explicit or self.team_arg or os.environ.get("SHOAL_TEAM") or DEFAULT_TEAM


def get_env(ctx: click.Context) -> Env:
    """The Env of this invocation (created by the top-level group)."""
    env = ctx.find_object(Env)
    if env is None:
        env = Env(None, None)
        ctx.find_root().obj = env
    return env


def _set_home(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        env = get_env(ctx)
        env.home_arg = value
        env.__dict__.pop("layout", None)


def _set_team(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    # An explicit empty name is refused, not read as "no team" (an empty $SHOAL_TEAM, as
    # empty variables go, is unset).
    if value == "":
        raise click.BadParameter(
            "the team name is empty; name a team, or leave --team out",
            param_hint="'--team'",
        )
    if value is not None:
        get_env(ctx).team_arg = value


def _complete(name: str) -> Callable[..., Any]:
    """A shell completer of shoal.cli.completers, imported only when completion asks."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> Any:
        from shoal.cli import completers

        return getattr(completers, name)(ctx, param, incomplete)

    return complete


complete_task_id = _complete("complete_task_id")
complete_member = _complete("complete_member")


def common_options(fn: F) -> F:
    """Add --home and --team to a command (they may also be given before the command)."""
    fn = click.option(
        "--team",
        "team_opt",
        expose_value=False,
        callback=_set_team,
        is_eager=True,
        metavar="TEAM",
        help="Team to act on.",
        shell_complete=_complete("complete_team"),
    )(fn)
    fn = click.option(
        "--home",
        "home_opt",
        expose_value=False,
        callback=_set_home,
        is_eager=True,
        type=click.Path(file_okay=False),
        metavar="DIR",
        help="shoal home directory (default $SHOAL_HOME or ~/.shoal).",
    )(fn)
    return fn


class Duration(click.ParamType[float]):
    """A time on the command line, as in a spec: seconds (`90`, `1.5`) or a number with a unit
    (`500ms`, `30s`, `5m`, `2h`, `1h30m`); the value is seconds, a float. Every option that
    takes a time takes this one, so `--timeout 5m` means the same to every command."""

    name = "duration"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool) and value > 0:
            return float(value)
        from shoal.orchestrator.batch.spec import parse_duration  # (only when one is given)

        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
"""A duration of more than zero (`90`, `1.5s`, `5m`)."""


def json_option(fn: F) -> F:
    """Add --json (machine-readable output)."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def print_json(obj: Any) -> None:
    """Write `obj` as one JSON document (pretty, sorted keys not needed) to stdout."""
    sys.stdout.buffer.write(
        orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    )
    sys.stdout.flush()


def print_json_line(obj: Any) -> None:
    """Write `obj` as one compact JSON line (for streams)."""
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))
    sys.stdout.flush()


def parse_json_arg(value: str, what: str) -> Any:
    """Parse a JSON command-line argument, as a usage error naming `what` when it is malformed."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print `shoal: error: message` and exit with `code`."""
    click.echo(f"shoal: error: {message}", err=True)
    sys.exit(code)
