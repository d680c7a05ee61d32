"""PR activity for coordinators: `subscribe_pr_activity(repo, number)` asks the leader to poll
a GitHub pull request, and each new comment, review, review comment, finished check run, push
or close reaches the coordinator once, as a `<pr-activity>` notification in the same inbox its
workers' `<task-notification>`s come through.

The leader (not the model) polls, on a small thread pool so its tick never waits on the
network; the loop applies each poll's result: delivers the new events, then records what it
has seen in `sessions/{s}/pr_activity.json` (atomic replace), so a leader killed in between
delivers the same messages again (same ids: the inbox handles each once) and one killed after
delivers nothing twice:

    {"v": 1, "subscriptions": [{"agent_id": "a…", "repo": "o/r", "number": 7, "api": "…",
      "subscribed_at": 1.7e9, "etags": {url: etag}, "since": {...}, "seen": ["comment:1", …],
      "head_sha": "…", "state": "open", "polled": true, "ended": null}]}

What was there before the subscription (items older than `subscribed_at`, the head and state
of the first poll) is taken as seen, not delivered. Requests are conditional (ETag /
If-None-Match: a 304 is nothing new, and free of the rate limit); a spent rate limit or a
Retry-After pauses polling until then (said once in the coordinator's output); a 401, 403 or
404 ends the subscription with a notification naming the PR and the status.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from shoal.core.errors import NotFoundError, ShoalError, UsageError
from shoal.core.ids import ulid_from_bytes
from shoal.core.jsonio import atomic_write, dumps, read_model
from shoal.core.notify import xml_escape
from shoal.workers.agent.github import Answer, GitHubApi, RateLimited, Refused, Unavailable

PR_ACTIVITY_FILE: Final = "pr_activity.json"
TOKEN_ENV: Final = "GITHUB_TOKEN"
POLL_THREADS: Final = 2
PER_PAGE: Final = "100"
MAX_PAGES: Final = 10  # (a thousand items a poll: more is a runaway, not a PR)
BODY_CHARS: Final = 4000  # of a comment's text in a notification (the url has the rest)
REPO: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
OPEN_TAG: Final = "<pr-activity>"


class Subscription(BaseModel):
    """One coordinator's subscription to one pull request, with what its polls have seen."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    agent_id: str  # the coordinator's agent id (the same across its resumes)
    repo: str
    number: int = Field(ge=1)
    api: str
    subscribed_at: float
    etags: dict[str, str] = Field(default_factory=dict)  # by request url: its last ETag
    since: dict[str, str] = Field(default_factory=dict)  # comment lists: newest updated_at
    seen: tuple[str, ...] = ()  # event keys delivered or taken as the baseline
    head_sha: str | None = None
    state: str | None = None  # open, closed or merged, as of the last poll
    polled: bool = False  # a first poll has set the baseline
    ended: str | None = None  # why it stopped (a refusal); None while active

    @property
    def key(self) -> str:
        return f"{self.agent_id}:{self.label}"

    @property
    def label(self) -> str:
        return f"{self.repo}#{self.number}"


class SubscriptionsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int = 1
    subscriptions: tuple[Subscription, ...] = ()


def load(session_dir: Path) -> dict[str, Subscription]:
    """The session's subscriptions by key ({} without a file; a bad file raises, naming it)."""
    try:
        data = read_model(session_dir / PR_ACTIVITY_FILE, SubscriptionsFile, "PR activity file")
    except NotFoundError:
        return {}
    return {s.key: s for s in data.subscriptions}


def save(session_dir: Path, subs: dict[str, Subscription]) -> None:
    data = SubscriptionsFile(subscriptions=tuple(subs.values()))
    atomic_write(session_dir / PR_ACTIVITY_FILE, dumps(data, pretty=True), durable=True)


def active_subscriptions(session_dir: Path, agent_id: str) -> list[str]:
    """The PRs (`o/r#n`) coordinator `agent_id` is subscribed to (it waits while there are);
    an unreadable file counts as none, so a coordinator is never held by a broken file."""
    with contextlib.suppress(ShoalError):
        return [
            s.label for s in load(session_dir).values() if s.agent_id == agent_id and not s.ended
        ]
    return []


def check_target(repo: str, number: int) -> None:
    """UsageError unless `repo` is `owner/name` and `number` a PR number."""
    if not REPO.fullmatch(repo):
        raise UsageError(f"repo {repo!r} is not owner/name (e.g. octo-org/octo-repo)")
    if number < 1:
        raise UsageError(f"PR number {number} of {repo} is not a pull request number")


# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrEvent:
    """One thing that happened on a PR, keyed so that it is delivered once."""

    key: str
    kind: str  # comment, review, review_comment, check_run, push, closed, merged
    at: str | None  # when (GitHub's ISO time), for the baseline
    author: str | None = None
    url: str | None = None
    text: str = ""


def _login(item: dict[str, Any]) -> str | None:
    user = item.get("user")
    return str(user.get("login")) if isinstance(user, dict) and user.get("login") else None


def comment_events(items: list[Any], kind: str) -> Iterator[PrEvent]:
    for item in items:
        if isinstance(item, dict) and "id" in item:
            where = f" on {item['path']}" if item.get("path") else ""
            yield PrEvent(
                key=f"{kind}:{item['id']}",
                kind=kind,
                at=item.get("created_at"),
                author=_login(item),
                url=item.get("html_url"),
                text=f"{where.strip()}\n{item.get('body') or ''}".strip(),
            )


def review_events(items: list[Any]) -> Iterator[PrEvent]:
    for item in items:
        if isinstance(item, dict) and "id" in item and item.get("state") != "PENDING":
            yield PrEvent(
                key=f"review:{item['id']}",
                kind="review",
                at=item.get("submitted_at"),
                author=_login(item),
                url=item.get("html_url"),
                text=f"{item.get('state', '')}\n{item.get('body') or ''}".strip(),
            )


def check_events(items: list[Any]) -> Iterator[PrEvent]:
    """Check runs that have finished (one that is queued or running says nothing yet)."""
    for item in items:
        if isinstance(item, dict) and "id" in item and item.get("status") == "completed":
            raw = item.get("output")
            output: dict[str, Any] = raw if isinstance(raw, dict) else {}
            yield PrEvent(
                key=f"check_run:{item['id']}",
                kind="check_run",
                at=item.get("completed_at"),
                author=(item.get("app") or {}).get("slug")
                if isinstance(item.get("app"), dict)
                else None,
                url=item.get("html_url"),
                text=f"{item.get('name', '?')}: {item.get('conclusion') or 'no conclusion'}"
                + (f"\n{output.get('title')}" if output.get("title") else ""),
            )


def _epoch(at: str | None) -> float | None:
    from datetime import datetime

    if not at:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
    return None


def notification_xml(sub: Subscription, event: PrEvent) -> str:
    """The `<pr-activity>` block of one event, every value escaped."""
    lines = [
        OPEN_TAG,
        f"<repo>{xml_escape(sub.repo)}</repo>",
        f"<pr>{sub.number}</pr>",
        f"<event>{xml_escape(event.kind)}</event>",
    ]
    for tag, value in (("author", event.author), ("url", event.url), ("at", event.at)):
        if value:
            lines.append(f"<{tag}>{xml_escape(value)}</{tag}>")
    text = event.text
    if len(text) > BODY_CHARS:
        text = text[:BODY_CHARS] + f"\n[… {len(event.text) - BODY_CHARS} more characters]"
    lines += [f"<body>{xml_escape(text)}</body>", "</pr-activity>"]
    return "\n".join(lines)


def ended_event(sub: Subscription, status: int, why: str) -> PrEvent:
    return PrEvent(
        key=f"ended:{sub.subscribed_at}",
        kind="subscription_ended",
        at=None,
        text=f"status {status}: the subscription to {sub.label} has ended ({why}); "
        "call subscribe_pr_activity again once the token or the PR is fixed",
    )


def message_id(sub: Subscription, event: PrEvent) -> str:
    """A message id fixed by the subscription and the event: one delivered again after a
    crash is the same message, handled once."""
    digest = hashlib.sha256(f"pr:{sub.key}:{event.key}".encode()).digest()
    return ulid_from_bytes(digest[:16])


# -- one poll (on a pool thread) ---------------------------------------------------------------


@dataclass(frozen=True)
class PollResult:
    """What one poll of `sub` found: the subscription as it now stands and the events to
    deliver; `wait_until` when the rate limit stopped it; `refused` (status, why) ends it."""

    sub: Subscription
    events: tuple[PrEvent, ...] = ()
    wait_until: float | None = None
    problem: str | None = None  # nothing usable this time (said once, tried again)
    refused: tuple[int, str] | None = None


