"""Assignment 04, context parallelism: reference solutions and mutants.

    ring.py      attention with its LSE, the merge, ring attention forward and backward by P2P
    zigzag.py    the zigzag layout and causal ring attention on it
    ulysses.py   Ulysses: context parallelism by all-to-all
    mutants.py   plausible wrong edits of the answer cells

Cut into source/04_context_parallel/ by assignments/04_context_parallel/_build_nb.py.
"""
