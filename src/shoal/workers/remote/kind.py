"""`remote_agent` tasks: work that runs as a Ray Job on a cluster, polled by the leader.

A remote task is submitted with `submission_id` = its task id (a continuation of an ultraplan
gets `{id}-2`, `{id}-3`...), its working directory packed from the git work tree and uploaded
once per content. Every poll reads the job's status and its whole log (the API has no
offsets): only what is new is appended to the task's output file, after Ray's own preamble,
and scanned for the markers a job prints (`::shoal-NAME:: VALUE`). A completion checker
registered per remote type turns status and markers into the task's next state.

Nothing here blocks the leader's loop: HTTP calls run on a small thread pool, one call chain
per task at a time, and the loop applies their results (on its own thread) when they are done.
A sidecar file `sessions/{s}/remote/{id}.json` is written at submit and deleted once the
task's end was notified; a resumed leader re-attaches to running jobs by id and never revives
a task that had ended.

Secrets: a job's environment is what `--env` names (Ray shows it to whoever reaches the
dashboard), never the leader's keys by default; the values of `--env` live in the leader's
memory only (the task's record names them), so a job not yet submitted when its leader
restarts cannot be, and says which `--env` it needs again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import stat
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field

from shoal.core import git
from shoal.core.errors import ShoalError, UsageError
from shoal.core.events import task_started, task_terminated
from shoal.core.jsonio import atomic_write, dumps
from shoal.core.secretenv import is_secret
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    RemoteAgentTaskState,
    RemoteTaskType,
    TaskStatus,
    TaskType,
    new_task_id,
)
from shoal.workers.kinds import Poll, TaskStore
from shoal.workers.remote.ray_jobs import (
    FAILED,
    STOPPED,
    SUCCEEDED,
    JobExists,
    JobInfo,
    RayError,
    RayJobs,
    RayUnreachable,
)

AGENT_TYPES: Final = ("remote-agent", "ultraplan", "ultrareview", "autofix-pr", "background-pr")
REMOTE_TYPES: Final = (*AGENT_TYPES, "shell")
POLL_INTERVAL_S: Final = 0.5
POLL_THREADS: Final = 8
UNREACHABLE_ENV: Final = "SHOAL_RAY_UNREACHABLE_S"
UNREACHABLE_S: Final = 30.0
"""A cluster that answers no poll for this long fails its tasks (a stop: kills them)."""
UPLOAD_LIMIT_ENV: Final = "SHOAL_RAY_UPLOAD_LIMIT_MB"
UPLOAD_LIMIT_MB: Final = 100
SHOAL_COMMAND_ENV: Final = "SHOAL_RAY_SHOAL"
"""How a cluster node runs shoal for a remote agent (default `shoal`, on the node's PATH)."""
LOG_KEEP: Final = 20  # status changes kept in a record's `log`
# What a job's environment gets of the leader's, for an agent type: the model providers'
# settings, never their keys (a key reaches a job only when named with --env).
MODEL_ENV: Final = ("SHOAL_MODEL", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL")
MARKER: Final = re.compile(r"^::shoal-([a-z-]+)::[ \t]?(.*)$")
# Ray's own lines in a job's log, before its entrypoint runs.
RAY_LINE: Final = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\t[A-Z]+ job_manager\.py:\d+ -- ")
QUESTION: Final = re.compile(r"^\s*QUESTION:\s*(.+)$", re.MULTILINE)
SIDECAR_DIR: Final = "remote"
SIDECAR_KEEP_S: Final = 2.0
"""An ended task's sidecar outlives its notification this long (the session's state, written
at most every 0.2 s, shows the end by then)."""


class RemoteError(ShoalError):
    """A remote task cannot be created (the cluster, the working directory or the model)."""


# --------------------------------------------------------------------------- the request


class RemoteSpec(BaseModel):
    """What `shoal remote submit` (or a batch run on Ray) asks the leader to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    remote_type: RemoteTaskType = "remote-agent"
    address: str
    package: str | None = None
    """The uploaded working directory (`gcs://_ray_pkg_*.zip`), if any."""
    cwd: str = "."
    """Where the job starts, relative to the packed work tree's root."""
    prompt: str | None = None
    command: str | None = None
    model: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    """The job's environment: the values travel in the request and stay in the leader's
    memory; the task's record keeps their names only."""
    insecure: bool = False
    """Send $SHOAL_RAY_TOKEN over plain http to a host off this machine (--insecure)."""
    timeout: float | None = Field(default=None, gt=0)
    long_running: bool = False
    title: str | None = None
    description: str | None = None
    num_cpus: float | None = Field(default=None, ge=0)


def new_remote_task(spec: RemoteSpec, output_file: Callable[[str], Path]) -> RemoteAgentTaskState:
    """A pending `remote_agent` task for `spec` (checked: an agent type has a prompt, a shell
    one a command)."""
    if spec.remote_type == "shell":
        if not (spec.command or "").strip():
            raise UsageError(
                "a remote shell task needs a command (shoal remote submit --type shell -- CMD)"
            )
        what = spec.command or ""
    else:
        if not (spec.prompt or "").strip():
            raise UsageError(f"a {spec.remote_type} task needs a prompt")
        what = spec.prompt or ""
    task_id = new_task_id(TaskType.REMOTE_AGENT)
    title = spec.title or _first_line(what)[:80]
    entry = entrypoint(spec)
    metadata: dict[str, Any] = {
        "address": spec.address,
        "package": spec.package,
        "cwd": spec.cwd,
        "entrypoint": entry,
        "env_names": sorted(spec.env),
        "insecure": spec.insecure,
        "model": spec.model,
        "prompt": spec.prompt,
        "timeout_s": spec.timeout,
        "num_cpus": spec.num_cpus,
        "job": 1,
    }
    return RemoteAgentTaskState(
        id=task_id,
        description=spec.description or title,
        output_file=str(output_file(task_id)),
        remote_task_type=spec.remote_type,
        remote_task_metadata=metadata,
        session_id=task_id,
        command=spec.command or "",
        title=title,
        is_long_running=spec.long_running,
        is_remote_review=spec.remote_type == "ultrareview",
        is_ultraplan=spec.remote_type == "ultraplan",
        ultraplan_phase="running" if spec.remote_type == "ultraplan" else None,
    )


def entrypoint(spec: RemoteSpec, prompt: str | None = None) -> str:
    """The job's shell command: a shell task's command, or shoal's agent on the node (which
    works in a private copy of the working directory, entered at `cwd` there: the unpacked
    package is Ray's cache, shared by every job of the same content)."""
    if spec.remote_type == "shell":
        cd = f"cd {shlex.quote(spec.cwd)} && " if spec.cwd not in ("", ".") else ""
        return f"{cd}sh -c {shlex.quote(spec.command or '')}"
    shoal = os.environ.get(SHOAL_COMMAND_ENV) or "shoal"
    argv = ["remote", "job", "--type", spec.remote_type]
    if spec.cwd not in ("", "."):
        argv += ["--cwd", spec.cwd]
    if spec.model:
        argv += ["--model", spec.model]
    argv += ["--", prompt if prompt is not None else spec.prompt or ""]
    return f"{shoal} {shlex.join(argv)}"


def preamble(remote_type: str) -> str:
    """What an agent of `remote_type` is told before the prompt (remote_prompts.toml)."""
    text = resources.files("shoal.workers.remote").joinpath("remote_prompts.toml").read_text()
    return str(tomllib.loads(text).get(remote_type, {}).get("preamble", ""))


# --------------------------------------------------------------------------- eligibility


@dataclass(frozen=True)
class Package:
    """A work tree packed for upload: Ray's content-addressed name and the zip's bytes."""

    root: Path
    name: str
    data: bytes
    files: int
    names: frozenset[str] = frozenset()  # the packed files' paths (relative to the root)


def upload_limit() -> int:
    """The largest working directory (zipped bytes) a remote task may take."""
    raw = os.environ.get(UPLOAD_LIMIT_ENV)
    try:
        mb = float(raw) if raw else UPLOAD_LIMIT_MB
    except ValueError:
        raise UsageError(f"${UPLOAD_LIMIT_ENV} must be a number of MB, not {raw!r}") from None
    return int(mb * 1024 * 1024)


def pack_workdir(cwd: Path, limit: int | None = None) -> Package:
    """Zip the git work tree `cwd` is in (what .gitignore excludes stays out), checking that
    it is a repository with a commit and that the zip stays under the upload limit.

    Nothing from outside the tree is packed: a symlink whose target leaves it is refused
    (named), one that stays inside is packed as a copy of its target (Ray unpacks with
    `zipfile`, which restores no links; the target's bytes are the tree's own), and a file
    with hard links that are not all in the tree is refused (its data is some other file's)."""
    import io
    import zipfile

    limit = upload_limit() if limit is None else limit
    root = git.toplevel(cwd)
    if root is None:
        raise RemoteError(
            f"{cwd} is not in a git repository: a remote task runs on a copy of the work tree "
            "(git init && git add -A && git commit)"
        )
    if not git.has_commit(root):
        raise RemoteError(f"the git repository {root} has no commit yet: commit once first")
    buffer = io.BytesIO()
    count = 0
    names: set[str] = set()
    real_root = os.path.realpath(root)
    links: dict[tuple[int, int], list[str]] = {}  # (dev, inode) -> packed names, nlink > 1
    nlinks: dict[tuple[int, int], int] = {}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for rel in git.listed_files(root):
            read = _read_inside(root, real_root, rel)
            if read is None:
                continue  # tracked but deleted, a dangling link, a submodule's directory
            st, content = read
            if st.st_nlink > 1:
                links.setdefault((st.st_dev, st.st_ino), []).append(rel)
                nlinks[(st.st_dev, st.st_ino)] = st.st_nlink
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IMODE(st.st_mode) | stat.S_IFREG) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, content)
            count += 1
            names.add(rel)
            if buffer.tell() > limit:
                break
    for inode, packed in links.items():
        if len(packed) < nlinks[inode]:
            raise RemoteError(
                f"{root / packed[0]} is a hard link to a file outside the work tree (it has "
                f"{nlinks[inode]} links, {len(packed)} of them here), whose data would be "
                "uploaded: give it its own copy (cp --remove-destination) or remove it"
            )
    data = buffer.getvalue()
    if len(data) > limit:
        raise RemoteError(
            f"the work tree {root} packs to more than {_mb(limit)} (the upload limit; "
            f"${UPLOAD_LIMIT_ENV} raises it): add what the job does not need to .gitignore"
        )
    name = f"_ray_pkg_{hashlib.sha1(data).hexdigest()}.zip"
    return Package(root=root, name=name, data=data, files=count, names=frozenset(names))


