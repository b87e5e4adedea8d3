"""Reference solutions (instructor only): one package per dimension, named as the assignments are.

    solutions/<dim>/            the reference modules of assignment NN_<dim>, unit-tested by tests/test_<dim>_*.py
                                and cut into the notebook's answer cells by assignments/NN_<dim>/_build_nb.py
    solutions/<dim>/mutants.py  its plausible wrong implementations (MUTANTS), kept as tests
    solutions/submissions.py    reference, untouched and mutant submissions, graded in-process

Never in the student package, never readable by a sandboxed submission.
"""
