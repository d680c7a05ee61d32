"""The pill label: wording for every mix of kinds, what it counts, and `shoal pill`'s reader."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from shoal.core.paths import Layout
from shoal.core.taskrecords import TeammateIdentity
from shoal.core.tasks import InProcessTeammateTaskState, LocalShellTaskState, TaskStatus
from shoal.ui.pill import pill_for, pill_label, pill_tasks
from shoal.ui.pill_fast import PillError, parse_pill_argv, pill_text, run, run_if_pill
from tests.unit.test_ui_fixtures import SESSION, build_swarm

Record = dict[str, Any]


def _task(type_: str, **extra: Any) -> Record:
    return {"type": type_, "status": "running", "is_backgrounded": True, **extra}


MAKERS: dict[str, Callable[[int], Record]] = {
    "shell": lambda i: _task("local_bash", kind="bash"),
    "monitor": lambda i: _task("local_bash", kind="monitor"),
    "local agent": lambda i: _task("local_agent", agent_type="main-session"),
    "cloud": lambda i: _task("remote_agent"),
    "teammate": lambda i: _task("in_process_teammate", identity={"team_name": f"team{i}"}),
    "dream": lambda i: _task("dream"),
    "workflow": lambda i: _task("local_workflow"),
    "mcp": lambda i: _task("monitor_mcp"),
}

SINGLE_KIND = [
    ("shell", 1, "1 shell"),
    ("shell", 3, "3 shells"),
    ("monitor", 1, "1 monitor"),
    ("monitor", 2, "2 monitors"),
    ("local agent", 1, "1 local agent"),
    ("local agent", 2, "2 local agents"),
    ("cloud", 1, "◇ 1 cloud session"),
    ("cloud", 3, "◇ 3 cloud sessions"),
    ("teammate", 1, "1 team"),
    ("teammate", 2, "2 teams"),
    ("dream", 1, "dreaming"),
    ("dream", 2, "dreaming"),
    ("workflow", 1, "1 background workflow"),
    ("workflow", 2, "2 background workflows"),
    ("mcp", 1, "1 monitor"),
    ("mcp", 3, "3 monitors"),
]


@pytest.mark.parametrize(("kind", "n", "label"), SINGLE_KIND, ids=lambda v: str(v))
def test_one_kind(kind: str, n: int, label: str) -> None:
    assert pill_label([MAKERS[kind](i) for i in range(n)]) == label


def _expected_mix(kinds: tuple[str, ...]) -> str:
    """What a mix of one task of each of `kinds` reads as."""
    if set(kinds) == {"shell", "monitor"}:
        return "1 shell, 1 monitor"  # both are shell tasks: one kind, two words
    return f"{len(kinds)} background tasks"


MIXES = [combo for r in range(2, len(MAKERS) + 1) for combo in itertools.combinations(MAKERS, r)]


@pytest.mark.parametrize("kinds", MIXES, ids=lambda ks: "+".join(ks))
def test_every_mix_of_kinds(kinds: tuple[str, ...]) -> None:
    tasks = [MAKERS[k](i) for i, k in enumerate(kinds)]
    assert pill_label(tasks) == _expected_mix(kinds)


def test_shells_and_monitors_are_counted_apart() -> None:
    tasks = [MAKERS["shell"](0)] * 2 + [MAKERS["monitor"](0)] * 3
    assert pill_label(tasks) == "2 shells, 3 monitors"


def test_teammates_are_counted_by_team() -> None:
    same_team = [MAKERS["teammate"](0) for _ in range(4)]
    assert pill_label(same_team) == "1 team"
    assert pill_label([*same_team, MAKERS["teammate"](1)]) == "2 teams"


@pytest.mark.parametrize(
    ("phase", "label"),
    [
        (None, "◇ ultraplan"),
        ("running", "◇ ultraplan"),
        ("needs_input", "◇ ultraplan needs your input"),
        ("plan_ready", "◆ ultraplan ready"),
    ],
)
def test_ultraplan_phase(phase: str | None, label: str) -> None:
    task = _task("remote_agent", is_ultraplan=True, ultraplan_phase=phase)
    assert pill_label([task]) == label
    # Two cloud sessions are counted, whatever their phase.
    assert pill_label([task, task]) == "◇ 2 cloud sessions"


def test_nothing_gives_an_empty_label() -> None:
    assert pill_label([]) == ""
    assert pill_for([]) == ""


def test_only_background_tasks_count() -> None:
    running = MAKERS["shell"](0)
    tasks = [
        running,
        {**running, "status": "pending"},
        {**running, "status": "completed"},
        {**running, "status": "failed"},
        {**running, "status": "killed"},
        {**running, "is_backgrounded": False},  # in the foreground
    ]
    assert pill_tasks(tasks) == [running, {**running, "status": "pending"}]
    assert pill_for(tasks) == "2 shells"


def test_panel_agent_tasks_are_left_out() -> None:
    panel = _task("local_agent", agent_type="researcher")
    main = _task("local_agent", agent_type="main-session")
    assert pill_for([panel]) == ""
    assert pill_for([panel, main]) == "1 local agent"
    assert pill_for([panel, MAKERS["shell"](0)]) == "1 shell"


def test_works_on_real_state_records(tmp_path: Path) -> None:
    shell = LocalShellTaskState(
        id="b00000001",
        description="x",
        command="x",
        status=TaskStatus.RUNNING,
        output_file=str(tmp_path / "o"),
    )
    mate = InProcessTeammateTaskState(
        id="t00000001",
        description="m",
        identity=TeammateIdentity(
            agent_id="a@t", agent_name="a", team_name="t", parent_session_id="s"
        ),
        prompt="p",
        status=TaskStatus.RUNNING,
        output_file=str(tmp_path / "o2"),
    )
    records = [t.model_dump(mode="json") for t in (shell, mate)]
    assert pill_for(records[:1]) == "1 shell"
    assert pill_for(records[1:]) == "1 team"
    assert pill_for(records) == "2 background tasks"


# --------------------------------------------------------------------------- the fast reader


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        (["pill"], {}),
        (["pill", "--team", "t"], {"team": "t"}),
        (["--home", "/h", "pill", "--team=t"], {"home": "/h", "team": "t"}),
        (["--home=/h", "--team", "pill", "pill"], {"home": "/h", "team": "pill"}),
        (["pill", "--help"], None),
        (["pill", "--json"], None),
        (["pill", "--team"], None),
        (["ps"], None),
        (["--home", "/h", "ps"], None),
        (["pill", "pill"], None),
    ],
)
def test_parse_pill_argv(argv: list[str], parsed: dict[str, str] | None) -> None:
    assert parse_pill_argv(argv) == parsed


def test_run_if_pill_only_for_shoal_itself() -> None:
    # Not shoal's own program, or not a pill command line: returns without doing anything.
    run_if_pill(["pytest", "pill"])
    run_if_pill(["/usr/bin/shoal", "ps"])
    run_if_pill(["/usr/bin/shoal", "pill", "--help"])


def test_pill_text_reads_the_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_swarm(Layout(tmp_path))
    assert pill_text(tmp_path, "demo") == "7 background tasks"
    monkeypatch.delenv("SHOAL_TEAM", raising=False)
    with pytest.raises(PillError, match="teams on disk: demo"):  # never "the only team"
        pill_text(tmp_path, None)
    monkeypatch.setenv("SHOAL_TEAM", "demo")
    assert pill_text(tmp_path, None) == "7 background tasks"


def test_pill_text_without_session_or_tasks(tmp_path: Path) -> None:
    from shoal.teams.store import Teams

    Teams(Layout(tmp_path)).create("empty")
    assert pill_text(tmp_path, "empty") == ""


def test_pill_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PillError, match="no team 'default'"):
        pill_text(tmp_path, None)
    with pytest.raises(PillError, match="invalid team name"):
        pill_text(tmp_path, "Bad/Name")
    layout = Layout(tmp_path)
    build_swarm(layout)
    with pytest.raises(PillError, match="no team 'other'"):
        pill_text(tmp_path, "other")
    (layout.session_dir(SESSION) / "state.json").write_bytes(b"{not json")
    with pytest.raises(PillError, match="corrupt session state"):
        pill_text(tmp_path, "demo")
    assert run(["pill", "--home", str(tmp_path), "--team", "demo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: corrupt session state") and err.count("\n") == 1


def test_state_file_shape_is_what_the_leader_writes(tmp_path: Path) -> None:
    session = build_swarm(Layout(tmp_path))
    raw = orjson.loads(session.state_file.read_bytes())
    assert pill_for(raw["tasks"].values()) == "7 background tasks"


def test_fast_path_copies_match_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.core import names, paths
    from shoal.ui import pill_fast

    assert pill_fast.NAME_PATTERN.pattern == names.NAME_PATTERN.pattern
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "h"))
    for home in (None, str(tmp_path / "x"), "~/y"):
        assert pill_fast.resolve_home(home) == paths.resolve_home(home)


def test_detail_breaks_a_mix_down_by_kind() -> None:
    tasks = [MAKERS["teammate"](0), MAKERS["shell"](0), MAKERS["teammate"](0)]
    tasks += [MAKERS["shell"](1), MAKERS["shell"](2)]
    assert pill_label(tasks) == "5 background tasks"  # the default stays the seed's rule
    assert pill_label(tasks, detail=True) == "3 shells, 1 team"
    one = [MAKERS["shell"](0), MAKERS["teammate"](0)]
    assert pill_label(one, detail=True) == "1 shell, 1 team"
    assert pill_label(one[:1], detail=True) == "1 shell"  # one kind: as without detail
