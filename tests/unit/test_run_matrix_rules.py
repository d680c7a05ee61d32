"""A matrix's `include` and `exclude`, and the timeout and retries of one combination."""

from __future__ import annotations

import pytest

from tests.unit.test_run_spec import errors_of, spec_of

RULES = """
[[task]]
id = "unit"
run = "tox -e py{py} -- --shard={shard}"
timeout = "5m"
retries = 0

[task.matrix]
py = ["3.11", "3.12"]
shard = [1, 2]
exclude = [{ py = "3.11", shard = 2 }]
include = [
    { py = "3.13", shard = 1, timeout = "20m" },
    { py = "3.12", retries = 2 },
    { py = "3.11", shard = 1, timeout = "1m" },
]
"""


def test_include_and_exclude_shape_the_combinations_and_their_settings() -> None:
    spec = spec_of(RULES)
    got = {t.id: (t.run, t.timeout, t.retries) for t in spec.tasks}
    assert got == {
        "unit[py=3.11,shard=1]": ("tox -e py3.11 -- --shard=1", 60.0, 0),
        "unit[py=3.12,shard=1]": ("tox -e py3.12 -- --shard=1", 300.0, 2),
        "unit[py=3.12,shard=2]": ("tox -e py3.12 -- --shard=2", 300.0, 2),
        "unit[py=3.13,shard=1]": ("tox -e py3.13 -- --shard=1", 1200.0, 0),
    }
    assert [t.seq for t in spec.tasks] == [1, 2, 3, 4]
    assert spec.task("unit[py=3.13,shard=1]").matrix == {"py": "3.13", "shard": "1"}


@pytest.mark.parametrize(
    ("rules", "fragment"),
    [
        ('exclude = [{ py = "3.10" }]', 'exclude: py = "3.10" is not one of its values'),
        ('exclude = [{ pyy = "3.11" }]', 'unknown key "pyy" (did you mean "py"?)'),
        ('include = [{ py = "3.13" }]', "matches no combination (to add one, give every key"),
        ('include = [{ py = "3.11", timeout = "soon" }]', 'bad duration "soon"'),
        ('include = [{ py = "3.11", retries = -1 }]', "retries must be a whole number >= 0"),
        ('include = { py = "3.11" }', "matrix.include must be an array of tables"),
        ("include = [{ timeout = 5 }]", "entry names no matrix key"),
        ('exclude = [{ py = "3.11" }, { py = "3.11" }]', "matches no combination"),
    ],
)
def test_bad_rules_are_spec_errors(rules: str, fragment: str) -> None:
    matrix = f'{{ py = ["3.11", "3.12"], n = [1], {rules} }}'
    found = errors_of(f'[[task]]\nid = "t"\nrun = "x {{py}} {{n}}"\nmatrix = {matrix}\n')
    assert any(fragment in e for e in found), found
    # (at the matrix; a combination's bad setting at the task: it is the task's key)
    assert all(e.startswith(("spec.toml:4:", "spec.toml:1:")) for e in found), found
