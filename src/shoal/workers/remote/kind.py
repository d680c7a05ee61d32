"""`remote_agent` tasks: work that runs as a Ray Job on a cluster, polled by the leader.

A remote task is submitted with `submission_id` = its task id (a continuation of an ultraplan
gets `{id}-2`, `{id}-3`...), its working directory packed from the git work tree (packing.py)
and uploaded once per content. Every poll is a call chain on a thread pool (calls.py) that
reads the job's status and its log; the completion checker of the task's remote type
(verdicts.py) turns status and markers into the task's next state, which this kind applies on
the loop's thread. A sidecar file (sidecar.py) lets a resumed leader re-attach to running jobs
by id; a task that had ended is never revived.

Secrets: a job's environment is what `--env` names, never the leader's keys by default; the
values of `--env` live in this kind's memory only (the task's record names them), so a job
not yet submitted when its leader restarts cannot be, and says which `--env` it needs again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import ShoalError, UsageError
from shoal.core.events import task_started, task_terminated
from shoal.core.secretenv import is_secret
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    RemoteAgentTaskState,
    TaskStatus,
    TaskType,
)
from shoal.workers.kinds import Poll, TaskStore
from shoal.workers.remote.calls import CallChains, Job
from shoal.workers.remote.ray_jobs import JobExists, RayError, RayJobs, RayUnreachable
from shoal.workers.remote.sidecar import (
    SIDECAR_DIR,
    Sidecars,
    cut_output,
    read_sidecar,
    sidecar_path,
)
from shoal.workers.remote.spec import AGENT_TYPES, RemoteError, RemoteSpec, entrypoint, first_line
from shoal.workers.remote.verdicts import Verdict, checker_for, todo_of

UNREACHABLE_ENV: Final = "SHOAL_RAY_UNREACHABLE_S"
UNREACHABLE_S: Final = 30.0
"""A cluster that answers no poll for this long fails its tasks (a stop: kills them)."""
LOG_KEEP: Final = 20  # status changes kept in a record's `log`
# What a job's environment gets of the leader's, for an agent type: the model providers'
# settings, never their keys (a key reaches a job only when named with --env).
MODEL_ENV: Final = ("SHOAL_MODEL", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL")


class RemoteKind:
    """The TaskKind of `remote_agent` tasks (Ray Jobs)."""

    types = frozenset({TaskType.REMOTE_AGENT})

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self.jobs: dict[str, Job] = {}
        self._clients: dict[str, RayJobs] = {}
        self._sidecars = Sidecars()
        self._calls = CallChains(self._sidecars)
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
        self._calls.wake = store.wake
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
        self._sidecars.write(current if isinstance(current, RemoteAgentTaskState) else task)
        store.emit(task_started(store.get(task.id) or task))
        self._calls.schedule(job)

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        if what is not Poll.REAP:
            return
        self._calls.wake = store.wake
        self._sidecars.sweep(store.output_file("-").parent.parent / SIDECAR_DIR, store)
        self._sidecars.drop(store)
        done = self._calls.take_done()
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
                self._calls.schedule(job)

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
            self._sidecars.record_end(task.id, TaskStatus.KILLED, changes)
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
                self._calls.schedule(job)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """Re-attach to a running job by its id (the poll clock restarts now); a task that had
        ended is never revived (its sidecar says how it ended when the session's state had not
        been written since), and one whose sidecar is gone cannot be re-attached. Lines the
        output file got after the sidecar's last offset are cut: they are read again."""
        assert isinstance(task, RemoteAgentTaskState)
        self._calls.wake = store.wake
        if task.is_terminal:
            self._sidecars.ended(task.id)
            return
        if task.status == TaskStatus.PENDING:
            return
        record = read_sidecar(task)
        ended = record.get("ended")
        if isinstance(ended, dict) and ended.get("status") in {s.value for s in TaskStatus}:
            self._sidecars.known(task, record)
            self._sidecars.ended(task.id)
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
        self._sidecars.known(task, record)
        job.offset = int(record.get("log_offset") or 0)
        cut_output(job.output, record.get("output_size"))
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
            self._calls.schedule(job)

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
        done = self._calls.done()
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
        self._calls.close()
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
            self._sidecars.record_end(task.id, TaskStatus.COMPLETED, changes)
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
        self._sidecars.write(current)
        self._calls.schedule(job)
        return current

    # -- applying results (the loop's thread) -------------------------------------------

    def _apply(self, job: Job, task: RemoteAgentTaskState, store: TaskStore) -> None:
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
            changes["log"] = _logged(task, info.status.lower(), first_line(info.message))
        checker = checker_for(task.remote_task_type)
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
        job: Job,
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
        job: Job,
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
        self._sidecars.record_end(task.id, status, changes)
        store.move_task(task.id, status, **changes)
        if status == TaskStatus.KILLED and job.stop_reason == STOPPED_ON_REQUEST:
            store.mark_notified(task.id)  # a stop the user asked for is not news (as shells)
            final = store.get(task.id)
            if final is not None:
                store.emit(task_terminated(final))

    def _check_timeout(self, job: Job, store: TaskStore) -> None:
        task = store.get(job.task_id)
        if not isinstance(task, RemoteAgentTaskState) or job.stop_reason or job.waiting:
            return
        limit = (task.remote_task_metadata or {}).get("timeout_s")
        if limit and not task.is_long_running and time.time() - task.poll_started_at > limit:
            self.kill(task, store, f"timed out after {limit:g}s")

    # -- helpers ---------------------------------------------------------------------------

    def _job_for(self, task: RemoteAgentTaskState, store: TaskStore, *, submitted: bool) -> Job:
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
        return Job(
            task_id=task.id,
            client=client,
            submission_id=task.session_id or task.id,
            entrypoint=str(meta.get("entrypoint") or ""),
            runtime_env=runtime_env,
            num_cpus=meta.get("num_cpus"),
            num_gpus=meta.get("num_gpus"),
            resources=dict(meta.get("resources") or {}),
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
