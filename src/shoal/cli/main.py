"""The `shoal` command: the top-level group, error reporting and exit codes."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, NoReturn

import click

from shoal import __version__
from shoal.cli.catalog import ALIASES, COMMANDS, HINTS, SECTIONS, names, target_of
from shoal.cli.common import Env, common_options
from shoal.core.errors import EXIT_INTERRUPTED, NoSpaceError, ShoalError, is_no_space


class ShoalGroup(click.Group):
    """A group that loads its commands on demand (shoal.cli.catalog names them), lists them
    by job in its help, and turns ShoalError into one `shoal: error:` line and its exit
    code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = target_of(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(f"shoal.cli.{module}"), attr)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """An unknown command is a usage error that suggests the nearest ones (or the command
        doing the job another tool's word names), as option typos are."""
        name = args[0] if args else ""
        if args and target_of(name) is None and not name.startswith("-"):
            raise click.UsageError(f"no such command {name!r}{_suggestion(name)}", ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands by job, each with its whole summary (from the catalog: nothing is
        imported to print this)."""
        for title, section in SECTIONS:
            with formatter.section(title):
                formatter.write_dl([(n, COMMANDS[n].summary) for n in section])
        with formatter.section("Also (pueue's words)"):
            formatter.write_text(", ".join(f"{a} = {c}" for a, c in ALIASES.items()) + ".")

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ShoalError as exc:
            click.echo(f"shoal: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except (KeyboardInterrupt, click.exceptions.Abort):  # (Abort: Ctrl-C at a prompt)
            click.echo("shoal: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except PermissionError as exc:  # (an agent's command, say: its sandbox keeps the home)
            where = exc.filename or "a file under SHOAL_HOME"
            click.echo(
                f"shoal: error: cannot write {where}: {exc.strerror or 'permission denied'} "
                "(a command an agent runs may not write SHOAL_HOME; otherwise check the "
                "owner and mode of that file)",
                err=True,
            )
            sys.exit(1)
        except OSError as exc:
            if not is_no_space(exc):
                raise_or_report(exc)
            # A write outside the helpers of core/jsonio.py met a full disk: still one line.
            failed = NoSpaceError.from_os_error(exc, exc.filename or "a file under SHOAL_HOME")
            click.echo(f"shoal: error: {failed}", err=True)
            sys.exit(failed.exit_code)
        except Exception as exc:  # a bug: one line, the traceback on request
            raise_or_report(exc)


def _suggestion(name: str) -> str:
    """ "; did you mean ..." for an unknown command `name`, or "" when nothing is near."""
    if name in HINTS:
        return f"; did you mean {HINTS[name]}?"
    import difflib

    near = difflib.get_close_matches(name, names(), n=3, cutoff=0.7)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


def raise_or_report(exc: Exception) -> NoReturn:
    """An unexpected exception (a bug): one line and exit 1, or the traceback with SHOAL_DEBUG."""
    if os.environ.get("SHOAL_DEBUG"):
        raise exc
    click.echo(
        f"shoal: internal error: {exc!r} (run with SHOAL_DEBUG=1 for the traceback)", err=True
    )
    sys.exit(1)


@click.group(
    cls=ShoalGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "-V", "--version", prog_name="shoal")
@common_options
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Run many workers at once from one terminal.

    Teams share nothing but files under SHOAL_HOME: a lock-guarded team file and one
    maildir inbox per member. `shoal COMMAND --help` tells what a command does.
    """
    ctx.ensure_object(Env)
    if ctx.invoked_subcommand is None:  # bare `shoal`: its help, which is no error
        click.echo(ctx.get_help())
        ctx.exit(0)


def _usage_message(exc: click.UsageError) -> str:
    """Click's usage error in shoal's words: `no such option --timout, did you mean
    --timeout?` rather than click's capitalised sentences."""
    if isinstance(exc, click.NoSuchOption):
        near = exc.possibilities or []
        hint = f", did you mean {' or '.join(near)}?" if near else ""
        return f"no such option {exc.option_name}{hint}"
    return exc.format_message().rstrip(".")


def main() -> None:
    """Console-script entry point: click's own errors become one `shoal: error:` line too."""
    try:
        code = cli.main(prog_name="shoal", standalone_mode=False)
    except click.UsageError as exc:  # unknown command or option, bad value: exit 2
        where = exc.ctx.command_path if exc.ctx is not None else "shoal"
        message = _usage_message(exc)
        click.echo(f"shoal: error: {message} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # e.g. a file that cannot be opened
        click.echo(f"shoal: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # Ctrl-C at a prompt
        click.echo("shoal: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
