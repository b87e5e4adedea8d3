"""The tests every assignment's notebook gets, written once: each tests/test_<dim>_notebook.py subclasses
NotebookTests with what is particular to its assignment.

    class TestTensorParallelNotebook(NotebookTests):
        assignment = "02_tensor_parallel"
        must_pass = {"copy_to_identity_backward": {"test_reduce_from_region"}}
        exact_sample = {"copy_to_identity_backward"}

        def readable(self, msg):
            return "rank " in msg

Graded in-process (solutions/submissions.py: `run_graded_cells`, the notebook's
cells run in order in this process, each test cell with its hidden tests):
(a) the reference submission gets full marks (its grading time is printed);
(b) the untouched release fails every graded cell, each naming its exercise and
    the stub that is not done yet;
(c) the mutant table (solutions/<dim>/mutants.py) is consistent: one demo
    mutant, unique names, each `must_fail` a set of graded cells but not all of
    them, empty only for VARIANTS (correct edits), `must_pass` disjoint from
    it, every patch applies exactly once;
(d) every mutant fails each cell of its `must_fail` with a readable message
    (`readable`) and passes its `must_pass` cells (only those cells run); the
    demo mutant earns partial credit (by default it must pass every other cell);
(e) running every cell for a mutant, the failing set is exactly `must_fail`
    (`exact_sample` in `make test`, every mutant with COURSE_EXHAUSTIVE=1);
(f) the builder reproduces the committed source notebook byte for byte;
(g) the visible part of a test cell (what the student runs) already fails on its exercise's mistakes of
    direction, peer and order (`visible_catches`: mutant -> the cells whose visible tests must catch it), so a
    student whose visible tests pass loses points only on cases the visible tests could not contain (bigger
    worlds, other dtypes, edge shapes), never on the same mistake at another size;
(h) with one answer cell left as released (a stub) and every other one solved, every cell that fails names
    that cell's exercise (a test of another exercise that uses it too: "Exercise 3 is not done yet: ...";
    `stub_sample` in `make test`, every answer cell with COURSE_EXHAUSTIVE=1).
The release notebook's leak check is tests/test_release.py's, real nbgrader's run tests/test_pipeline.py's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import tempfile
import time

import nbformat
import pytest
from conftest import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from autograder.grading.trusted import _split_hidden  # noqa: E402 - the release's test cell: the visible part
from solutions.submissions import (  # noqa: E402
    mutant_submission, mutants_of, notebook_path, reference_submission, run_graded_cells, untouched_submission,
)


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def answer_cells(assignment: str) -> list[tuple[str, str]]:
    """(grade id, "Exercise N") of each answer cell of the source notebook, in order."""
    source = nbformat.read(notebook_path("source", assignment), as_version=4)
    out, label = [], None
    for cell in source.cells:
        if cell.cell_type == "markdown":
            found = re.findall(r"^#+\s*(Exercise\s+\d+)\b", cell.source, re.M)
            label = found[-1] if found else label
        elif nbgrader_meta(cell).get("solution"):
            out.append((nbgrader_meta(cell)["grade_id"], label))
    return out


def graded_ids(assignment: str) -> list[str]:
    """The grade ids of the source notebook's graded cells, in order."""
    source = nbformat.read(notebook_path("source", assignment), as_version=4)
    return [nbgrader_meta(c)["grade_id"] for c in source.cells if nbgrader_meta(c).get("grade")]