def _read_inside(root: Path, real_root: str, rel: str) -> tuple[os.stat_result, bytes] | None:
    """The stat and bytes of the regular file `rel` of the tree (a symlink: its target's),
    None when there is none; a link (or a linked directory on the way) that leads out of the
    tree, or into its .git (which may hold credentials), is refused. Where the file was
    opened is checked again (/proc/self/fd), so a link swapped in meanwhile is caught too."""
    path = root / rel
    try:
        lst = os.lstat(path)
    except OSError:
        return None
    real = os.path.realpath(path)
    if not os.path.exists(real):
        return None  # a dangling link: nothing to pack
    what = "a symlink" if stat.S_ISLNK(lst.st_mode) else "reached through a symlink"
    _check_beneath(path, rel, real, root, real_root, what)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None  # a submodule's directory, a link to a directory, a FIFO
        with contextlib.suppress(OSError):  # (no /proc: the check above stands alone)
            opened = os.readlink(f"/proc/self/fd/{fd}")
            _check_beneath(path, rel, opened, root, real_root, "now a link")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return st, b"".join(chunks)
    finally:
        os.close(fd)


def _check_beneath(path: Path, rel: str, real: str, root: Path, real_root: str, what: str) -> None:
    """Refuse `path` (resolving to `real`) unless it stays in the tree, out of its .git."""
    if not _beneath(real, real_root):
        where = f"outside the work tree {root}"
    elif _beneath(real, os.path.join(real_root, ".git")):
        where = "in the repository's .git (which may hold credentials)"
    else:
        return
    raise RemoteError(
        f"{path} is {what} to {real}, {where}: its target would be uploaded with the tree; "
        f"remove the link (git rm {shlex.quote(rel)}) or make it point inside the tree"
    )


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_model_key(
    remote_type: str,
    model: str | None,
    env: Mapping[str, str],
    home: Path,
    cwd: Path,
    package: Package | None = None,
) -> None:
    """An agent type needs its model's key in the job's environment `env` (what `--env`
    names: a key in ours alone does not reach the job; the offline scripted model needs none).
    A script's or a transcript's file is the node's, relative to the job's working directory:
    with the `package` the job gets (at submit), it must be a file packed in it (relative to
    `cwd`) or, absolute, a file here; without one (the leader) it is not checked."""
    if remote_type not in AGENT_TYPES:
        return
    from shoal.workers.agent.models import PROVIDER_ENV, check_model, choose_model

    spec = choose_model(model, None, env, home)
    if spec.provider in PROVIDER_ENV:
        key = PROVIDER_ENV[spec.provider][0]
        if not env.get(key):
            raise RemoteError(
                f"model {spec} needs ${key} on the cluster: pass --env {key} (its value is "
                "taken from this environment; a key reaches a Ray job only when named)"
            )
        return
    if not spec.name or package is None:
        return
    if Path(os.path.expanduser(spec.name)).is_absolute():
        check_model(spec, env, cwd)
        return
    what = "script" if spec.provider == "scripted" else "transcript"
    path = Path(os.path.abspath(cwd / spec.name))
    rel = os.path.relpath(path.resolve(), Path(package.root).resolve())
    if rel.startswith("..") or rel not in package.names:
        raise RemoteError(
            f"model {spec}: the {what} {path} is not in the packed work tree of "
            f"{package.root}, where the job reads it (add it there, out of .gitignore's reach)"
        )


