"""Teammates (in-process, process and pane backends): the runner, its brains and console,
and the leader's half (spawning, member runs)."""
