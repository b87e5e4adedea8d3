"""What the lessons compute and draw: a bottom layer beside the runtime, in the student package.

Used by the lessons' numbers and the notebooks (assignments 04 and 06 import
them), by the checks (volumes, figures, the tiny GPT, the planner's types),
by the site's figures (docs/figures.py) and by the reference planner
(solutions/composition/planner.py).

    volume      bytes each dimension's collectives send per rank, and the seconds they take
    hardware    the stated figures of an 8x H100 node; bytes and FLOPs turned into seconds
    planner     the layout planner's vocabulary (ModelConfig, Training, Layout, Cluster, Plan) and its picture
    tinygpt     the capstone's small Llama-shaped GPT
    plots       matplotlib figures without pyplot, shown as PNG images

Notebooks and lessons name the module: `from autograder.lessons.volume import
cp_comparison_table`. Imports nothing from the other layers (no torch
process groups, no checks).
"""
