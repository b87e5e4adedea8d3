"""Assignment 06, the capstone: reference solutions and mutants.

    layout.py    the rank layout of DP x CP x TP x PP, its process groups and DeviceMesh, each rank's batch
    train.py     the small GPT trained as DP x TP and PP x DP x TP with PyTorch's APIs, and the glue
    planner.py   memory and step time per layout, the feasible layouts ranked
    checkpoint.py  a stage's model and optimizer state under DCP's flat keys (exercise 13)
    mutants.py   plausible wrong edits of the answer cells

Cut into source/06_composition/ by assignments/06_composition/_build_nb.py.
"""