# --------------------------------------------------------------------------- completion


@dataclass(frozen=True)
class Verdict:
    """What a completion checker decided: a new status (None: still running) and fields."""

    status: TaskStatus | None = None
    changes: dict[str, Any] = field(default_factory=dict)


CompletionChecker = Callable[[RemoteAgentTaskState, JobInfo, Mapping[str, str]], Verdict | None]
_CHECKERS: dict[str, CompletionChecker] = {}


def register_completion_checker(remote_type: str, checker: CompletionChecker) -> None:
    """Run `checker` at every poll of a task of `remote_type` (the last one registered wins)."""
    _CHECKERS[remote_type] = checker


def _marker_text(markers: Mapping[str, str], name: str) -> str | None:
    raw = markers.get(name)
    if raw is None:
        return None
    with contextlib.suppress(orjson.JSONDecodeError):
        value = orjson.loads(raw)
        if isinstance(value, str):
            return value
    return raw


TASK_LIST_KEEP: Final = 100  # items of a job's task list kept in its record
TASK_LIST_STATUSES: Final = ("pending", "in_progress", "completed")


def todo_of(markers: Mapping[str, str]) -> tuple[dict[str, str], ...] | None:
    """The job's agent's task list from its latest `todo` marker (a JSON list of {content,
    status}), each content cut to 200 characters; None when it printed none, or garbage."""
    raw = markers.get("todo")
    if raw is None:
        return None
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list):
        return None
    return tuple(
        {
            "content": item["content"][:200],
            "status": item.get("status") if item.get("status") in TASK_LIST_STATUSES else "pending",
        }
        for item in items[:TASK_LIST_KEEP]
        if isinstance(item, dict) and isinstance(item.get("content"), str)
    )


def job_verdict(
    task: RemoteAgentTaskState, info: JobInfo, markers: Mapping[str, str]
) -> Verdict | None:
    """Done when the job is: succeeded is completed, failed is failed (with its exit code),
    stopped is killed. The result is the job's `result` marker, if it printed one."""
    if not info.terminal:
        return None
    result = _marker_text(markers, "result")
    changes: dict[str, Any] = {"exit_code": info.exit_code}
    if result is not None:
        changes["result"] = result
    if info.status == SUCCEEDED:
        return Verdict(TaskStatus.COMPLETED, changes)
    if info.status == STOPPED:
        return Verdict(TaskStatus.KILLED, changes)
    if info.exit_code is not None:
        error = f"the job exited with code {info.exit_code}"
    else:
        error = f"the job failed: {_first_line(info.message) or 'no reason given'}"
    return Verdict(TaskStatus.FAILED, {**changes, "error": error})


