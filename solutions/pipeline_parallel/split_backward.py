"""Reference solution, assignment 03 (part 4): the backward of a stage split in two, input gradient then weights.

    input_grads, w_state = backward_input(output, grad_output, [x], list(stage.parameters()))   # "B"
    ...                                                                  # other work: the W can wait
    backward_weight(w_state)                                             # "W": accumulates into .grad

A stage's backward computes two things: the gradient of its input (B), which
the previous stage is waiting for, and the gradients of its weights (W), which
only the optimizer needs. Zero-bubble schedules (Qi et al. 2024) and DualPipe
run them as two actions. This is PyTorch's `stage_backward_input` /
`stage_backward_weight` (`torch/distributed/pipelining/_backward.py`), in the
course's words:

- the given `_weight_split_points` walks the autograd graph of the output and
  finds, for every parameter, the operation where its gradient branches off
  (the `addmm` of a linear layer: the gradient of its output `dz` gives both
  `dx = dz W` and `dW = dz^T x`);
- B is ONE `torch.autograd.grad` call, to the stage's inputs AND to those
  points (`GradientEdge`s of the graph): it returns the input gradients and
  the `dz` of every weighted operation, keeps the graph below them
  (`retain_graph=True`: W still needs their saved inputs) and computes no
  weight gradient;
- W is one `torch.autograd.grad` per point, from its saved `dz` to its own
  parameters only (so no input gradient is computed again), accumulated into
  `.grad` exactly as a full backward would.

What B keeps alive until W runs: the saved inputs of the weighted operations
and their output gradients (and the graph between them); the part of the
graph above the last weight (the stage output's side) is released as soon as
the caller drops the output. Megatron-LM does the same split inside its
layers instead (`--delay-wgrad-compute`: TransformerEngine's `backward_dw`),
as do DeepSeek's DualPipe (`WeightGradStore`) and the zero-bubble authors'
fork: the lesson compares them.

Tested by:  .venv/bin/python -m pytest -q tests/test_pipeline_zero_bubble.py
"""

from __future__ import annotations

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

__all__ = ["backward_input", "backward_weight"]


# ---------------------------------------------------------------------------
# Given helper (no exercise): where each weight's gradient branches off the graph
# ---------------------------------------------------------------------------

def _weight_split_points(output, params):
    """[(node, [params])]: for each parameter used by `output`'s graph, the autograd node where its gradient
    branches off, with every parameter that branches off there.

    Walk up from the parameter's gradient accumulator through the nodes that
    only transform it (a transpose, a view, a cast: one input each) to the first
    node that combines it with something else: a linear layer's `AddmmBackward0`
    (its bias too) or `MmBackward0`, a layer norm's `NativeLayerNormBackward0`.
    The gradient flowing INTO that node (its output's gradient) is all that the
    weight gradient needs. Parameters the output does not use are left out (their
    `.grad` stays as it is, as in a full backward). ValueError for a parameter used
    by two operations of the stage (tied weights inside one stage: not supported).
    """
    if output.grad_fn is None:
        raise ValueError("backward_input: the output has no autograd graph (was it computed under no_grad, "
                         "or detached?)")
    parents: dict = {}
    seen = {output.grad_fn}
    stack = [output.grad_fn]
    while stack:  # every node reachable from the output, and who uses it
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents.setdefault(child, []).append(node)
            if child not in seen:
                seen.add(child)
                stack.append(child)
    groups: dict = {}
    for param in params:
        node = get_gradient_edge(param).node  # the parameter's AccumulateGrad
        if node not in parents:
            continue  # not used by this output
        while True:
            users = parents.get(node, [])
            if len(users) != 1:
                raise ValueError(f"backward_input: a parameter of shape {list(param.shape)} is used by "
                                 f"{len(users)} operations of the stage; the split supports one use per parameter")
            node = users[0]
            if len(node.next_functions) > 1:  # combines the parameter with an activation (or another parameter)
                break
        groups.setdefault(node, []).append(param)
    return list(groups.items())


# ---------------------------------------------------------------------------
# Exercise 6: split the backward
# ---------------------------------------------------------------------------

def backward_input(output, grad_output, inputs, params):
    """B: the gradients of `inputs` only; returns `(input_grads, w_state)`, `w_state` for `backward_weight`.

    `output`: the stage's output (or, on the last stage, its scalar loss, with
    `grad_output=None`); `grad_output`: the gradient of `output` received from
    the next stage; `inputs`: the stage inputs whose gradient is wanted (a list;
    empty on the first stage, whose input is data); `params`: the stage's
    parameters. Touches no `.grad`: neither the inputs' nor the parameters'.
    """
    ### BEGIN SOLUTION
    points = _weight_split_points(output, params)
    edges = [GradientEdge(node, 0) for node, _ in points]  # the gradient of each weighted operation's output
    grads = torch.autograd.grad(output, list(inputs) + edges, grad_outputs=grad_output,
                                retain_graph=True)  # W still needs the saved inputs below these points
    input_grads = list(grads[:len(inputs)])
    w_state = [(node, group, grad) for (node, group), grad in zip(points, grads[len(inputs):])]
    return input_grads, w_state
    ### END SOLUTION


def backward_weight(w_state):
    """W: the weight gradients `backward_input` left for later, ADDED to each parameter's `.grad`.

    Afterwards every parameter's `.grad` is what one full backward would have
    accumulated; `w_state` is used up (run W once per B).
    """
    ### BEGIN SOLUTION
    for node, group, grad in w_state:
        # from this operation's output gradient to its own parameters only: no input gradient again
        weight_grads = torch.autograd.grad([GradientEdge(node, 0)], group, grad_outputs=[grad])
        for param, dw in zip(group, weight_grads):
            param.grad = dw if param.grad is None else param.grad + dw  # accumulate, as a full backward does
    w_state.clear()  # the saved tensors go with the nodes
    ### END SOLUTION
