"""Write sets and leases: which globs are accepted, which overlap (erring towards yes), and
the lease file's acquire/release with fencing numbers and dead holders dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.core.errors import UsageError
from shoal.core.writeset import check_write_set, covers, overlaps
from shoal.workers.agent.coordinator.leases import Leases


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ([], "non-empty list"),
        ("src/*.py", "non-empty list"),
        ([3], "not a glob"),
        ([""], "not a glob"),
        (["/etc/passwd"], "is absolute"),
        (["~/x"], "is absolute"),
        (["../x/*"], "leads outside the working directory"),
        (["a/../../b"], "leads outside the working directory"),
        (["a/../b"], "has '..'"),
        (["."], "names the working directory itself"),
    ],
)
def test_bad_write_sets_are_refused_with_the_reason(bad: object, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        check_write_set(bad)


def test_a_write_set_is_normalised() -> None:
    assert check_write_set(["./src//*.py", "src/*.py", "docs\\\\a.md"]) == ("src/*.py", "docs/a.md")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (["src/*.py"], ["src/calc.py"], True),
        (["src/*.py"], ["src/a*"], True),  # src/a.py is in both
        (["src/**"], ["src/x/y.py"], True),
        (["**/*.md"], ["docs/a.md"], True),
        (["src/a.py"], ["src/b.py"], False),
        (["docs/*"], ["src/*"], False),
        (["src/*.py"], ["src/*.md"], False),
        (["a/b"], ["a"], False),
        (["src/{a,b}.py"], ["src/b.py"], True),
        (["{src/a,b}/x.py"], ["src/a/x.py"], True),  # (a brace holding a slash)
        (["{src/a,b}/x.py"], ["src/c/x.py"], False),
    ],
)
def test_overlaps(a: list[str], b: list[str], expected: bool) -> None:
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected


def test_covers_matches_at_any_depth_only_with_globstar() -> None:
    assert covers(["src/**/*.py"], "src/x/y/a.py")
    assert not covers(["src/*.py"], "src/x/a.py")
    assert covers(["src/*.py"], "src/.hidden.py")


def test_leases_fence_wait_and_release(tmp_path: Path) -> None:
    leases = Leases(tmp_path)
    alive = {"a1", "a2", "a3"}
    first, holder = leases.acquire("a1", ["src/*.py"], str(tmp_path), alive.__contains__)
    assert first is not None and holder is None and first["fence"] == 1
    second, holder = leases.acquire("a2", ["src/calc.py"], str(tmp_path), alive.__contains__)
    assert second is None and holder == "a1"
    other, _ = leases.acquire("a3", ["docs/**"], str(tmp_path), alive.__contains__)
    assert other is not None and other["fence"] == 2
    # The same globs from a nested working directory are the same files.
    nested, holder = leases.acquire("a2", ["calc.py"], str(tmp_path / "src"), alive.__contains__)
    assert nested is None and holder == "a1"
    assert leases.release("a1") and not leases.release("a1")
    second, _ = leases.acquire("a2", ["src/calc.py"], str(tmp_path), alive.__contains__)
    assert second is not None and second["fence"] == 3  # never reused
    alive.discard("a3")  # its task ended without a release: dropped at the next acquire
    again, holder = leases.acquire("a4", ["docs/x.md"], str(tmp_path), lambda h: h in alive)
    assert again is not None and holder is None
    assert set(leases.held()) == {"a2", "a4"}


def test_a_cwd_reached_through_a_link_is_the_same_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    leases = Leases(tmp_path)
    mine, _ = leases.acquire("a1", ["x.py"], str(real), lambda h: True)
    other, holder = leases.acquire("a2", ["x.py"], str(tmp_path / "link"), lambda h: True)
    assert mine is not None and other is None and holder == "a1"
