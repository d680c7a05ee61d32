"""shoal: run many workers at once from one terminal, sharing nothing but files."""

from __future__ import annotations

__version__ = "0.1.0"
