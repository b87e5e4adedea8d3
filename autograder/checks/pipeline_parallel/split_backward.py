"""Public checks of assignment 03, exercise 6: the split backward (B now, W later).

    from autograder.checks.pipeline_parallel import check_split_backward
    check_split_backward(backward_input, backward_weight)

A stage's backward is split in two: `backward_input` gives the input gradients at once and keeps what the
weight gradients need, `backward_weight` computes them later. Both run on a stage built here, in one rank
process; their gradients are compared with a plain backward, and `check_split_backward_memory` checks
what stays allocated between them.
"""

from __future__ import annotations

import gc
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from autograder.checks import inputs_only
from autograder.runtime.compare import CheckFailure, assert_close

from .executor import _portable, _run_ranks

__all__ = ["check_split_backward", "check_split_backward_memory"]


# ---------------------------------------------------------------------------
# Exercise: the split backward
# ---------------------------------------------------------------------------

# Stages of the split-backward checks: layers (kind, in, out, bias) and where the stage sits.
_SPLIT_CASES = {
    "two linear layers with bias, a middle stage": ([("linear", 5, 6, True), ("tanh",), ("linear", 6, 4, True),
                                                      ("tanh",)], "middle"),
    "linear layers without bias, a middle stage": ([("linear", 4, 6, False), ("tanh",), ("linear", 6, 4, False)],
                                                   "middle"),
    "the first stage (its input is data: no input gradient)": ([("linear", 4, 5, True), ("tanh",),
                                                                ("linear", 5, 3, True)], "first"),
    "the last stage (its output is the loss)": ([("linear", 4, 5, False), ("tanh",), ("linear", 5, 4, True)],
                                                "last"),
    "three layers and a layer norm, a middle stage": ([("linear", 4, 6, True), ("tanh",), ("layernorm", 6),
                                                       ("linear", 6, 6, False), ("tanh",), ("linear", 6, 5, True),
                                                       ("tanh",)], "middle"),
}
VISIBLE_SPLIT_CASES = ("two linear layers with bias, a middle stage", "the first stage (its input is data: no input "
                       "gradient)", "the last stage (its output is the loss)")


class _Watch(nn.Module):
    """Identity that keeps a weak reference to what passes (an activation), to count what stays alive."""

    def __init__(self, refs: list):
        super().__init__()
        self.refs = refs

    def forward(self, x):
        self.refs.append(weakref.ref(x))
        return x


def _split_case(name: str, batch: int, seed: int, prefill: bool) -> dict:
    layers, where = _SPLIT_CASES[name]
    gen = torch.Generator().manual_seed(seed)
    params = []
    for layer in layers:
        if layer[0] == "linear":
            _, n_in, n_out, bias = layer
            params.append(torch.randn(n_out, n_in, generator=gen, dtype=torch.float64) / n_in ** 0.5)
            if bias:
                params.append(0.3 * torch.randn(n_out, generator=gen, dtype=torch.float64))
        elif layer[0] == "layernorm":
            params.append(1 + 0.2 * torch.randn(layer[1], generator=gen, dtype=torch.float64))
            params.append(0.2 * torch.randn(layer[1], generator=gen, dtype=torch.float64))
    n_in = layers[0][1]
    n_out = [lay for lay in layers if lay[0] == "linear"][-1][2]
    case = {"name": name, "layers": layers, "where": where, "params": params,
            "x": torch.randn(batch, n_in, generator=gen, dtype=torch.float64),
            "grad_output": torch.randn(batch, n_out, generator=gen, dtype=torch.float64),
            "target": torch.randn(batch, n_out, generator=gen, dtype=torch.float64),
            "prefill": [0.1 * torch.randn(q.shape, generator=gen, dtype=torch.float64) for q in params]
            if prefill else None}
    # the reference: one full backward, float64, the same accumulation into pre-filled .grad
    stage = _build_stage(case, [])
    x = case["x"].clone().requires_grad_(where != "first")
    out = stage(x)
    with FlopCounterMode(display=False) as flops:
        if where == "last":
            F.mse_loss(out, case["target"]).backward()
        else:
            out.backward(case["grad_output"])
    case["expected_grads"] = [q.grad.clone() for q in stage.parameters()]
    case["expected_input_grad"] = x.grad.clone() if where != "first" else None
    case["full_flops"] = flops.get_total_flops()
    case["weight_flops"] = sum(2 * batch * lay[1] * lay[2] for lay in layers if lay[0] == "linear")
    return case


