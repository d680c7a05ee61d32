"""`shoal completion bash|zsh|fish`: the shell completion script to source (its completers
are in shoal.cli.completers)."""

from __future__ import annotations

import click

from shoal.cli.common import common_options

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@common_options
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    It completes commands, options, team names, member names and task ids.

    \b
    bash:  eval "$(shoal completion bash)"       (in ~/.bashrc)
    zsh:   eval "$(shoal completion zsh)"        (in ~/.zshrc)
    fish:  shoal completion fish | source        (in ~/.config/fish/config.fish)
    """
    from click.shell_completion import get_completion_class

    root = click.get_current_context().find_root().command
    cls = get_completion_class(shell)
    assert cls is not None  # (every choice has a class)
    click.echo(cls(root, {}, "shoal", "_SHOAL_COMPLETE").source())
