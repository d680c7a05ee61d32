"""Shared foundations: paths, names, errors, JSON I/O, ids and times."""
