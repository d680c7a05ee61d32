"""A spec made of plain commands, as GNU parallel takes them: a commands file (one command per
line, as `parallel < FILE`) or a command and its `:::` arguments (`parallel CMD ::: ARGS`).

Each command becomes one `[[task]]` numbered from 1 (as parallel's job sequence), and the
whole is checked and run as any spec is (joblog, halt, reports, resume), so nothing in the
engine knows where its tasks came from.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

from shoal.core.errors import UsageError
from shoal.orchestrator.batch.parse import parse_spec_text
from shoal.orchestrator.batch.spec import Spec, SpecError, SpecIssue

ARGS_SEPARATOR = ":::"
# `{}` is the job's arguments (joined by spaces, each quoted), `{1}`, `{2}`... one source's.
_PLACEHOLDER = re.compile(r"\{(\d*)\}")


def commands_of_file(path: Path, shown: str) -> list[str]:
    """The commands of a commands file: one per line, blank lines and `#` lines skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(shown, [SpecIssue(None, "no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SpecError(shown, [SpecIssue(None, f"cannot read it: {reason}")]) from None
    commands = [ln.strip() for ln in text.splitlines()]
    commands = [c for c in commands if c and not c.startswith("#")]
    if not commands:
        raise SpecError(shown, [SpecIssue(None, "no commands in it (one per line)")])
    return commands


def commands_of_args(argv: list[str]) -> list[str]:
    """`COMMAND... ::: A B ::: C D`: one command per combination of the sources' arguments
    (every one of the first with every one of the next, as parallel does). `{}` in COMMAND is
    replaced by the combination, `{N}` by the Nth source's argument; with neither, the
    arguments are appended. Each argument is quoted for the shell."""
    at = argv.index(ARGS_SEPARATOR)
    template, rest = argv[:at], argv[at:]
    if not template:
        raise UsageError("no command before ::: (usage: shoal run -- COMMAND ::: ARGS...)")
    sources: list[list[str]] = []
    for word in rest:
        if word == ARGS_SEPARATOR:
            sources.append([])
        else:
            sources[-1].append(word)
    if any(not source for source in sources):
        raise UsageError("::: takes at least one argument after it")
    command = " ".join(template)
    commands: list[str] = []
    for combination in itertools.product(*sources):
        quoted = [shlex.quote(a) for a in combination]

        def fill(match: re.Match[str], quoted: list[str] = quoted) -> str:
            number = match.group(1)
            if not number:
                return " ".join(quoted)
            index = int(number)
            if not 1 <= index <= len(quoted):
                raise UsageError(f"{{{number}}}: there are {len(quoted)} ::: sources")
            return quoted[index - 1]

        if _PLACEHOLDER.search(command):
            commands.append(_PLACEHOLDER.sub(fill, command))
        else:
            commands.append(" ".join([command, *quoted]))
    return commands


def spec_of_commands(
    commands: list[str],
    path: Path,
    *,
    display: str,
    timeout: float | None = None,
    retries: int | None = None,
) -> Spec:
    """The spec whose tasks are `commands`, numbered from 1, as if read from `path` (its run
    record and team are named after it); `timeout` and `retries` apply to each."""
    lines = ["[run]"]
    if timeout is not None:
        lines.append(f"timeout = {float(timeout)!r}")
    if retries is not None:
        lines.append(f"retries = {retries}")
    for number, command in enumerate(commands, 1):
        lines += ["", "[[task]]", f'id = "{number}"', f"run = {_toml_string(command)}"]
    return parse_spec_text("\n".join(lines) + "\n", path, display=display)


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() or c == " " else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'
