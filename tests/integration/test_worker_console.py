"""What a teammate shows as it works: its tmux pane (read with capture-pane from a real tmux
server), and under the process backend its log file — one readable line per event."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.integration.test_claude_preset import FAKE, FIXTURE
from tests.integration.test_leader import LeaderProc
from tests.polling import wait_until

TEAM = "t"
# A shell command whose output differs from its text: the output line proves it ran.
COMMAND = "echo pane-check-$((6*7))"
OUTPUT = "pane-check-42"
# The brain runs each message it gets as a shell command.
# (a placeholder is one quoted word: running the message as a command is said, with sh -c)
SCRIPT = '[[step]]\nwhen = "message"\nrun = "sh -c {prompt}"\n'
STAMP = re.compile(r"^\d\d:\d\d:\d\d ")
SGR = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def leader(home: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Iterator[LeaderProc]:
    monkeypatch.delenv("NO_COLOR", raising=False)  # (a pane is a terminal: colour expected)
    proc = LeaderProc(home, team=TEAM, env={"SHOAL_SHUTDOWN_TIMEOUT": "5"})
    yield proc
    cli("down", "--team", TEAM)
    proc.stop()


@pytest.fixture
def tmux_leader(tmux_socket: str, leader: LeaderProc) -> LeaderProc:
    """The leader, started once the private tmux server's socket is set for it."""
    return leader


