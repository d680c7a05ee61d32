"""`shoal run` as GNU parallel is used: a plain commands file (one command per line) and
`shoal run -- COMMAND ::: ARGS`, with --joblog, --halt (parallel's short form too),
--timeout and --retries on the command line."""

from __future__ import annotations

from pathlib import Path

from shoal.core.errors import EXIT_USAGE
from tests.conftest import Cli
from tests.integration.test_run import FAST


def joblog(path: Path) -> list[list[str]]:
    """The joblog's rows past its header, as fields."""
    head, *rows = path.read_text().splitlines()
    assert head.split("\t")[0] == "Seq"
    return [row.split("\t") for row in rows]


def test_a_commands_file_runs_each_line_with_joblog_retries_and_timeout(
    cli: Cli, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs"
    jobs.write_text(f"echo one > {tmp_path}/one\n# not a command\n\nexit 3\nsleep 30\n")
    log = tmp_path / "joblog.tsv"
    out = cli(
        "run", str(jobs), "--joblog", str(log), "--retries", "1", "--timeout", "1.5s",
        env=FAST,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert (tmp_path / "one").read_text() == "one\n"
    rows = joblog(log)
    by_seq: dict[str, list[list[str]]] = {}
    for row in rows:
        by_seq.setdefault(row[0], []).append(row)
    assert sorted(by_seq) == ["1", "2", "3"]
    assert [r[6] for r in by_seq["1"]] == ["0"]
    assert [r[6] for r in by_seq["2"]] == ["3", "3"]  # (retried once)
    assert by_seq["2"][0][-1] == "exit 3"
    assert len(by_seq["3"]) == 2  # (timed out twice)
    assert "timed out" in out.stdout or "timeout" in out.stdout


def test_args_after_three_colons_are_jobs_and_halt_2_stops_at_the_first_failure(
    cli: Cli, tmp_path: Path
) -> None:
    out = cli(
        "run", "-j", "1", "--", "printf", "%s-%s\\n", "{2}", "{1}", ":::", "a", "b",
        ":::", "x", "y", env=FAST,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok: all 4 task(s) succeeded" in out.stdout
    log = tmp_path / "halted.tsv"
    halted = cli(
        "run", "-j", "1", "--halt", "2", "--joblog", str(log), "--",
        "test", "{}", "!=", "bad", ":::", "good", "bad", "later", env=FAST,
    )  # fmt: skip
    assert halted.returncode == 1, halted.stdout + halted.stderr
    assert "halt now,fail=1" in halted.stdout
    assert [row[-1] for row in joblog(log)] == ["test good != bad", "test bad != bad"]


def test_command_line_timeout_and_retries_are_not_for_a_toml_spec(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('[[task]]\nid = "a"\nrun = "true"\n')
    out = cli("run", str(spec), "--retries", "2")
    assert out.returncode == EXIT_USAGE and "[run]" in out.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n# nothing\n")
    out = cli("run", str(empty))
    assert out.returncode == EXIT_USAGE and "no commands in it" in out.stderr
    two = cli("run", str(spec), str(empty))
    assert two.returncode == EXIT_USAGE and "-- COMMAND ::: ARGS" in two.stderr
