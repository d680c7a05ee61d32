"""The Ray Jobs REST client: the only module that speaks HTTP (through httpx2).

The API is small, so shoal talks to it directly instead of importing the heavy `ray` package:
`GET /api/version` (the address answers), `PUT /api/packages/gcs/{name}` (the packed working
directory), `POST /api/jobs/` (submit, with `submission_id` = the shoal task id),
`GET /api/jobs/{id}`, `GET /api/jobs/{id}/logs` (the whole log: callers keep their own offset),
`POST /api/jobs/{id}/stop`, `DELETE /api/jobs/{id}`, and the state API's `GET /api/v0/nodes`
(the cluster's nodes, each with its resources). Every failure is a `RayError` whose
text names the address and what was asked, never a traceback from the dashboard.
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import orjson

from shoal.core.errors import ShoalError

if TYPE_CHECKING:
    import httpx2

ADDRESS_ENV: Final = "SHOAL_RAY_ADDRESS"
TOKEN_ENV: Final = "SHOAL_RAY_TOKEN"
DEFAULT_PORT: Final = 8265  # the dashboard's, where the Jobs API lives
REQUEST_TIMEOUT_S: Final = 10.0
NODE_RETRY_S: Final = 5.0
CONNECT_TIMEOUT_S: Final = 3.0
# Job statuses, as Ray names them.
PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED = (
    "PENDING",
    "RUNNING",
    "STOPPED",
    "SUCCEEDED",
    "FAILED",
)
TERMINAL: Final = frozenset({STOPPED, SUCCEEDED, FAILED})
_EXISTS = re.compile(r"submission_id \S+ already exists")


class RayError(ShoalError):
    """A Ray Jobs API call failed (unreachable address, refused request, unknown job)."""


class RayUnreachable(RayError):
    """Nothing answers at the address (or it is not a Ray dashboard)."""


class JobNotFound(RayError):
    """The cluster has no job with this submission id."""


class JobExists(RayError):
    """A job with this submission id was submitted before."""


@dataclass(frozen=True)
class JobInfo:
    """What `GET /api/jobs/{id}` says of one job (the fields shoal reads)."""

    submission_id: str
    status: str
    message: str
    exit_code: int | None
    node_ip: str | None
    node_id: str | None
    start_time: float | None
    end_time: float | None
    node_name: str | None = None
    """Ray's name of the node (its address unless it was started with `--node-name`)."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def host(self) -> str:
        """Where the job ran, for a joblog's host column: the node's name, else its address,
        else its id (':' while it has none)."""
        return self.node_name or self.node_ip or (self.node_id[:12] if self.node_id else ":")

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> JobInfo:
        driver = data.get("driver_info") or {}
        agent = data.get("driver_agent_http_address") or ""
        node_ip = driver.get("node_ip_address") or (
            urlsplit(agent).hostname if agent.startswith("http") else None
        )
        start, end = data.get("start_time"), data.get("end_time")
        return cls(
            submission_id=str(data.get("submission_id") or data.get("job_id") or ""),
            status=str(data.get("status") or PENDING),
            message=str(data.get("message") or ""),
            exit_code=data.get("driver_exit_code"),
            node_ip=node_ip or None,
            node_id=data.get("driver_node_id") or None,
            start_time=start / 1000 if start else None,
            end_time=end / 1000 if end else None,
        )


@dataclass(frozen=True)
class NodeInfo:
    """One live node of the cluster, as the state API lists it: its name (Ray's node name, its
    address unless it was given one), its address and the resources it has in all."""

    name: str
    address: str
    resources: Mapping[str, float]
    node_id: str = ""

    def schedulable(self) -> dict[str, float]:
        """The resources a job may ask for (CPU, GPU and custom ones; not memory, the object
        store, nor the `node:*` markers Ray adds to every node)."""
        return {
            k: v
            for k, v in self.resources.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")
        }


