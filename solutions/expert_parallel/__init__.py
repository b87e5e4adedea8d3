"""Assignment 05, expert parallelism: reference solutions and mutants.

    routing.py   the top-k router, its load-balancing loss, permute/unpermute, the differentiable all-to-all
    layers.py    the all-to-all token dispatcher, capacity-factor token dropping, the MoE layer
    mutants.py   plausible wrong edits of the answer cells

Cut into source/05_expert_parallel/ by assignments/05_expert_parallel/_build_nb.py.
"""
