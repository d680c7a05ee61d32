"""PR activity through the real CLI and a real leader: a scripted coordinator subscribes to
pull requests of a loopback server speaking GitHub's REST format; new comments arrive as
`<pr-activity>` notifications once each, across a kill -9 of the leader; unsubscribing stops
them; a spent rate limit is said once; a 401 or 403 ends the subscription, naming it, and the
coordinator, no longer held, completes."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, FAST, script
from tests.integration.test_coordinator import TEAM, coordinate, ended, record
from tests.polling import wait_until
from tests.support.github_stub import OLD, FakeGitHub

REPO = "octo/repo"
TOKEN = "ghp_loopback"
ENV = {**FAST, "SHOAL_PR_POLL_S": "0.2", "GITHUB_TOKEN": TOKEN}


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as stub:
        stub.token = TOKEN
        for number in (1, 2):
            stub.add_pull(REPO, number)
            stub.comment(REPO, number, f"old comment on {number}", at=OLD)
        yield stub


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=ENV)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def prompts(task: dict[str, Any]) -> str:
    """Every user-side text of the coordinator's conversation (tool results included)."""
    from shoal.workers.agent.progress import prompt_texts
    from shoal.workers.agent.transcript import Transcript

    messages = Transcript.load(Path(task["transcript"])).messages
    texts = prompt_texts(messages)
    for message in messages:
        for part in getattr(message, "parts", ()):
            if part.part_kind == "tool-return":
                texts.append(part.model_response_str())
    return "\n".join(texts)


def arrived(cli: Cli, task_id: str, body: str) -> int:
    """How often `body` came in a `<pr-activity>` notification of the coordinator."""
    blocks = re.findall(r"<pr-activity>.*?</pr-activity>", prompts(record(cli, task_id)), re.S)
    return sum(f"<body>{body}</body>" in b for b in blocks)


def lead_pid(cli: Cli) -> int:
    shown = json.loads(cli("team", "show", "--team", TEAM, "--json").stdout)
    return int(next(m["pid"] for m in shown["members"] if m["name"] == "team-lead"))


WATCH = """
final = "noted {turn}"

[[turn]]
[[turn.call]]
tool = "subscribe_pr_activity"
args = { repo = "octo/repo", number = 1 }
[[turn.call]]
tool = "subscribe_pr_activity"
args = { repo = "octo/repo", number = 2 }

[[turn]]
text = "Watching both."

[[turn]]
text = "Heard of PR 1."

[[turn]]
[[turn.call]]
tool = "unsubscribe_pr_activity"
args = { repo = "octo/repo", number = 1 }

[[turn]]
text = "Only PR 2 now."
"""


def test_new_comments_arrive_once_across_a_leader_kill_until_unsubscribed(
    leader: Cli, github: FakeGitHub, tmp_path: Path
) -> None:
    model = script(tmp_path, WATCH)
    coord = coordinate(leader, model, tmp_path, "--backend", "process", *BYPASS,
                       "--github-api", github.url)  # fmt: skip
    session = Path(record(leader, coord)["output_file"]).parent.parent
    wait_until(lambda: len(github.requests("/pulls/2/reviews")) >= 2, timeout=60,
               what="two polls of each PR")  # fmt: skip
    github.comment(REPO, 1, "first news")
    wait_until(lambda: arrived(leader, coord, "first news"), timeout=60, what="the comment")

    pid = lead_pid(leader)  # kill -9 of the leader; the coordinator's process goes on
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
               timeout=30)  # fmt: skip
    github.comment(REPO, 2, "news while no leader ran")
    up = leader("up", "--team", TEAM, "--detach", "--quiet", env=ENV)
    assert up.returncode == 0, up.stderr
    wait_until(lambda: arrived(leader, coord, "news while no leader ran"), timeout=60,
               what="the comment made while the leader was down")  # fmt: skip
    subs = json.loads((session / "pr_activity.json").read_text())["subscriptions"]
    wait_until(lambda: "unsubscribed from octo/repo#1" in prompts(record(leader, coord)),
               timeout=60, what="the unsubscribe")  # fmt: skip

    github.comment(REPO, 1, "after unsubscribing")
    github.comment(REPO, 2, "still watched")
    wait_until(lambda: arrived(leader, coord, "still watched"), timeout=60, what="PR 2's news")
    assert arrived(leader, coord, "after unsubscribing") == 0
    for body in ("first news", "news while no leader ran", "still watched"):
        assert arrived(leader, coord, body) == 1, body  # each exactly once
    assert not any(arrived(leader, coord, f"old comment on {n}") for n in (1, 2))
    assert {s["repo"] for s in subs} == {REPO} and all(s["etags"] for s in subs)
    assert {s.authorization for s in github.requests()} == {f"Bearer {TOKEN}"}
    assert any(s.status == 304 and s.if_none_match for s in github.requests())

    github.refuse(REPO, 2, 401)  # the token stopped working: the subscription ends
    final = ended(leader, coord, timeout=60)
    assert final["status"] == "completed", final
    text = prompts(final)
    assert "<event>subscription_ended</event>" in text and "status 401" in text
    assert "the subscription to octo/repo#2 has ended" in text
    assert TOKEN not in (session / "pr_activity.json").read_text()


HELD = """
final = "noted {turn}"

[[turn]]
[[turn.call]]
tool = "subscribe_pr_activity"
args = { repo = "octo/repo", number = 1 }

[[turn]]
text = "Watching."
"""


def test_a_spent_rate_limit_is_said_once_and_a_403_ends_the_subscription(
    leader: Cli, github: FakeGitHub, tmp_path: Path
) -> None:
    github.spend_rate_limit(1)
    github.spend_rate_limit(1)  # (refused twice running: still one spell, said once)
    coord = coordinate(leader, script(tmp_path, HELD), tmp_path, "--backend", "process",
                       *BYPASS, "--github-api", github.url)  # fmt: skip
    output = Path(record(leader, coord)["output_file"])

    def said() -> str:
        return output.read_text() if output.exists() else ""

    wait_until(lambda: "polling octo/repo#1 again]" in said(), timeout=60,
               what="polling to go on after the wait")  # fmt: skip
    assert output.read_text().count("rate limit is spent") == 1
    github.refuse(REPO, 1, 403)
    final = ended(leader, coord, timeout=60)
    assert final["status"] == "completed", final
    assert "status 403" in prompts(final) and "octo/repo#1 has ended" in prompts(final)


def test_bad_github_flags_are_usage_errors(leader: Cli, tmp_path: Path) -> None:
    out = leader("agent", "--team", TEAM, "--github-api", "http://x", "hi")
    assert out.returncode == 2 and "add --coordinator" in out.stderr
    out = leader("agent", "--team", TEAM, "--coordinator", "--github-api", "ftp://x", "hi")
    assert out.returncode == 2 and "--github-api: 'ftp://x'" in out.stderr


BAD = """
[[turn]]
[[turn.call]]
tool = "subscribe_pr_activity"
args = { repo = "not-a-repo", number = 1 }

[[turn]]
text = "said: {last}"
"""


def test_a_bad_repo_is_a_tool_error_naming_it(leader: Cli, tmp_path: Path) -> None:
    coord = coordinate(leader, script(tmp_path, BAD), tmp_path, "--backend", "in-process",
                       "--github-api", "http://127.0.0.1:9")  # fmt: skip
    final = ended(leader, coord, timeout=60)
    assert final["status"] == "completed" and "'not-a-repo' is not owner/name" in final["result"]