def _build_stage(case: dict, refs: list) -> nn.Sequential:
    """The stage of a case, from its master parameters (prefilled .grad if the case says so); watched activations."""
    mods = []
    it = iter(case["params"])
    prefill = iter(case["prefill"]) if case["prefill"] is not None else None
    for layer in case["layers"]:
        if layer[0] == "linear":
            _, n_in, n_out, bias = layer
            lin = nn.Linear(n_in, n_out, bias=bias, dtype=torch.float64)
            with torch.no_grad():
                lin.weight.copy_(next(it))
                if bias:
                    lin.bias.copy_(next(it))
            mods.append(lin)
        elif layer[0] == "layernorm":
            norm = nn.LayerNorm(layer[1], dtype=torch.float64)
            with torch.no_grad():
                norm.weight.copy_(next(it))
                norm.bias.copy_(next(it))
            mods.append(norm)
        else:
            mods.append(nn.Tanh())
        mods.append(_Watch(refs))
    stage = nn.Sequential(*mods)
    if prefill is not None:
        for q in stage.parameters():
            q.grad = next(prefill).clone()
    return stage


def _split_one(backward_input, backward_weight, case):
    refs: list = []
    stage = _build_stage(case, refs)
    params = list(stage.parameters())
    x = case["x"].clone().requires_grad_(case["where"] != "first")
    out = stage(x)
    if case["where"] == "last":
        out, grad_output = F.mse_loss(out, case["target"]), None
    else:
        grad_output = case["grad_output"].clone()
    before = [None if q.grad is None else q.grad.clone() for q in params]
    inputs = [] if case["where"] == "first" else [x]
    gc.collect()  # only what was made since _split_rank froze the rest: fast
    gc.freeze()  # set aside what exists now: the counts below see only what the step made (until the rank's end)
    with FlopCounterMode(display=False) as flops_b:
        returned = backward_input(out, grad_output, inputs, params)
    try:
        input_grads, state = returned
    except (TypeError, ValueError):
        return {"error": f"backward_input returned {type(returned).__name__}; expected (input_grads, w_state)"}
    touched = [i for i, (q, b) in enumerate(zip(params, before))
               if not ((q.grad is None and b is None) or (q.grad is not None and b is not None
                                                          and torch.equal(q.grad, b)))]
    x_grad_set = x.grad is not None
    del out, grad_output, returned
    gc.collect()
    alive_after_b = [ref() is not None for ref in refs]
    with FlopCounterMode(display=False) as flops_w:
        backward_weight(state)
    del state
    gc.collect()
    alive_after_w = [ref() is not None for ref in refs]
    listed = isinstance(input_grads, (list, tuple))
    portable = ([g.detach().clone() if isinstance(g, torch.Tensor) else _portable(g) for g in input_grads]
                if listed else None)
    return {"input_grads": portable, "input_grads_type": type(input_grads).__name__, "touched": touched,
            "x_grad_set": x_grad_set, "grads": [None if q.grad is None else q.grad.detach().clone() for q in params],
            "flops_b": flops_b.get_total_flops(), "flops_w": flops_w.get_total_flops(),
            "alive_after_b": alive_after_b, "alive_after_w": alive_after_w}


