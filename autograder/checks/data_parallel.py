"""Public checks of assignment 01 (data parallelism): what is graded, readable.

Each `check_*` takes the student's implementation plus keyword parameters,
runs a rank program of this module in `world_size` processes, and decides in
the calling process: the numbers against a single-process reference built from
the same initial weights and the same global batch, and the communication from
each rank's `CommLedger`. It returns None or raises CheckFailure /
DistributedError naming the rank, the tensor and the element.

    from autograder.checks.data_parallel import check_all_reduce_gradients
    check_all_reduce_gradients(all_reduce_gradients, world_size=2)
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.compare import CheckFailure, assert_close, dtype_name, fmt_shape
from autograder.dist import rank_device, run_distributed
from autograder.plots import new_figure, picture
from autograder.ledger import CommLedger, check_consistent, counts, expect_comm, expect_no_comm, format_trace, select

__all__ = ["ToyNet", "check_broadcast_module_states", "check_all_reduce_gradients", "check_ddp_broadcast",
           "check_ddp_gradients", "check_ddp_buckets", "check_ddp_no_sync", "check_zero_bytes_per_param",
           "check_zero_matches_adamw", "check_zero_rounding", "check_zero_state_sharded", "check_zero_comm",
           "check_fsdp_numerics", "check_fsdp_comm", "check_fsdp_frees", "expected_buckets",
           "plot_memory_ledger", "ddp_timeline", "plot_ddp_timeline"]


# ---------------------------------------------------------------------------
# The toy model and helpers shared by the rank programs
# ---------------------------------------------------------------------------

class ToyNet(nn.Module):
    """Linear layers `dims[0] -> dims[1] -> ...` with tanh between them, plus optional oddities.

    unused: a linear layer registered first and never called (no gradient).
    frozen: an output scale with requires_grad=False (broadcast, never bucketed).
    tied: layer 2 reuses layer 1's weight (needs dims[1] == dims[2] == dims[3]).
    """

    def __init__(self, dims, *, unused=False, frozen=False, tied=False):
        super().__init__()
        if unused:
            self.unused = nn.Linear(2, 3)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        if tied:
            if len(dims) < 4 or not dims[1] == dims[2] == dims[3]:
                raise ValueError(f"ToyNet(tied=True) needs dims[1] == dims[2] == dims[3], got {dims}")
            self.layers[2].weight = self.layers[1].weight
        if frozen:
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dims[-1]), requires_grad=False)
        self.frozen = frozen

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x * self.scale if self.frozen else x


def _build(model_kw, state, dtype, device):
    model = ToyNet(**model_kw).to(dtype)
    model.load_state_dict(state)
    return model.to(device)


def _initial_state(model_kw, dtype, seed):
    torch.manual_seed(seed)
    return ToyNet(**model_kw).to(dtype).state_dict()


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()  # local mean: DDP averages local means


def _batches(seed, n, batch, dims, dtype, world_size):
    """n global batches of world_size * batch samples (rank r gets rows [r*batch, (r+1)*batch))."""
    g = torch.Generator().manual_seed(seed + 1)
    xs = torch.randn(n, world_size * batch, dims[0], generator=g, dtype=torch.float64).to(dtype)
    ys = torch.randn(n, world_size * batch, dims[-1], generator=g, dtype=torch.float64).to(dtype)
    return xs, ys


def _grads(model):
    return {name: (p.grad.detach().cpu() if p.grad is not None else None)
            for name, p in model.named_parameters() if p.requires_grad}


def _reference_grads(model_kw, state, dtype, x, y):
    model = _build(model_kw, state, dtype, "cpu")
    _loss(model, x, y).backward()
    return _grads(model)


def _compare_grads(got, expected, *, rank, what, missing_is_zero):
    for name, exp in expected.items():
        if name not in got:
            raise CheckFailure(f"rank {rank}: parameter {name!r} is missing from the model after {what}.")
        if exp is None:
            if missing_is_zero:
                assert_close(got[name], torch.zeros_like(_shape_of(got, name)), name=f"grad of {name} (unused)",
                             rank=rank)
            elif got[name] is not None:
                raise CheckFailure(f"rank {rank}: grad of {name} should stay None (no rank produced one), "
                                   f"got a tensor of shape {fmt_shape(got[name].shape)}.")
            continue
        assert_close(got[name], exp, name=f"grad of {name} after {what}", rank=rank)


def _shape_of(got, name):
    t = got[name]
    if t is None:
        raise CheckFailure(f"grad of {name} (a parameter no rank used) is None; after "
                           f"finish_gradient_synchronization() every trainable parameter must have a grad "
                           f"(zeros here).")
    return t


def _world():
    return dist.group.WORLD


# ---------------------------------------------------------------------------
# Worked example and all_reduce_gradients
# ---------------------------------------------------------------------------

def _broadcast_rank(rank, world_size, fn, model_kw, seed, backend):
    torch.manual_seed(seed + 1000 * rank)  # every rank starts from different weights
    model = ToyNet(**model_kw).to(torch.float64).to(rank_device(rank, backend))
    with CommLedger() as ledger:
        fn(model, group=_world())
    return {"state": {k: v.cpu() for k, v in model.state_dict().items()}, "comm": ledger.records}


def check_broadcast_module_states(fn, *, world_size=2, dims=(5, 7, 3), frozen=True, seed=0, backend="gloo"):
    """After fn(model, group=...) every rank holds rank 0's parameters (frozen ones included)."""
    model_kw = dict(dims=dims, frozen=frozen)
    outs = run_distributed(_broadcast_rank, world_size, args=(fn, model_kw, seed, backend), backend=backend)
    torch.manual_seed(seed)
    expected = ToyNet(**model_kw).to(torch.float64).state_dict()
    for rank, out in enumerate(outs):
        for name, exp in expected.items():
            assert_close(out["state"][name], exp, name=f"{name} after the broadcast", rank=rank)
    check_consistent([o["comm"] for o in outs], context="broadcast_module_states")


