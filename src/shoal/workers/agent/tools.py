"""The file and shell tools an agent's model sees: Read, Write, Edit, Glob, Grep, Bash.

Names and argument names are the model-facing contract (tool_args.py: the seed's names,
`file_path`, `old_string`, `-i`, ..., as aliases of pydantic models whose JSON schema is what
the model is shown). A failure the model can act on (a missing file, an
`old_string` that is not unique, a write to a file it has not read) is returned to it as a
`<tool_use_error>`, as Claude Code does; arguments that fail the schema are a retry prompt
(pydantic-ai's ModelRetry). Neither ends the agent: only a model stuck sending one tool bad
arguments more than `tool_retries` times in a row (config.toml, default 25) does. Bash runs a
foreground command as foreground.py says, a background one as a task of the leader.

Paths are relative to the agent's working directory and go through one path gate
(core/pathgate.py). In the confined modes (plan, default, acceptEdits, bubble) a path must lie
beneath the working directory or the scratchpad and no symlink is followed; in every mode
writes go by temp file and rename, and `.git/`, `.shoal/` and SHOAL_HOME are never written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shoal.core.pathgate import GateError, PathGate, Written, open_entry
from shoal.core.paths import resolve_home
from shoal.core.sandbox import Policy
from shoal.workers.agent.foreground import run_foreground
from shoal.workers.agent.tool_args import (
    BashArgs,
    EditArgs,
    GlobArgs,
    GrepArgs,
    ReadArgs,
    ToolFailure,
    WriteArgs,
)

BASH_DEFAULT_TIMEOUT_MS: Final = 120_000
READ_DEFAULT_LINES: Final = 2000
READ_LINE_CHARS: Final = 2000
GLOB_LIMIT: Final = 100
CONFINED_MODES: Final = frozenset({"default", "acceptEdits", "plan", "bubble"})
GREP_SKIP: Final = frozenset({".git", "node_modules", "__pycache__", ".venv"})


# A background starter: (command, description, sandbox) -> (the id, the output file) of the
# local_bash task it started (confined to the sandbox policy when one is given).
BackgroundStarter = Callable[[str, str | None, "Policy | None"], Awaitable[tuple[str, str]]]


@dataclass
class Workspace:
    """One agent's view of the file system: its cwd, its permission mode, and the files it
    has read (path -> (mtime_ns, size) when read), which Write and Edit require."""

    cwd: Path
    mode: str = "default"
    env: dict[str, str] = field(default_factory=dict)
    start_background: BackgroundStarter | None = None
    track_command: Callable[[int, bool], None] | None = None
    read_files: dict[Path, tuple[int, int]] = field(default_factory=dict)
    # A coordinator's worker: Write and Edit only inside `write_set` (globs relative to the
    # cwd) or the shared `scratchpad`; a Bash command that changes files outside them is
    # reported to the worker and to `on_violation`.
    write_set: tuple[str, ...] | None = None
    scratchpad: Path | None = None
    lease_skip: tuple[Path, ...] = ()  # left out of the check (shoal's home)
    lease_peers: tuple[Path, str] | None = None  # (session dir, own task id): others' leases
    # A worker's background commands: task id -> (command, snapshot at start, start time)
    background_watch: dict[str, tuple[str, Any, float]] = field(default_factory=dict)
    on_violation: Callable[[str, list[str]], None] | None = None
    # The kernel sandbox of its commands (None: they run unconfined; see core/sandbox.py).
    sandbox: Policy | None = None
    home: Path | None = None  # SHOAL_HOME (default: resolve_home()), never written by the tools
    # The names of the tools the agent has: what it is told to use names only these.
    tool_names: frozenset[str] = frozenset()
    _gates: dict[str, PathGate] = field(default_factory=dict, repr=False, compare=False)

    # -- paths -----------------------------------------------------------------------------

    @property
    def gate(self) -> PathGate:
        """The path gate of the file tools in the current mode (made on first use)."""
        gate = self._gates.get(self.mode)
        if gate is None:
            gate = self._gates[self.mode] = self._make_gate()
        return gate

    def _make_gate(self) -> PathGate:
        cwd = Path(os.path.realpath(self.cwd))
        pad = Path(os.path.realpath(self.scratchpad)) if self.scratchpad is not None else None
        return PathGate(
            cwd,
            (cwd, *((pad,) if pad is not None else ())),
            confined=self.mode in CONFINED_MODES,
            protected=protected_paths(cwd, self.home or resolve_home()),
            where=f"the working directory {cwd}" + (f" and the scratchpad {pad}" if pad else ""),
        )

    def _refusal_note(self) -> str:
        return f" (refused in permission mode {self.mode})" if self.mode in CONFINED_MODES else ""

    @contextlib.contextmanager
    def _gated(self) -> Iterator[None]:
        """A refusal of the gate, as the model is told it."""
        try:
            yield
        except GateError as exc:
            note = self._refusal_note() if exc.problem in ("outside", "link") else ""
            raise ToolFailure(f"{exc}{note}") from None

    def _in_pad(self, path: Path) -> bool:
        pad = self.scratchpad
        return pad is not None and (path == pad.resolve() or path.is_relative_to(pad.resolve()))

    def _check_lease(self, path: Path, verb: str) -> None:
        """A worker writes only inside its lease (or the scratchpad)."""
        from shoal.core.writeset import covers, relative

        if self.write_set is None or self._in_pad(path):
            return
        rel = relative(path, self.cwd.resolve())
        if rel is None or not covers(self.write_set, rel):
            raise ToolFailure(
                f"{verb} {path}: outside this worker's lease (write set "
                f"{', '.join(self.write_set)}); only those files, and the scratchpad "
                f"{self.scratchpad}, may be changed"
            )

    def _before_write(self, name: str, verb: str) -> None:
        """Refuse a write before anything is made on disk (a directory the lease leaves out)."""
        self._check_lease(self.gate.locate(name).shown, verb)

    def _after_write(self, done: Written) -> None:
        """A file was written (the dream keeps a list)."""

    def _remember(self, path: Path, st: os.stat_result) -> None:
        self.read_files[path] = (st.st_mtime_ns, st.st_size)

    def _check_fresh(self, path: Path, st: os.stat_result, verb: str) -> None:
        seen = self.read_files.get(path)
        if seen is None:
            raise ToolFailure(f"{verb} {path}: the file exists but was not Read first; Read it")
        if (st.st_mtime_ns, st.st_size) != seen:
            raise ToolFailure(f"{verb} {path}: the file changed since it was Read; Read it again")

    # -- tools (each runs on a thread of its own: see tool_calls.py) -----------------------------

    def read(self, args: ReadArgs) -> str:
        with self._gated():
            try:
                got = self.gate.read(args.file_path)
            except GateError as exc:
                if exc.problem == "directory":
                    raise ToolFailure(f"{exc}; use Glob or Bash ls to list it") from None
                raise
        self._remember(got.real, got.st)
        path = got.shown
        lines = got.data.decode("utf-8", "replace").splitlines()
        start = (args.offset or 1) - 1
        chosen = lines[start : start + (args.limit or READ_DEFAULT_LINES)]
        if not chosen:
            return f"({path} has {len(lines)} line(s); nothing at line {start + 1})"
        out = [f"{n:6}\t{line[:READ_LINE_CHARS]}" for n, line in enumerate(chosen, start + 1)]
        rest = len(lines) - start - len(chosen)
        if rest > 0:
            out.append(f"({rest} more line(s); Read with offset={start + len(chosen) + 1})")
        return "\n".join(out)

    def write(self, args: WriteArgs) -> str:
        def check(real: Path, st: os.stat_result | None) -> None:
            self._check_lease(real, "Write")
            if st is not None:
                self._check_fresh(real, st, "Write")

        with self._gated():
            self._before_write(args.file_path, "Write")
            done = self.gate.write(args.file_path, args.content.encode(), check=check)
        self._remember(done.real, done.st)
        self._after_write(done)
        verb = "updated" if done.existed else "created"
        return f"{verb} {done.shown} ({len(args.content)} characters)"

    def edit(self, args: EditArgs) -> str:
        with self._gated():
            self._before_write(args.file_path, "Edit")
            got = self.gate.read(args.file_path)
            self._check_lease(got.real, "Edit")
            self._check_fresh(got.real, got.st, "Edit")
            try:
                text = got.data.decode()
            except UnicodeDecodeError:
                raise ToolFailure(
                    f"{got.shown} is not UTF-8 text; Edit changes text only"
                ) from None
            new, count = edited(text, args, got.shown)

            def unchanged(real: Path, st: os.stat_result | None) -> None:
                was = got.st
                if st is None or (st.st_ino, st.st_mtime_ns, st.st_size) != (
                    was.st_ino,
                    was.st_mtime_ns,
                    was.st_size,
                ):
                    raise ToolFailure(f"Edit {real}: the file changed while it was edited; Read it")

            done = self.gate.write(args.file_path, new.encode(), check=unchanged)
        self._remember(done.real, done.st)
        self._after_write(done)
        return f"edited {done.shown} ({count if args.replace_all else 1} replacement(s))"

    def glob(self, args: GlobArgs) -> str:
        with self._gated():
            base = self.gate.locate(args.path).shown if args.path else self.gate.base
            found = [(e.st.st_mtime_ns, e.shown) for e in self.gate.files(args.path, args.pattern)]
        if not found:
            return f"no files match {args.pattern} under {base}"
        found.sort(key=lambda hit: hit[0], reverse=True)
        lines = [str(path) for _mtime, path in found[:GLOB_LIMIT]]
        if len(found) > GLOB_LIMIT:
            lines.append(f"({len(found) - GLOB_LIMIT} more; narrow the pattern)")
        return "\n".join(lines)

    def grep(self, args: GrepArgs) -> str:
        """Grep, in Python over the files the gate opens (never ripgrep: it opens paths
        itself, so what it read could not be held to the gate)."""
        try:
            regex = re.compile(args.pattern, re.IGNORECASE if args.case_insensitive else 0)
        except re.error as exc:
            raise ToolFailure(f"bad regular expression {args.pattern!r}: {exc}") from None
        with self._gated():
            base = self.gate.locate(args.path).shown if args.path else self.gate.base
            lines = _grep(self.gate, args, regex)
        if args.head_limit is not None:
            lines = lines[: args.head_limit]
        return "\n".join(lines) if lines else f"no matches for {args.pattern} under {base}"

    async def bash(self, args: BashArgs) -> str:
        if args.run_in_background:
            if self.start_background is None:
                raise ToolFailure("background commands are not available to this agent")
            watched = None
            if self.write_set is not None:
                from shoal.workers.agent.coordinator import leasecheck

                began = time.time()
                watched = (await asyncio.to_thread(leasecheck.snapshot, self.cwd,
                                                   self.lease_skip), began)  # fmt: skip
            task_id, output_file = await self.start_background(
                args.command, args.description, self.sandbox
            )
            if watched is not None:
                self.background_watch[task_id] = (args.command, *watched)
            return self.background_reply(task_id, output_file)
        timeout_ms = args.timeout or BASH_DEFAULT_TIMEOUT_MS
        if self.write_set is None:
            return await run_foreground(
                args.command, self.cwd, self.env, timeout_ms / 1000, self.track_command,
                self.sandbox,
            )  # fmt: skip
        from shoal.workers.agent.coordinator import leasecheck

        began = time.time()
        before = await asyncio.to_thread(leasecheck.snapshot, self.cwd, self.lease_skip)
        out = await run_foreground(
            args.command, self.cwd, self.env, timeout_ms / 1000, self.track_command, self.sandbox
        )
        return out + self._lease_check(args.command, before, began)

    def background_reply(self, task_id: str, output_file: str) -> str:
        """What the model is told of a command it started in the background: that its end
        arrives as a notification, and how to read its output meanwhile with a tool it has
        (no background agent has TaskOutput; Read reaches the file only where the gate lets
        it; a Bash command always may: the sandbox never restricts reads)."""
        if "TaskOutput" in self.tool_names:
            how = f"TaskOutput {task_id} reads it"
        elif "Read" in self.tool_names and self._readable(output_file):
            how = "the Read tool reads it"
        else:
            how = f"Bash `tail {shlex.quote(output_file)}` reads it"
        return (
            f"started background task {task_id}; its <task-notification> arrives when it ends. "
            f"Its output so far is in {output_file} ({how})."
        )

    def _readable(self, path: str) -> bool:
        """True when Read, in the current mode, may open `path`."""
        try:
            self.gate.locate(path)
        except GateError:
            return False
        return True

    async def lease_guard(self, name: str, call: Callable[[], Awaitable[str]]) -> str:
        """An MCP tool call of a worker, checked as a Bash command is: what the server changed
        outside the worker's lease while it ran is reported with the result and recorded."""
        if self.write_set is None:
            return await call()
        from shoal.workers.agent.coordinator import leasecheck

        began = time.time()
        before = await asyncio.to_thread(leasecheck.snapshot, self.cwd, self.lease_skip)
        out = await call()
        return out + await asyncio.to_thread(self._lease_check, name, before, began)

    def background_ended(self, task_id: str | None, text: str) -> str:
        """A worker's background command ended (its notification is `text`): what it changed
        outside the lease since it started is reported with it, and recorded."""
        watched = self.background_watch.pop(task_id, None) if task_id else None
        if watched is None:
            return text
        command, before, began = watched
        return text + self._lease_check(f"{command} (background {task_id})", before, began)

    def _lease_check(self, command: str, before: Any, began: float) -> str:
        """The violation note for what changed outside the lease since `before` ("" if none)."""
        from shoal.workers.agent.coordinator import leasecheck

        assert self.write_set is not None
        after = leasecheck.snapshot(self.cwd, self.lease_skip)
        elsewhere = (
            leasecheck.others_cover(*self.lease_peers, self.cwd, began)
            if self.lease_peers
            else None
        )
        outside = leasecheck.outside(before, after, self.write_set, elsewhere)
        if not outside:
            return ""
        if self.on_violation is not None:
            self.on_violation(command, outside)
        shown = ", ".join(outside[:20]) + (
            f" (+{len(outside) - 20} more)" if len(outside) > 20 else ""
        )
        return (
            f"\n[lease violation: this command changed files outside your write set "
            f"({', '.join(self.write_set)}): {shown}. Undo those changes; only your write set "
            "may change. This is recorded in your task.]"
        )