def _split_rank(rank, world_size, fns, cases):
    # What the rank inherited (torch, the kernel's or grader's objects) is set aside before the cases, not
    # collected before each: a full collection of that heap took 50-150 ms, 18 of them per check (1 s of a
    # visible test). Each case freezes its own set-up in turn; all of it is given back at the end.
    gc.freeze()
    try:
        return [_split_one(*fns, case) for case in cases]
    finally:
        gc.unfreeze()


def _run_split(backward_input, backward_weight, names, batch, seed, prefills, timeout):
    """Every (case, prefill) in one rank process; [(case, result)]."""
    cases = [_split_case(name, batch, seed, prefill) for name in names for prefill in prefills]
    hidden = ("expected_grads", "expected_input_grad", "full_flops", "weight_flops")
    (results,) = _run_ranks(_split_rank, 1, args=((backward_input, backward_weight), inputs_only(cases, *hidden)),
                            timeout=timeout, backend="gloo")
    for case, res in zip(cases, results):
        if "error" in res:
            raise CheckFailure(f"{case['name']}: {res['error']}")
    return list(zip(cases, results))


def _param_names(case) -> list[str]:
    names, i = [], 0
    for layer in case["layers"]:
        if layer[0] == "linear":
            i += 1
            names.append(f"layer {i} (linear {layer[1]}->{layer[2]}) weight")
            if layer[3]:
                names.append(f"layer {i} (linear) bias")
        elif layer[0] == "layernorm":
            i += 1
            names += [f"layer {i} (layer norm) weight", f"layer {i} (layer norm) bias"]
        else:
            i += 1
    return names


# One rank and no communication: nothing can deadlock, so the limit only stops a runaway loop; the
# cases' backward passes take seconds on a loaded 2-core grader (5 s, the P2P checks' limit, was hit).
_SPLIT_TIMEOUT = 60.0


def check_split_backward(backward_input, backward_weight, *, cases=VISIBLE_SPLIT_CASES, batch: int = 3,
                         seed: int = 0, timeout: float = _SPLIT_TIMEOUT) -> None:
    """B then W equal one full backward, on each stage of `cases` (names of _SPLIT_CASES), float64.

    For each case, run twice (parameters' .grad empty, and pre-filled as by
    an earlier micro-batch): `backward_input(output, grad_output, inputs,
    params)` returns the gradient of the stage input (none on the first stage,
    whose input is data) equal to the full backward's, and changes no `.grad`
    (not the input's, not the parameters'); then `backward_weight(w_state)`
    leaves every parameter's `.grad` equal to its value before plus the full
    backward's gradient (rtol 1e-12): W accumulates, once.
    """
    for case, res in _run_split(backward_input, backward_weight, cases, batch, seed, (False, True), timeout):
        name, prefill = case["name"], case["prefill"] is not None
        ctx = f"{name}, parameters' .grad {'pre-filled (an earlier micro-batch)' if prefill else 'empty'}"
        names = _param_names(case)
        if res["touched"]:
            raise CheckFailure(f"{ctx}: backward_input changed the .grad of {names[res['touched'][0]]} "
                               f"({len(res['touched'])} parameter(s) in all): B computes the input gradient "
                               f"only; the weight gradients wait for backward_weight (W)")
        if res["x_grad_set"]:
            raise CheckFailure(f"{ctx}: backward_input set the input's .grad; it returns the input gradients "
                               f"instead (torch.autograd.grad, not .backward()), and changes no .grad")
        grads = res["input_grads"]
        want = [] if case["where"] == "first" else [case["expected_input_grad"]]
        if not isinstance(grads, list) or len(grads) != len(want):
            raise CheckFailure(f"{ctx}: backward_input returned input_grads {grads!r:.200} "
                               f"({res['input_grads_type']}); expected a list of {len(want)} tensor(s), one "
                               f"per input passed in")
        for g, w in zip(grads, want):
            assert_close(g, w, name=f"{ctx}: gradient of the stage input returned by backward_input")
        prefills = case["prefill"] or [None] * len(names)
        for got, exp, before, label in zip(res["grads"], case["expected_grads"], prefills, names):
            if got is None:
                raise CheckFailure(f"{ctx}: after backward_weight, {label} has no .grad: W must accumulate "
                                   f"every weight gradient its B left")
            if before is not None:
                twice = 2 * exp - before
                if torch.allclose(got, twice, rtol=1e-9, atol=1e-12) and not torch.allclose(got, exp):
                    raise CheckFailure(f"{ctx}: {label}: .grad holds the earlier value plus TWICE this "
                                       f"micro-batch's gradient: W accumulated it twice")
                if torch.allclose(got, exp - before, rtol=1e-9, atol=1e-12):
                    raise CheckFailure(f"{ctx}: {label}: .grad holds this micro-batch's gradient only; the "
                                       f"earlier value was overwritten: W adds to .grad (as a full backward "
                                       f"accumulates), it does not assign it")
            elif torch.allclose(got, 2 * exp, rtol=1e-9, atol=1e-12):
                raise CheckFailure(f"{ctx}: {label}: .grad is TWICE the full backward's gradient: W "
                                   f"accumulated it twice")
            assert_close(got, exp, name=f"{ctx}: {label} .grad after backward_weight (W)")


