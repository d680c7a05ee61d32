"""The model-facing contract of an agent's file and shell tools: each tool's name, its
arguments as a pydantic model whose aliases are the seed's names (`file_path`,
`old_string`, `-i`, ...) and whose JSON schema is what the model is shown, how bad arguments
are named, and how a failure the model can act on reads to it (a `<tool_use_error>`).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.core.validation import error_text

BASH_MAX_TIMEOUT_MS: Final = 600_000
# The tools that touch the disk: each call runs on a thread, off the agent's event loop.
FILE_TOOLS: Final = frozenset({"Read", "Write", "Edit", "Glob", "Grep"})


class ToolFailure(Exception):
    """A failure the model is told about (its text is the tool's result)."""


def tool_error(message: str) -> str:
    """How a failed tool call reads to the model."""
    return f"<tool_use_error>{message}</tool_use_error>"


class ToolArgs(BaseModel):
    """A tool's arguments: unknown ones refused, the seed's names accepted as aliases."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ReadArgs(ToolArgs):
    file_path: str = Field(description="The path of the file to read")
    offset: int | None = Field(None, ge=1, description="The line number to start from (1-based)")
    limit: int | None = Field(None, ge=1, description="How many lines to read")


class WriteArgs(ToolArgs):
    file_path: str = Field(description="The path of the file to write")
    content: str = Field(description="The whole new content of the file")


class EditArgs(ToolArgs):
    file_path: str = Field(description="The path of the file to edit")
    old_string: str = Field(description="The exact text to replace")
    new_string: str = Field(description="The text to put in its place")
    replace_all: bool = Field(False, description="Replace every occurrence, not just one")


class GlobArgs(ToolArgs):
    pattern: str = Field(description="A glob pattern such as **/*.py")
    path: str | None = Field(None, description="The directory to search (default: cwd)")


class GrepArgs(ToolArgs):
    pattern: str = Field(description="A regular expression")
    path: str | None = Field(None, description="A file or directory (default: cwd)")
    glob: str | None = Field(None, description="Only files matching this glob, e.g. *.py")
    output_mode: Literal["content", "files_with_matches", "count"] = "files_with_matches"
    case_insensitive: bool = Field(False, alias="-i", description="Ignore case")
    line_numbers: bool = Field(False, alias="-n", description="Show line numbers (content mode)")
    head_limit: int | None = Field(None, ge=1, description="Only the first N lines of output")


class BashArgs(ToolArgs):
    command: str = Field(description="The command line to run with /bin/sh")
    timeout: int | None = Field(
        None, ge=1, le=BASH_MAX_TIMEOUT_MS, description="Milliseconds (default 120000)"
    )
    description: str | None = Field(None, description="What the command does, in a few words")
    run_in_background: bool = Field(False, description="Start it as a background task")


# (name, argument model, description): the tools of this module, as the model sees them.
TOOL_SPECS: Final[tuple[tuple[str, type[ToolArgs], str], ...]] = (
    ("Read", ReadArgs, "Read a file; lines are numbered from 1."),
    ("Write", WriteArgs, "Write a file (an existing file must have been Read first)."),
    ("Edit", EditArgs, "Replace text in a file that was Read first."),
    ("Glob", GlobArgs, "Find files by glob pattern, newest first."),
    ("Grep", GrepArgs, "Search file contents with a regular expression."),
    ("Bash", BashArgs, "Run a shell command (foreground with a timeout, or in the background)."),
)


def schema_of(model: type[ToolArgs]) -> dict[str, Any]:
    """The JSON schema the model is shown (argument names by alias)."""
    return model.model_json_schema(by_alias=True)


def parse_args(model: type[ToolArgs], args: dict[str, Any]) -> ToolArgs:
    """Validate a call's arguments; a ValueError names every bad field."""
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(error_text(e, "arguments") for e in exc.errors())
        raise ValueError(f"bad arguments: {problems}") from None
