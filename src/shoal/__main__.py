"""`python -m shoal` runs the command-line interface."""

from __future__ import annotations

from shoal.cli.entry import main

if __name__ == "__main__":
    main()
