"""How big a shell task's command may be: what one exec, and one control message, can carry.

Checked at the edge (`sh`, `sh --batch`, the leader's `sh` request, a run spec), so an
oversize command is refused with its size and the limit before any task exists, instead of
failing at run time with "Argument list too long" or leaving a task whose answer is over the
message cap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import orjson

# One argument string of an exec is at most MAX_ARG_STRLEN bytes on Linux, its NUL included;
# the wrapper hands a command line to `sh` as one argument.
MAX_ARG_STRLEN = 128 * 1024
COMMAND_MAX_BYTES = MAX_ARG_STRLEN - 1
# A task's request as JSON (command, description, environment, directory). Its answer repeats
# the command (as `command`, in `argv`, as the default description), and both must fit in one
# 1 MiB message: a quarter of it leaves room even for a command of escaped characters.
SPEC_MAX_JSON_BYTES = 256 * 1024
# The wrapper's own exec arguments (its script, the exit file, the working directory), whose
# exact size only the leader knows when it starts the task.
WRAPPER_ROOM = 16 * 1024
_POINTER = 8  # each exec string also costs its argv/envp pointer

FIX = "put it in a script file"


def command_bytes(command: Sequence[str]) -> int:
    """The size of `command` as a command line: its arguments' bytes, a space between each."""
    return sum(len(os.fsencode(a)) for a in command) + max(0, len(command) - 1)


def exec_bytes(strings: Iterable[str | bytes]) -> int:
    """What `strings` take of ARG_MAX: each with its NUL and its pointer."""
    return sum(len(os.fsencode(s)) + 1 + _POINTER for s in strings)


def environ_bytes(environ: Mapping[str, str] | Mapping[bytes, bytes]) -> int:
    """What an environment takes of ARG_MAX (`KEY=VALUE` strings)."""
    return sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 + _POINTER for k, v in environ.items())


def arg_max() -> int:
    """The system's limit on an exec's arguments and environment together (ARG_MAX)."""
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 2 * 1024 * 1024


def command_problem(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    base_env_bytes: int = 0,
) -> str | None:
    """Why `command` (with the extra `env`, on top of an inherited environment of
    `base_env_bytes`) cannot be started, or None; worded to follow "command ..." or a place."""
    size = command_bytes(command)
    if size > COMMAND_MAX_BYTES:
        return f"command is {size:,} bytes; the limit is {COMMAND_MAX_BYTES:,} ({FIX})"
    for key, value in (env or {}).items():
        one = len(os.fsencode(key)) + len(os.fsencode(value)) + 1
        if one > COMMAND_MAX_BYTES:
            return (
                f"environment variable {key} is {one:,} bytes; the limit is "
                f"{COMMAND_MAX_BYTES:,} (pass it in a file)"
            )
    argv = ["-c", command[0]] if len(command) == 1 else list(command)
    total = exec_bytes(argv) + environ_bytes(env or {}) + base_env_bytes + WRAPPER_ROOM
    most = arg_max()
    if total > most:
        return (
            f"command and environment are {total:,} bytes to exec; the limit is {most:,} "
            f"(ARG_MAX, with {WRAPPER_ROOM:,} kept for shoal's wrapper): pass less environment "
            f"or {FIX}"
        )
    return None


def spec_problem(spec: Mapping[str, object]) -> str | None:
    """Why the `sh` request of one task (its JSON fields) is too big for a control message."""
    size = len(orjson.dumps(spec))
    if size > SPEC_MAX_JSON_BYTES:
        return (
            f"the task's request is {size:,} bytes as JSON (escaped characters count more than "
            f"once); the limit is {SPEC_MAX_JSON_BYTES:,} ({FIX})"
        )
    return None
