"""Plausible wrong implementations, one module per assignment, kept as tests.

Each `Mutant` is a student's edit of a reference solution cell, written as
exact text replacements, so the same wrong code is graded in-process by the
test suite (tests/test_*_mutants.py) and by real nbgrader in the demo.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str                   # short slug, e.g. "mean_not_averaged"
    cell: str                   # grade_id of the solution cell it edits
    patches: tuple              # ((old, new), ...): each `old` must occur exactly once in the cell
    must_fail: frozenset        # grade_ids of test cells that must fail
    why: str = ""               # what a student got wrong, in one line
    demo: bool = False          # the wrong submission that `make demo` grades

    def apply(self, source: str) -> str:
        for old, new in self.patches:
            n = source.count(old)
            if n != 1:
                raise ValueError(f"mutant {self.name!r}: patch text occurs {n} times in cell {self.cell!r} "
                                 f"(must be exactly once): {old!r}")
            source = source.replace(old, new)
        return source


def mutant(name, cell, patches, must_fail, why="", demo=False) -> Mutant:
    return Mutant(name, cell, tuple(tuple(p) for p in patches), frozenset(must_fail), why, demo)
