"""`--backend auto`: which backend the environment means, and why; bad names are usage errors."""

from __future__ import annotations

import sys

import pytest

from shoal.core.errors import UsageError
from shoal.teams.backends.base import BACKEND_NAMES, BackendUnavailable, choose, detect
from shoal.teams.backends.process import ProcessBackend

TMUX_ENV = {"TMUX": "/tmp/tmux-1000/default,4242,0", "TMUX_PANE": "%1"}


@pytest.mark.parametrize(
    ("environ", "expected", "why"),
    [
        ({"TERM_PROGRAM": "iTerm.app"}, "iterm2", "running inside iTerm2 (TERM_PROGRAM=iTerm.app)"),
        ({"ITERM_SESSION_ID": "w0t0p0:ABCD"}, "iterm2", "running inside iTerm2"),
        # iTerm2 wins over tmux: tmux running in an iTerm2 window still has iTerm2 around it.
        ({"TERM_PROGRAM": "iTerm.app", **TMUX_ENV}, "iterm2", "running inside iTerm2"),
        (TMUX_ENV, "tmux", "running inside tmux ($TMUX is set)"),
        ({"TMUX": ""}, "process", "not inside tmux or iTerm2"),
        ({}, "process", "teammates run as background processes"),
        ({"TERM_PROGRAM": "Apple_Terminal"}, "process", "not inside tmux or iTerm2"),
    ],
)
def test_detect_names_the_backend_and_the_reason(
    environ: dict[str, str], expected: str, why: str
) -> None:
    name, reason = detect(environ)
    assert name == expected
    assert why in reason


def test_auto_outside_any_multiplexer_is_process_and_says_why() -> None:
    backend, why = choose("auto", {})
    assert isinstance(backend, ProcessBackend)
    assert why == "not inside tmux or iTerm2: teammates run as background processes"


def test_an_explicit_choice_says_so() -> None:
    backend, why = choose("process", {"TMUX": "/tmp/x,1,0"})
    assert isinstance(backend, ProcessBackend)
    assert why == "asked for with --backend"


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_auto_inside_iterm2_off_macos_refuses_rather_than_falling_back() -> None:
    # On this (Linux) machine the iTerm2 backend cannot run: `auto` says so, never picks another.
    with pytest.raises(BackendUnavailable, match="iTerm2 panes need macOS"):
        choose("auto", {"TERM_PROGRAM": "iTerm.app"})


@pytest.mark.parametrize("name", ["tmux2", "Process", "", "inprocess", "screen"])
def test_unknown_backend_names_are_usage_errors(name: str) -> None:
    with pytest.raises(UsageError, match="unknown backend") as err:
        choose(name)
    assert err.value.exit_code == 2
    assert all(known in str(err.value) for known in BACKEND_NAMES)


def test_a_dead_pane_line_keeps_its_exit_status() -> None:
    from shoal.teams.backends.tmux import _parse_pane

    line = "\t".join(["/tmp/s", "$1", "@2", "alpha", "0", "%3", "4242", "1", "3", "ana", "t"])
    pane = _parse_pane(line)
    assert pane is not None
    assert (pane.pane_id, pane.dead, pane.dead_status, pane.member) == ("%3", True, "3", "ana")
    assert _parse_pane(line.replace("alpha", "")) is None  # not a shoal window
    assert _parse_pane("garbage") is None