def _all_reduce_rank(rank, world_size, fn, model_kw, state, dtype, x, y, batch, backend):
    dev = rank_device(rank, backend)
    model = _build(model_kw, state, dtype, dev)
    rows = slice(rank * batch, (rank + 1) * batch)
    _loss(model, x[rows].to(dev), y[rows].to(dev)).backward()
    with CommLedger() as ledger:
        with ledger.outside():
            fn(model, group=_world())
    return {"grads": _grads(model), "comm": ledger.records}


def check_all_reduce_gradients(fn, *, world_size=2, dims=(5, 7, 3), batch=3, dtype=torch.float64,
                               unused=False, frozen=False, tied=False, seed=0, backend="gloo"):
    """Every rank's grads equal the grads of the global-batch mean loss (mean of local means)."""
    model_kw = dict(dims=dims, unused=unused, frozen=frozen, tied=tied)
    state = _initial_state(model_kw, dtype, seed)
    xs, ys = _batches(seed, 1, batch, dims, dtype, world_size)
    outs = run_distributed(_all_reduce_rank, world_size,
                           args=(fn, model_kw, state, dtype, xs[0], ys[0], batch, backend), backend=backend)
    expected = _reference_grads(model_kw, state, dtype, xs[0], ys[0])
    for rank, out in enumerate(outs):
        _compare_grads(out["grads"], expected, rank=rank, what="all_reduce_gradients", missing_is_zero=False)
        if world_size == 1:
            expect_no_comm(out["comm"], rank=rank, context="a group of one communicates nothing")
    check_consistent([o["comm"] for o in outs], context="all_reduce_gradients")


# ---------------------------------------------------------------------------
# BucketedDDP
# ---------------------------------------------------------------------------

def expected_buckets(model, bucket_cap_mb):
    """The bucket rule of spec 4.1 (DDP's compute_bucket_assignment_by_size): lists of parameter names.

    Trainable parameters in reverse order; a bucket closes once it holds at
    least bucket_cap_mb * 2**20 bytes, or when the dtype changes.
    """
    cap = bucket_cap_mb * 2**20
    names = {p: n for n, p in model.named_parameters()}
    buckets, bucket, size = [], [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        if bucket and p.dtype != bucket[0][1].dtype:
            buckets.append(bucket)
            bucket, size = [], 0
        bucket.append((names[p], p))
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(bucket)
            bucket, size = [], 0
    if bucket:
        buckets.append(bucket)
    return [[n for n, _ in b] for b in buckets]


def _ddp_rank(rank, world_size, ddp_cls, model_kw, state, dtype, xs, ys, batch, cap, micro, stagger, backend):
    dev = rank_device(rank, backend)
    model = _build(model_kw, state, dtype, dev)
    ddp = ddp_cls(model, group=_world(), bucket_cap_mb=cap)
    rows = slice(rank * batch, (rank + 1) * batch)
    marks = []
    with CommLedger(trace_compute=True) as ledger:
        for i in range(micro):
            last = i == micro - 1
            marks.append(len(ledger.records))
            if last and stagger:
                time.sleep(stagger * rank)  # later ranks start their last backward late
            if last:
                _loss(ddp, xs[i][rows].to(dev), ys[i][rows].to(dev)).backward()
            else:
                with ddp.no_sync():
                    _loss(ddp, xs[i][rows].to(dev), ys[i][rows].to(dev)).backward()
        marks.append(len(ledger.records))
        with ledger.outside():
            ddp.finish_gradient_synchronization()
    return {"grads": _grads(model), "comm": ledger.records, "ops": ledger.ops, "marks": marks}


def _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, frozen, tied, dtype, seed, micro, stagger,
             backend):
    model_kw = dict(dims=dims, unused=unused, frozen=frozen, tied=tied)
    state = _initial_state(model_kw, dtype, seed)
    xs, ys = _batches(seed, micro, batch, dims, dtype, world_size)
    outs = run_distributed(_ddp_rank, world_size, backend=backend, check_collectives=not stagger,
                           args=(ddp_cls, model_kw, state, dtype, xs, ys, batch, bucket_cap_mb, micro, stagger,
                                 backend))
    model = _build(model_kw, state, dtype, "cpu")
    for i in range(micro):  # gradient accumulation: sum over micro-steps of global-batch means
        _loss(model, xs[i], ys[i]).backward()
    return outs, _grads(model), model


