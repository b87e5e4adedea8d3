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


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: an opt-in sweep, run with COURSE_EXHAUSTIVE=1 (make test-all)")


def pytest_collection_modifyitems(config, items):
    if EXHAUSTIVE:
        return
    skip = pytest.mark.skip(reason="exhaustive sweep: run with COURSE_EXHAUSTIVE=1 (make test-all); "
                                   "a sample of it runs in make test")
    for item in items:
        if "exhaustive" in item.keywords:
            item.add_marker(skip)


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
