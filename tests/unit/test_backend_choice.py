"""`--backend auto`: which backend the environment means, and why; bad names are usage errors."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from shoal.core.errors import ShoalError, UsageError
from shoal.teams.backends.base import BACKEND_NAMES, BackendUnavailable, choose, detect
from shoal.teams.backends.iterm2 import ITerm2Backend
from shoal.teams.backends.process import ProcessBackend
from shoal.teams.backends.tmux import TmuxBackend

TMUX_ENV = {"TMUX": "/tmp/tmux-1000/default,4242,0", "TMUX_PANE": "%1"}


class _Usable(ProcessBackend):
    """A stand-in for a backend that can run here (which of them is chosen is the question)."""

    def available(self) -> tuple[bool, str]:
        return True, "usable"


USABLE = {"iterm2": _Usable(), "tmux": _Usable()}


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
    name, reason = detect(environ, USABLE)
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
def test_iterm2_asked_for_by_name_off_macos_still_refuses_naming_why() -> None:
    # On this (Linux) machine the iTerm2 backend cannot run: named, it is refused, never replaced.
    with pytest.raises(BackendUnavailable, match="iTerm2 panes need macOS"):
        choose("iterm2", {"TERM_PROGRAM": "iTerm.app"})


def test_tmux_asked_for_by_name_without_a_tmux_binary_refuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # (an empty directory: no tmux on the PATH)
    with pytest.raises(BackendUnavailable, match="backend 'tmux' is not available: tmux is not"):
        choose("tmux", TMUX_ENV)


@pytest.mark.skipif(sys.platform == "darwin", reason="iTerm2 can run on macOS")
def test_auto_inside_iterm2_off_macos_falls_through_to_process_saying_why() -> None:
    backend, why = choose("auto", {"TERM_PROGRAM": "iTerm.app"})
    assert isinstance(backend, ProcessBackend)
    assert why == (
        "running inside iTerm2 (TERM_PROGRAM=iTerm.app) but iterm2 cannot be used "
        f"(iTerm2 panes need macOS; this is {sys.platform}); tmux: not inside tmux; "
        "so process: teammates run as background processes"
    )


def test_auto_inside_iterm2_without_its_python_api_falls_through_to_tmux(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On macOS inside iTerm2 with no `iterm2` module (as here: it is not installed), inside
    tmux with a tmux binary on the PATH: tmux, and the skipped iTerm2 step is said."""
    assert importlib.util.find_spec("iterm2") is None
    tmux = shutil.which("tmux")
    assert tmux is not None, "tmux must be installed for this test (apt-get install tmux)"
    (tmp_path / "tmux").symlink_to(tmux)
    monkeypatch.setenv("PATH", str(tmp_path))
    env = {"TERM_PROGRAM": "iTerm.app", **TMUX_ENV}
    iterm = ITerm2Backend(platform="darwin", environ=env)
    name, why = detect(env, {"iterm2": iterm})
    assert name == "tmux"
    assert why == (
        "running inside iTerm2 (TERM_PROGRAM=iTerm.app) but iterm2 cannot be used (the iterm2 "
        "package is not installed (pip install 'shoal[iterm2]')); "
        "running inside tmux ($TMUX is set)"
    )
    backend, _ = choose("auto", env, {"iterm2": iterm})
    assert isinstance(backend, TmuxBackend)


def test_auto_inside_tmux_without_a_tmux_binary_falls_through_to_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    backend, why = choose("auto", TMUX_ENV)
    assert isinstance(backend, ProcessBackend)
    assert why == (
        "iterm2: not inside iTerm2; running inside tmux ($TMUX is set) but tmux cannot be used "
        "(tmux is not installed (apt-get install tmux)); "
        "so process: teammates run as background processes"
    )


def test_auto_with_both_unusable_says_each_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    env = {"ITERM_SESSION_ID": "w0t0p0:ABCD", **TMUX_ENV}
    name, why = detect(env, {"iterm2": ITerm2Backend(platform="darwin", environ=env)})
    assert name == "process"
    steps = why.split("; ")
    assert steps[0].startswith("running inside iTerm2 ($ITERM_SESSION_ID is set) but iterm2")
    assert "iterm2 package is not installed" in steps[0]
    assert steps[1].startswith("running inside tmux ($TMUX is set) but tmux cannot be used")
    assert steps[2] == "so process: teammates run as background processes"


def test_an_iterm2_api_that_does_not_answer_is_not_usable() -> None:
    """`usable` connects: an API that is there but refuses the connection falls through."""

    class Refusing(ITerm2Backend):
        def available(self) -> tuple[bool, str]:
            return True, "inside iTerm2, with the iterm2 Python API"

        def _run(self, what: str, coro: object) -> object:
            raise ShoalError(f"{what}: iTerm2 API error: refused")

    ok, why = Refusing().usable()
    assert not ok
    assert why == "cannot connect to iTerm2's Python API: iTerm2 API error: refused"


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
