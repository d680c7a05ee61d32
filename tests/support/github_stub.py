"""A loopback server speaking the part of GitHub's REST API that PR polling reads, a stand-in
for api.github.com, which cannot be reached from here: a pull request, its issue comments,
review comments and reviews, the check runs of a commit; JSON as GitHub returns it, ETags
with 304 on If-None-Match (not counted against the rate limit), X-RateLimit-* headers,
`since` on the comment lists, pages with a Link header, and refusals on demand (401, 403,
404, a spent rate limit, Retry-After)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Reply = tuple[int, dict[str, str], bytes]  # status, headers, body
OLD = "2020-01-01T00:00:00Z"  # (before any subscription: the baseline)


def iso(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if at is None else at))


@dataclass
class Pull:
    head: str = "0" * 40
    state: str = "open"
    merged: bool = False
    comments: list[dict[str, Any]] = field(default_factory=list)
    review_comments: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Seen:
    """One request as the server saw it."""

    path: str
    query: dict[str, str]
    authorization: str | None
    if_none_match: str | None
    status: int


class FakeGitHub:
    """The server's state; change it from the test while the server runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pulls: dict[tuple[str, int], Pull] = {}
        self.checks: dict[str, list[dict[str, Any]]] = {}  # by commit sha
        self.refusals: dict[tuple[str, int], int] = {}
        self.limited: list[dict[str, str]] = []  # headers of the next refused answers
        self.token: str | None = None  # when set, any other Authorization is a 401
        self.remaining = 5000
        self.seen: list[Seen] = []
        self.per_page_cap = 100
        self._next_id = 1000
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeGitHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the test's side --------------------------------------------------------------------

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def add_pull(self, repo: str, number: int, head: str = "a" * 40) -> Pull:
        with self.lock:
            pull = self.pulls[(repo, number)] = Pull(head=head)
            return pull

    def comment(self, repo: str, number: int, body: str, *, user: str = "alice",
                at: str | None = None) -> int:  # fmt: skip
        with self.lock:
            cid = self._id()
            stamp = at or iso()
            self.pulls[(repo, number)].comments.append({
                "id": cid, "body": body, "user": {"login": user, "id": 1, "type": "User"},
                "created_at": stamp, "updated_at": stamp,
                "html_url": f"https://github.com/{repo}/pull/{number}#issuecomment-{cid}",
                "author_association": "MEMBER",
            })  # fmt: skip
            return cid

    def review_comment(self, repo: str, number: int, body: str, path: str,
                       at: str | None = None) -> int:  # fmt: skip
        with self.lock:
            cid = self._id()
            stamp = at or iso()
            self.pulls[(repo, number)].review_comments.append({
                "id": cid, "body": body, "path": path, "line": 3, "user": {"login": "bob"},
                "created_at": stamp, "updated_at": stamp,
                "html_url": f"https://github.com/{repo}/pull/{number}#discussion_r{cid}",
            })  # fmt: skip
            return cid

    def review(self, repo: str, number: int, state: str, body: str = "",
               at: str | None = None) -> int:  # fmt: skip
        with self.lock:
            rid = self._id()
            self.pulls[(repo, number)].reviews.append({
                "id": rid, "state": state, "body": body, "user": {"login": "carol"},
                "submitted_at": at or iso(), "commit_id": self.pulls[(repo, number)].head,
                "html_url": f"https://github.com/{repo}/pull/{number}#pullrequestreview-{rid}",
            })  # fmt: skip
            return rid

    def check_run(self, sha: str, name: str, conclusion: str | None,
                  at: str | None = None) -> int:  # fmt: skip
        with self.lock:
            rid = self._id()
            done = conclusion is not None
            self.checks.setdefault(sha, []).append({
                "id": rid, "name": name, "head_sha": sha,
                "status": "completed" if done else "in_progress", "conclusion": conclusion,
                "started_at": at or iso(), "completed_at": (at or iso()) if done else None,
                "app": {"slug": "github-actions"}, "output": {"title": f"{name} {conclusion}"},
                "html_url": f"https://github.com/o/r/runs/{rid}",
            })  # fmt: skip
            return rid

    def refuse(self, repo: str, number: int, status: int) -> None:
        with self.lock:
            self.refusals[(repo, number)] = status

    def spend_rate_limit(self, reset_in: float, *, retry_after: bool = False) -> None:
        """The next request is refused as over the rate limit, to be tried after `reset_in`."""
        headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(time.time()
                   + reset_in))}  # fmt: skip
        if retry_after:
            headers = {"Retry-After": str(int(reset_in))}
        with self.lock:
            self.limited.append(headers)

    def requests(self, part: str = "") -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if part in s.path]

    # -- answering ----------------------------------------------------------------------------

    def answer(self, path: str, query: dict[str, str], headers: Any) -> Reply:
        with self.lock:
            status, extra, body = self._answer(path, query, headers)
            self.seen.append(Seen(path, query, headers.get("Authorization"),
                                  headers.get("If-None-Match"), status))  # fmt: skip
            return status, extra, body

    def _answer(self, path: str, query: dict[str, str], headers: Any) -> Reply:
        rate = {"X-RateLimit-Limit": "5000", "X-RateLimit-Used": str(5000 - self.remaining),
                "X-RateLimit-Reset": str(int(time.time()) + 3600)}  # fmt: skip
        if self.limited:
            extra = self.limited.pop(0)
            msg = {"message": "API rate limit exceeded", "documentation_url": "https://docs"}
            return 403, {**rate, "X-RateLimit-Remaining": "0", **extra}, json.dumps(msg).encode()
        if self.token is not None and headers.get("Authorization") != f"Bearer {self.token}":
            return 401, rate, b'{"message": "Bad credentials"}'
        parts = path.strip("/").split("/")
        found = self._resource(parts, query)
        if isinstance(found, int):
            message = {401: "Bad credentials", 403: "Resource not accessible by integration",
                       404: "Not Found"}.get(found, "error")  # fmt: skip
            return found, rate, json.dumps({"message": message}).encode()
        body, link = found
        raw = json.dumps(body).encode()
        etag = f'W/"{hashlib.sha256(raw).hexdigest()[:32]}"'
        remaining = {"X-RateLimit-Remaining": str(self.remaining)}
        if headers.get("If-None-Match") == etag:
            return 304, {**rate, **remaining, "ETag": etag}, b""  # (a 304 costs nothing)
        self.remaining -= 1
        remaining = {"X-RateLimit-Remaining": str(self.remaining)}
        extra = {**rate, **remaining, "ETag": etag, "Content-Type": "application/json"}
        if link:
            extra["Link"] = link
        return 200, extra, raw

    def _resource(self, parts: list[str], query: dict[str, str]) -> tuple[Any, str | None] | int:
        if len(parts) < 4 or parts[0] != "repos":
            return 404
        repo = f"{parts[1]}/{parts[2]}"
        if parts[3] == "commits" and len(parts) == 6 and parts[5] == "check-runs":
            runs = self.checks.get(parts[4], [])
            return {"total_count": len(runs), "check_runs": runs}, None
        if len(parts) < 5 or not parts[4].isdigit():
            return 404
        key = (repo, int(parts[4]))
        if key in self.refusals:
            return self.refusals[key]
        pull = self.pulls.get(key)
        if pull is None:
            return 404
        tail = parts[5:]
        if parts[3] == "pulls" and not tail:
            return {
                "number": key[1], "state": pull.state, "merged": pull.merged,
                "head": {"sha": pull.head, "ref": "topic"}, "base": {"ref": "main"},
                "html_url": f"https://github.com/{repo}/pull/{key[1]}", "title": "A change",
            }, None  # fmt: skip
        lists = {("issues", "comments"): pull.comments, ("pulls", "comments"):
                 pull.review_comments, ("pulls", "reviews"): pull.reviews}  # fmt: skip
        items = lists.get((parts[3], tail[0])) if len(tail) == 1 else None
        if items is None:
            return 404
        if "since" in query:
            items = [i for i in items if i["updated_at"] >= query["since"]]
        per_page = min(int(query.get("per_page", "30")), self.per_page_cap)
        page = int(query.get("page", "1"))
        chunk = items[(page - 1) * per_page : page * per_page]
        link = None
        if page * per_page < len(items):
            nxt = {**query, "page": str(page + 1)}
            qs = "&".join(f"{k}={v}" for k, v in nxt.items())
            link = f'<{self.url}/{"/".join(parts)}?{qs}>; rel="next"'
        return chunk, link


def _handler(stub: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            split = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(split.query).items()}
            status, headers, body = stub.answer(split.path, query, self.headers)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
