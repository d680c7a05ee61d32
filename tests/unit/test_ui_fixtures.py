"""A fixture team for the UI tests: real team, status, state and output files, every task kind.

`build_swarm` writes them with the real models under a test's SHOAL_HOME. Members that should
look alive carry this test process's pid and start time; the others are dead or departed.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from shoal.core.paths import Layout
from shoal.core.procs import current_identity
from shoal.core.taskrecords import (
    AgentProgress,
    DreamTurn,
    ShellResult,
    TeammateIdentity,
    ToolActivity,
)
from shoal.core.tasks import (
    DreamTaskState,
    InProcessTeammateTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    LocalWorkflowTaskState,
    MonitorMcpTaskState,
    RemoteAgentTaskState,
    TaskStatus,
)
from shoal.teams.session import Session, SessionState
from shoal.teams.store import Teams

TEAM = "demo"
SESSION = "01fixturesession"
T0 = 1_900_000_000.0
"""Start times of the fixture (after any real join time, so the lead sorts first)."""
NOW = T0 + 100.0

TASK_IDS = {
    "shell": "bshell001",
    "failed": "bfailed01",
    "monitor": "bmonitor1",
    "agent": "aagent001",
    "remote": "rremote01",
    "teammate": "tteammat1",
    "dream": "ddream001",
    "workflow": "wworkflo1",
    "mcp": "mmcpmon01",
}


def build_swarm(layout: Layout, team: str = TEAM) -> Session:
    """Write the fixture team (lead, alice, bob, carol, dave) and its session; returns it."""
    teams = Teams(layout)
    teams.create(team)
    me, started = current_identity()
    teams.update_member(team, "team-lead", pid=me, pid_started_at=started)
    teams.join(team, "alice", pid=me, pid_started_at=started, agent_type="researcher")
    teams.join(team, "bob", pid=me, pid_started_at=started, plan_mode_required=True)
    teams.join(team, "carol")  # no pid: dead
    teams.join(team, "dave", pid=me, pid_started_at=started)
    teams.leave(team, "dave")
    teams.update_member(team, "alice", color="red")
    teams.write_status(team, "team-lead", {"started_at": T0})
    teams.write_status(
        team,
        "alice",
        {
            "state": "busy",
            "activity": "Reading src/auth.py",
            "recent_activities": ["Grep 'login'", "Reading src/auth.py"],
            "awaiting_approval": False,
            "current_task": 3,
            "progress": {"tool_use_count": 7, "token_count": 1200, "summary": "mapping auth"},
            "messages": [
                {
                    "from": "team-lead",
                    "kind": "text",
                    "text": "look at the login flow",
                    "sent_at": "2030-03-17T17:46:41.000000Z",
                }
            ],
            "prompt": "Map the auth module",
            "watcher": "inotify",
            "started_at": T0 + 1,
        },
    )
    teams.write_status(
        team, "bob", {"state": "idle", "awaiting_approval": True, "started_at": T0 + 2}
    )
    teams.write_status(team, "carol", {"state": "busy", "started_at": T0 + 3})
    teams.write_status(team, "dave", {"state": "idle", "started_at": T0 + 4})

    session = Session(layout, SESSION).ensure()
    teams.update(team, lambda t: t.model_copy(update={"lead_session_id": SESSION}))

    def out(task_id: str) -> str:
        return str(session.output_file(task_id))

    Path(out(TASK_IDS["shell"])).write_text("compiling\nline 2\nline 3\n")
    tasks = [
        LocalShellTaskState(
            id=TASK_IDS["shell"],
            description="make test",
            command="make test",
            cwd="/src",
            status=TaskStatus.RUNNING,
            start_time=T0 + 10,
            output_file=out(TASK_IDS["shell"]),
        ),
        LocalShellTaskState(
            id=TASK_IDS["failed"],
            description="lint",
            command="ruff check",
            status=TaskStatus.FAILED,
            result=ShellResult(code=2),
            start_time=T0 + 11,
            end_time=T0 + 15,
            output_file=out(TASK_IDS["failed"]),
        ),
        LocalShellTaskState(
            id=TASK_IDS["monitor"],
            description="tail the log",
            command="tail -f app.log",
            kind="monitor",
            status=TaskStatus.RUNNING,
            start_time=T0 + 12,
            output_file=out(TASK_IDS["monitor"]),
        ),
        LocalAgentTaskState(
            id=TASK_IDS["agent"],
            description="find flaky tests",
            agent_id="frank@demo",
            agent_type="researcher",
            prompt="Find flaky tests",
            status=TaskStatus.RUNNING,
            progress=AgentProgress(
                tool_use_count=4,
                token_count=900,
                last_activity=ToolActivity(tool_name="Grep", description="Grep flaky"),
                recent_activities=(ToolActivity(tool_name="Grep", description="Grep flaky"),),
            ),
            messages=({"from": "team-lead", "text": "also check retries"},),
            start_time=T0 + 13,
            output_file=out(TASK_IDS["agent"]),
        ),
        RemoteAgentTaskState(
            id=TASK_IDS["remote"],
            description="plan the migration",
            title="Plan the migration",
            remote_task_type="ultraplan",
            is_ultraplan=True,
            ultraplan_phase="needs_input",
            session_id="remote-s1",
            todo_list=({"content": "read schema", "status": "completed"},),
            status=TaskStatus.RUNNING,
            start_time=T0 + 14,
            output_file=out(TASK_IDS["remote"]),
        ),
        InProcessTeammateTaskState(
            id=TASK_IDS["teammate"],
            description="erin: write docs",
            identity=TeammateIdentity(
                agent_id="erin@demo",
                agent_name="erin",
                team_name=team,
                parent_session_id=SESSION,
            ),
            prompt="Write the docs",
            progress=AgentProgress(
                last_activity=ToolActivity(tool_name="Edit", description="Editing docs/ui.md")
            ),
            status=TaskStatus.RUNNING,
            start_time=T0 + 15,
            output_file=out(TASK_IDS["teammate"]),
        ),
        DreamTaskState(
            id=TASK_IDS["dream"],
            description="consolidating memory",
            phase="updating",
            sessions_reviewing=3,
            files_touched=("notes/memory.md",),
            turns=(DreamTurn(text="merged two notes", tool_use_count=2),),
            status=TaskStatus.RUNNING,
            start_time=T0 + 16,
            output_file=out(TASK_IDS["dream"]),
        ),
        LocalWorkflowTaskState(
            id=TASK_IDS["workflow"],
            description="release",
            workflow="release",
            total_steps=5,
            completed_steps=2,
            current_step="build",
            status=TaskStatus.RUNNING,
            start_time=T0 + 17,
            output_file=out(TASK_IDS["workflow"]),
        ),
        MonitorMcpTaskState(
            id=TASK_IDS["mcp"],
            description="watch PRs",
            server_name="github",
            target="org/repo",
            event_count=12,
            status=TaskStatus.RUNNING,
            start_time=T0 + 18,
            output_file=out(TASK_IDS["mcp"]),
        ),
    ]
    session.write_state(
        SessionState(
            session_id=SESSION,
            team=team,
            created_at=T0,
            updated_at=T0,
            tasks={t.id: t for t in tasks},
        )
    )
    return session


def evict(session: Session, task_id: str) -> None:
    """Move a finished task from state.json into history.jsonl, as the leader does."""
    state = session.read_state()
    session.record_history(state.tasks[task_id])
    session.close()
    tasks = {k: v for k, v in state.tasks.items() if k != task_id}
    session.write_state(state.model_copy(update={"tasks": tasks}))


def add_history(session: Session, count: int, first: int = 0) -> list[str]:
    """Append `count` finished shells to the session's history (task i started at T0 + 20 + i
    and ended a second later); their ids, oldest first."""
    ids = []
    for i in range(first, first + count):
        task = LocalShellTaskState(
            id=f"bhist{i:04d}",
            description=f"job {i}",
            command=f"job {i}",
            status=TaskStatus.COMPLETED,
            result=ShellResult(code=0),
            start_time=T0 + 20 + i,
            end_time=T0 + 21 + i,
            output_file=str(session.output_file(f"bhist{i:04d}")),
        )
        session.record_history(task)
        ids.append(task.id)
    session.close()
    return ids


def add_plan_request(session: Session, member: str, request_id: str, plan: str) -> None:
    """Record a plan_approval_request from `member` in the lead's events, as the leader does."""
    message = {
        "v": 1,
        "id": f"01plan{request_id}",
        "from": member,
        "to": "team-lead",
        "kind": "plan_approval_request",
        "sent_at": "2030-03-17T17:46:41.000000Z",
        "text": None,
        "summary": None,
        "reply_to": None,
        "data": {"request_id": request_id, "plan": plan},
    }
    with open(session.events_file, "ab") as fh:
        fh.write(orjson.dumps({"type": "message", "message": message, "ts": T0 + 50}) + b"\n")


def test_fixture_state_is_valid(tmp_path: Path) -> None:
    session = build_swarm(Layout(tmp_path))
    state = session.read_state()
    assert sorted(state.tasks) == sorted(TASK_IDS.values())