def protected_paths(cwd: Path, home: Path) -> tuple[Path, ...]:
    """What an agent's file tools never write, whatever its lease or mode: SHOAL_HOME, the
    project's `.shoal/` (in the working directory and at the top of its git repository),
    and the git directory a worktree's `.git` file names, with its common directory. (A
    `.git` component anywhere is refused by the gate itself.)"""
    found = [home, cwd / ".shoal"]
    for top in (cwd, *cwd.parents):
        dot_git = top / ".git"
        if not os.path.lexists(dot_git):
            continue
        found.append(top / ".shoal")
        if dot_git.is_file() and not dot_git.is_symlink():
            with contextlib.suppress(OSError, UnicodeDecodeError):
                line = dot_git.read_text()[:4096].strip()
                if line.startswith("gitdir:"):
                    gitdir = (top / line.removeprefix("gitdir:").strip()).resolve()
                    found.append(gitdir)
                    common = gitdir / "commondir"
                    if common.is_file():
                        found.append((gitdir / common.read_text()[:4096].strip()).resolve())
        break
    return tuple(found)


def _grep(gate: PathGate, args: GrepArgs, regex: re.Pattern[str]) -> list[str]:
    """The output lines of Grep: a file `path`, or the files the gate lists under it."""
    lines: list[str] = []
    if args.path is not None:
        try:
            fd, spot = gate.open_file(args.path)
        except GateError as exc:
            if exc.problem == "missing":
                raise GateError(
                    f"path not found: {gate.locate(args.path).shown}", "missing"
                ) from None
            if exc.problem != "directory":
                raise
        else:
            _search(fd, spot.shown, regex, args, lines)
            return lines
    for entry in gate.files(args.path, args.glob or "*", skip=GREP_SKIP, anywhere=True):
        opened = open_entry(entry)
        if opened is not None:
            _search(opened, entry.shown, regex, args, lines)
        if args.head_limit is not None and len(lines) >= args.head_limit:
            break
    return lines


