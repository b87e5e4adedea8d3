"""Assignment 03, pipeline parallelism: reference solutions and mutants.

    p2p.py        send/recv of activations and gradients between neighbouring stages
    schedules.py  GPipe, 1F1B and interleaved 1F1B as action lists, and the bubble
    executor.py   run_pipeline: the executor of a schedule, deadlock-free on a blocking transport
    mutants.py    plausible wrong edits of the answer cells

Cut into source/03_pipeline_parallel/ by assignments/03_pipeline_parallel/_build_nb.py.
"""
