"""Coordinator mode: the prompt and budgets, write-set leases and their checks."""