def check_ddp_broadcast(ddp_cls, *, world_size=2, dims=(5, 7, 3), frozen=True, seed=0, backend="gloo"):
    """Constructing BucketedDDP copies rank 0's parameters (frozen ones too) to every rank."""
    check_broadcast_module_states(lambda model, group: ddp_cls(model, group=group, bucket_cap_mb=25),
                                  world_size=world_size, dims=dims, frozen=frozen, seed=seed, backend=backend)


def check_ddp_gradients(ddp_cls, *, world_size=2, dims=(5, 7, 3), batch=3, bucket_cap_mb=25.0, unused=False,
                        frozen=False, tied=False, dtype=torch.float64, seed=0, stagger=0.0, backend="gloo"):
    """After backward + finish_gradient_synchronization() every rank holds the global-batch gradients.

    A parameter no rank used gets zeros. `stagger` (seconds) delays rank r's
    backward by stagger * r, so that rank 0's buckets are still in flight when
    it calls finish_gradient_synchronization(): copying before wait() shows.
    """
    outs, expected, _ = _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, frozen, tied, dtype,
                                 seed, 1, stagger, backend)
    for rank, out in enumerate(outs):
        _compare_grads(out["grads"], expected, rank=rank, what="finish_gradient_synchronization()",
                       missing_is_zero=True)


def _bucket_report(buckets, model):
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    return "\n".join(f"    bucket {i}: {b} ({sum(sizes[n] for n in b)} elements)" for i, b in enumerate(buckets))


def check_ddp_buckets(ddp_cls, *, world_size=2, dims=(5, 7, 3), batch=3, bucket_cap_mb=25.0, unused=False,
                      frozen=False, tied=False, dtype=torch.float64, seed=0, backend="gloo"):
    """One async all-reduce per bucket, of the bucket's size, in bucket order, all in backward.

    And overlap: when the first bucket does not contain the first layer, its
    all-reduce must be issued before backward computes the first layer's
    weight gradient (launched as soon as it is full, not at the end).
    """
    outs, _, model = _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, frozen, tied, dtype,
                              seed, 1, 0.0, backend)
    buckets = expected_buckets(model, bucket_cap_mb)
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    shapes = [(sum(sizes[n] for n in b),) for b in buckets]
    report = f"expected buckets (cap {bucket_cap_mb * 2**20:g} bytes):\n{_bucket_report(buckets, model)}"
    first_weight = tuple(model.layers[0].weight.shape)
    for rank, out in enumerate(outs):
        comm = out["comm"]
        if world_size == 1:
            expect_no_comm(comm, rank=rank, context="a group of one communicates nothing")
            continue
        reduces = select(comm, op="all_reduce")
        others = [r for r in comm if r.op not in ("all_reduce", "wait")]
        if others:
            raise CheckFailure(f"rank {rank}: BucketedDDP should only all-reduce after construction; "
                               f"saw:\n{format_trace(others, rank)}")
        got = [tuple(r.shape) for r in reduces]
        if got != shapes:
            raise CheckFailure(f"rank {rank}: expected {len(shapes)} all_reduce of shapes {shapes} (one per bucket, "
                               f"bucket order), saw {got}.\n{report}\nCommunication of rank {rank}:\n"
                               f"{format_trace(comm, rank)}")
        late = [r for r in reduces if r.phase != "backward"]
        if late:
            raise CheckFailure(f"rank {rank}: {len(late)} bucket all-reduce(s) were issued in phase "
                               f"{late[0].phase!r}, after backward; launch each bucket from the gradient hooks "
                               f"(and leftovers from an end-of-backward callback).\n{format_trace(comm, rank)}")
        sync = [r for r in reduces if not r.async_op]
        if sync:
            raise CheckFailure(f"rank {rank}: bucket all-reduces must be asynchronous (async_op=True) so "
                               f"backward continues; {len(sync)} were not.\n{format_trace(comm, rank)}")
        names0 = set(buckets[0])
        if len(buckets) > 1 and "layers.0.weight" not in names0 and not any(n.startswith("unused") for n in names0):
            first = reduces[0].seq
            later = [o for o in out["ops"] if o.phase == "backward" and o.seq > first and first_weight in o.out_shapes]
            if not later:
                raise CheckFailure(f"rank {rank}: bucket 0 ({buckets[0]}) was all-reduced only after backward had "
                                   f"computed the gradient of layers.0.weight {fmt_shape(first_weight)}; launch a "
                                   f"bucket as soon as its last gradient arrives, to overlap with backward.")
    check_consistent([o["comm"] for o in outs], context="BucketedDDP buckets")


