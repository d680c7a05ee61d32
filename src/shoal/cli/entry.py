"""The console script: answers `shoal pill` before click and pydantic are even imported.

tmux runs `shoal pill` every few seconds for its status line, so it must start fast; every
other command goes to the click CLI in `shoal.cli.main`.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of the `shoal` command and of `python -m shoal`."""
    from shoal.ui.pill_fast import run_if_pill

    run_if_pill(sys.argv)
    from shoal.cli.main import main as cli_main

    cli_main()
