"""pytest configuration of the course's own tests.

Opt-in exhaustive sweeps (e.g. every mutant graded on every cell of its
notebook) are marked `@pytest.mark.exhaustive` and run only with
`COURSE_EXHAUSTIVE=1` (`make test-all`); `make test` runs a fast sample of
each sweep (see `sweep`), so every kind of check still runs in CI.
"""

from __future__ import annotations

import os

import pytest

EXHAUSTIVE = os.environ.get("COURSE_EXHAUSTIVE", "") == "1"


# Tests that assert how fast something is reported (a deadlock within seconds, a failed rank within 3 s): `make
# test` runs them after the rest, on an otherwise idle machine, never beside another test process (pytest-xdist).
TIMING = {
    "tests/test_dist.py": None,                 # the whole file
    "tests/test_student_messages.py": {"test_a_deadlock_is_reported_within_seconds_with_the_blocked_line"},
    "tests/test_kernel.py": None,
    "tests/test_context_parallel_notebook.py": {"test_deadlocking_ring_is_reported_with_a_hint_within_seconds"},
    "tests/test_composition_notebook.py": {"test_the_hang_is_reported_with_each_rank_line_and_the_grader_goes_on"},
}


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: an opt-in sweep, run with COURSE_EXHAUSTIVE=1 (make test-all)")
    config.addinivalue_line("markers", "timing: asserts a time bound; make test runs it alone, after the rest")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path in TIMING and (TIMING[path] is None or item.originalname in TIMING[path]):
            item.add_marker(pytest.mark.timing)
    if EXHAUSTIVE:
        return
    skip = pytest.mark.skip(reason="exhaustive sweep: run with COURSE_EXHAUSTIVE=1 (make test-all); "
                                   "a sample of it runs in make test")
    for item in items:
        if "exhaustive" in item.keywords:
            item.add_marker(skip)


def sample(values, *, always) -> list:
    """pytest params over `values` (e.g. the assignments): those in `always` run in `make test`, the rest only with
    COURSE_EXHAUSTIVE=1 (for tests whose every case costs a browser page or a whole notebook run)."""
    unknown = set(always) - set(values)
    if unknown:
        raise ValueError(f"sample: {sorted(unknown)} not among {list(values)}")
    return [pytest.param(v, id=str(v), marks=() if v in always else pytest.mark.exhaustive) for v in values]


def sweep(mutants, *, always: set[str]) -> list:
    """pytest params of a mutant sweep: the ones named in `always` run in `make test`, the rest only
    with COURSE_EXHAUSTIVE=1.

        @pytest.mark.parametrize("m", sweep(MUTANTS, always={"average_forgotten"}))
        def test_mutant_fails_exactly_its_cells(m): ...
    """
    names = {m.name for m in mutants}
    unknown = set(always) - names
    if unknown:
        raise ValueError(f"sweep: no mutant named {sorted(unknown)}")
    return [pytest.param(m, id=m.name, marks=() if m.name in always else pytest.mark.exhaustive) for m in mutants]