def check_ddp_no_sync(ddp_cls, *, world_size=2, dims=(5, 7, 3), batch=3, micro_steps=3, bucket_cap_mb=25.0,
                      unused=False, dtype=torch.float64, seed=0, backend="gloo"):
    """Inside no_sync() nothing is communicated; the last micro-step all-reduces the accumulated grads."""
    outs, expected, model = _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, False, False, dtype,
                                     seed, micro_steps, 0.0, backend)
    n_buckets = 0 if world_size == 1 else len(expected_buckets(model, bucket_cap_mb))
    for rank, out in enumerate(outs):
        comm, marks = out["comm"], out["marks"]
        expect_no_comm(comm[:marks[-2]], rank=rank, context=f"the first {micro_steps - 1} micro-steps, in no_sync()")
        expect_comm(comm[marks[-2]:marks[-1]], rank=rank, op="all_reduce", count=n_buckets, phase="backward",
                    context="the last micro-step, one per bucket")
        _compare_grads(out["grads"], expected, rank=rank, what=f"{micro_steps} accumulated micro-steps",
                       missing_is_zero=True)


# ---------------------------------------------------------------------------
# zero_bytes_per_param
# ---------------------------------------------------------------------------

def check_zero_bytes_per_param(fn, *, cases=None):
    """The ZeRO memory ledger: p+g+o, p+g+o/d, p+(g+o)/d, (p+g+o)/d bytes per parameter for stages 0-3."""
    cases = cases or [(s, d, {}) for s in range(4) for d in (1, 8)]
    for stage, d, kw in cases:
        p, g, o = kw.get("param_bytes", 2), kw.get("grad_bytes", 2), kw.get("optim_bytes", 12)
        exp = [p + g + o, p + g + o / d, p + (g + o) / d, (p + g + o) / d][stage]
        got = fn(stage, d, **kw)
        if not isinstance(got, (int, float)) or abs(got - exp) > 1e-9 * max(1.0, abs(exp)):
            raise CheckFailure(f"zero_bytes_per_param({stage}, {d}{''.join(f', {k}={v}' for k, v in kw.items())}) "
                               f"returned {got!r}, expected {exp!r}.")


# ---------------------------------------------------------------------------
# ZeroShardedOptimizer
# ---------------------------------------------------------------------------

def _state_summary(opt):
    """{state key: [total elements, dtype names]} over the optimizer's tensors (0-dim step counters excluded)."""
    summary = {}

    def walk(key, value):
        if isinstance(value, torch.Tensor):
            if value.dim() >= 1:
                entry = summary.setdefault(str(key), [0, []])
                entry[0] += value.numel()
                if str(value.dtype) not in entry[1]:
                    entry[1].append(str(value.dtype))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(key, v)

    # optimizer.state, and that of inner optimizers (torch's AdamW run on the owned pieces)
    holders = [opt] + [v for v in vars(opt).values() if isinstance(v, torch.optim.Optimizer) and v is not opt]
    for holder in holders:
        state = getattr(holder, "state", None)
        if isinstance(state, dict):
            for value in state.values():
                walk("state", value)
    return summary


def _zero_rank(rank, world_size, opt_cls, model_kw, state, dtype, xs, ys, batch, lrs, hyper, backend):
    dev = rank_device(rank, backend)
    model = _build(model_kw, state, dtype, dev)
    opt = opt_cls(model.parameters(), group=_world(), lr=lrs[0], **hyper)
    rows = slice(rank * batch, (rank + 1) * batch)
    with CommLedger() as ledger:
        for step, lr in enumerate(lrs):
            opt.param_groups[0]["lr"] = lr
            for p in model.parameters():
                p.grad = None
            _loss(model, xs[step][rows].to(dev), ys[step][rows].to(dev)).backward()
            with ledger.outside():
                opt.step()
    params = {name: p.detach().cpu() for name, p in model.named_parameters()}
    return {"params": params, "state": _state_summary(opt), "comm": ledger.records}


_HYPER = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _run_zero(opt_cls, world_size, dims, batch, lrs, unused, frozen, tied, dtype, seed, backend):
    model_kw = dict(dims=dims, unused=unused, frozen=frozen, tied=tied)
    state = _initial_state(model_kw, dtype, seed)
    xs, ys = _batches(seed, len(lrs), batch, dims, dtype, world_size)
    outs = run_distributed(_zero_rank, world_size, backend=backend,
                           args=(opt_cls, model_kw, state, dtype, xs, ys, batch, list(lrs), _HYPER, backend))
    model = _build(model_kw, state, dtype, "cpu")
    ref = torch.optim.AdamW(model.parameters(), lr=lrs[0], **_HYPER)
    for step, lr in enumerate(lrs):
        ref.param_groups[0]["lr"] = lr
        ref.zero_grad()
        _loss(model, xs[step], ys[step]).backward()
        ref.step()
    return outs, model