def review_verdict(
    task: RemoteAgentTaskState, info: JobInfo, markers: Mapping[str, str]
) -> Verdict | None:
    """An ultrareview is done when its result file is named in the job's logs (with the
    review itself); its progress is the last `progress` marker."""
    progress = _marker_text(markers, "progress")
    changes: dict[str, Any] = {}
    if progress is not None:
        changes["review_progress"] = {"stage": progress}
    if "result-file" in markers and "result" in markers:
        file = _marker_text(markers, "result-file")
        changes.update(result=_marker_text(markers, "result"), exit_code=info.exit_code)
        meta = {**(task.remote_task_metadata or {}), "result_file": file}
        return Verdict(TaskStatus.COMPLETED, {**changes, "remote_task_metadata": meta})
    verdict = job_verdict(task, info, markers)
    if verdict is not None and verdict.status == TaskStatus.COMPLETED:
        return Verdict(
            TaskStatus.FAILED,
            {**verdict.changes, "error": "the review ended without naming its result file"},
        )
    if verdict is None:
        return Verdict(None, changes) if changes else None
    return Verdict(verdict.status, {**changes, **verdict.changes})


def plan_verdict(
    task: RemoteAgentTaskState, info: JobInfo, markers: Mapping[str, str]
) -> Verdict | None:
    """An ultraplan moves `running -> needs_input -> plan_ready` by the job's `phase`
    markers; it stays running (waiting for `shoal approve`) once its job has ended with one."""
    phase = _marker_text(markers, "phase")
    if phase in ("needs_input", "plan_ready") and info.terminal:
        changes: dict[str, Any] = {"ultraplan_phase": phase, "exit_code": info.exit_code}
        result = _marker_text(markers, "result")
        if result is not None:
            changes["result"] = result
        question = _marker_text(markers, "question")
        if phase == "needs_input":
            meta = {**(task.remote_task_metadata or {}), "question": question}
            changes["remote_task_metadata"] = meta
        return Verdict(None, changes)
    return job_verdict(task, info, markers)


for _type in ("remote-agent", "autofix-pr", "background-pr", "shell"):
    register_completion_checker(_type, job_verdict)
register_completion_checker("ultrareview", review_verdict)
register_completion_checker("ultraplan", plan_verdict)


# --------------------------------------------------------------------------- the kind


@dataclass
class _Job:
    """What the kind holds in memory about one remote task's current Ray job."""

    task_id: str
    client: RayJobs
    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    num_cpus: float | None
    output: Path
    submitted: bool
    submit_tried: bool = False
    retried_submit: bool = False  # a submit failed before (a timeout: it may have got through)
    offset: int = 0  # characters of the job's log (as the API gives it) read and written
    markers: dict[str, str] = field(default_factory=dict)
    log_error: str | None = None  # why the job's log could not be read (said once)
    info: JobInfo | None = None
    error: BaseException | None = None  # the last call chain's failure
    future: Future[None] | None = None
    next_poll: float = 0.0
    unreachable_since: float | None = None
    stop_reason: str | None = None
    stop_asked_at: float | None = None
    stop_sent: bool = False
    waiting: bool = False  # an ultraplan waiting for `shoal approve`: no job to poll


