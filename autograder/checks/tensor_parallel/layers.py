"""Public checks of assignment 02, exercises 3, 4 and 6: the parallel layers, the MLP and the overlap.

    from autograder.checks.tensor_parallel import check_column_parallel_linear, check_parallel_mlp
    check_column_parallel_linear(ColumnParallelLinear, world_size=2)

ColumnParallelLinear and RowParallelLinear (their numbers, their error contract, the communication of a
column -> row pair with and without sequence parallelism), ParallelMLP and the sequence-parallel
gradient all-reduce, LinearWithAsyncAllReduce (its gradients, and its all-reduce in flight while the
weight gradient is computed), and the picture of a pair's communication. How every check of the
assignment works: autograder/checks/tensor_parallel/__init__.py.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from autograder.checks import expect_value_errors, inputs_only, one_thread
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import rank_device, run_distributed
from autograder.lessons.plots import new_figure, picture
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace
from autograder.lessons.volume import ring_factor

from .common import (
    _TIMEOUT, _check_output_type, _chunk, _combos, _cpu, _expect_phase, _forward, _param, _randn, _require_divisible,
)
from .mappings import MAPPINGS, _expect_mapping_comm

__all__ = [
    "check_column_parallel_linear", "check_row_parallel_linear", "check_argument_errors", "check_tp_pair_communication",
    "check_parallel_mlp", "check_sequence_parallel_grads", "check_async_allreduce_gradients",
    "check_async_allreduce_overlap", "plot_pair_communication",
]


# ---------------------------------------------------------------------------
# Column- and row-parallel layers
# ---------------------------------------------------------------------------

def _linear_reference(x, w, b, g):
    """Single-process Y = X W^T + b and the gradients of <Y, g>, in float64."""
    x = x.detach().double().requires_grad_()
    w = w.detach().double().requires_grad_()
    bb = b.detach().double().requires_grad_() if b is not None else None
    y = F.linear(x, w, bb)
    y.backward(g.double())
    return y.detach(), x.grad, w.grad, (bb.grad if bb is not None else None)


def _layer_rank(rank, world_size, cls, kind, cases, backend):
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    out = []
    for case in cases:
        kwargs = dict(case["kwargs"])
        kwargs["master_weight"] = case["W"].to(dev)
        kwargs["master_bias"] = case["b"].to(dev) if case["b"] is not None else None
        layer = cls(case["in"], case["out"], tp_group=group, **kwargs)
        weight = _param(layer, "weight", kind, rank)
        bias = _param(layer, "bias", kind, rank)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != tuple(case["w_shape"]):
            got = fmt_shape(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise CheckFailure(f"rank {rank}: {case['ctx']}: .weight has shape {got}, expected "
                               f"{fmt_shape(case['w_shape'])} (this rank's shard of the [out, in] master_weight)")
        w0 = _cpu(weight).clone()
        b0 = _cpu(bias).clone() if isinstance(bias, torch.Tensor) else bias
        x = case["x"][rank].to(dev).clone().requires_grad_()
        g = case["g"][rank].to(dev)
        with CommLedger() as ledger:
            y = _forward(layer, x, kind, rank, case["w_shape"])
            _check_output_type(y, f"{kind} forward", rank, g.shape)
            y.backward(g)
        out.append({"weight": w0, "bias": b0, "out": _cpu(y), "x_grad": _cpu(x.grad),
                    "w_grad": _cpu(getattr(weight, "grad", None)), "b_grad": _cpu(getattr(bias, "grad", None)),
                    "records": ledger.records})
    return out


def _run_layer_cases(cls, kind, cases, world_size, backend, timeout):
    results = run_distributed(_layer_rank, world_size,
                              args=(cls, kind, inputs_only(cases, "expected", "comm"), backend),
                              timeout=timeout, backend=backend)
    for i, case in enumerate(cases):
        check_consistent([r[i]["records"] for r in results], context=case["ctx"])
    return results


def _compare_layer(results, cases, world_size, kind):
    """Numbers, case by case; the expected communication explains wrong numbers (graded in the pair cells)."""
    for i, case in enumerate(cases):
        ctx = case["ctx"]
        findings = Findings()
        for rank in range(world_size):
            res, exp = results[rank][i], case["expected"][rank]
            with findings.numbers():
                assert_close(res["weight"], exp["weight"], name=f"{ctx}: .weight ({exp['weight_doc']})", rank=rank)
                if exp["bias"] is None:
                    if res["bias"] is not None:
                        raise CheckFailure(f"rank {rank}: {ctx}: .bias should be None with bias=False")
                else:
                    assert_close(res["bias"], exp["bias"], name=f"{ctx}: .bias ({exp['bias_doc']})", rank=rank)
                assert_close(res["out"], exp["out"], name=f"{ctx}: forward output", rank=rank)
                assert_close(res["x_grad"], exp["x_grad"], name=f"{ctx}: input gradient", rank=rank)
                assert_close(res["w_grad"], exp["w_grad"], name=f"{ctx}: .weight.grad", rank=rank)
                if exp["b_grad"] is not None:
                    assert_close(res["b_grad"], exp["b_grad"], name=f"{ctx}: .bias.grad ({exp['b_grad_doc']})",
                                 rank=rank)
            with findings.communication(hint=True):
                _expect_mapping_comm(res["records"], rank, world_size, *case["comm"], ctx)
        findings.raise_if_any()


def _layer_comm(kind: str, flags: dict, s: int, b: int, in_f: int, out_f: int, dtype) -> tuple[list, list]:
    """The collectives one layer issues (forward, backward), as _expect_phase takes them."""
    AR, AG, RS = "all_reduce", "all_gather", "reduce_scatter"
    sp = flags.get("sequence_parallel")
    if kind == "column":
        if sp:  # all-gather the sequence in forward; reduce-scatter its gradient (+ a re-gather, Megatron)
            return [(AG, {1}, (s, b, in_f), None, dtype)], [(RS, {1}, (s, b, in_f), None, dtype),
                                                             (AG, {0, 1}, (s, b, in_f), None, dtype)]
        fwd = [(AG, {1}, None, s * b * out_f, dtype)] if flags.get("gather_output") else []
        return fwd, [(AR, {1}, (s, b, in_f), None, dtype)]
    if sp:  # reduce-scatter the partial sums; all-gather the output gradient
        return [(RS, {1}, (s, b, out_f), None, dtype)], [(AG, {1}, (s, b, out_f), None, dtype)]
    bwd = [] if flags.get("input_is_parallel") else [(AG, {1}, None, s * b * in_f, dtype)]
    return [(AR, {1}, (s, b, out_f), None, dtype)], bwd


@one_thread
def check_column_parallel_linear(ColumnParallelLinear, *, world_size: int = 2, in_features: int = 6,
                                 out_features: int = 4, seq: int = 4, batch: int = 3, bias=None,
                                 gather_output=None, sequence_parallel=None, dtype=torch.float64,
                                 seed: int = 0, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """ColumnParallelLinear against nn.Linear maths, for every valid flag combination.

    A flag left as None is tried both ways (gather_output with
    sequence_parallel is invalid and skipped). Checked per rank: the weight
    shard (rows of master_weight) and bias shard, the output (`[s, b, out/t]`,
    or `[s, b, out]` with gather_output), the input gradient (the full one, or
    the rank's sequence chunk with sequence_parallel), and the weight and bias
    gradients.
    """
    t = world_size
    _require_divisible(out_features, t, "out_features")
    _require_divisible(seq, t, "seq")
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for flags in _combos(bias=bias, gather_output=gather_output, sequence_parallel=sequence_parallel):
        if flags["gather_output"] and flags["sequence_parallel"]:
            continue
        W = _randn(gen, out_features, in_features, dtype=dtype)
        b = _randn(gen, out_features, dtype=dtype) if flags["bias"] else None
        X = _randn(gen, seq, batch, in_features, dtype=dtype)
        G = _randn(gen, seq, batch, out_features, dtype=dtype)
        Y, dX, dW, db = _linear_reference(X, W, b, G)
        sp, go = flags["sequence_parallel"], flags["gather_output"]
        part = out_features // t
        expected = []
        for r in range(t):
            rows = slice(r * part, (r + 1) * part)
            expected.append({
                "weight": W[rows], "weight_doc": f"rows {r * part}:{(r + 1) * part} of master_weight",
                "bias": b[rows] if b is not None else None, "bias_doc": f"master_bias[{r * part}:{(r + 1) * part}]",
                "out": (Y if go else Y[..., rows]).to(dtype),
                "x_grad": (_chunk(dX, t, r, 0) if sp else dX).to(dtype),
                "w_grad": dW[rows].to(dtype),
                "b_grad": db[rows].to(dtype) if db is not None else None, "b_grad_doc": "slice of the full bias gradient",
            })
        cases.append({
            "in": in_features, "out": out_features, "kwargs": flags, "W": W, "b": b,
            "x": [_chunk(X, t, r, 0) if sp else X for r in range(t)],
            "g": [G if go else G[..., r * part:(r + 1) * part].contiguous() for r in range(t)],
            "w_shape": (part, in_features), "expected": expected,
            "comm": _layer_comm("column", flags, seq, batch, in_features, out_features, dtype),
            "ctx": (f"ColumnParallelLinear({in_features}, {out_features}, bias={flags['bias']}, "
                    f"gather_output={go}, sequence_parallel={sp}), world size {t}, "
                    f"[s, b] = [{seq}, {batch}], {dtype_name(dtype)}"),
        })
    results = _run_layer_cases(ColumnParallelLinear, "ColumnParallelLinear", cases, t, backend, timeout)
    _compare_layer(results, cases, t, "ColumnParallelLinear")


@one_thread
def check_row_parallel_linear(RowParallelLinear, *, world_size: int = 2, in_features: int = 6,
                              out_features: int = 4, seq: int = 4, batch: int = 3, bias=None,
                              input_is_parallel=None, sequence_parallel=None, dtype=torch.float64,
                              seed: int = 0, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """RowParallelLinear against nn.Linear maths, for every valid flag combination.

    A flag left as None is tried both ways (sequence_parallel without
    input_is_parallel is invalid and skipped). Checked per rank: the weight
    shard (columns of master_weight), the whole bias, the output (`[s, b, out]`,
    or the rank's sequence chunk `[s/t, b, out]` with sequence_parallel), the
    input gradient, the weight gradient, and the bias gradient (with
    sequence_parallel: the partial sum over the rank's own sequence chunk).
    """
    t = world_size
    _require_divisible(in_features, t, "in_features")
    _require_divisible(seq, t, "seq")
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for flags in _combos(bias=bias, input_is_parallel=input_is_parallel, sequence_parallel=sequence_parallel):
        if flags["sequence_parallel"] and not flags["input_is_parallel"]:
            continue
        W = _randn(gen, out_features, in_features, dtype=dtype)
        b = _randn(gen, out_features, dtype=dtype) if flags["bias"] else None
        X = _randn(gen, seq, batch, in_features, dtype=dtype)
        G = _randn(gen, seq, batch, out_features, dtype=dtype)
        Y, dX, dW, db = _linear_reference(X, W, b, G)
        sp, iip = flags["sequence_parallel"], flags["input_is_parallel"]
        part = in_features // t
        expected = []
        for r in range(t):
            cols = slice(r * part, (r + 1) * part)
            b_grad = _chunk(G, t, r, 0).double().sum((0, 1)) if sp else db
            expected.append({
                "weight": W[:, cols], "weight_doc": f"columns {r * part}:{(r + 1) * part} of master_weight",
                "bias": b, "bias_doc": "the whole master_bias",
                "out": (_chunk(Y, t, r, 0) if sp else Y).to(dtype),
                "x_grad": (dX[..., cols] if iip else dX).to(dtype),
                "w_grad": dW[:, cols].to(dtype),
                "b_grad": b_grad.to(dtype) if b is not None else None,
                "b_grad_doc": ("partial: this rank's sequence chunk only, before allreduce_sequence_parallel_grads"
                               if sp else "the full bias gradient"),
            })
        cases.append({
            "in": in_features, "out": out_features, "kwargs": flags, "W": W, "b": b,
            "x": [X[..., r * part:(r + 1) * part].contiguous() if iip else X for r in range(t)],
            "g": [_chunk(G, t, r, 0) if sp else G for r in range(t)],
            "w_shape": (out_features, part), "expected": expected,
            "comm": _layer_comm("row", flags, seq, batch, in_features, out_features, dtype),
            "ctx": (f"RowParallelLinear({in_features}, {out_features}, bias={flags['bias']}, "
                    f"input_is_parallel={iip}, sequence_parallel={sp}), world size {t}, "
                    f"[s, b] = [{seq}, {batch}], {dtype_name(dtype)}"),
        })
    results = _run_layer_cases(RowParallelLinear, "RowParallelLinear", cases, t, backend, timeout)
    _compare_layer(results, cases, t, "RowParallelLinear")


# ---------------------------------------------------------------------------
# The error contract (spec 3.8)
# ---------------------------------------------------------------------------

def _error_cases():
    """(label, builder name, kwargs, strings the message must contain)."""
    return [
        ("ColumnParallelLinear(4, 5) on 2 ranks: out_features not divisible", "column", dict(in_features=4, out_features=5), ["5", "2"]),
        ("RowParallelLinear(5, 4) on 2 ranks: in_features not divisible", "row", dict(in_features=5, out_features=4), ["5", "2"]),
        ("ColumnParallelLinear(gather_output=True, sequence_parallel=True)", "column", dict(gather_output=True, sequence_parallel=True), []),
        ("RowParallelLinear(input_is_parallel=False, sequence_parallel=True)", "row", dict(input_is_parallel=False, sequence_parallel=True), []),
        ("ColumnParallelLinear(6, 4) with a master_weight of shape [6, 4] (must be [out, in] = [4, 6])", "column", dict(in_features=6, out_features=4, master_weight=(6, 4)), ["4", "6"]),
        ("RowParallelLinear(4, 6) with a master_weight of shape [4, 6] (must be [out, in] = [6, 4])", "row", dict(in_features=4, out_features=6, master_weight=(4, 6)), ["4", "6"]),
        ("ColumnParallelLinear with tp_group=None", "column", dict(tp_group=None), []),
        ("RowParallelLinear with tp_group=0 (a rank, not a ProcessGroup)", "row", dict(tp_group=0), []),
        *[(f"{name}(x, group=None)", "mapping", dict(name=name), [])
          for name in MAPPINGS if name != "scatter_to_sequence_parallel_region"],
        ("scatter_to_tensor_model_parallel_region on [4, 2, 5] (last dim 5) over 2 ranks", "mapping", dict(name="scatter_to_tensor_model_parallel_region", shape=(4, 2, 5)), ["5"]),
        ("reduce_scatter_to_sequence_parallel_region on [5, 2, 4] (dim 0 is 5) over 2 ranks", "mapping", dict(name="reduce_scatter_to_sequence_parallel_region", shape=(5, 2, 4)), ["5"]),
        ("RowParallelLinear(4, 4, sequence_parallel=True) forward on a sequence of 5", "row_forward", dict(sequence_parallel=True, seq=5), ["5"]),
    ]


def _error_rank(rank, world_size, impls, cases, backend):
    dev = rank_device(rank, backend)
    world = dist.group.WORLD
    results = []
    for label, builder, kw, _ in cases:
        kw = dict(kw)
        err = None
        with CommLedger() as ledger:
            try:
                if builder in ("column", "row", "row_forward"):
                    cls = impls["ColumnParallelLinear" if builder == "column" else "RowParallelLinear"]
                    group = kw.pop("tp_group", world)
                    seq = kw.pop("seq", None)
                    if "master_weight" in kw:
                        kw["master_weight"] = torch.randn(*kw["master_weight"], device=dev)
                    in_f, out_f = kw.pop("in_features", 4), kw.pop("out_features", 4)
                    layer = cls(in_f, out_f, tp_group=group, **kw)
                    if builder == "row_forward":
                        layer(torch.randn(seq, 2, in_f // world_size, device=dev))
                else:
                    shape = kw.get("shape", (4, 2, 4))
                    group = world if "shape" in kw else None
                    impls[kw["name"]](torch.randn(*shape, device=dev, requires_grad=True), group=group)
            except NotImplementedError:
                raise  # a stub: reported as such, not as a wrong exception type
            except Exception as exc:  # noqa: BLE001 - the verdict is made in the parent
                err = (type(exc).__name__, str(exc))
        results.append({"error": err, "records": ledger.records})
    return results


@one_thread
def check_argument_errors(impls: dict, *, world_size: int = 2, backend: str = "gloo",
                          timeout: float = _TIMEOUT) -> None:
    """Invalid arguments raise ValueError on every rank before any communication, naming the sizes.

    `impls` maps names to the student's implementations: ColumnParallelLinear,
    RowParallelLinear and the six mappings. Cases (spec 3.8, 4.2): sizes not
    divisible by the group size, gather_output with sequence_parallel, a row
    layer with sequence_parallel and input_is_parallel=False, a master_weight of
    the wrong shape, a group that is not a ProcessGroup, a sequence not
    divisible by the group size under sequence parallelism.
    """
    cases = _error_cases()
    needed = {"ColumnParallelLinear", "RowParallelLinear"} | {kw["name"] for _, b, kw, _ in cases if b == "mapping"}
    missing = sorted(needed - set(impls))
    if missing:
        raise ValueError(f"check_argument_errors: impls lacks {', '.join(missing)}")
    sent = [(label, builder, kw, None) for label, builder, kw, _ in cases]  # what the message must name stays here
    results = run_distributed(_error_rank, world_size, args=(impls, sent, backend), timeout=timeout,
                              backend=backend)
    expect_value_errors(results, [(label, must_mention) for label, _, _, must_mention in cases], world_size)


# ---------------------------------------------------------------------------
# A column -> row pair: the communication of tensor and sequence parallelism
# ---------------------------------------------------------------------------

def _pair_rank(rank, world_size, column_cls, row_cls, case, backend):
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    sp = case["sp"]
    col = column_cls(case["h"], case["ffn"], tp_group=group, sequence_parallel=sp,
                     master_weight=case["W1"].to(dev), master_bias=case["b1"].to(dev))
    row = row_cls(case["ffn"], case["h"], tp_group=group, input_is_parallel=True, sequence_parallel=sp,
                  master_weight=case["W2"].to(dev), master_bias=case["b2"].to(dev))
    x = case["x"][rank].to(dev).clone().requires_grad_()
    g = case["g"][rank].to(dev)
    with CommLedger() as ledger:
        y = row(_forward(col, x, "ColumnParallelLinear", rank, (case["ffn"] // world_size, case["h"])))
        _check_output_type(y, "RowParallelLinear(ColumnParallelLinear(x))", rank, g.shape)
        y.backward(g)
    return {"out": _cpu(y), "x_grad": _cpu(x.grad), "records": ledger.records}


def _pair_case(world_size, hidden, ffn, seq, batch, sp, dtype, seed):
    t = world_size
    gen = torch.Generator().manual_seed(seed)
    W1, b1 = _randn(gen, ffn, hidden, dtype=dtype), _randn(gen, ffn, dtype=dtype)
    W2, b2 = _randn(gen, hidden, ffn, dtype=dtype), _randn(gen, hidden, dtype=dtype)
    X, G = _randn(gen, seq, batch, hidden, dtype=dtype), _randn(gen, seq, batch, hidden, dtype=dtype)
    xr = X.detach().clone().double().requires_grad_()
    y = F.linear(F.linear(xr, W1.double(), b1.double()), W2.double(), b2.double())
    y.backward(G.double())
    split = (lambda T, r: _chunk(T, t, r, 0)) if sp else (lambda T, r: T)
    return {"sp": sp, "h": hidden, "ffn": ffn, "W1": W1, "b1": b1, "W2": W2, "b2": b2,
            "x": [split(X, r) for r in range(t)], "g": [split(G, r) for r in range(t)],
            "out": [split(y.detach(), r).to(dtype) for r in range(t)],
            "x_grad": [split(xr.grad, r).to(dtype) for r in range(t)]}


@one_thread
def check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, *, world_size: int = 2,
                                sequence_parallel: bool = False, hidden: int = 6, ffn: int = 8,
                                seq: int = 4, batch: int = 3, dtype=torch.float64, seed: int = 0,
                                backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """Column(h -> ffn) then Row(ffn -> h): the numbers, then exactly the expected collectives.

    Without sequence parallelism: one all-reduce of `[s, b, h]` in forward (the
    row layer's g) and one in backward (the column layer's f), nothing else.
    With it: one all-gather and one reduce-scatter of `[s, b, h]` in forward; in
    backward one reduce-scatter and one all-gather (the gathered input kept for
    the weight gradient) or two all-gathers (re-gathered, as Megatron-LM does).
    A group of size 1: no communication.
    """
    t, sp = world_size, sequence_parallel
    _require_divisible(ffn, t, "ffn")
    if sp:
        _require_divisible(seq, t, "seq")
    case = _pair_case(t, hidden, ffn, seq, batch, sp, dtype, seed)
    results = run_distributed(_pair_rank, t, args=(ColumnParallelLinear, RowParallelLinear,
                                                   inputs_only(case, "out", "x_grad"), backend),
                              timeout=timeout, backend=backend)
    ctx = (f"ColumnParallelLinear({hidden}, {ffn}) -> RowParallelLinear({ffn}, {hidden}), "
           f"sequence_parallel={sp}, world size {t}, [s, b, h] = [{seq}, {batch}, {hidden}]")
    check_consistent([r["records"] for r in results], context=ctx)
    for rank, res in enumerate(results):
        assert_close(res["out"], case["out"][rank], name=f"{ctx}: output", rank=rank)
        assert_close(res["x_grad"], case["x_grad"][rank], name=f"{ctx}: input gradient", rank=rank)
    full = (seq, batch, hidden)
    if sp:
        fwd = [("all_gather", {1}, full, None, dtype), ("reduce_scatter", {1}, full, None, dtype)]
        bwd = [("reduce_scatter", {1}, full, None, dtype), ("all_gather", {1, 2}, full, None, dtype)]
    else:
        fwd = [("all_reduce", {1}, full, None, dtype)]
        bwd = [("all_reduce", {1}, full, None, dtype)]
    for rank, res in enumerate(results):
        if t == 1:
            expect_no_comm(res["records"], rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
            continue
        _expect_phase(res["records"], rank=rank, phase="forward", expected=fwd, context=ctx)
        _expect_phase(res["records"], rank=rank, phase="backward", expected=bwd, context=ctx)


# ---------------------------------------------------------------------------
# ParallelMLP and the sequence-parallel gradient all-reduce
# ---------------------------------------------------------------------------

def _mlp_rank(rank, world_size, mlp_cls, allreduce_fn, case, backend):
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    sp = case["sp"]
    h, ffn = case["h"], case["ffn"]
    ln = nn.LayerNorm(h, dtype=case["dtype"], device=dev)
    with torch.no_grad():
        ln.weight.copy_(case["ln_w"])
        ln.bias.copy_(case["ln_b"])
    if sp:  # replicated, but fed sequence shards: partial gradients
        ln.weight.sequence_parallel = True
        ln.bias.sequence_parallel = True
    bias = lambda b: None if b is None else b.to(dev)  # noqa: E731
    mlp = mlp_cls(h, ffn, tp_group=group, sequence_parallel=sp,
                  master_fc1_weight=case["W1"].to(dev), master_fc1_bias=bias(case["b1"]),
                  master_fc2_weight=case["W2"].to(dev), master_fc2_bias=bias(case["b2"]))
    model = nn.Sequential(ln, mlp)
    if case["unused"]:  # marked like a LayerNorm weight, but no forward uses it: it never gets a gradient
        model.unused_norm = nn.Parameter(torch.ones(h, dtype=case["dtype"], device=dev))
        model.unused_norm.sequence_parallel = sp
    x = case["x"][rank].to(dev).clone().requires_grad_()
    g = case["g"][rank].to(dev)
    fc1, fc2 = getattr(mlp, "linear_fc1", None), getattr(mlp, "linear_fc2", None)
    if fc1 is None or fc2 is None:
        raise CheckFailure(f"rank {rank}: ParallelMLP must hold its layers as .linear_fc1 (column) and "
                           f".linear_fc2 (row), as Megatron-LM's MLP does")
    with CommLedger() as ledger:
        y = model(x)
        _check_output_type(y, "LayerNorm -> ParallelMLP forward", rank, g.shape)
        y.backward(g)
        if allreduce_fn is not None:
            with ledger.outside():
                allreduce_fn(model, tp_group=group)
    grad = lambda p: _cpu(getattr(p, "grad", None))  # noqa: E731
    return {"out": _cpu(y), "x_grad": _cpu(x.grad), "ln_w": grad(ln.weight), "ln_b": grad(ln.bias),
            "fc1_w": grad(fc1.weight), "fc1_b": grad(fc1.bias), "fc2_w": grad(fc2.weight),
            "fc2_b": grad(fc2.bias), "mlp_params": [n for n, _ in mlp.named_parameters()],
            "unused_grad": grad(model.unused_norm) if case["unused"] else None, "records": ledger.records}


def _run_mlp(mlp_cls, allreduce_fn, world_size, hidden, ffn, seq, batch, sp, dtype, seed, backend, timeout,
             bias=True, unused=False):
    t = world_size
    _require_divisible(ffn, t, "ffn")
    if sp:
        _require_divisible(seq, t, "seq")
    gen = torch.Generator().manual_seed(seed)
    W1, b1 = _randn(gen, ffn, hidden, dtype=dtype), _randn(gen, ffn, dtype=dtype)
    W2, b2 = _randn(gen, hidden, ffn, dtype=dtype), _randn(gen, hidden, dtype=dtype)
    if not bias:
        b1 = b2 = None
    ln_w, ln_b = 1 + 0.5 * _randn(gen, hidden, dtype=dtype), _randn(gen, hidden, dtype=dtype)
    X, G = _randn(gen, seq, batch, hidden, dtype=dtype), _randn(gen, seq, batch, hidden, dtype=dtype)
    # Single-process reference in float64.
    tensors = dict(W1=W1, b1=b1, W2=W2, b2=b2, ln_w=ln_w, ln_b=ln_b, x=X)
    ref = {k: (None if v is None else v.detach().clone().double().requires_grad_()) for k, v in tensors.items()}
    z = F.layer_norm(ref["x"], (hidden,), ref["ln_w"], ref["ln_b"])
    y = F.linear(F.gelu(F.linear(z, ref["W1"], ref["b1"])), ref["W2"], ref["b2"])
    y.backward(G.double())
    split = (lambda T, r: _chunk(T, t, r, 0)) if sp else (lambda T, r: T)
    case = {"sp": sp, "h": hidden, "ffn": ffn, "dtype": dtype, "W1": W1, "b1": b1, "W2": W2, "b2": b2,
            "ln_w": ln_w, "ln_b": ln_b, "x": [split(X, r) for r in range(t)], "g": [split(G, r) for r in range(t)],
            "unused": unused}
    results = run_distributed(_mlp_rank, t, args=(mlp_cls, allreduce_fn, case, backend),
                              timeout=timeout, backend=backend)
    ctx = (f"LayerNorm({hidden}) -> ParallelMLP({hidden}, {ffn}, sequence_parallel={sp}"
           f"{'' if bias else ', master biases None'}), world size {t}, [s, b] = [{seq}, {batch}], "
           f"{dtype_name(dtype)}")
    check_consistent([r["records"] for r in results], context=ctx)
    grads = {k: (None if v is None else v.grad) for k, v in ref.items()}
    return results, y.detach(), grads, split, ctx


@one_thread
def check_parallel_mlp(ParallelMLP, *, world_size: int = 2, sequence_parallel: bool = False,
                       hidden: int = 6, ffn: int = 8, seq: int = 4, batch: int = 3, bias: bool = True,
                       dtype=torch.float64, seed: int = 0, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """A LayerNorm then ParallelMLP (fc1 column -> exact GeLU -> fc2 row) against single-process maths.

    Checked per rank: the output and input gradient (sequence shards `[s/t, b, h]`
    with sequence_parallel), and the gradients of the tensor-parallel shards
    (fc1 weight and bias, fc2 weight). Without sequence parallelism the
    replicated parameters (LayerNorm, fc2 bias) must have their full gradient
    already; with it they are checked by check_sequence_parallel_grads. With
    bias=False the master biases are None: the layers have no bias parameter.
    """
    t = world_size
    results, y, grads, split, ctx = _run_mlp(ParallelMLP, None, t, hidden, ffn, seq, batch,
                                             sequence_parallel, dtype, seed, backend, timeout, bias=bias)
    part = ffn // t
    want_params = ["linear_fc1.weight", "linear_fc2.weight"] + (["linear_fc1.bias", "linear_fc2.bias"] if bias else [])
    for rank, res in enumerate(results):
        if sorted(res["mlp_params"]) != sorted(want_params):
            raise CheckFailure(f"rank {rank} ({ctx}): ParallelMLP's parameters are {res['mlp_params']}; expected "
                               f"{sorted(want_params)} (a master bias of None means no bias, as "
                               f"nn.Linear(bias=False)).")
        rows = slice(rank * part, (rank + 1) * part)
        assert_close(res["out"], split(y, rank).to(dtype), name=f"{ctx}: output", rank=rank)
        assert_close(res["x_grad"], split(grads["x"], rank).to(dtype), name=f"{ctx}: input gradient", rank=rank)
        assert_close(res["fc1_w"], grads["W1"][rows].to(dtype), name=f"{ctx}: linear_fc1.weight.grad", rank=rank)
        if bias:
            assert_close(res["fc1_b"], grads["b1"][rows].to(dtype), name=f"{ctx}: linear_fc1.bias.grad", rank=rank)
        assert_close(res["fc2_w"], grads["W2"][:, rows].to(dtype), name=f"{ctx}: linear_fc2.weight.grad", rank=rank)
        if not sequence_parallel:
            if bias:
                assert_close(res["fc2_b"], grads["b2"].to(dtype), name=f"{ctx}: linear_fc2.bias.grad", rank=rank)
            assert_close(res["ln_w"], grads["ln_w"].to(dtype), name=f"{ctx}: LayerNorm weight grad", rank=rank)


@one_thread
def check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, *, world_size: int = 2,
                                  sequence_parallel: bool = True, hidden: int = 6, ffn: int = 8,
                                  seq: int = 4, batch: int = 3, unused: bool = False, dtype=torch.float64,
                                  seed: int = 0, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """After allreduce_sequence_parallel_grads, every gradient equals the single-process one.

    The model is a LayerNorm (its weight and bias marked `.sequence_parallel = True`
    by the check when sequence_parallel) followed by ParallelMLP. Checked per
    rank: LayerNorm weight and bias gradients, fc2 (row) bias gradient, and the
    tensor-parallel shards' gradients unchanged. Communication in the "outside"
    phase: only all-reduces, of `3 * hidden` elements in total (LayerNorm weight
    and bias, fc2 bias) with sequence parallelism, none without it. With
    unused=True the model also holds a marked parameter that no forward uses:
    its grad stays None and it is not communicated.
    """
    t = world_size
    results, y, grads, split, ctx = _run_mlp(ParallelMLP, allreduce_sequence_parallel_grads, t, hidden, ffn,
                                             seq, batch, sequence_parallel, dtype, seed, backend, timeout,
                                             unused=unused)
    ctx += ", after allreduce_sequence_parallel_grads"
    if unused:
        ctx += " (one marked parameter without a gradient)"
    part = ffn // t
    findings = Findings()
    for rank, res in enumerate(results):
        with findings.numbers():
            rows = slice(rank * part, (rank + 1) * part)
            assert_close(res["ln_w"], grads["ln_w"].to(dtype), name=f"{ctx}: LayerNorm weight grad", rank=rank)
            assert_close(res["ln_b"], grads["ln_b"].to(dtype), name=f"{ctx}: LayerNorm bias grad", rank=rank)
            assert_close(res["fc2_b"], grads["b2"].to(dtype), name=f"{ctx}: linear_fc2.bias.grad", rank=rank)
            assert_close(res["fc1_w"], grads["W1"][rows].to(dtype), name=f"{ctx}: linear_fc1.weight.grad", rank=rank)
            assert_close(res["fc2_w"], grads["W2"][:, rows].to(dtype), name=f"{ctx}: linear_fc2.weight.grad",
                         rank=rank)
            if unused and res["unused_grad"] is not None:
                raise CheckFailure(f"rank {rank} ({ctx}): the marked parameter no forward used has a gradient "
                                   f"after allreduce_sequence_parallel_grads; a parameter whose grad is None is "
                                   f"skipped (it stays None).")
        with findings.communication():
            outside = [r for r in res["records"] if r.op != "wait" and r.phase == "outside"]
            if t == 1 or not sequence_parallel:
                if outside:
                    raise CheckFailure(f"rank {rank} ({ctx}): expected no communication (nothing to sum), saw:\n"
                                       f"{format_trace(outside, rank)}")
                continue
            others = [r for r in outside if r.op != "all_reduce"]
            numel = sum(math.prod(r.shape) for r in outside if r.op == "all_reduce")
            if others or numel != 3 * hidden:
                raise CheckFailure(f"rank {rank} ({ctx}): expected all-reduces of {3 * hidden} elements in total "
                                   f"(LayerNorm weight and bias, fc2 bias: 3 x {hidden}) and nothing else; saw "
                                   f"{numel} all-reduced elements:\n{format_trace(outside, rank)}")
    findings.raise_if_any()


# ---------------------------------------------------------------------------
# Overlap: LinearWithAsyncAllReduce
# ---------------------------------------------------------------------------

def _async_rank(rank, world_size, fn, case, backend):
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    x = case["x"].to(dev).clone().requires_grad_()
    w = case["w"][rank].to(dev).clone().requires_grad_()
    b = case["b"][rank].to(dev).clone().requires_grad_() if case["b"] is not None else None
    g = case["g"][rank].to(dev)
    with CommLedger(trace_compute=True) as ledger:
        y = fn.apply(x, w, b, group)
        _check_output_type(y, "LinearWithAsyncAllReduce.apply", rank, g.shape)
        y.backward(g)
        if world_size > 1 and backend == "gloo":
            # Settle: a gloo barrier completes only after all earlier work of the group, so an all-reduce
            # that was never waited for has finished before the gradients are read. The numbers are then
            # the same on every run; the missing wait() is graded by check_async_allreduce_overlap.
            n = len(ledger.records)
            dist.barrier(group=group)
            del ledger.records[n:]  # the check's own barrier is not the student's communication
    return {"out": _cpu(y), "x_grad": _cpu(x.grad), "w_grad": _cpu(w.grad),
            "b_grad": _cpu(b.grad) if b is not None else None, "records": ledger.records, "ops": ledger.ops}


def _run_async(fn, world_size, in_features, out_features, seq, batch, bias, dtype, seed, backend, timeout):
    t = world_size
    _require_divisible(out_features, t, "out_features")
    part = out_features // t
    if seq * batch == in_features or (part, in_features) in ((seq * batch, in_features), (seq, batch)):
        raise ValueError("check parameters: choose seq * batch != in_features so that only the weight "
                         "gradient has the weight's shape")
    gen = torch.Generator().manual_seed(seed)
    W = _randn(gen, out_features, in_features, dtype=dtype)
    bvec = _randn(gen, out_features, dtype=dtype) if bias else None
    X, G = _randn(gen, seq, batch, in_features, dtype=dtype), _randn(gen, seq, batch, out_features, dtype=dtype)
    Y, dX, dW, db = _linear_reference(X, W, bvec, G)
    rows = [slice(r * part, (r + 1) * part) for r in range(t)]
    case = {"x": X, "w": [W[s].contiguous() for s in rows], "b": [bvec[s].contiguous() for s in rows] if bias else None,
            "g": [G[..., s].contiguous() for s in rows]}
    results = run_distributed(_async_rank, t, args=(fn, case, backend), timeout=timeout, backend=backend)
    ctx = (f"LinearWithAsyncAllReduce, world size {t}, input [{seq}, {batch}, {in_features}], "
           f"weight shard [{part}, {in_features}], bias={bias}, {dtype_name(dtype)}")
    check_consistent([r["records"] for r in results], context=ctx)
    expected = [{"out": Y[..., s].to(dtype), "x_grad": dX.to(dtype), "w_grad": dW[s].to(dtype),
                 "b_grad": db[s].to(dtype) if bias else None} for s in rows]
    return results, expected, ctx, (part, in_features)


@one_thread
def check_async_allreduce_gradients(LinearWithAsyncAllReduce, *, world_size: int = 2, in_features: int = 6,
                                    out_features: int = 4, seq: int = 4, batch: int = 3, bias: bool = True,
                                    dtype=torch.float64, seed: int = 0, backend: str = "gloo",
                                    timeout: float = _TIMEOUT) -> None:
    """The fused column layer's output and gradients equal the plain column layer's (nn.Linear maths).

    Rank r gets the replicated input `[s, b, in]` and rows `[r*out/t, (r+1)*out/t)`
    of the weight (and bias); checked: its output shard, the full input
    gradient (all-reduced), its weight and bias gradients. Deterministic: the
    rank program lets every launched collective finish (a barrier) before it
    reads the gradients, so a missing `wait()` cannot make the numbers depend
    on thread scheduling (check_async_allreduce_overlap grades the wait).
    """
    results, expected, ctx, _ = _run_async(LinearWithAsyncAllReduce, world_size, in_features, out_features,
                                           seq, batch, bias, dtype, seed, backend, timeout)
    for rank, (res, exp) in enumerate(zip(results, expected)):
        assert_close(res["out"], exp["out"], name=f"{ctx}: output", rank=rank)
        assert_close(res["x_grad"], exp["x_grad"], name=f"{ctx}: input gradient (all-reduced)", rank=rank)
        assert_close(res["w_grad"], exp["w_grad"], name=f"{ctx}: weight gradient", rank=rank)
        if bias:
            assert_close(res["b_grad"], exp["b_grad"], name=f"{ctx}: bias gradient", rank=rank)
        elif res["b_grad"] is not None:
            raise CheckFailure(f"rank {rank} ({ctx}): bias is None, yet a bias gradient came back")


def _timeline(records, ops, phase="backward") -> str:
    events = sorted([(r.seq, r.describe()) for r in records if r.phase == phase]
                    + [(o.seq, f"{o.name} -> {', '.join(fmt_shape(s) for s in o.out_shapes)}")
                       for o in ops if o.phase == phase])
    return "\n".join(f"    {seq:4d}  {text}" for seq, text in events)


@one_thread
def check_async_allreduce_overlap(LinearWithAsyncAllReduce, *, world_size: int = 2, in_features: int = 6,
                                  out_features: int = 4, seq: int = 4, batch: int = 3, bias: bool = True,
                                  dtype=torch.float64, seed: int = 0, backend: str = "gloo",
                                  timeout: float = _TIMEOUT) -> None:
    """The input-gradient all-reduce overlaps the weight-gradient matmul, judged from the op trace.

    From `CommLedger(trace_compute=True)` of every rank: no communication in
    forward; in backward exactly one all-reduce of the input gradient
    `[s, b, in]`, launched with async_op=True BEFORE the first op whose output
    has the weight shard's shape (the weight-gradient matmul), and a
    `Work.wait()` AFTER that op, still inside backward. (CPU timing proves
    nothing: gloo runs collectives on its own threads.) A group of size 1:
    no communication and no wait. Deterministic: the order is the ledger's
    sequence numbers, given in the one thread that runs CPU autograd, so the
    same code gives the same trace on every run.
    """
    results, _, ctx, wshape = _run_async(LinearWithAsyncAllReduce, world_size, in_features, out_features,
                                         seq, batch, bias, dtype, seed, backend, timeout)
    for rank, res in enumerate(results):
        recs, ops = res["records"], res["ops"]
        if world_size == 1:
            expect_no_comm(recs, rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
            continue
        _expect_phase(recs, rank=rank, phase="forward", expected=[], context=ctx)
        _expect_phase(recs, rank=rank, phase="backward",
                      expected=[("all_reduce", {1}, (seq, batch, in_features), None, dtype)], context=ctx)
        trace = f"Backward of rank {rank}, in order:\n{_timeline(recs, ops)}"
        ar = next(r for r in recs if r.op == "all_reduce" and r.phase == "backward")
        if not ar.async_op:
            raise CheckFailure(f"rank {rank} ({ctx}): the input-gradient all-reduce was synchronous; launch it "
                               f"with async_op=True so the weight gradient can be computed meanwhile.\n{trace}")
        wgrad = next((o for o in ops if o.phase == "backward" and tuple(wshape) in [tuple(s) for s in o.out_shapes]),
                     None)
        if wgrad is None:
            raise CheckFailure(f"rank {rank} ({ctx}): no op in backward produced a tensor of the weight's shape "
                               f"{fmt_shape(wshape)}: where is the weight gradient computed?\n{trace}")
        if ar.seq > wgrad.seq:
            raise CheckFailure(f"rank {rank} ({ctx}): the all-reduce (#{ar.seq}) was launched after the weight "
                               f"gradient ({wgrad.name}, #{wgrad.seq}): nothing overlaps it.\n{trace}")
        waits = [r for r in recs if r.op == "wait" and r.seq > ar.seq]
        if not waits:
            raise CheckFailure(f"rank {rank} ({ctx}): the async all-reduce was never waited for inside backward "
                               f"(call work.wait() before returning the input gradient).\n{trace}")
        first = waits[0]
        if first.phase != "backward" or first.seq < wgrad.seq:
            raise CheckFailure(f"rank {rank} ({ctx}): wait() (#{first.seq}) came before the weight gradient "
                               f"({wgrad.name}, #{wgrad.seq}): the all-reduce was not overlapped with it "
                               f"(wait after computing the weight gradient).\n{trace}")


# ---------------------------------------------------------------------------
# The picture: communication of a column -> row pair, with and without SP
# ---------------------------------------------------------------------------

_COLORS = {"all_reduce": "#4C72B0", "all_gather": "#55A868", "reduce_scatter": "#C44E52", "wait": "#999999"}


def _ring_bytes(record, world_size: int) -> float:
    """Bytes one rank sends for this op in a ring (autograder/lessons/volume.py, the lesson's section 3)."""
    return ring_factor(record.op, world_size) * record.bytes


def plot_pair_communication(ColumnParallelLinear, RowParallelLinear, *, world_size: int = 2, hidden: int = 8,
                            ffn: int = 16, seq: int = 4, batch: int = 2, dtype=torch.float32, seed: int = 0,
                            backend: str = "gloo", timeout: float = _TIMEOUT):
    """Draw rank 0's collectives for Column -> Row, without and with SP, from the ledgers of real runs.

    One row per scheme; each collective is a box in issue order, labelled with
    op, shape, bytes of the full tensor and bytes each rank sends in a ring
    (README section 3), in a forward and a backward panel. Returns the
    picture (an image in the notebook and in the feedback; no pyplot).
    """
    from matplotlib.patches import Patch

    runs = {}
    for sp in (False, True):
        case = _pair_case(world_size, hidden, ffn, seq, batch, sp, dtype, seed)
        res = run_distributed(_pair_rank, world_size, args=(ColumnParallelLinear, RowParallelLinear,
                                                            inputs_only(case, "out", "x_grad"), backend),
                              timeout=timeout, backend=backend)
        runs[sp] = [r for r in res[0]["records"] if r.op != "wait"]
    fig, axes = new_figure(figsize=(11, 4.2), nrows=2, ncols=2, sharey=True)
    for row, sp in enumerate((False, True)):
        for col, phase in enumerate(("forward", "backward")):
            ax = axes[row][col]
            recs = [r for r in runs[sp] if r.phase == phase]
            for i, r in enumerate(recs):
                ax.barh(0, 0.9, left=i, color=_COLORS.get(r.op, "#8172B2"), edgecolor="black")
                ax.text(i + 0.45, 0, f"{r.op.replace('_', '-')}\n{fmt_shape(r.shape)}\n{r.bytes} B\n"
                        f"sends {_ring_bytes(r, world_size):g} B", ha="center", va="center", fontsize=8,
                        color="white")
            ax.set_xlim(-0.1, max(2, len(recs)) + 0.1)
            ax.set_yticks([])
            ax.set_xticks([])
            sent = sum(_ring_bytes(r, world_size) for r in recs)
            label = "TP + SP" if sp else "TP"
            ax.set_title(f"{label}, {phase}: {len(recs)} collective(s), each rank sends {sent:g} B", fontsize=10)
    fig.suptitle(f"Column({hidden}->{ffn}) -> Row({ffn}->{hidden}), rank 0 of {world_size}, "
                 f"[s, b, h] = [{seq}, {batch}, {hidden}] {dtype_name(dtype)} (bytes = the full tensor of each op)",
                 fontsize=10)
    fig.legend(handles=[Patch(color=c, label=o) for o, c in _COLORS.items() if o != "wait"],
               loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.08))
    return picture(fig)