def _padded(model, world_size):
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return -(-total // world_size) * world_size, total


def check_zero_matches_adamw(opt_cls, *, world_size=2, dims=(5, 7, 3), batch=3, lrs=(1e-2, 1e-2, 1e-2),
                             unused=False, frozen=False, tied=False, dtype=torch.float64, seed=0, backend="gloo"):
    """After len(lrs) steps every rank's parameters equal torch.optim.AdamW on the global batch.

    `lrs[i]` is written to param_groups[0]["lr"] before step i (a schedule).
    """
    outs, model = _run_zero(opt_cls, world_size, dims, batch, lrs, unused, frozen, tied, dtype, seed, backend)
    for rank, out in enumerate(outs):
        for name, p in model.named_parameters():
            assert_close(out["params"].get(name), p.detach(), name=f"{name} after {len(lrs)} steps", rank=rank)
    check_consistent([o["comm"] for o in outs], context="ZeroShardedOptimizer.step")


def check_zero_state_sharded(opt_cls, *, world_size=2, dims=(5, 7, 3), batch=3, steps=2, unused=False,
                             frozen=False, tied=False, dtype=torch.float64, seed=0, backend="gloo"):
    """Each rank's optimizer state (tensors in `optimizer.state`, or in an inner optimizer's) covers its shard only."""
    outs, model = _run_zero(opt_cls, world_size, dims, batch, [1e-2] * steps, unused, frozen, tied, dtype, seed,
                            backend)
    padded, total = _padded(model, world_size)
    shard = padded // world_size
    want = str(torch.float64 if dtype == torch.float64 else torch.float32)
    for rank, out in enumerate(outs):
        lo, hi = rank * shard, (rank + 1) * shard
        owned, offset = 0, 0  # elements of this rank's range that belong to parameters with a gradient
        for name, p in model.named_parameters():
            if p.requires_grad:
                if not name.startswith("unused"):
                    owned += max(0, min(offset + p.numel(), hi) - max(offset, lo))
                offset += p.numel()
        summary = out["state"]
        if not summary:
            raise CheckFailure(f"rank {rank}: found no state tensors in optimizer.state; keep AdamW's exp_avg and "
                               f"exp_avg_sq for your range there (e.g. self.state[param][\"exp_avg\"]).")
        for key, (numel, dtypes) in summary.items():
            if numel > shard:
                raise CheckFailure(f"rank {rank}: optimizer state {key!r} holds {numel} elements; the shard of this "
                                   f"rank is {shard} elements ({total} parameters padded to {padded}, over "
                                   f"{world_size} ranks). ZeRO keeps state for the owned range only.")
            if numel < owned:
                raise CheckFailure(f"rank {rank}: optimizer state {key!r} holds {numel} elements, but this rank "
                                   f"updates {owned} elements of its range [{lo}, {hi}) that have gradients; "
                                   f"each needs its own AdamW state.")
            if dtypes != [want]:
                raise CheckFailure(f"rank {rank}: optimizer state {key!r} has dtype {dtypes}, expected {want} for "
                                   f"{dtype_name(dtype)} parameters.")


def check_zero_comm(opt_cls, *, world_size=2, dims=(5, 7, 3), batch=3, steps=2, unused=False, frozen=False,
                    tied=False, dtype=torch.float64, seed=0, backend="gloo"):
    """Per step exactly one reduce-scatter and one all-gather of the padded flat size, and nothing else."""
    outs, model = _run_zero(opt_cls, world_size, dims, batch, [1e-2] * steps, unused, frozen, tied, dtype, seed,
                            backend)
    padded, total = _padded(model, world_size)
    n = 0 if world_size == 1 else steps
    ctx = f"{steps} steps, {total} trainable parameters padded to {padded}"
    for rank, out in enumerate(outs):
        comm = out["comm"]
        expect_no_comm([r for r in comm if r.phase != "outside"], rank=rank, context="forward and backward")
        expect_comm(comm, rank=rank, op="reduce_scatter", count=n, phase="outside", shape=(padded,), dtype=dtype,
                    context=ctx)
        expect_comm(comm, rank=rank, op="all_gather", count=n, phase="outside", shape=(padded,), dtype=dtype,
                    context=ctx)
        extra = {k: v for k, v in counts(comm).items() if k not in ("reduce_scatter", "all_gather")}
        if extra:
            raise CheckFailure(f"rank {rank} ({ctx}): unexpected communication {dict(extra)}:\n"
                               f"{format_trace(comm, rank)}")
    check_consistent([o["comm"] for o in outs], context="ZeroShardedOptimizer.step")


def _skipped(flag, step):
    """frozen/unused: never a grad; late: no grad at step 0 (its step counter lags behind)."""
    return flag in ("frozen", "unused") or (flag == "late" and step == 0)


def _rounding_rank(rank, world_size, opt_cls, params, grads, flags, lrs, backend):
    dev = rank_device(rank, backend)
    ps = [nn.Parameter(p.clone().to(dev), requires_grad=flag != "frozen") for p, flag in zip(params, flags)]
    opt = opt_cls(ps, group=_world(), lr=lrs[0], **_HYPER)
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        for i, p in enumerate(ps):
            p.grad = None if _skipped(flags[i], step) else grads[step][rank][i].to(dev)
        opt.step()
    return [p.detach().cpu() for p in ps]


def check_zero_rounding(opt_cls, *, world_size=2, shapes=((3, 5), (7,), (1,), (2, 2), (4,)),
                        flags=("", "late", "unused", "", "frozen"), lrs=(1e-2, 3e-3, 1e-2), seed=0, backend="gloo"):
    """float32: agreement with torch.optim.AdamW to rtol 1e-7 (same operations in the same order).

    Gradients are small dyadic numbers, so their average over the ranks is
    exact and any difference comes from the update itself.
    """
    g = torch.Generator().manual_seed(seed)
    # parameters of the size of a few updates, so a last-bit difference in the update shows in them
    params = [torch.randn(s, generator=g) * 1e-2 for s in shapes]
    grads = [[[torch.randint(-1024, 1024, s, generator=g).float() / 4096 for s in shapes] for _ in range(world_size)]
             for _ in lrs]
    outs = run_distributed(_rounding_rank, world_size, backend=backend,
                           args=(opt_cls, params, grads, list(flags), list(lrs), backend))
    ref = [nn.Parameter(p.clone(), requires_grad=f != "frozen") for p, f in zip(params, flags)]
    opt = torch.optim.AdamW(ref, lr=lrs[0], **_HYPER)
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        for i, p in enumerate(ref):
            p.grad = None if _skipped(flags[i], step) else sum(grads[step][r][i] for r in range(world_size)) / world_size
        opt.step()
    for rank, out in enumerate(outs):
        for i, p in enumerate(ref):
            assert_close(out[i], p.detach(), name=f"parameter {i} {fmt_shape(shapes[i])} ({flags[i] or 'trained'})",
                         rank=rank, rtol=1e-7, atol=0.0)


# ---------------------------------------------------------------------------
# fully_shard / FullyShardedLinear
# ---------------------------------------------------------------------------

class _GatherWatcher(TorchDispatchMode):
    """Keeps a weak reference to the storage of every all-gather output (to see what stays alive)."""

    _OPS = {"_allgather_base_": "output_tensor", "allgather_into_tensor_coalesced_": "outputs",
            "allgather_": "output_tensors", "all_gather_into_tensor": None, "all_gather_into_tensor_out": "out"}

    def __init__(self):
        super().__init__()
        self.storages = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        if func.namespace in ("c10d", "_c10d_functional") and name in self._OPS:
            by_name = {a.name: v for a, v in zip(func._schema.arguments, args)}
            by_name.update(kwargs)
            target = out if self._OPS[name] is None else by_name.get(self._OPS[name])
            for t in _tensors(target):
                self.storages.append((weakref.ref(t.untyped_storage()), tuple(t.shape)))
        return out

    def alive(self):
        """Shapes of gathered outputs whose storage still exists with bytes in it."""
        result = []
        for ref, shape in self.storages:
            s = ref()
            if s is not None and s.nbytes() > 0:
                result.append(shape)
        return result


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def _mlp(dims, bias):
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if i < len(dims) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _fsdp_rank(rank, world_size, shard_fn, dims, bias, state, dtype, x, y, batch, backend):
    dev = rank_device(rank, backend)
    model = _mlp(dims, bias).to(dtype)
    model.load_state_dict(state)
    model = shard_fn(model.to(dev), group=_world())
    shards = list(model.parameters())
    rows = slice(rank * batch, (rank + 1) * batch)
    inp = x[rows].clone().to(dev).requires_grad_()
    watcher, saved = _GatherWatcher(), []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with CommLedger() as ledger:
        with watcher, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(inp)
        alive = watcher.alive()  # right after forward
        ((out - y[rows].to(dev)) ** 2).mean().backward()
    return {"out": out.detach().cpu(), "x_grad": None if inp.grad is None else inp.grad.cpu(),
            "shards": [s.detach().cpu() for s in shards],
            "shard_grads": [None if s.grad is None else s.grad.cpu() for s in shards],
            "comm": ledger.records, "alive": alive, "saved": saved, "n_gathers": len(watcher.storages)}


def _flat(tensors, world_size):
    """Layout of one wrapped linear layer: weight (row-major), then bias, zero-padded to a multiple of d."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    padded = -(-flat.numel() // world_size) * world_size
    return torch.cat([flat, flat.new_zeros(padded - flat.numel())])


def _run_fsdp(shard_fn, world_size, dims, batch, bias, dtype, seed, backend):
    torch.manual_seed(seed)
    model = _mlp(dims, bias).to(dtype)
    state = model.state_dict()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(world_size * batch, dims[0], generator=g, dtype=torch.float64).to(dtype)
    y = torch.randn(world_size * batch, dims[-1], generator=g, dtype=torch.float64).to(dtype)
    outs = run_distributed(_fsdp_rank, world_size, backend=backend,
                           args=(shard_fn, dims, bias, state, dtype, x, y, batch, backend))
    return outs, model, x, y


def check_fsdp_numerics(shard_fn, *, world_size=2, dims=(5, 7, 3), batch=3, bias=True, dtype=torch.float64, seed=0,
                        backend="gloo"):
    """fully_shard(model): outputs, input grads and each rank's shard of the averaged param grads match nn.Linear."""
    outs, model, x, y = _run_fsdp(shard_fn, world_size, dims, batch, bias, dtype, seed, backend)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    grads = [[torch.zeros_like(p) for p in lin.parameters()] for lin in linears]
    for rank in range(world_size):  # averaged gradients of the local-mean losses
        rows = slice(rank * batch, (rank + 1) * batch)
        model.zero_grad()
        inp = x[rows].clone().requires_grad_()
        out = model(inp)
        ((out - y[rows]) ** 2).mean().backward()
        o = outs[rank]
        assert_close(o["out"], out.detach(), name="forward output", rank=rank)
        assert_close(o["x_grad"], inp.grad, name="grad of the input", rank=rank)
        for gs, lin in zip(grads, linears):
            for acc, p in zip(gs, lin.parameters()):
                acc += p.grad / world_size
    for rank, o in enumerate(outs):
        if len(o["shards"]) != len(linears):
            raise CheckFailure(f"rank {rank}: after fully_shard the model has {len(o['shards'])} parameters; expected "
                               f"one flat shard per linear layer ({len(linears)}).")
        for i, (gs, lin) in enumerate(zip(grads, linears)):
            full_w = _flat([p.detach() for p in lin.parameters()], world_size)
            full_g = _flat(gs, world_size)
            shard = full_w.numel() // world_size
            part = slice(rank * shard, (rank + 1) * shard)
            assert_close(o["shards"][i], full_w[part], name=f"flat shard of linear {i}", rank=rank)
            assert_close(o["shard_grads"][i], full_g[part], name=f"grad of the flat shard of linear {i}", rank=rank)


def check_fsdp_comm(shard_fn, *, world_size=2, dims=(5, 7, 3), batch=3, bias=True, dtype=torch.float64, seed=0,
                    backend="gloo"):
    """Per wrapped linear: 1 all-gather in forward; 1 all-gather + 1 reduce-scatter in backward (padded size)."""
    outs, model, _, _ = _run_fsdp(shard_fn, world_size, dims, batch, bias, dtype, seed, backend)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    for rank, o in enumerate(outs):
        comm = o["comm"]
        if world_size == 1:
            expect_no_comm(comm, rank=rank, context="a group of one communicates nothing")
            continue
        for i, lin in enumerate(linears):
            padded = _flat([p.detach() for p in lin.parameters()], world_size).numel()
            same = sum(1 for other in linears
                       if _flat([p.detach() for p in other.parameters()], world_size).numel() == padded)
            ctx = f"linear {i}, flat size {padded}"
            expect_comm(comm, rank=rank, op="all_gather", count=same, phase="forward", shape=(padded,), context=ctx)
            expect_comm(comm, rank=rank, op="all_gather", count=same, phase="backward", shape=(padded,), context=ctx)
            expect_comm(comm, rank=rank, op="reduce_scatter", count=same, phase="backward", shape=(padded,),
                        context=ctx)
        n = len(linears)
        c_fwd, c_bwd = counts(comm, "forward"), counts(comm, "backward")
        if dict(c_fwd) != {"all_gather": n} or dict(c_bwd) != {"all_gather": n, "reduce_scatter": n}:
            raise CheckFailure(f"rank {rank}: expected forward {{all_gather: {n}}} and backward {{all_gather: {n}, "
                               f"reduce_scatter: {n}}}, saw forward {dict(c_fwd)}, backward {dict(c_bwd)}:\n"
                               f"{format_trace(comm, rank)}")
    check_consistent([o["comm"] for o in outs], context="fully_shard")


def check_fsdp_frees(shard_fn, *, world_size=2, dims=(5, 7, 3), batch=3, bias=True, dtype=torch.float64, seed=0,
                     backend="gloo"):
    """After forward no gathered full parameter is alive, and none is saved for backward."""
    outs, model, _, _ = _run_fsdp(shard_fn, world_size, dims, batch, bias, dtype, seed, backend)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    full_shapes = {tuple(lin.weight.shape) for lin in linears} - {(batch, d) for d in dims}
    padded = [_flat([p.detach() for p in lin.parameters()], world_size).numel() for lin in linears]
    full_shapes |= {(n,) for n in padded}
    full_shapes -= {(n // world_size,) for n in padded}  # a shard may have the size of another layer's full buffer
    for rank, o in enumerate(outs):
        if world_size > 1 and o["n_gathers"] == 0:
            raise CheckFailure(f"rank {rank}: forward issued no all-gather; gather the flat parameter in forward.")
        if o["alive"]:
            raise CheckFailure(f"rank {rank}: after forward, {len(o['alive'])} gathered parameter buffer(s) of shape "
                               f"{[fmt_shape(s) for s in o['alive']]} are still allocated. Free them after forward "
                               f"(drop every reference, or untyped_storage().resize_(0)) and gather again in backward.")
        kept = [s for s in o["saved"] if s in full_shapes]
        if world_size > 1 and kept:
            raise CheckFailure(f"rank {rank}: forward saved tensor(s) of shape {[fmt_shape(s) for s in kept]} for "
                               f"backward: a full parameter. Save the input and the shard; gather again in backward.")


# ---------------------------------------------------------------------------
# Pictures (not graded)
# ---------------------------------------------------------------------------

def plot_memory_ledger(zero_bytes_fn, *, num_params=7e9, dp_size=8):
    """Stacked bars: GiB of parameters, gradients and optimizer state per rank for DDP and ZeRO-1/2/3."""
    parts = [("parameters (bf16)", dict(param_bytes=2, grad_bytes=0, optim_bytes=0)),
             ("gradients (bf16)", dict(param_bytes=0, grad_bytes=2, optim_bytes=0)),
             ("optimizer: fp32 master + Adam m, v", dict(param_bytes=0, grad_bytes=0, optim_bytes=12))]
    labels = ["DDP (stage 0)", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP"]
    fig, ax = new_figure(figsize=(7, 3.5))
    bottom = [0.0] * 4
    for name, kw in parts:
        vals = [zero_bytes_fn(s, dp_size, **kw) * num_params / 2**30 for s in range(4)]
        ax.bar(labels, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.1f} GiB", ha="center", va="bottom")
    ax.set_ylim(0, max(bottom) * 1.15)
    ax.set_ylabel("GiB per rank")
    ax.set_title(f"Model state per rank, {num_params / 1e9:g}B parameters, d = {dp_size}")
    ax.legend(fontsize=8)
    return picture(fig)


def _timeline_rank(rank, world_size, ddp_cls, dims, batch, cap):
    torch.manual_seed(0)
    model = ToyNet(dims).to(torch.float64)
    ddp = ddp_cls(model, group=_world(), bucket_cap_mb=cap)
    x = torch.randn(batch, dims[0], dtype=torch.float64)
    with CommLedger(trace_compute=True) as ledger:
        out = ddp(x)
        out.pow(2).mean().backward()
        with ledger.outside():
            ddp.finish_gradient_synchronization()
    return {"comm": ledger.records, "ops": ledger.ops}


def ddp_timeline(ddp_cls, *, world_size=2, dims=(16, 32, 32, 32, 8), batch=4, bucket_cap_mb=2000 / 2**20):
    """Run one BucketedDDP step with a compute-tracing ledger; return rank 0's (records, ops)."""
    out = run_distributed(_timeline_rank, world_size, args=(ddp_cls, dims, batch, bucket_cap_mb))[0]
    return out["comm"], out["ops"]


def plot_ddp_timeline(records, ops):
    """Backward compute ops and bucket all-reduce launches of one rank, in issue order (the ledger's seq)."""
    fig, ax = new_figure(figsize=(9, 2.8))
    colors = {"forward": "tab:blue", "backward": "tab:orange", "outside": "tab:gray"}
    for phase, color in colors.items():
        seqs = [o.seq for o in ops if o.phase == phase]
        ax.scatter(seqs, [0] * len(seqs), marker="|", s=300, color=color, label=f"{phase} compute")
    for r in records:
        if r.op == "all_reduce":
            ax.axvline(r.seq, color="tab:red", lw=1.5)
            ax.text(r.seq, 0.55, f"all_reduce {fmt_shape(r.shape)}", rotation=90, fontsize=7, va="bottom")
        elif r.op == "wait":
            ax.scatter([r.seq], [0.3], marker="v", color="black")
    ax.set_yticks([])
    ax.set_ylim(-0.5, 1.8)
    ax.set_xlabel("issue order on rank 0 (ledger seq); red: bucket all-reduce launched, v: wait()")
    ax.legend(loc="upper left", fontsize=8)
    return picture(fig)