class NotebookTests:
    """Subclass as `Test<Dim>Notebook` (pytest collects the subclass, not this base); set the attributes."""

    assignment: str = ""
    # mutant name -> graded cells it must still pass (partial credit: its failure stays with its behaviour);
    # the demo mutant without an entry must pass every cell outside its must_fail
    must_pass: dict[str, set[str]] = {}
    # mutants whose whole-notebook sweep runs in `make test` (the others with COURSE_EXHAUSTIVE=1)
    exact_sample: set[str] = set()
    # mutants whose test_mutant_is_caught runs only with COURSE_EXHAUSTIVE=1 (a hang, a timeout per cell)
    slow_to_catch: set[str] = set()
    # the sweep runs the graded cells only (not the scratch and picture cells between them)
    sweep_graded_cells_only: bool = False
    # answer cells whose "one stub, the rest solved" run is in `make test` (all of them with COURSE_EXHAUSTIVE=1)
    stub_sample: set[str] = set()
    # mutants of direction, peer or order -> the graded cells whose VISIBLE part must fail on them
    visible_catches: dict[str, set[str]] = {}

    # -- what each assignment says ------------------------------------------------------------------------
    def readable(self, msg: str) -> bool:
        """Whether a mutant's failure message says what is wrong (which rank, tensor, stage, ...)."""
        raise NotImplementedError(f"{type(self).__name__} must say what a readable failure message is")

    def cells_to_check(self, m) -> set[str]:
        """The cells of m.must_fail that test_mutant_is_caught runs (all of them unless an assignment says)."""
        return set(m.must_fail)

    # -- helpers ---------------------------------------------------------------------------------------------
    @property
    def mutants(self) -> list:
        return mutants_of(self.assignment)

    @property
    def variants(self) -> list:
        """Correct edits kept beside the mutants (in MUTANTS too, with an empty must_fail)."""
        dim = self.assignment.split("_", 1)[1]
        return list(getattr(importlib.import_module(f"solutions.{dim}.mutants"), "VARIANTS", []))

    def must_pass_of(self, m) -> set[str]:
        if m.name in self.must_pass:
            return set(self.must_pass[m.name])
        if m.demo:
            return set(graded_ids(self.assignment)) - set(m.must_fail)
        return set()

    def pytest_generate_tests(self, metafunc):
        if "m" not in metafunc.fixturenames:
            pass
        elif metafunc.function.__name__ == "test_mutant_is_caught":
            wrong = [m for m in self.mutants if m.must_fail]
            metafunc.parametrize("m", [pytest.param(m, id=m.name, marks=pytest.mark.exhaustive
                                                    if m.name in self.slow_to_catch else ()) for m in wrong])
        elif metafunc.function.__name__ == "test_mutant_fails_exactly_its_cells":
            metafunc.parametrize("m", sweep(self.mutants, always=self.exact_sample))
        if "visible_case" in metafunc.fixturenames:
            by_name = {m.name: m for m in self.mutants}
            metafunc.parametrize("visible_case", [
                pytest.param((by_name[name], cells), id=name,
                             marks=pytest.mark.exhaustive if name in self.slow_to_catch else ())
                for name, cells in self.visible_catches.items()])
        if "answer" in metafunc.fixturenames:
            cells = answer_cells(self.assignment)
            unknown = self.stub_sample - {gid for gid, _ in cells}
            assert not unknown, f"stub_sample names no answer cell: {unknown}"
            metafunc.parametrize("answer", [pytest.param((gid, label), id=gid, marks=() if gid in self.stub_sample
                                                         else pytest.mark.exhaustive) for gid, label in cells])

    # -- the tests -------------------------------------------------------------------------------------------
    # make test-all only: in make test the demo grades every reference 100/100 through the real pipeline
    # (tests/test_pipeline.py), and each sampled mutant's exact set of failing cells needs the others to pass
    @pytest.mark.exhaustive
    def test_reference_gets_full_marks(self):
        import matplotlib.pyplot  # noqa: F401 - imports are paid once per kernel; time the cells themselves

        dim = self.assignment.split("_", 1)[1]
        importlib.import_module(f"autograder.checks.{dim}")  # the package imports every module of its checks
        t0 = time.perf_counter()
        results = run_graded_cells(reference_submission(self.assignment), self.assignment)
        elapsed = time.perf_counter() - t0
        total = sum(v.points for v in results.values())
        print(f"\n{self.assignment}: reference graded in-process in {elapsed:.1f} s ({total:g} points, "
              f"the pictures included)")
        failed = {k: v.message for k, v in results.items() if not v.passed}
        assert not failed, failed
        assert set(results) == set(graded_ids(self.assignment))
        assert total == 100, total
        # the time is printed, not asserted: benchmarks/runner_overhead.py measures it

    def test_untouched_release_fails_every_cell_naming_its_exercise_and_stub(self):
        results = run_graded_cells(untouched_submission(self.assignment), self.assignment)
        assert set(results) == set(graded_ids(self.assignment))
        passed = [k for k, v in results.items() if v.passed]
        assert not passed, f"cells passing on the stubs: {passed}"
        for k, v in results.items():
            assert v.message.startswith("NotImplementedError") and re.search(r"Exercise \d+ is not done yet", v.message) \
                and "is still the stub" in v.message, (k, v.message[:400])

    def test_mutant_table_is_consistent(self):
        graded = set(graded_ids(self.assignment))
        names = [m.name for m in self.mutants]
        assert len(names) == len(set(names)), "mutant names must be unique"
        assert sum(m.demo for m in self.mutants) == 1, "exactly one mutant is the demo's wrong submission"
        variants = {v.name for v in self.variants}
        assert variants <= set(names), "VARIANTS are part of MUTANTS (every sweep grades them too)"
        for m in self.mutants:
            assert m.must_fail <= graded, (m.name, m.must_fail - graded)
            assert m.must_fail != graded, f"{m.name} fails every cell: not a plausible partial mistake"
            assert bool(m.must_fail) == (m.name not in variants), f"{m.name}: only a VARIANT fails nothing"
            assert self.must_pass_of(m).isdisjoint(m.must_fail), m.name
            mutant_submission(self.assignment, m)  # every patch applies exactly once
        assert set(self.must_pass) <= set(names), set(self.must_pass) - set(names)
        assert self.exact_sample | self.slow_to_catch <= set(names)

    def test_mutant_is_caught(self, m):
        must_pass = self.must_pass_of(m)
        check = self.cells_to_check(m)
        t0 = time.perf_counter()
        results = run_graded_cells(mutant_submission(self.assignment, m), self.assignment, only=check | must_pass)
        elapsed = time.perf_counter() - t0
        for gid in sorted(check):
            ok, msg = results[gid].passed, results[gid].message
            assert not ok, f"mutant {m.name} ({m.why}) passed {gid}"
            assert self.readable(msg), f"mutant {m.name}: {gid} failed with an unclear message:\n{msg[:800]}"
        for gid in sorted(must_pass):
            ok, msg = results[gid].passed, results[gid].message
            assert ok, f"mutant {m.name} should still pass {gid}: {msg[:800]}"
        if m.demo:
            assert must_pass, "the demo mutant must earn partial credit"
        print(f"\n{m.name}: {len(check)} failing + {len(must_pass)} passing cell(s) graded in {elapsed:.1f} s")

    def test_mutant_fails_exactly_its_cells(self, m):
        """Every cell per mutant: the failing cells are exactly `must_fail` (every mutant: COURSE_EXHAUSTIVE=1)."""
        only = set(graded_ids(self.assignment)) if self.sweep_graded_cells_only else None
        results = run_graded_cells(mutant_submission(self.assignment, m), self.assignment, only=only)
        failed = {k for k, v in results.items() if not v.passed}
        unexpected = {k: results[k].message[:600] for k in failed - m.must_fail}
        assert failed == set(m.must_fail), (sorted(m.must_fail - failed), unexpected)

    def test_visible_tests_catch_mistakes_of_direction_peer_and_order(self, visible_case):
        m, cells = visible_case
        assert cells <= m.must_fail, (m.name, cells - m.must_fail)
        source = nbformat.read(notebook_path("source", self.assignment), as_version=4)
        visible = {nbgrader_meta(c)["grade_id"]: _split_hidden(c.source)[0] for c in source.cells
                   if nbgrader_meta(c).get("grade") and nbgrader_meta(c)["grade_id"] in cells}
        nb = mutant_submission(self.assignment, m)
        for cell in nb.cells:
            gid = nbgrader_meta(cell).get("grade_id")
            if gid in visible:
                cell.source = visible[gid]  # what the student's notebook runs: the release's test cell
        results = run_graded_cells(nb, None, only=set(cells))
        for gid in sorted(cells):
            assert not results[gid].passed, f"the visible test of {gid} passes {m.name} ({m.why})"
            assert self.readable(results[gid].message), f"{m.name}: {gid}: {results[gid].message[:800]}"

    def test_a_stub_is_named_with_its_own_exercise_wherever_it_is_used(self, answer):
        gid, label = answer
        nb = reference_submission(self.assignment)
        stub = next(c.source for c in untouched_submission(self.assignment).cells
                    if nbgrader_meta(c).get("grade_id") == gid)
        for cell in nb.cells:
            if nbgrader_meta(cell).get("grade_id") == gid:
                cell.source = stub
        only = set(graded_ids(self.assignment)) if self.sweep_graded_cells_only else None
        results = run_graded_cells(nb, self.assignment, only=only)
        failed = {k: v.message for k, v in results.items() if not v.passed}
        assert failed, f"no cell fails with {gid} left as the stub"
        wrong = {k: msg[:300] for k, msg in failed.items()
                 if not msg.startswith(f"NotImplementedError: {label} is not done yet: ")}
        assert not wrong, f"with {gid} ({label}) a stub, these cells do not name {label}: {wrong}"

    def test_builder_reproduces_the_source_notebook(self):
        builder = os.path.join(ROOT, "assignments", self.assignment, "_build_nb.py")
        spec = importlib.util.spec_from_file_location(f"_build_{self.assignment}", builder)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "nb.ipynb")
            module.build().write(path)
            with open(path, "rb") as f, open(notebook_path("source", self.assignment), "rb") as g:
                assert f.read() == g.read(), f"source notebook is stale: run assignments/{self.assignment}/_build_nb.py"