def resolve_address(option: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The cluster's dashboard URL: `--ray ADDRESS`, else $SHOAL_RAY_ADDRESS (`host:port`
    or a URL; the port defaults to the dashboard's 8265)."""
    env = os.environ if environ is None else environ
    address = (option or env.get(ADDRESS_ENV) or "").strip()
    if not address:
        raise RayError(
            f"no Ray cluster address: pass --ray ADDRESS or set {ADDRESS_ENV} "
            f"(the dashboard's, e.g. http://127.0.0.1:{DEFAULT_PORT})"
        )
    if "://" not in address:
        address = f"http://{address}"
    url = urlsplit(address)
    try:
        port = url.port
    except ValueError:
        raise RayError(f"{address!r} is not a Ray dashboard address (bad port)") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise RayError(f"{address!r} is not a Ray dashboard address (http://HOST:PORT)")
    netloc = url.netloc if port is not None else f"{url.netloc}:{DEFAULT_PORT}"
    return f"{url.scheme}://{netloc}{url.path}".rstrip("/")


def is_loopback(host: str) -> bool:
    """True for `localhost` and the loopback addresses (127.0.0.0/8, ::1): traffic to them
    never leaves the machine. A name is not resolved (that would ask the network)."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_token_transport(address: str, token: str | None, *, insecure: bool = False) -> None:
    """Refuse to send a bearer token in clear (http) to a host off this machine, unless the
    user said `--insecure`: anyone on the path would read it and drive the cluster."""
    if not token or insecure:
        return
    url = urlsplit(address)
    if url.scheme == "http" and not is_loopback(url.hostname or ""):
        raise RayError(
            f"refusing to send ${TOKEN_ENV} in clear over http to {address} (not this "
            "machine): use the cluster's https:// address, or pass --insecure to send it anyway"
        )


class RayJobs:
    """A client of one cluster's Jobs API (thread-safe: httpx2's client is)."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        *,
        timeout: float = REQUEST_TIMEOUT_S,
        insecure: bool = False,
    ) -> None:
        """A client of the cluster at `address`; a token (else $SHOAL_RAY_TOKEN) is sent
        only over https or to loopback, unless `insecure` (checked before any connection)."""
        self.address = address.rstrip("/")
        self._names: dict[str, tuple[str | None, float]] = {}  # node id -> (name, retry at)
        self._names_lock = threading.Lock()
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        check_token_transport(self.address, token, insecure=insecure)
        import httpx2  # (imported with the first client: a leader without one never pays)

        self._httpx = httpx2
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http: httpx2.Client = httpx2.Client(
            base_url=self.address,
            headers=headers,
            timeout=httpx2.Timeout(timeout, connect=CONNECT_TIMEOUT_S),
            trust_env=False,  # a proxy from the environment must not see the cluster's traffic
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RayJobs:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """The cluster's versions (`ray_version`, ...): proof that the address answers."""
        data = self._json("GET", "/api/version", what="ask its version")
        if not isinstance(data, dict) or "ray_version" not in data:
            raise RayUnreachable(f"{self.address} answers, but not as a Ray dashboard")
        return data

    def nodes(self, *, alive: bool = True) -> list[NodeInfo]:
        """The cluster's live nodes (all it knows unless `alive`) and their resources
        (`GET /api/v0/nodes`)."""
        data = self._json("GET", "/api/v0/nodes?limit=10000", what="list its nodes")
        listed = ((data or {}).get("data") or {}).get("result") or {}
        rows = listed.get("result") if isinstance(listed, dict) else None
        out = []
        for row in rows or []:
            if not isinstance(row, dict) or (alive and row.get("state") != "ALIVE"):
                continue
            total = row.get("resources_total") or {}
            out.append(
                NodeInfo(
                    name=str(row.get("node_name") or row.get("node_ip") or row.get("node_id")),
                    address=str(row.get("node_ip") or ""),
                    resources={str(k): float(v) for k, v in total.items()},
                    node_id=str(row.get("node_id") or ""),
                )
            )
        return out

    def node_name(self, node_id: str) -> str | None:
        """Ray's name of node `node_id` (listed once, then remembered; None when the cluster
        does not list it: asked again after NODE_RETRY_S)."""
        with self._names_lock:
            known = self._names.get(node_id)
            if known is not None and (known[0] or time.monotonic() < known[1]):
                return known[0]
        try:
            names = {n.node_id: n.name for n in self.nodes(alive=False)}
        except RayError:
            names = {}
        with self._names_lock:
            for nid, name in names.items():
                self._names[nid] = (name, 0.0)
            if node_id not in names:
                self._names[node_id] = (None, time.monotonic() + NODE_RETRY_S)
            return names.get(node_id)

    def package_exists(self, name: str) -> bool:
        response = self._request("GET", f"/api/packages/gcs/{name}", what=f"look up {name}")
        return bool(response.status_code == 200)

    def upload_package(self, name: str, data: bytes) -> str:
        """Upload a zipped working directory (once per content); its `gcs://` URI."""
        if not self.package_exists(name):
            response = self._request(
                "PUT", f"/api/packages/gcs/{name}", what=f"upload {name}", content=data
            )
            self._check(response, f"upload {name}")
        return f"gcs://{name}"

    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        *,
        runtime_env: Mapping[str, Any] | None = None,
        metadata: Mapping[str, str] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> str:
        """Submit a job under `submission_id` (its entrypoint holding `num_cpus`, `num_gpus`
        and the custom `resources` on its node); a second job with the same id is refused."""
        body: dict[str, Any] = {"entrypoint": entrypoint, "submission_id": submission_id}
        if runtime_env:
            body["runtime_env"] = dict(runtime_env)
        if metadata:
            body["metadata"] = dict(metadata)
        if num_cpus is not None:
            body["entrypoint_num_cpus"] = num_cpus
        if num_gpus is not None:
            body["entrypoint_num_gpus"] = num_gpus
        if resources:
            body["entrypoint_resources"] = dict(resources)
        what = f"submit job {submission_id}"
        response = self._request("POST", "/api/jobs/", what=what, content=orjson.dumps(body))
        if response.status_code != 200 and _EXISTS.search(response.text):
            raise JobExists(
                f"the cluster at {self.address} already has a job {submission_id!r} (a job's "
                "id is its task's id, used once: submit a new task rather than re-using one)"
            )
        self._check(response, what)
        return str(orjson.loads(response.content).get("submission_id") or submission_id)

    def info(self, submission_id: str) -> JobInfo:
        data = self._json("GET", f"/api/jobs/{submission_id}", what=f"read job {submission_id}")
        return JobInfo.from_api(data)

    def logs(self, submission_id: str) -> str:
        """The job's whole log so far (the API has no offsets)."""
        data = self._json(
            "GET", f"/api/jobs/{submission_id}/logs", what=f"read the logs of {submission_id}"
        )
        return str(data.get("logs") or "")

    def stop(self, submission_id: str) -> bool:
        """Ask the cluster to stop the job (TERM to its process group, KILL after Ray's
        grace time); False when it had already ended."""
        data = self._json(
            "POST", f"/api/jobs/{submission_id}/stop", what=f"stop job {submission_id}"
        )
        return bool(data.get("stopped"))

    def delete(self, submission_id: str) -> bool:
        """Forget an ended job (its record and logs on the cluster)."""
        data = self._json("DELETE", f"/api/jobs/{submission_id}", what=f"delete {submission_id}")
        return bool(data.get("deleted"))

    # -- plumbing ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, what: str, content: bytes | None = None) -> Any:
        headers = {"Content-Type": "application/json"} if method == "POST" else None
        try:
            return self._http.request(method, path, content=content, headers=headers)
        except self._httpx.TimeoutException as exc:
            raise RayUnreachable(
                f"the Ray cluster at {self.address} did not answer in time (to {what}): {exc}"
            ) from exc
        except self._httpx.HTTPError as exc:
            raise RayUnreachable(
                f"cannot reach the Ray cluster at {self.address} (to {what}): {exc}"
            ) from exc

    def _json(self, method: str, path: str, *, what: str) -> Any:
        response = self._request(method, path, what=what)
        self._check(response, what)
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise RayUnreachable(
                f"{self.address} answered {what} with something that is not JSON "
                "(is it a Ray dashboard?)"
            ) from exc

    def _check(self, response: Any, what: str) -> None:
        status = response.status_code
        if status == 200:
            return
        text = _last_line(response.text)
        if status == 404 and "does not exist" in response.text:
            raise JobNotFound(f"the Ray cluster at {self.address} has no such job ({what}): {text}")
        if status in (401, 403):
            raise RayError(
                f"the Ray cluster at {self.address} refused to {what} (HTTP {status}): set "
                f"{TOKEN_ENV} to the cluster's token"
            )
        raise RayError(
            f"the Ray cluster at {self.address} could not {what} (HTTP {status}): {text}"
        )


def _last_line(text: str) -> str:
    """The message of a dashboard error (its tracebacks end with the exception's line)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip() not in ("", ".")]
    return (lines[-1] if lines else "no details")[:300]
