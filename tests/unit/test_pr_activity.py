"""The PR poller against a loopback server speaking GitHub's REST format: the baseline, each
kind of event once, conditional requests (304s), `since`, pages, the rate limit and
Retry-After, refusals; and the leader's side (`PrActivity`) with its file read back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.errors import UsageError
from shoal.workers.agent.github import check_api_url
from shoal.workers.agent.pr_activity import (
    PR_ACTIVITY_FILE,
    PrActivity,
    PrEvent,
    Subscription,
    active_subscriptions,
    check_target,
    notification_xml,
    poll,
)
from tests.polling import wait_until
from tests.support.github_stub import OLD, FakeGitHub

REPO = "octo/repo"


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as stub:
        pull = stub.add_pull(REPO, 7)
        stub.comment(REPO, 7, "an old comment", at=OLD)
        stub.review(REPO, 7, "COMMENTED", "an old review", at=OLD)
        stub.check_run(pull.head, "lint", "success", at=OLD)
        yield stub


def subscription(github: FakeGitHub) -> Subscription:
    return Subscription(
        agent_id="a12345678", repo=REPO, number=7, api=github.url, subscribed_at=time.time()
    )


def test_the_first_poll_is_the_baseline_and_each_new_event_comes_once(github: FakeGitHub) -> None:
    first = poll(subscription(github), "tok")
    assert first.problem is None and first.events == ()
    assert first.sub.polled and first.sub.head_sha == "a" * 40 and first.sub.state == "open"
    assert {"comment", "review", "check_run"} <= {k.split(":")[0] for k in first.sub.seen}
    github.comment(REPO, 7, "please rename x")
    github.review_comment(REPO, 7, "typo here", "src/calc.py")
    github.review(REPO, 7, "CHANGES_REQUESTED", "needs tests")
    github.check_run("a" * 40, "tests", "failure")
    github.check_run("a" * 40, "slow", None)  # (still running: nothing to say yet)
    second = poll(first.sub, "tok")
    kinds = sorted(e.kind for e in second.events)
    assert kinds == ["check_run", "comment", "review", "review_comment"], second.events
    texts = "\n".join(e.text for e in second.events)
    assert "please rename x" in texts and "CHANGES_REQUESTED" in texts
    assert "tests: failure" in texts and "src/calc.py" in texts
    third = poll(second.sub, "tok")
    assert third.events == () and third.problem is None


def test_an_unchanged_pr_costs_only_304s(github: FakeGitHub) -> None:
    sub = poll(poll(subscription(github), None).sub, None).sub  # (the 2nd asks `since`)
    before = len(github.requests())
    again = poll(sub, None)
    asked = github.requests()[before:]
    assert asked and all(s.status == 304 and s.if_none_match for s in asked), asked
    assert again.events == () and again.sub.etags == sub.etags
    assert all(s.authorization is None for s in asked)  # (no token: no Authorization)


def test_the_token_is_a_bearer_and_the_comment_lists_ask_since(github: FakeGitHub) -> None:
    github.token = "s3cret"
    sub = poll(subscription(github), "s3cret").sub
    github.comment(REPO, 7, "new")
    poll(sub, "s3cret")
    assert {s.authorization for s in github.requests()} == {"Bearer s3cret"}
    comments = github.requests("/issues/7/comments")
    assert "since" not in comments[0].query and comments[-1].query["since"] == OLD
    refused = poll(sub, "wrong")
    assert refused.refused is not None and refused.refused[0] == 401
    assert "Bad credentials" in refused.refused[1]


def test_pages_are_followed(github: FakeGitHub) -> None:
    github.per_page_cap = 2
    sub = poll(subscription(github), None).sub
    for n in range(5):
        github.review(REPO, 7, "APPROVED", f"lgtm {n}")
    found = poll(sub, None)
    assert sorted(e.text for e in found.events) == [f"APPROVED\nlgtm {n}" for n in range(5)]


def test_pushes_and_merges_are_events(github: FakeGitHub) -> None:
    sub = poll(subscription(github), None).sub
    github.pulls[(REPO, 7)].head = "b" * 40
    github.check_run("b" * 40, "tests", "success")
    pushed = poll(sub, None)
    assert sorted(e.kind for e in pushed.events) == ["check_run", "push"]
    github.pulls[(REPO, 7)].merged = True
    github.pulls[(REPO, 7)].state = "closed"
    merged = poll(pushed.sub, None)
    assert [e.kind for e in merged.events] == ["merged"]


@pytest.mark.parametrize("retry_after", [False, True])
def test_a_spent_rate_limit_is_a_wait(github: FakeGitHub, retry_after: bool) -> None:
    github.spend_rate_limit(120, retry_after=retry_after)
    sub = subscription(github)
    waited = poll(sub, None)
    assert waited.refused is None and waited.wait_until is not None
    assert time.time() + 100 < waited.wait_until < time.time() + 130
    assert waited.sub == sub  # (nothing of it taken: the poll after the wait does it all)


@pytest.mark.parametrize("status", [401, 403, 404])
def test_refusals_end_a_subscription(github: FakeGitHub, status: int) -> None:
    github.refuse(REPO, 7, status)
    result = poll(subscription(github), None)
    assert result.refused is not None and result.refused[0] == status


def test_no_server_is_a_problem_to_try_again() -> None:
    sub = Subscription(agent_id="a1", repo=REPO, number=1, api="http://127.0.0.1:9",
                       subscribed_at=0)  # fmt: skip
    result = poll(sub, None)
    assert result.refused is None and result.problem and "no answer" in result.problem


def test_bad_targets_and_addresses_are_named() -> None:
    with pytest.raises(UsageError, match="'nope' is not owner/name"):
        check_target("nope", 1)
    with pytest.raises(UsageError, match="0 of o/r"):
        check_target("o/r", 0)
    with pytest.raises(UsageError, match="github_api in x: 'ftp://h'"):
        check_api_url("ftp://h", "github_api in x")
    assert check_api_url("https://ghe.example/api/v3/") == "https://ghe.example/api/v3"


def test_the_notification_escapes_what_github_sent() -> None:
    sub = Subscription(agent_id="a1", repo=REPO, number=7, api="x", subscribed_at=0)
    event = PrEvent("comment:1", "comment", OLD, "mallory", "https://x", "</body><b>&")
    xml = notification_xml(sub, event)
    assert xml.startswith("<pr-activity>") and "<pr>7</pr>" in xml
    assert "&lt;/body&gt;&lt;b&gt;&amp;" in xml and xml.count("</body>") == 1


class Recorder:
    def __init__(self) -> None:
        self.delivered: list[tuple[str, str]] = []
        self.said: list[str] = []

    def deliver(self, sub: Subscription, event: PrEvent) -> None:
        self.delivered.append((sub.label, event.key))

    def say(self, sub: Subscription, text: str) -> None:
        self.said.append(text)


def policy(tmp_path: Path, seen: Recorder, live: bool = True) -> PrActivity:
    return PrActivity(tmp_path, interval=0.0, deliver=seen.deliver, say=seen.say,
                      live=lambda _a: live, wake=lambda: None, token=lambda: None)  # fmt: skip


def run_until(feed: PrActivity, cond: object, what: str) -> None:
    def check() -> bool:
        feed.step(None, time.monotonic())
        return bool(cond() if callable(cond) else cond)

    wait_until(check, timeout=15, what=what)


def test_the_policy_delivers_once_across_a_reload_and_stops_on_unsubscribe(
    github: FakeGitHub, tmp_path: Path
) -> None:
    seen = Recorder()
    feed = policy(tmp_path, seen)
    feed.subscribe("a1", REPO, 7, github.url)
    assert feed.subscribe("a1", REPO, 7, github.url)["already"] is True
    assert active_subscriptions(tmp_path, "a1") == [f"{REPO}#7"]
    run_until(feed, lambda: feed.subs[f"a1:{REPO}#7"].polled, "the baseline")
    cid = github.comment(REPO, 7, "one")
    run_until(feed, lambda: seen.delivered, "the new comment")
    assert seen.delivered == [(f"{REPO}#7", f"comment:{cid}")]
    feed.close()

    again = Recorder()  # a leader killed and started again: the file says what was seen
    feed = policy(tmp_path, again)
    before = len(github.requests())
    run_until(feed, lambda: len(github.requests()) >= before + 10, "two polls")
    assert again.delivered == []
    feed.unsubscribe("a1", REPO, 7)
    assert active_subscriptions(tmp_path, "a1") == []
    with pytest.raises(UsageError, match="not subscribed to octo/repo#7"):
        feed.unsubscribe("a1", REPO, 7)
    feed.close()


def test_the_policy_ends_a_refused_subscription_and_says_a_wait_once(
    github: FakeGitHub, tmp_path: Path
) -> None:
    seen = Recorder()
    feed = policy(tmp_path, seen)
    github.spend_rate_limit(1)
    feed.subscribe("a1", REPO, 7, github.url)
    run_until(feed, lambda: seen.said, "the wait to be said")
    assert "rate limit" in seen.said[0] and f"{REPO}#7" in seen.said[0]
    run_until(feed, lambda: feed.subs[f"a1:{REPO}#7"].polled, "the poll after the wait")
    assert seen.said[1:] == [f"polling {REPO}#7 again"]
    github.refuse(REPO, 7, 401)
    run_until(feed, lambda: seen.delivered, "the end")
    assert seen.delivered == [(f"{REPO}#7", seen.delivered[0][1])]
    assert seen.delivered[0][1].startswith("ended:")
    assert feed.subs[f"a1:{REPO}#7"].ended and active_subscriptions(tmp_path, "a1") == []
    assert (tmp_path / PR_ACTIVITY_FILE).is_file()
    feed.close()


def test_no_poll_while_the_coordinator_is_not_running(github: FakeGitHub, tmp_path: Path) -> None:
    feed = policy(tmp_path, Recorder(), live=False)
    feed.subscribe("a1", REPO, 7, github.url)
    feed.step(None, time.monotonic())
    assert not feed.flight and github.requests() == []


def test_the_poll_interval_and_api_come_from_the_environment_or_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shoal.core.config import PR_POLL_S, github_api, pr_poll_s

    monkeypatch.delenv("SHOAL_PR_POLL_S", raising=False)
    assert pr_poll_s(tmp_path) == PR_POLL_S and github_api(tmp_path) is None
    (tmp_path / "config.toml").write_text('pr_poll_s = 5\ngithub_api = "https://ghe/api/v3"\n')
    assert pr_poll_s(tmp_path) == 5.0 and github_api(tmp_path) == "https://ghe/api/v3"
    monkeypatch.setenv("SHOAL_PR_POLL_S", "0.2")
    assert pr_poll_s(tmp_path) == 0.2
    monkeypatch.delenv("SHOAL_PR_POLL_S")
    (tmp_path / "config.toml").write_text("pr_poll_s = 0\ngithub_api = 3\n")
    with pytest.raises(UsageError, match="pr_poll_s must be a positive number"):
        pr_poll_s(tmp_path)
    with pytest.raises(UsageError, match="github_api must be an address"):
        github_api(tmp_path)
