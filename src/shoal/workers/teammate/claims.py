"""A teammate's part in its team's task list: a task the lead assigned it, taken; the next
open one claimed when it is idle (the list is read only when its directory changed); and the
task of a turn settled as the turn went: completed, failed (counted, so that a task failing
MAX_TASK_FAILURES times is no longer claimed), or, for a turn cut short, the outcome of its
last command if that had ended, else back to pending with no failure counted.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from shoal.core.errors import ShoalError
from shoal.teams.taskitems import MAX_TASK_FAILURES, TaskItem
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import TurnResult
from shoal.workers.teammate.commands import CommandRecord, settle_from

# The most of a failed turn's result kept as its task's `last_error`.
LAST_ERROR_CHARS: Final = 500


class TaskClaims:
    """The tasks teammate `name` takes from `tasks`, whose files are in `directory`."""

    def __init__(self, tasks: TaskList, name: str, directory: Path) -> None:
        self.tasks = tasks
        self.name = name
        self.directory = directory
        self._mtime = -1.0  # the directory's as last read with nothing to claim

    def take_assigned(self, task_id: int) -> TaskItem | None:
        """Claim task `task_id`, assigned by the lead; None when it is done already (e.g.
        claimed from the list before the assignment came); a ShoalError when it cannot."""
        with contextlib.suppress(ShoalError):
            if self.tasks.get(task_id).status == "completed":
                return None
        return self.tasks.claim(task_id, self.name, check_busy=False)

    def claim_next(self) -> TaskItem | None:
        """The next open task, claimed; None when there is none (or the list has not changed
        since there was none)."""
        try:
            mtime = os.stat(self.directory).st_mtime
        except FileNotFoundError:
            return None
        if mtime == self._mtime:
            return None
        if not any(n.endswith(".json") for n in os.listdir(self.directory)):
            self._mtime = mtime  # an empty list: nothing to lock and read
            return None
        item = None
        with contextlib.suppress(ShoalError):
            item = self.tasks.claim_next(self.name, max_failures=MAX_TASK_FAILURES)
        if item is None:
            self._mtime = mtime
        return item

    def settle(
        self, task_id: int, result: TurnResult, cut_short: bool, commands: list[CommandRecord]
    ) -> None:
        """Settle the task of a turn that ended with `result`; `cut_short`: the turn was (the
        teammate stopping, its pane gone), `commands`: the turn's commands."""
        with contextlib.suppress(ShoalError):
            if result.ok:
                self.tasks.update(task_id, status="completed")
            elif cut_short:  # (not the task's failure)
                self._settle_cut_short(task_id, commands)
            else:  # (only while it is still this teammate's: a failure is counted once)
                error = result.result[-LAST_ERROR_CHARS:]
                self.tasks.settle_claim(task_id, self.name, completed=False, error=error)

    def _settle_cut_short(self, task_id: int, commands: list[CommandRecord]) -> None:
        """If the task's last command had already ended on its own, the task takes that
        command's outcome, as when the leader settles a dead teammate: a finished task must
        not go back to the list and run a second time. Otherwise it goes back to pending."""
        last = next((r for r in reversed(commands) if r.task_id == task_id), None)
        settled = (
            last is not None
            and not last.group_alive()  # (killed with the turn, or it had ended)
            and settle_from(self.tasks, task_id, self.name, last) is not None
        )
        if not settled:
            self.tasks.settle_claim(task_id, self.name, completed=False)
