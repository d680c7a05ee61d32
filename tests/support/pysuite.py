"""A generated pytest suite to run through `shoal run` as CI runs a real one: a few hundred
tests across files, sharded by its conftest, some chosen to fail or to be flaky.

The conftest (not the tests) decides: `SUITE_SHARD` / `SUITE_SHARDS` keep one shard's tests
(by a hash of the node id, as pytest-shard does), `SUITE_FAIL` names tests that fail every
time and `SUITE_FLAKY` tests that fail on a task's first attempt only (`SHOAL_RUN_ATTEMPT`),
both as comma-separated node ids. A chosen test fails by its own assertion, in its own file,
so a report's trace names the test's file and line as a real failure's does.

`python -m tests.support.pysuite DIR [FILES [TESTS_PER_FILE]]` writes one (for the bench).
"""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MARK: Final = "suite_chosen_to_fail"

CONFTEST: Final = f'''"""Shards the suite and marks the tests chosen to fail."""

import os
import zlib


def _names(var):
    return {{name for name in os.environ.get(var, "").split(",") if name}}


def pytest_collection_modifyitems(config, items):
    shard = int(os.environ.get("SUITE_SHARD", "1"))
    shards = int(os.environ.get("SUITE_SHARDS", "1"))
    keep, drop = [], []
    for item in items:
        mine = zlib.crc32(item.nodeid.encode()) % shards == shard - 1
        (keep if mine else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    first = os.environ.get("SHOAL_RUN_ATTEMPT", "1") == "1"
    fail, flaky = _names("SUITE_FAIL"), _names("SUITE_FLAKY")
    for item in keep:
        if item.nodeid in fail or (first and item.nodeid in flaky):
            item.add_marker("{MARK}")
'''

PYTEST_INI: Final = f"""[pytest]
markers =
    {MARK}: the conftest chose this test to fail
"""

TEST: Final = """

def test_{n:04d}(request):
    value = {n} * 2
    assert request.node.get_closest_marker("{mark}") is None, "chosen to fail"
    assert value // 2 == {n}
"""


@dataclass(frozen=True)
class Suite:
    """A generated suite: its directory and every test's node id, in file order."""

    root: Path
    node_ids: tuple[str, ...]

    def shard_of(self, node_id: str, shards: int) -> int:
        """The shard (1-based) that runs `node_id`, as the conftest splits them."""
        return zlib.crc32(node_id.encode()) % shards + 1

    def in_shard(self, shard: int, shards: int) -> list[str]:
        """The node ids shard `shard` of `shards` runs."""
        return [n for n in self.node_ids if self.shard_of(n, shards) == shard]


def write_suite(root: Path, files: int = 10, per_file: int = 30) -> Suite:
    """Write the suite into `root` (its own rootdir: pytest.ini, conftest.py, test files)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    (root / "conftest.py").write_text(CONFTEST)
    ids: list[str] = []
    number = 0
    for f in range(files):
        name = f"test_mod_{f:02d}.py"
        body = ['"""A generated test module."""']
        for _ in range(per_file):
            body.append(TEST.format(n=number, mark=MARK))
            ids.append(f"{name}::test_{number:04d}")
            number += 1
        (root / name).write_text("".join(body))
    return Suite(root, tuple(ids))


if __name__ == "__main__":
    args = sys.argv[1:]
    suite = write_suite(
        Path(args[0]),
        int(args[1]) if len(args) > 1 else 10,
        int(args[2]) if len(args) > 2 else 30,
    )
    print(f"{len(suite.node_ids)} tests in {suite.root}")