GREP_LINE_BYTES: Final = 1 << 20  # how much of one line Grep holds at a time


def _search(fd: int, path: Path, regex: re.Pattern[str], args: GrepArgs, out: list[str]) -> None:
    """Append the matches of the file open at `fd` (closed here; a binary file has none)."""
    with os.fdopen(fd, "rb") as stream:
        if b"\0" in stream.read(8192):
            return
        stream.seek(0)
        hits = 0
        n = 0
        fresh = True  # the next piece read begins a line
        # (a line is read GREP_LINE_BYTES at a time: one huge line never sits whole in memory;
        # its pieces are searched, and shown, each with that line's number)
        while raw := stream.readline(GREP_LINE_BYTES):
            n += fresh
            fresh = raw.endswith(b"\n")
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not regex.search(line):
                continue
            hits += 1
            if args.output_mode == "files_with_matches":
                out.append(str(path))
                return
            if args.output_mode == "content":
                out.append(f"{path}:{n}:{line}" if args.line_numbers else f"{path}:{line}")
        if hits and args.output_mode == "count":
            out.append(f"{path}:{hits}")


def edited(text: str, args: EditArgs, path: Path) -> tuple[str, int]:
    """`text` with the Edit tool's replacement applied, and how many occurrences there were;
    a ToolFailure naming `path` when old_string is missing, equal to new_string, or not
    unique without replace_all (one rule for every workspace's Edit)."""
    if args.old_string == args.new_string:
        raise ToolFailure("old_string and new_string are the same; nothing to change")
    count = text.count(args.old_string) if args.old_string else 0
    if count == 0:
        raise ToolFailure(f"old_string was not found in {path}")
    if count > 1 and not args.replace_all:
        raise ToolFailure(
            f"old_string occurs {count} times in {path}; give more context to make it "
            "unique, or pass replace_all=true"
        )
    return text.replace(args.old_string, args.new_string, -1 if args.replace_all else 1), count
