"""The iTerm2 backend, as far as Linux allows.

The real iTerm2 Python API needs a running iTerm2 on macOS, so it cannot run here, and no test
pretends it does: nothing below fakes a spawn. What is tested: `available()` and `choose`
refusing it with the reason (no fallback), `spawn`/`is_alive`/`kill` refusing the same way, and
the pure parts the API is fed — the pane's profile settings (custom command = the worker
command, run from creation; working directory; name, badge and tab colour) and the colour
conversion. The API calls themselves (connect, split, set name, close) are untested here.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

from shoal.core.errors import UsageError
from shoal.teams.backends.base import BackendUnavailable, Handle, SpawnSpec, choose
from shoal.teams.backends.iterm2 import (
    ITerm2Backend,
    build_profile_settings,
    color_rgb,
    worker_command,
)
from shoal.teams.colors import PALETTE

off_macos = pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
ITERM_ENV = {"TERM_PROGRAM": "iTerm.app", "ITERM_SESSION_ID": "w0t0p0:1234-ABCD"}


def spec(**overrides: object) -> SpawnSpec:
    fields: dict[str, object] = {
        "team": "alpha",
        "name": "alice",
        "argv": [sys.executable, "-m", "shoal", "worker", "--team", "alpha", "--name", "alice"],
        "cwd": "/work/it's here",
        "home": Path("/tmp/shoal-home"),
        "color": "colour33",
        "env": {"SHOAL_TEAM": "alpha"},
    }
    fields.update(overrides)
    return SpawnSpec(**fields)  # type: ignore[arg-type]


@off_macos
def test_unavailable_off_macos_with_the_reason() -> None:
    ok, why = ITerm2Backend().available()
    assert not ok
    assert why == f"iTerm2 panes need macOS; this is {sys.platform}"
    # Even from inside iTerm2's environment: the platform decides first.
    assert ITerm2Backend(environ=ITERM_ENV).available() == (False, why)


@off_macos
def test_choose_iterm2_refuses_with_the_reason_and_no_fallback() -> None:
    with pytest.raises(BackendUnavailable) as err:
        choose("iterm2", ITERM_ENV)
    assert str(err.value) == (
        f"backend 'iterm2' is not available: iTerm2 panes need macOS; this is {sys.platform}"
    )


@off_macos
def test_spawn_and_friends_refuse_rather_than_pretend() -> None:
    backend = ITerm2Backend(environ=ITERM_ENV)
    handle = Handle(backend="iterm2", pid=None, pane_id="1234-ABCD")
    for call in (
        lambda: backend.spawn(spec()),
        lambda: backend.is_alive(handle),
        lambda: backend.kill(handle),
    ):
        with pytest.raises(BackendUnavailable, match="need macOS"):
            call()


@pytest.mark.skipif(
    importlib.util.find_spec("iterm2") is not None, reason="the iterm2 package is installed"
)
def test_without_the_iterm2_package_the_reason_names_the_extra() -> None:
    ok, why = ITerm2Backend(platform="darwin", environ=ITERM_ENV).available()
    assert not ok
    assert why == "the iterm2 package is not installed (pip install 'shoal[iterm2]')"


def test_profile_runs_the_worker_command_from_creation() -> None:
    s = spec()
    settings = build_profile_settings(s, environ={"PATH": "/opt/bin:/usr/bin", "HOME": "/r"})
    assert settings["Custom Command"] == "Yes"
    argv = shlex.split(settings["Command"])
    # `env` execs the worker (same pid) with our variables; HOME etc. stay iTerm2's own.
    assert argv[0] == "/usr/bin/env"
    assert argv[1:3] == ["PATH=/opt/bin:/usr/bin", "SHOAL_TEAM=alpha"]
    assert argv[3:] == s.argv
    assert settings["Custom Directory"] == "Yes"
    assert settings["Working Directory"] == "/work/it's here"
    assert settings["Name"] == "alice" and settings["Badge Text"] == "alice"


def test_command_without_variables_is_the_argv_itself() -> None:
    s = spec(env={}, argv=["/bin/echo", "a b", "it's"])
    assert worker_command(s, environ={}) == shlex.join(["/bin/echo", "a b", "it's"])
    with pytest.raises(UsageError, match="empty command"):
        worker_command(spec(argv=[]), environ={})


def test_tab_colour_is_the_members_colour() -> None:
    tab = build_profile_settings(spec(color="colour33"), environ={})["Tab Color"]
    assert build_profile_settings(spec(), environ={})["Use Tab Color"] is True
    assert (tab["Red Component"], tab["Green Component"], tab["Blue Component"]) == (
        0.0,
        135 / 255,
        1.0,
    )
    assert tab["Color Space"] == "sRGB"


@pytest.mark.parametrize(
    ("colour", "rgb"),
    [
        ("red", (205, 0, 0)),
        ("orange", (255, 165, 0)),
        ("colour9", (255, 0, 0)),
        ("colour33", (0, 135, 255)),
        ("color160", (215, 0, 0)),
        ("colour232", (8, 8, 8)),
        ("colour255", (238, 238, 238)),
        ("#1a2B3c", (26, 43, 60)),
    ],
)
def test_color_rgb(colour: str, rgb: tuple[int, int, int]) -> None:
    assert color_rgb(colour) == rgb


def test_every_palette_colour_converts() -> None:
    assert all(len(color_rgb(c)) == 3 for c in PALETTE)


@pytest.mark.parametrize("bad", ["bleu", "colour256", "#12345", ""])
def test_unknown_colours_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="unknown colour"):
        color_rgb(bad)