@dataclass
class _Poll:
    api: GitHubApi
    sub: Subscription
    etags: dict[str, str] = field(default_factory=dict)  # of the urls asked this poll
    since: dict[str, str] = field(default_factory=dict)

    def get(self, url: str) -> Answer:
        """A conditional GET of `url` (its ETag kept: a 304 need not repeat it)."""
        answer = self.api.get(url, self.sub.etags.get(url))
        _limit(answer.remaining, answer.reset)
        etag = answer.etag or self.sub.etags.get(url)
        if etag:
            self.etags[url] = etag
        return answer

    def get_list(self, path: str, *, name: str | None = None, items: str = "") -> list[Any] | None:
        """Every item of a list endpoint (None on a 304), pages followed on a change; `name`:
        a comment list asked only for what changed since the newest it has seen."""
        query = {"per_page": PER_PAGE}
        if name is not None and name in self.sub.since:
            query["since"] = self.sub.since[name]
        answer = self.get(self.api.url(path, query))
        if answer.body is None:
            return None
        found = _items(answer.body, items)
        pages = 1
        next_url = answer.next_url
        while next_url and pages < MAX_PAGES:
            more = self.api.get(next_url)
            _limit(more.remaining, more.reset)
            found += _items(more.body, items)
            next_url, pages = more.next_url, pages + 1
        if name is not None:
            stamps = [str(i["updated_at"]) for i in found if isinstance(i, dict)
                      and i.get("updated_at")]  # fmt: skip
            if stamps:
                self.since[name] = max(stamps)
        return found


def _items(body: Any, key: str) -> list[Any]:
    if key:
        body = body.get(key) if isinstance(body, dict) else None
    return list(body) if isinstance(body, list) else []


def _limit(remaining: int | None, reset: float | None) -> None:
    """The rate limit is spent once an answer says 0 remain: wait until its reset."""
    if remaining == 0:
        raise RateLimited(reset or time.time() + 60, "GitHub's rate limit is spent")


def poll(sub: Subscription, token: str | None) -> PollResult:
    """Ask GitHub what happened on `sub`'s PR since its last poll."""
    api = GitHubApi(sub.api, token)
    run = _Poll(api, sub)
    base = f"/repos/{sub.repo}"
    try:
        events: list[PrEvent] = []
        answer = run.get(api.url(f"{base}/pulls/{sub.number}"))
        head, state = sub.head_sha, sub.state
        if isinstance(answer.body, dict):
            head = str((answer.body.get("head") or {}).get("sha") or "") or head
            state = "merged" if answer.body.get("merged") else str(answer.body.get("state"))
            if sub.polled and head and head != sub.head_sha:
                events.append(PrEvent(f"push:{head}", "push", None, text=f"new head {head}"))
            if sub.polled and state != sub.state and state in ("closed", "merged"):
                events.append(PrEvent(f"{state}:{head}", state, None, text=f"the PR is {state}"))
        lists = (
            (f"{base}/issues/{sub.number}/comments", "comments", "", "comment"),
            (f"{base}/pulls/{sub.number}/comments", "review_comments", "", "review_comment"),
            (f"{base}/pulls/{sub.number}/reviews", None, "", "review"),
        )
        for path, name, key, kind in lists:
            items = run.get_list(path, name=name, items=key)
            if items is not None:
                events += review_events(items) if kind == "review" else comment_events(items, kind)
        if head:
            checks = run.get_list(f"{base}/commits/{head}/check-runs", items="check_runs")
            if checks is not None:
                events += check_events(checks)
    except RateLimited as exc:
        return PollResult(sub, wait_until=exc.until, problem=str(exc))
    except Unavailable as exc:
        return PollResult(sub, problem=str(exc))
    except Refused as exc:
        return PollResult(sub, refused=(exc.status, str(exc)))
    return _settle(sub, run, events, head, state)


def _settle(
    sub: Subscription, run: _Poll, events: list[PrEvent], head: str | None, state: str | None
) -> PollResult:
    """The new events of a poll (the first one's older items are its baseline, not news)."""
    seen = set(sub.seen)
    fresh: list[PrEvent] = []
    baseline: list[str] = []
    for event in events:
        if event.key in seen:
            continue
        seen.add(event.key)
        at = _epoch(event.at)
        # (GitHub's times are whole seconds: one in the second of the subscription is news)
        if not sub.polled and (at is None or at < int(sub.subscribed_at)):
            baseline.append(event.key)
        else:
            fresh.append(event)
    updated = sub.model_copy(
        update={
            "etags": run.etags,  # (those of urls no longer asked, e.g. an old `since`, go)
            "since": {**sub.since, **run.since},
            "seen": (*sub.seen, *baseline, *(e.key for e in fresh)),
            "head_sha": head,
            "state": state,
            "polled": True,
        }
    )
    return PollResult(updated, events=tuple(fresh))


