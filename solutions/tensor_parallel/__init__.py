"""Assignment 02, tensor and sequence parallelism: reference solutions and mutants.

    mappings.py  the six f/g communication ops between replicated, tensor- and sequence-parallel regions
    layers.py    column/row-parallel linear, the parallel MLP, sequence-parallel grads, the overlapped all-reduce
    loss.py      cross-entropy over vocab-parallel logits
    mutants.py   plausible wrong edits of the answer cells

Cut into source/02_tensor_parallel/ by assignments/02_tensor_parallel/_build_nb.py.
"""