class RemoteKind:
    """The TaskKind of `remote_agent` tasks (Ray Jobs)."""

    types = frozenset({TaskType.REMOTE_AGENT})

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self.jobs: dict[str, _Job] = {}
        self._clients: dict[str, RayJobs] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._done: set[str] = set()  # ids whose call chain finished (read at the next REAP)
        # Ended ids (when they ended): their sidecar goes once they are notified and the
        # session's state has surely been written since (its writes are throttled).
        self._ended: dict[str, float] = {}
        self._wake: Callable[[], None] | None = None
        self._sidecars: dict[str, tuple[Path, dict[str, Any]]] = {}
        # The values of each task's --env, in memory only (its record keeps the names).
        self._env_values: dict[str, dict[str, str]] = {}

    @property
    def environ(self) -> dict[str, str]:
        """The leader's environment."""
        return self._environ

    def inherited_env(self, remote_type: str) -> dict[str, str]:
        """What an agent job gets of the leader's environment without asking: the model
        settings of MODEL_ENV, never a secret (a key reaches a job only through --env)."""
        if remote_type not in AGENT_TYPES:
            return {}
        return {
            name: self._environ[name]
            for name in MODEL_ENV
            if self._environ.get(name) and not is_secret(name)
        }

    def remember_env(self, task_id: str, env: Mapping[str, str]) -> None:
        """Keep task `task_id`'s --env values for its jobs (in memory: never written)."""
        if env:
            self._env_values[task_id] = dict(env)

    def forget_env(self, task_id: str) -> None:
        """The task has ended: its values are no longer needed."""
        self._env_values.pop(task_id, None)

    # -- TaskKind --------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, RemoteAgentTaskState)
        self._wake = store.wake
        meta = task.remote_task_metadata or {}
        try:
            job = self._job_for(task, store, submitted=False)
        except ShoalError as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=str(exc))
            store.emit(task_started(store.get(task.id) or task))
            return
        if not store.write_ahead(task.id):
            store.emit(task_started(store.get(task.id) or task))
            return
        self.jobs[task.id] = job
        job.output.touch(exist_ok=True)  # (a job that prints nothing has an empty output)
        store.set_task(
            task.id,
            poll_started_at=time.time(),
            log=_logged(task, "submitting", f"to {meta.get('address')}"),
        )
        current = store.get(task.id)
        self._write_sidecar(current if isinstance(current, RemoteAgentTaskState) else task)
        store.emit(task_started(store.get(task.id) or task))
        self._schedule(job)

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        if what is not Poll.REAP:
            return
        self._wake = store.wake
        self._drop_sidecars(store)
        with self._lock:
            done, self._done = self._done, set()
        for task_id in list(self.jobs if only is None else only):
            job = self.jobs.get(task_id)
            if job is None:
                continue
            task = store.get(task_id)
            if not isinstance(task, RemoteAgentTaskState) or task.is_terminal:
                self.jobs.pop(task_id, None)
                continue
            if task_id in done or (job.future is not None and job.future.done()):
                job.future = None
                self._apply(job, task, store)
            if task_id not in self.jobs:
                continue
            self._check_timeout(job, store)
            if job.future is None and not job.waiting and time.monotonic() >= job.next_poll:
                self._schedule(job)

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        job = self.jobs.get(task.id)
        if task.status == TaskStatus.PENDING or job is None or (job.waiting and not job.future):
            self.jobs.pop(task.id, None)
            self.forget_env(task.id)
            changes: dict[str, Any] = {
                "kill_reason": reason,
                "error": reason,
                "end_time": time.time(),
            }
            if isinstance(task, RemoteAgentTaskState):
                changes["log"] = _logged(task, TaskStatus.KILLED.value, reason)
            self._record_end(task.id, TaskStatus.KILLED, changes)
            store.move_task(task.id, TaskStatus.KILLED, **changes)
            if reason == STOPPED_ON_REQUEST:
                store.mark_notified(task.id)
                final = store.get(task.id)
                if final is not None:
                    store.emit(task_terminated(final))
            return
        if job.stop_reason is None:
            job.stop_reason = reason
            job.stop_asked_at = time.monotonic()
            store.set_task(task.id, kill_reason=reason)
            job.next_poll = 0.0
            if job.future is None:
                self._schedule(job)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """Re-attach to a running job by its id (the poll clock restarts now); a task that had
        ended is never revived (its sidecar says how it ended when the session's state had not
        been written since), and one whose sidecar is gone cannot be re-attached. Lines the
        output file got after the sidecar's last offset are cut: they are read again."""
        assert isinstance(task, RemoteAgentTaskState)
        self._wake = store.wake
        if task.is_terminal:
            self._ended[task.id] = time.monotonic()
            return
        if task.status == TaskStatus.PENDING:
            return
        record = _read_sidecar(task)
        ended = record.get("ended")
        if isinstance(ended, dict) and ended.get("status") in {s.value for s in TaskStatus}:
            self._sidecars[task.id] = (sidecar_path(task), record)
            self._ended[task.id] = time.monotonic()
            changes = {k: v for k, v in (ended.get("changes") or {}).items() if k != "status"}
            if isinstance(changes.get("log"), list):
                changes["log"] = tuple(changes["log"])
            store.move_task(task.id, TaskStatus(ended["status"]), **changes)
            return
        if not record:  # (gone, or not readable)
            store.move_task(
                task.id,
                TaskStatus.FAILED,
                error=f"its sidecar {sidecar_path(task)} is gone: the job cannot be re-attached",
            )
            return
        try:
            # (a sidecar that does not say the job was submitted: it is submitted now, unless
            # the cluster has it already)
            submitted = record.get("submitted") is not False
            job = self._job_for(task, store, submitted=submitted)
        except ShoalError as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=f"cannot re-attach: {exc}")
            return
        job.retried_submit = not submitted
        meta = task.remote_task_metadata or {}
        self._sidecars[task.id] = (sidecar_path(task), record)
        job.offset = int(record.get("log_offset") or 0)
        _cut_output(job.output, record.get("output_size"))
        job.markers = dict(meta.get("markers") or {})
        job.waiting = task.ultraplan_phase in ("needs_input", "plan_ready")
        if task.kill_reason:
            job.stop_reason, job.stop_asked_at = task.kill_reason, time.monotonic()
        self.jobs[task.id] = job
        store.set_task(
            task.id,
            poll_started_at=time.time(),
            log=_logged(task, "re-attached", "by a resumed leader"),
        )
        if not job.waiting:
            self._schedule(job)

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        result = getattr(task, "result", None)
        return {"result": result} if result else {}

    def live(self) -> Iterable[str]:
        return list(self.jobs)

    def signalled(self) -> Iterable[str]:
        """Tasks whose call chain finished, and those whose next poll is due (`next_due`
        points the loop's quick steps at them: left out, the loop would wake for a due poll
        and find nothing to do until its next full tick, spinning meanwhile)."""
        now = time.monotonic()
        with self._lock:
            done = set(self._done)
        due = {
            i
            for i, j in self.jobs.items()
            if j.future is None and not j.waiting and j.next_poll <= now
        }
        return list(done | due)

    def on_exit(self, key: str) -> bool:
        return False

    def next_due(self) -> float | None:
        due = [j.next_poll for j in self.jobs.values() if j.future is None and not j.waiting]
        return min(due) if due else None

    def running(self) -> int:
        """Jobs in flight on clusters (an ultraplan waiting for an answer holds none)."""
        return sum(1 for j in self.jobs.values() if not j.waiting)

    def close(self) -> None:
        """Stop the poll threads and close the HTTP clients (the jobs run on)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self._clients.values():
            client.close()

    # -- answering an ultraplan ------------------------------------------------------------

    def answer(
        self, task: RemoteAgentTaskState, store: TaskStore, *, approve: bool, text: str | None
    ) -> RemoteAgentTaskState:
        """`shoal approve`/`reject` of an ultraplan: a ready plan approved completes the task
        with it; a question answered (or a plan sent back with feedback) continues the
        planning in a new job `{id}-N`, told the earlier answer and what the user said."""
        if not task.is_ultraplan or task.ultraplan_phase not in ("needs_input", "plan_ready"):
            raise UsageError(
                f"remote task {task.id} waits for no answer (it is {task.status.value}"
                + (f", {task.ultraplan_phase}" if task.ultraplan_phase else "")
                + ")"
            )
        if task.ultraplan_phase == "plan_ready" and approve:
            self.jobs.pop(task.id, None)
            self.forget_env(task.id)
            changes: dict[str, Any] = {
                "end_time": time.time(),
                "log": _logged(task, "approved", "the plan"),
            }
            self._record_end(task.id, TaskStatus.COMPLETED, changes)
            store.move_task(task.id, TaskStatus.COMPLETED, **changes)
            done = store.get(task.id)
            assert isinstance(done, RemoteAgentTaskState)
            return done
        if task.ultraplan_phase == "needs_input" and not (text or "").strip():
            raise UsageError(f"{task.id} asks a question: answer it with --feedback TEXT")
        if not approve and not (text or "").strip():
            raise UsageError(f"say what to change in the plan of {task.id}: --feedback TEXT")
        meta = dict(task.remote_task_metadata or {})
        number = int(meta.get("job") or 1) + 1
        said = (text or "").strip()
        prompt = (
            f"{meta.get('prompt') or ''}\n\nYour earlier answer was:\n{task.result or ''}\n\n"
            f"The user answered: {said}"
            if task.ultraplan_phase == "needs_input"
            else f"{meta.get('prompt') or ''}\n\nYour plan was:\n{task.result or ''}\n\n"
            f"The user wants it changed: {said}"
        )
        self._named_env(task)  # (the next job needs them: refused here, the task unchanged)
        spec = RemoteSpec(
            remote_type="ultraplan",
            address=str(meta.get("address")),
            package=meta.get("package"),
            cwd=str(meta.get("cwd") or "."),
            prompt=prompt,
            model=meta.get("model"),
        )
        meta.update(
            job=number,
            markers={},
            entrypoint=entrypoint(spec),
            question=None,
        )
        submission = f"{task.id}-{number}"
        store.set_task(
            task.id,
            ultraplan_phase="running",
            session_id=submission,
            remote_task_metadata=meta,
            poll_started_at=time.time(),
            log=_logged(task, "continued", f"as job {submission}"),
        )
        current = store.get(task.id)
        assert isinstance(current, RemoteAgentTaskState)
        job = self._job_for(current, store, submitted=False)
        self.jobs[task.id] = job
        self._write_sidecar(current)
        self._schedule(job)
        return current

    # -- the call chain (pool threads) ----------------------------------------------------

    def _schedule(self, job: _Job) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="shoal-ray")
        job.next_poll = time.monotonic() + POLL_INTERVAL_S
        job.future = self._pool.submit(self._call_chain, job)

    def _call_chain(self, job: _Job) -> None:
        """Submit (once), stop (once, when asked), read status and logs; never raises."""
        try:
            job.error = None
            if not job.submitted:
                try:
                    job.submit_tried = True
                    job.client.submit(
                        job.submission_id,
                        job.entrypoint,
                        runtime_env=job.runtime_env,
                        metadata={"shoal_task": job.task_id},
                        num_cpus=job.num_cpus,
                    )
                except JobExists:
                    # An earlier try that failed to answer (a timeout) may have got through:
                    # that job is this task's. A first try that meets one is refused.
                    if not job.retried_submit:
                        raise
                job.submitted = True
                self._write_sidecar_of(job)  # (a leader killed before this submits again)
            if job.stop_reason is not None and not job.stop_sent:
                job.client.stop(job.submission_id)
                job.stop_sent = True
            job.info = job.client.info(job.submission_id)
            try:
                logs = job.client.logs(job.submission_id)
            except RayUnreachable:
                raise
            except RayError as exc:
                # The dashboard cannot serve this log (it decodes it strictly: a job that
                # printed bytes that are not UTF-8 breaks the call); the job's status still
                # decides the task, and the output file says why it stops there.
                if job.log_error is None:
                    job.log_error = str(exc)
                    with open(job.output, "a", encoding="utf-8") as fh:
                        fh.write(f"[shoal: the rest of the job's log cannot be read: {exc}]\n")
                    self._write_sidecar_of(job)
            else:
                self._read_logs(job, logs, job.info.terminal)
        except BaseException as exc:  # (a thread's failure must reach the loop)
            job.error = exc
            job.retried_submit = job.submit_tried
        finally:
            with self._lock:
                self._done.add(job.task_id)
            if self._wake is not None:
                self._wake()

    def _read_logs(self, job: _Job, logs: str, final: bool) -> None:
        """Append the job's new complete lines (less Ray's own about the job's start) to the
        output file, scan them for markers, and record how far the log has been read."""
        new = logs[job.offset :]
        if not new:
            return
        cut = len(new) if final else new.rfind("\n") + 1
        if cut <= 0:
            return  # no complete line yet
        chunk = new[:cut]
        head = f"Running entrypoint for job {job.submission_id}: {job.entrypoint}\n"
        if job.offset == 0 or head in chunk:
            chunk = chunk.replace(head, "", 1)
        lines = [line for line in chunk.splitlines(keepends=True) if not RAY_LINE.match(line)]
        if lines:
            with open(job.output, "a", encoding="utf-8", errors="replace") as fh:
                fh.write("".join(lines))
        job.offset += cut
        self._write_sidecar_of(job)
        for line in lines:
            match = MARKER.match(line.rstrip("\r\n"))
            if match:
                job.markers[match.group(1)] = match.group(2).strip()

    # -- applying results (the loop's thread) -------------------------------------------

    def _apply(self, job: _Job, task: RemoteAgentTaskState, store: TaskStore) -> None:
        now = time.monotonic()
        if job.error is not None:
            self._failed_call(job, task, store, job.error, now)
            return
        job.unreachable_since = None
        info = job.info
        if info is None:
            return
        meta = task.remote_task_metadata or {}
        changes: dict[str, Any] = {}
        if info.host != ":" and info.host != task.host:
            changes["host"] = info.host
        if job.markers != (meta.get("markers") or {}):
            changes["remote_task_metadata"] = {**meta, "markers": dict(job.markers)}
        todo = todo_of(job.markers)
        if todo is not None and todo != task.todo_list:
            changes["todo_list"] = todo
        if info.status != _last_status(task):
            changes["log"] = _logged(task, info.status.lower(), _first_line(info.message))
        checker = _CHECKERS.get(task.remote_task_type, job_verdict)
        verdict = checker(task, info, job.markers)
        if job.stop_reason is not None and info.terminal:
            verdict = Verdict(TaskStatus.KILLED, {"exit_code": info.exit_code})
        if verdict is not None:
            extra = dict(verdict.changes)
            if "remote_task_metadata" in extra and "remote_task_metadata" in changes:
                extra["remote_task_metadata"] = {
                    **changes["remote_task_metadata"],
                    **extra["remote_task_metadata"],
                }
            changes.update(extra)
        if verdict is not None and verdict.status is not None:
            self._end(job, task, store, verdict.status, changes)
            return
        if changes:
            store.set_task(task.id, **changes)
        if task.is_ultraplan and changes.get("ultraplan_phase") in ("needs_input", "plan_ready"):
            job.waiting = True  # (its job has ended: nothing to poll until it is answered)

    def _failed_call(
        self,
        job: _Job,
        task: RemoteAgentTaskState,
        store: TaskStore,
        exc: BaseException,
        now: float,
    ) -> None:
        address = job.client.address
        if isinstance(exc, RayUnreachable) or (
            isinstance(exc, RayError)
            and not job.submitted
            and not isinstance(exc, JobExists)
            and "HTTP 5" in str(exc)
        ):
            job.unreachable_since = job.unreachable_since or now
            waited = now - job.unreachable_since
            if waited < _unreachable_s():
                return
            why = f"the Ray cluster at {address} stopped answering ({waited:.0f}s): {exc}"
            if job.stop_reason is not None:
                self._end(
                    job,
                    task,
                    store,
                    TaskStatus.KILLED,
                    {"error": f"{job.stop_reason}; the cluster never confirmed the stop ({why})"},
                )
            else:
                self._end(job, task, store, TaskStatus.FAILED, {"error": why})
            return
        if isinstance(exc, ShoalError):
            self._end(job, task, store, TaskStatus.FAILED, {"error": str(exc)})
            return
        self._end(
            job,
            task,
            store,
            TaskStatus.FAILED,
            {"error": f"internal error polling job {job.submission_id}: {exc!r}"},
        )

    def _end(
        self,
        job: _Job,
        task: RemoteAgentTaskState,
        store: TaskStore,
        status: TaskStatus,
        changes: dict[str, Any],
    ) -> None:
        self.jobs.pop(task.id, None)
        self.forget_env(task.id)
        if status == TaskStatus.KILLED:
            reason = job.stop_reason or task.kill_reason or "the job was stopped on the cluster"
            changes.setdefault("error", reason)
            changes["kill_reason"] = reason
        changes["log"] = _logged(task, status.value, changes.get("error") or "")
        changes["end_time"] = time.time()
        self._record_end(task.id, status, changes)
        store.move_task(task.id, status, **changes)
        if status == TaskStatus.KILLED and job.stop_reason == STOPPED_ON_REQUEST:
            store.mark_notified(task.id)  # a stop the user asked for is not news (as shells)
            final = store.get(task.id)
            if final is not None:
                store.emit(task_terminated(final))

    def _check_timeout(self, job: _Job, store: TaskStore) -> None:
        task = store.get(job.task_id)
        if not isinstance(task, RemoteAgentTaskState) or job.stop_reason or job.waiting:
            return
        limit = (task.remote_task_metadata or {}).get("timeout_s")
        if limit and not task.is_long_running and time.time() - task.poll_started_at > limit:
            self.kill(task, store, f"timed out after {limit:g}s")

    # -- helpers ---------------------------------------------------------------------------

    def _job_for(self, task: RemoteAgentTaskState, store: TaskStore, *, submitted: bool) -> _Job:
        meta = task.remote_task_metadata or {}
        address = str(meta.get("address") or "")
        if not address:
            raise RemoteError(f"remote task {task.id} names no cluster address")
        insecure = bool(meta.get("insecure"))
        client = self._clients.get(f"{insecure}:{address}")
        if client is None:
            client = RayJobs(address, self._environ.get("SHOAL_RAY_TOKEN"), insecure=insecure)
            self._clients[f"{insecure}:{address}"] = client
        env_vars = {**self.inherited_env(task.remote_task_type), "PYTHONUNBUFFERED": "1"}
        if not submitted:  # (a job on the cluster has its environment already)
            env_vars.update(self._named_env(task))
        runtime_env: dict[str, Any] = {"env_vars": env_vars}
        if meta.get("package"):
            runtime_env["working_dir"] = meta["package"]
        return _Job(
            task_id=task.id,
            client=client,
            submission_id=task.session_id or task.id,
            entrypoint=str(meta.get("entrypoint") or ""),
            runtime_env=runtime_env,
            num_cpus=meta.get("num_cpus"),
            output=Path(task.output_file),
            submitted=submitted,
        )

    def _named_env(self, task: RemoteAgentTaskState) -> dict[str, str]:
        """The values of the task's --env (kept in memory); a leader that restarted before
        the job was submitted has none, and says which --env the job needs again."""
        meta = task.remote_task_metadata or {}
        names = [str(n) for n in meta.get("env_names") or ()]
        values = self._env_values.get(task.id, {})
        missing = [n for n in names if n not in values]
        if missing:
            flags = " ".join(f"--env {n}" for n in missing)
            raise RemoteError(
                f"the job of {task.id} needs {flags}, whose value was kept in the leader's "
                "memory only (never on disk) and went when it restarted: submit a new task "
                f"with shoal remote submit {flags}"
            )
        return dict(values)

    def _write_sidecar(self, task: RemoteAgentTaskState) -> None:
        """The task's sidecar: what re-attaching needs (the job, the cluster, how far its log
        was read and how long the output file was then), beside the session's state (written
        at submit, then after each read)."""
        meta = task.remote_task_metadata or {}
        path = sidecar_path(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "task_id": task.id,
            "submission_id": task.session_id,
            "address": meta.get("address"),
            "remote_task_type": task.remote_task_type,
            "title": task.title,
            "submitted": False,
            "log_offset": 0,
            "output_size": _size(Path(task.output_file)),
            "written_at": time.time(),
        }
        atomic_write(path, dumps(record))
        self._sidecars[task.id] = (path, record)

    def _write_sidecar_of(self, job: _Job) -> None:
        """Record how far the job's log was read and the output file's size (after the lines
        were appended: a resumed leader cuts what a kill left after that size and reads it
        again, so that no line is lost or doubled)."""
        known = self._sidecars.get(job.task_id)
        if known is None:
            return
        path, record = known
        record = {
            **record,
            "submission_id": job.submission_id,
            "submitted": job.submitted,
            "log_offset": job.offset,
            "output_size": _size(job.output),
            "written_at": time.time(),
        }
        self._sidecars[job.task_id] = (path, record)
        atomic_write(path, dumps(record))

    def _record_end(self, task_id: str, status: TaskStatus, changes: Mapping[str, Any]) -> None:
        """Write how the task ended into its sidecar, before the task moves: a leader killed
        before the session's state shows the end finds it there, and does not re-attach."""
        self._ended[task_id] = time.monotonic()
        known = self._sidecars.get(task_id)
        if known is None:
            return
        path, record = known
        ended = {"status": status.value, "changes": orjson.loads(dumps(dict(changes)))}
        record = {**record, "ended": ended, "written_at": time.time()}
        self._sidecars[task_id] = (path, record)
        with contextlib.suppress(OSError):
            atomic_write(path, dumps(record))

    def _drop_sidecars(self, store: TaskStore) -> None:
        now = time.monotonic()
        for task_id, ended_at in list(self._ended.items()):
            task = store.get(task_id)
            if (task is not None and not task.notified) or now - ended_at < SIDECAR_KEEP_S:
                continue
            del self._ended[task_id]
            path = self._sidecars.pop(task_id, (None, None))[0]
            if path is None and task is not None:
                path = sidecar_path(task)
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def sidecar_path(task: AnyTaskState) -> Path:
    """`sessions/{s}/remote/{id}.json` (the output file is in `sessions/{s}/tasks/`)."""
    return Path(task.output_file).parent.parent / SIDECAR_DIR / f"{task.id}.json"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _cut_output(path: Path, size: object) -> None:
    """Cut the output file back to `size` bytes (what the sidecar's offset accounts for)."""
    if not isinstance(size, int) or size < 0:
        return
    with contextlib.suppress(OSError):
        if path.stat().st_size > size:
            os.truncate(path, size)


def _read_sidecar(task: AnyTaskState) -> dict[str, Any]:
    try:
        data = orjson.loads(sidecar_path(task).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _logged(task: RemoteAgentTaskState, status: str, message: str) -> tuple[dict[str, Any], ...]:
    entry = {"ts": round(time.time(), 3), "status": status, "message": message[:300]}
    return (*task.log, entry)[-LOG_KEEP:]


def _last_status(task: RemoteAgentTaskState) -> str | None:
    return str(task.log[-1].get("status")).upper() if task.log else None


def _unreachable_s() -> float:
    try:
        return float(os.environ.get(UNREACHABLE_ENV) or UNREACHABLE_S)
    except ValueError:
        return UNREACHABLE_S


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.3g} MB"  # (the limit as set: 0.01, not 0.00999928)


__all__ = [
    "AGENT_TYPES",
    "FAILED",
    "QUESTION",
    "REMOTE_TYPES",
    "CompletionChecker",
    "Package",
    "RemoteError",
    "RemoteKind",
    "RemoteSpec",
    "Verdict",
    "check_model_key",
    "entrypoint",
    "new_remote_task",
    "pack_workdir",
    "preamble",
    "register_completion_checker",
    "sidecar_path",
]
