"""A small client of GitHub's REST API for the leader's PR polling: conditional GETs
(ETag / If-None-Match, where a 304 costs no rate limit), the rate-limit headers read on every
answer, and one error type per way a request can fail.

It uses the standard library (urllib): the requests are few, on a thread of their own, and
the one HTTP library shoal depends on stays in the Ray Jobs client.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shoal.core.errors import UsageError

DEFAULT_API: Final = "https://api.github.com"
TIMEOUT_S: Final = 20.0
API_VERSION: Final = "2022-11-28"
# Answers that end a subscription: the token is wrong, lacks access, or the PR is not there.
REFUSED: Final = frozenset({401, 403, 404})


def check_api_url(url: str, where: str = "--github-api") -> str:
    """`url` without its trailing slash; UsageError naming `where` unless http(s)://host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(
            f"{where}: {url!r} is not an API address (e.g. https://github.example.com/api/v3)"
        )
    return url.rstrip("/")


class GitHubError(Exception):
    """A request that gave no usable answer."""


class Unavailable(GitHubError):
    """Nothing usable this time (no connection, a timeout, a 5xx): try again at the next poll."""


class Refused(GitHubError):
    """A 401, 403 or 404: asking again will not help."""

    def __init__(self, status: int, url: str, message: str) -> None:
        super().__init__(f"GitHub answered {status} for {url}: {message}")
        self.status = status
        self.message = message


class RateLimited(GitHubError):
    """The rate limit is spent (or GitHub asked to slow down) until `until` (epoch seconds)."""

    def __init__(self, until: float, why: str) -> None:
        super().__init__(why)
        self.until = until


@dataclass(frozen=True)
class Answer:
    """One answer: `body` is None on a 304 (nothing changed since `etag`)."""

    status: int
    body: Any
    etag: str | None
    next_url: str | None  # the `Link: rel="next"` page, if any
    remaining: int | None  # X-RateLimit-Remaining
    reset: float | None  # X-RateLimit-Reset (epoch seconds)


def _next_link(header: str | None) -> str | None:
    for part in (header or "").split(","):
        url, _, rest = part.partition(";")
        if 'rel="next"' in rest:
            return url.strip().strip("<>")
    return None


def _number(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """When a `Retry-After` header (seconds, or an HTTP date) lets the next request go."""
    raw = headers.get("Retry-After")
    if raw is None:
        return None
    seconds = _number(headers, "Retry-After")
    if seconds is not None:
        return now + seconds
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None


class GitHubApi:
    """GET requests to one API base (`https://api.github.com`, or GitHub Enterprise's)."""

    def __init__(self, base: str, token: str | None, timeout: float = TIMEOUT_S) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout

    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        tail = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"{self.base}{path}{tail}"

    def get(self, url: str, etag: str | None = None) -> Answer:
        """GET `url` (If-None-Match `etag` when given); raises Refused, RateLimited or
        Unavailable when the answer is not a 200 or a 304."""
        # (imported here: urllib.request brings http.client and ssl, 30 ms a leader's start)
        import urllib.error
        import urllib.request

        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "shoal",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if etag:
            headers["If-None-Match"] = etag
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return _answer(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as exc:
            got = dict(exc.headers or {})
            if exc.code == 304:
                return _answer(304, got, b"")
            raise _failure(exc.code, url, got, exc.read()) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise Unavailable(f"no answer from {url}: {exc}") from None


def _answer(status: int, headers: Mapping[str, str], raw: bytes) -> Answer:
    body = None
    if status != 304:
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise Unavailable(f"GitHub's answer is not JSON: {raw[:80]!r}") from None
    remaining = _number(headers, "X-RateLimit-Remaining")
    return Answer(
        status=status,
        body=body,
        etag=headers.get("ETag"),
        next_url=_next_link(headers.get("Link")),
        remaining=int(remaining) if remaining is not None else None,
        reset=_number(headers, "X-RateLimit-Reset"),
    )


def _failure(status: int, url: str, headers: Mapping[str, str], raw: bytes) -> GitHubError:
    """The error an answer other than 200/304 stands for. A 403 or 429 with the rate limit
    spent (or a Retry-After) is a wait, not a refusal."""
    now = time.time()
    after = retry_after(headers, now)
    remaining = _number(headers, "X-RateLimit-Remaining")
    if status in (403, 429) and (after is not None or remaining == 0):
        until = after if after is not None else (_number(headers, "X-RateLimit-Reset") or now + 60)
        return RateLimited(until, f"GitHub's rate limit is spent ({status} for {url})")
    if status in REFUSED:
        try:
            message = str(json.loads(raw).get("message") or "")
        except (ValueError, AttributeError):
            message = ""
        return Refused(status, url, message or "no message")
    return Unavailable(f"GitHub answered {status} for {url}")