def check_split_backward_memory(backward_input, backward_weight, *, cases=VISIBLE_SPLIT_CASES, batch: int = 3,
                                seed: int = 0, timeout: float = _SPLIT_TIMEOUT) -> None:
    """What B and W compute, and what B keeps alive until W runs.

    Per case (FlopCounterMode in the rank): W computes exactly the weight
    gradients' GEMMs, 2 b in out per linear layer, and B all the rest of the
    full backward and nothing more (B + W = one full backward; a B that
    computes the weight gradients ahead, or a W that runs the backward again
    from the output, fails). Weak references to every layer's output: once B
    has returned and the caller has dropped the stage output and its gradient,
    the output is freed (what B keeps for W is the graph below the last weight:
    the saved layer inputs and the gradients at the weights, not the output's
    side); once W has run and its state is dropped, no activation of the step
    is alive.
    """
    for case, res in _run_split(backward_input, backward_weight, cases, batch, seed, (False,), timeout):
        name = case["name"]
        full, w_flops = case["full_flops"], case["weight_flops"]
        b_flops = full - w_flops
        if res["flops_w"] != w_flops or res["flops_b"] != b_flops:
            why = []
            if res["flops_b"] > b_flops and res["flops_w"] < w_flops:
                why.append("B computed (some of) the weight gradients ahead of W")
            elif res["flops_w"] > w_flops:
                why.append("W computed more than the weight gradients (a second pass through the layers "
                           "above each weight: run W from the saved gradients at the weights, not from the "
                           "output)")
            elif res["flops_b"] > b_flops:
                why.append("B computed more than one full backward's input-gradient work")
            raise CheckFailure(
                f"{name}: FLOPs (torch.utils.flop_counter) of backward_input {res['flops_b']:,} and backward_weight "
                f"{res['flops_w']:,}; expected {b_flops:,} and {w_flops:,} (one full backward: {full:,}, of which "
                f"the weight-gradient GEMMs 2 b in out per linear layer: {w_flops:,})"
                + (f": {why[0]}" if why else ""))
        if res["alive_after_b"][-1]:
            raise CheckFailure(
                f"{name}: after backward_input returned and the caller dropped the stage output and its gradient, "
                f"the output is still alive: B's state (or something else) keeps it and the graph above the last "
                f"weight. W needs only what each weighted operation saved and the gradient arriving there "
                f"(torch's stage_backward_input keeps the same)")
        alive = sum(res["alive_after_w"])
        if alive:
            raise CheckFailure(f"{name}: after backward_weight and its state dropped, {alive} of the stage's "
                               f"{len(res['alive_after_w'])} layer outputs are still alive: something still holds "
                               f"the step's graph or saved tensors (W uses its state up; keep no reference "
                               f"elsewhere)")
