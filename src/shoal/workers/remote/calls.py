"""The call chains of remote tasks: what the kind knows of each task's current Ray job
(`Job`), and the HTTP calls made for it on a small thread pool, one chain per task at a time.

A chain submits the job (once), stops it (once, when asked), and reads its status and its
whole log (the API has no offsets): only what is new is appended to the task's output file,
after Ray's own preamble, and scanned for the markers a job prints. Nothing here blocks the
leader's loop: a chain never raises, it leaves its result (or its failure) on the `Job`, and
the loop applies it on its own thread when the chain is done.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shoal.workers.remote.ray_jobs import JobExists, JobInfo, RayError, RayJobs, RayUnreachable
from shoal.workers.remote.sidecar import Sidecars
from shoal.workers.remote.verdicts import MARKER

POLL_INTERVAL_S: Final = 0.5
POLL_THREADS: Final = 8
# Ray's own lines in a job's log, before its entrypoint runs.
RAY_LINE: Final = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\t[A-Z]+ job_manager\.py:\d+ -- ")


@dataclass
class Job:
    """What the kind holds in memory about one remote task's current Ray job."""

    task_id: str
    client: RayJobs
    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    num_cpus: float | None
    output: Path
    submitted: bool
    num_gpus: float | None = None
    resources: dict[str, float] = field(default_factory=dict)
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


class CallChains:
    """The thread pool the remote kind's HTTP calls run on, and which chains have finished
    since the loop last looked."""

    def __init__(self, sidecars: Sidecars) -> None:
        self._sidecars = sidecars
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._done: set[str] = set()  # ids whose call chain finished (read at the next REAP)
        self.wake: Callable[[], None] | None = None
        """Wakes the leader's loop when a chain is done (its store's `wake`)."""

    def schedule(self, job: Job) -> None:
        """Start the job's next call chain (its next poll is due POLL_INTERVAL_S from now)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="shoal-ray")
        job.next_poll = time.monotonic() + POLL_INTERVAL_S
        job.future = self._pool.submit(self._call_chain, job)

    def take_done(self) -> set[str]:
        """The ids whose chain finished since the last call (now forgotten)."""
        with self._lock:
            done, self._done = self._done, set()
        return done

    def done(self) -> set[str]:
        """The ids whose chain finished since `take_done` was last called."""
        with self._lock:
            return set(self._done)

    def close(self) -> None:
        """Stop the pool's threads (a chain under way is not waited for)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _progress(self, job: Job) -> None:
        self._sidecars.progress(
            job.task_id,
            job.submission_id,
            submitted=job.submitted,
            log_offset=job.offset,
            output=job.output,
        )

    def _call_chain(self, job: Job) -> None:
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
                        num_gpus=job.num_gpus,
                        resources=job.resources,
                    )
                except JobExists:
                    # An earlier try that failed to answer (a timeout) may have got through:
                    # that job is this task's. A first try that meets one is refused.
                    if not job.retried_submit:
                        raise
                job.submitted = True
                self._progress(job)  # (a leader killed before this submits again)
            if job.stop_reason is not None and not job.stop_sent:
                job.client.stop(job.submission_id)
                job.stop_sent = True
            info = job.client.info(job.submission_id)
            if info.node_id:  # (the joblog's host is the node's name)
                info = dataclasses.replace(info, node_name=job.client.node_name(info.node_id))
            job.info = info
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
                    self._progress(job)
            else:
                self._read_logs(job, logs, job.info.terminal)
        except BaseException as exc:  # (a thread's failure must reach the loop)
            job.error = exc
            job.retried_submit = job.submit_tried
        finally:
            with self._lock:
                self._done.add(job.task_id)
            if self.wake is not None:
                self.wake()

    def _read_logs(self, job: Job, logs: str, final: bool) -> None:
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
        self._progress(job)
        for line in lines:
            match = MARKER.match(line.rstrip("\r\n"))
            if match:
                job.markers[match.group(1)] = match.group(2).strip()