# -- the leader's side (a policy of its loop) --------------------------------------------------


Deliver = Callable[[Subscription, PrEvent], None]
Say = Callable[[Subscription, str], None]


class PrActivity:
    """The session's PR subscriptions: polled on a pool, results applied on the loop's
    thread (`step`), each delivered through `deliver` before it is recorded as seen."""

    def __init__(
        self,
        session_dir: Path,
        *,
        interval: float,
        deliver: Deliver,
        say: Say,
        live: Callable[[str], bool],
        wake: Callable[[], None],
        token: Callable[[], str | None] = lambda: os.environ.get(TOKEN_ENV) or None,
    ) -> None:
        self.session_dir = session_dir
        self.interval = interval
        self.deliver = deliver
        self.say = say
        self.live = live
        self.wake = wake
        self.token = token
        self.subs = load(session_dir)
        self.due: dict[str, float] = {}  # by key: monotonic time of the next poll
        self.flight: dict[str, Future[PollResult]] = {}
        self.troubled: set[str] = set()  # keys whose poll trouble has been said this spell
        self._pool: ThreadPoolExecutor | None = None

    # -- requests (the loop's thread) ----------------------------------------------------

    def subscribe(self, agent_id: str, repo: str, number: int, api: str) -> dict[str, Any]:
        check_target(repo, number)
        sub = Subscription(
            agent_id=agent_id, repo=repo, number=number, api=api, subscribed_at=time.time()
        )
        old = self.subs.get(sub.key)
        if old is not None and old.ended is None:
            return {"repo": repo, "number": number, "api": old.api, "already": True}
        self.subs[sub.key] = sub
        self._save()
        self.due[sub.key] = 0.0
        self.wake()
        return {"repo": repo, "number": number, "api": api, "already": False}

    def unsubscribe(self, agent_id: str, repo: str, number: int) -> dict[str, Any]:
        key = f"{agent_id}:{repo}#{number}"
        sub = self.subs.get(key)
        if sub is None or sub.ended is not None:
            mine = [s.label for s in self.subs.values() if s.agent_id == agent_id and not s.ended]
            raise UsageError(
                f"not subscribed to {repo}#{number} (subscribed to: {', '.join(mine) or 'nothing'})"
            )
        del self.subs[key]
        self.due.pop(key, None)
        self._save()
        return {"repo": repo, "number": number}

    # -- the policy -----------------------------------------------------------------------

    def on_event(self, event: Any) -> None:
        pass

    def next_due(self) -> float | None:
        due = [d for k, d in self.due.items() if k in self.subs and k not in self.flight]
        return min(due) if due else None

    def step(self, leader: Any, now: float) -> None:
        """Apply the polls that have finished, then start those that are due."""
        for key, future in list(self.flight.items()):
            if future.done():
                del self.flight[key]
                self._apply(future.result(), now)
        for key, sub in list(self.subs.items()):
            if sub.ended or key in self.flight or not self.live(sub.agent_id):
                continue
            if self.due.setdefault(key, now) <= now:
                self.due[key] = now + self.interval
                self._start(sub)

    def _start(self, sub: Subscription) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="shoal-github")
        future = self._pool.submit(poll, sub, self.token())
        future.add_done_callback(lambda _: self.wake())
        self.flight[sub.key] = future

    def _apply(self, result: PollResult, now: float) -> None:
        current = self.subs.get(result.sub.key)
        if current is None or current.subscribed_at != result.sub.subscribed_at:
            return  # (unsubscribed, or subscribed again, while it polled)
        if result.refused is not None:
            status, why = result.refused
            self.deliver(current, ended_event(current, status, why))
            self.subs[current.key] = current.model_copy(update={"ended": why})
            self._save()
            return
        if result.problem is not None:
            if result.wait_until is not None:
                self.due[current.key] = now + max(0.0, result.wait_until - time.time())
                when = time.strftime("%H:%M:%S", time.localtime(result.wait_until))
                text = f"{result.problem}; polling {current.label} again at {when}"
            else:
                text = f"{result.problem}; trying {current.label} again"
            if current.key not in self.troubled:
                self.troubled.add(current.key)
                self.say(current, text)
            return
        if current.key in self.troubled:
            self.troubled.discard(current.key)
            self.say(current, f"polling {current.label} again")
        for event in result.events:
            self.deliver(current, event)
        if result.sub != current:
            self.subs[current.key] = result.sub
            self._save()

    def _save(self) -> None:
        save(self.session_dir, self.subs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