def spawn(cli: Cli, tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    script = tmp_path / f"{name}.toml"
    script.write_text(SCRIPT)
    out = cli("spawn", "--team", TEAM, name, "--json", "--script", str(script), *args)
    assert out.returncode == 0, out.stderr
    info: dict[str, Any] = json.loads(out.stdout)
    return info


def send(cli: Cli, name: str, *args: str) -> None:
    out = cli("send", "--team", TEAM, name, *args)
    assert out.returncode == 0, out.stderr


def shut_down(cli: Cli, name: str) -> None:
    """Ask one teammate to shut down, as the lead would (the others, and the pane, stay)."""
    data = json.dumps({"request_id": "r1", "reason": "the test is over"})
    send(cli, name, "--kind", "shutdown_request", "--data", data)


def events(lines: list[str]) -> list[str]:
    """The console lines (timestamp dropped, spaces collapsed), anything else left out."""
    return [" ".join(STAMP.sub("", line).split()) for line in lines if STAMP.match(line)]


def in_order(seen: list[str], expected: list[str]) -> bool:
    """Whether each expected line appears, in this order (other lines may come between)."""
    rest = iter(seen)
    return all(any(line == want for line in rest) for want in expected)


EXPECTED = [
    f"received text from team-lead: {COMMAND}",
    f"busy working on {COMMAND}",
    f"step run: sh -c {COMMAND}",
    f"output {OUTPUT}",
    "exit exit code 0",
    f"sent task_notification to team-lead: completed: {OUTPUT}",
    "idle",
    "received shutdown_request from team-lead: the test is over",
    "shutdown approved; leaving the team",
    "sent shutdown_response to team-lead: approved",
    "stopped exit code 0",
]


def capture(socket: str, pane: str, *flags: str) -> str:
    res = subprocess.run(
        ["tmux", "-L", socket, "capture-pane", "-p", "-J", "-S", "-", *flags, "-t", pane],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.tmux
def test_a_tmux_pane_shows_what_its_teammate_receives_runs_sends_and_when_it_stops(
    cli: Cli, tmux_leader: LeaderProc, tmp_path: Path, tmux_socket: str
) -> None:
    info = spawn(cli, tmp_path, "ana", "--backend", "tmux")
    pane = info["pane_id"]
    assert pane and pane.startswith("%")

    def shown() -> list[str]:
        return events(capture(tmux_socket, pane).splitlines())

    wait_until(
        lambda: any(line.startswith("ready ana of team t, backend tmux") for line in shown()),
        what=lambda: f"the ready line in the pane, which shows:\n{capture(tmux_socket, pane)}",
    )

    send(cli, "ana", COMMAND)
    wait_until(
        lambda: "idle" in shown(),
        what=lambda: f"the turn in the pane, which shows:\n{capture(tmux_socket, pane)}",
    )
    shut_down(cli, "ana")
    wait_until(
        lambda: "stopped exit code 0" in shown(),
        what=lambda: f"the stop in the pane, which shows:\n{capture(tmux_socket, pane)}",
    )
    assert in_order(shown(), EXPECTED), capture(tmux_socket, pane)
    # On a terminal the tags are coloured (capture-pane -e keeps the escape sequences).
    coloured = capture(tmux_socket, pane, "-e")
    assert any(SGR.search(line) for line in coloured.splitlines() if "pane-check-42" in line)


def test_the_process_backend_writes_the_same_lines_to_its_log_file_in_plain_text(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    spawn(cli, tmp_path, "ben", "--backend", "process")
    log = home / "teams" / TEAM / "logs" / "ben.log"

    def shown() -> list[str]:
        return events(log.read_text().splitlines()) if log.exists() else []

    wait_until(lambda: any(line.startswith("ready ben of team t") for line in shown()))
    send(cli, "ben", COMMAND)
    # Line-buffered: each line is in the file as soon as it happened, not at exit.
    wait_until(lambda: "idle" in shown(), what=lambda: f"the turn in {log}:\n{log.read_text()}")
    assert in_order(shown(), EXPECTED[:7]), log.read_text()
    shut_down(cli, "ben")
    wait_until(lambda: "stopped exit code 0" in shown(), what=lambda: log.read_text())
    assert in_order(shown(), EXPECTED), log.read_text()
    assert "\x1b" not in log.read_text()  # not a terminal: no colour


def test_a_failing_command_and_messages_to_teammates_are_shown(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "cy.toml"
    script.write_text(
        '[[step]]\nsend = "dee"\ntext = "hello dee,\\nfrom {name}"\n'
        '[[step]]\nrun = "echo partial; echo to-stderr >&2; exit 3"\n'
    )
    for name, brain in (("cy", ["--script", str(script)]), ("dee", [])):
        out = cli("spawn", "--team", TEAM, name, "--backend", "process", *brain)
        assert out.returncode == 0, out.stderr
    log = home / "teams" / TEAM / "logs" / "cy.log"

    def shown() -> list[str]:
        return events(log.read_text().splitlines()) if log.exists() else []

    wait_until(lambda: any(line.startswith("ready cy") for line in shown()))
    send(cli, "cy", "go")
    wait_until(lambda: "idle" in shown(), what=lambda: log.read_text())
    assert in_order(
        shown(),
        [
            "received text from team-lead: go",
            "step send",
            "sent text to dee: hello dee, from cy",  # (one line: the newline is a space)
            "step run: echo partial; echo to-stderr >&2; exit 3",
            "output partial",
            "output to-stderr",
            "failed exit code 3",
            "sent task_notification to team-lead: failed: command failed with exit code 3: "
            "partial to-stderr",
            "idle",
        ],
    ), log.read_text()
    dee = home / "teams" / TEAM / "logs" / "dee.log"
    wait_until(
        lambda: "received text from cy: hello dee, from cy" in events(dee.read_text().splitlines()),
        what=lambda: dee.read_text(),
    )


def test_an_llm_teammate_shows_its_readable_transcript(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model.toml"
    model.write_text(
        '[[turn]]\ntext = "Counting first."\n[[turn.call]]\ntool = "Bash"\n'
        'args = { command = "echo counted-$((2+3))", description = "count" }\n'
        '[[turn]]\ntext = "The count is {last}"\n'
    )
    out = cli(
        "spawn", "--team", TEAM, "eve", "--backend", "process",
        "--agent", "llm", "--model", f"scripted:{model}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    log = home / "teams" / TEAM / "logs" / "eve.log"

    def shown() -> list[str]:
        return events(log.read_text().splitlines()) if log.exists() else []

    wait_until(lambda: any(line.startswith("ready eve") for line in shown()))
    send(cli, "eve", "count please")
    wait_until(lambda: "idle" in shown(), what=lambda: log.read_text())
    text = " ".join(log.read_text().split())
    # The transcript's own lines (what the model said, the tool call and its result) come
    # between the teammate's event lines.
    said = text.index("Counting first.")
    assert text.index("received text from team-lead: count please") < said
    assert said < text.index("● Bash") < text.index("counted-5") < text.index("The count is")
    assert text.index("The count is") < text.index("sent task_notification to team-lead")


def test_a_plan_approval_request_and_its_answer_are_shown(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    spawn(cli, tmp_path, "fay", "--backend", "process", "--plan-mode")
    log = home / "teams" / TEAM / "logs" / "fay.log"

    def shown() -> list[str]:
        return events(log.read_text().splitlines()) if log.exists() else []

    wait_until(lambda: any(line.startswith("ready fay") for line in shown()))
    send(cli, "fay", "echo planned")
    asks = "plan asks team-lead to approve (shoal approve fay): - run: sh -c echo planned"
    wait_until(lambda: asks in shown(), what=lambda: log.read_text())
    assert "output planned" not in shown()  # (nothing ran before the approval)
    approved = cli("approve", "--team", TEAM, "fay")
    assert approved.returncode == 0, approved.stderr
    wait_until(lambda: "idle" in shown(), what=lambda: log.read_text())
    assert in_order(
        shown(), [asks, "approval plan approved", "step run: sh -c echo planned", "output planned"]
    ), log.read_text()


GATED_AGENT = """
[[turn]]
[[turn.call]]
tool = "Write"
args = { file_path = "a.txt", content = "one" }

[[turn]]
text = "wrote it"
"""


def test_an_agents_permission_request_is_in_its_readable_transcript(
    cli: Cli, leader: LeaderProc, tmp_path: Path
) -> None:
    model = tmp_path / "gated.toml"
    model.write_text(GATED_AGENT)
    out = cli(
        "agent", "--team", TEAM, "--model", f"scripted:{model}", "--cwd", str(tmp_path),
        "--backend", "process", "go",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()

    def record() -> dict[str, Any]:
        listed = json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
        (task,) = [t for t in listed if t["id"] == task_id]
        return dict(task)

    wait_until(lambda: record().get("waiting_for"), what=f"{task_id} to ask the lead")
    output = Path(record()["output_file"])
    asks = f"[asks the lead to run Write (a.txt): shoal approve {task_id}.1 | shoal reject"
    wait_until(lambda: asks in output.read_text(), what=lambda: output.read_text())
    assert cli("approve", "--team", TEAM, f"{task_id}.1").returncode == 0
    wait_until(lambda: "wrote it" in output.read_text(), what=lambda: output.read_text())
    text = output.read_text()
    assert text.index(asks) < text.index("[Write approved]") < text.index("wrote it")


def test_a_commands_output_is_shown_while_it_still_runs(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    spawn(cli, tmp_path, "gus", "--backend", "process")
    log = home / "teams" / TEAM / "logs" / "gus.log"

    def shown() -> list[str]:
        return events(log.read_text().splitlines()) if log.exists() else []

    wait_until(lambda: any(line.startswith("ready gus") for line in shown()))
    gate = tmp_path / "gate"
    send(cli, "gus", f"echo before-gate; while [ ! -f {gate} ]; do sleep 0.05; done; echo after")
    wait_until(lambda: "output before-gate" in shown(), what=lambda: log.read_text())
    assert "output after" not in shown() and "idle" not in shown()  # (it still runs)
    gate.touch()
    wait_until(lambda: "idle" in shown(), what=lambda: log.read_text())
    assert in_order(shown(), ["output before-gate", "output after", "exit exit code 0"])


def test_a_claude_teammate_shows_the_readable_text_of_its_stream_not_the_raw_json(
    cli: Cli, leader: LeaderProc, home: Path, tmp_path: Path
) -> None:
    # (the `claude` run is the stand-in of test_claude_preset: it prints a real recorded stream)
    (tmp_path / "stream.jsonl").write_text(FIXTURE.read_text())
    fake = tmp_path / "fake_claude.py"
    fake.write_text(FAKE)
    cmd = f"{sys.executable} {fake} {tmp_path / 'calls.jsonl'}"
    out = cli(
        "spawn", "--team", TEAM, "hal", "--agent", "claude", "--cmd", cmd,
        "--backend", "process", "--cwd", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    log = home / "teams" / TEAM / "logs" / "hal.log"

    def shown() -> list[str]:
        return events(log.read_text().splitlines()) if log.exists() else []

    wait_until(lambda: any(line.startswith("ready hal") for line in shown()))
    send(cli, "hal", "say hello")
    wait_until(lambda: "idle" in shown(), what=lambda: log.read_text())
    text = log.read_text()
    assert (
        "● Bash(write a file)" in text
        and "[claude: 3 turn(s), 141 tokens (120 in the latest request, 21 out)" in text
    )
    assert '"type":"assistant"' not in text  # (the raw stream stays in its own file)
    assert text.index("● Bash(") < text.index("sent     task_notification to team-lead")
