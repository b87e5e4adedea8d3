"""Assignment 03, pipeline parallelism: reference solutions and mutants.

    p2p.py        send/recv of activations and gradients between neighbouring stages
    schedules.py  GPipe, 1F1B, interleaved 1F1B, ZB-H1 and DualPipeV as action lists, and the bubble
    executor.py   run_pipeline: the executor of a schedule, deadlock-free on a blocking transport
    split_backward.py  a stage's backward in two calls: the input gradient (B), the weight gradient (W)
    executor_zb.py     run_pipeline_zb: the executor of F, B, W and F&B lists (ZB-H1, DualPipeV), loop or V
    mutants.py    plausible wrong edits of the answer cells

Cut into source/03_pipeline_parallel/ by assignments/03_pipeline_parallel/_build_nb.py.
"""
