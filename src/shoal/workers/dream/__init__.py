"""The `dream` task kind: memory consolidation by a forked agent (see kind.py)."""
