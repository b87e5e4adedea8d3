"""Public checks of assignment 01, exercises 1-4: all_reduce_gradients, BucketedDDP, the ZeRO ledger, ZeRO.

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

import contextlib
import math
import time

import torch
import torch.distributed as dist
from torch import nn

from autograder.checks import one_thread
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import rank_device, run_distributed
from autograder.lessons.plots import new_figure, picture
from autograder.runtime.ledger import CommLedger, check_consistent, counts, expect_comm, expect_no_comm, format_trace, select

__all__ = ["ToyNet", "check_broadcast_module_states", "check_all_reduce_gradients", "check_ddp_broadcast",
           "check_ddp_gradients", "check_ddp_buckets", "check_ddp_no_sync", "check_zero_bytes_per_param",
           "check_zero_matches_optimizer", "check_zero_rounding", "check_zero_state_sharded", "check_zero_comm",
           "expected_buckets", "param_groups", "zero_padded_size", "OPTIMIZER_HYPER", "PADDING_BOUND_PER_RANK",
           "plot_memory_ledger", "ddp_timeline", "plot_ddp_timeline"]


# ---------------------------------------------------------------------------
# The toy model and helpers shared by the rank programs
# ---------------------------------------------------------------------------

class ToyNet(nn.Module):
    """Linear layers `dims[0] -> dims[1] -> ...` with tanh between them, plus optional oddities.

    unused: a linear layer registered first and never called (no gradient).
    frozen: an output scale with requires_grad=False (broadcast, never bucketed).
    tied: layer 2 reuses layer 1's weight (needs dims[1] == dims[2] == dims[3]).
    mixed: after `cast(dtype)`, layer 1 is float32 and the rest `dtype` (each layer
    casts its input to its own dtype): a model whose parameters change dtype.
    """

    def __init__(self, dims, *, unused=False, frozen=False, tied=False, mixed=False):
        super().__init__()
        if mixed and len(dims) < 4:
            raise ValueError(f"ToyNet(mixed=True) needs at least 3 layers, got dims {dims}")
        self.mixed = mixed
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
            x = layer(x.to(layer.weight.dtype))
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x * self.scale if self.frozen else x

    def cast(self, dtype):
        """`self.to(dtype)`, but layer 1 float32 when `mixed`; returns self."""
        self.to(dtype)
        if self.mixed:
            self.layers[1].to(torch.float32)
        return self


def _build(model_kw, state, dtype, device):
    model = ToyNet(**model_kw).cast(dtype)
    model.load_state_dict(state)
    return model.to(device)


def _initial_state(model_kw, dtype, seed):
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
        torch.manual_seed(seed)
        return ToyNet(**model_kw).cast(dtype).state_dict()


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


@one_thread
def check_broadcast_module_states(fn, *, world_size=2, dims=(5, 7, 3), frozen=True, seed=0, backend="gloo"):
    """After fn(model, group=...) every rank holds rank 0's parameters (frozen ones included)."""
    model_kw = dict(dims=dims, frozen=frozen)
    outs = run_distributed(_broadcast_rank, world_size, args=(fn, model_kw, seed, backend), backend=backend)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
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


@one_thread
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
    names = {p: n for n, p in model.named_parameters()}  # a tied parameter: its first name
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


# How long a late rank waits for rank 0 to block in wait() before it starts anyway (a submission that waits
# some other way than Work.wait(): it is then merely late, by this much).
_LATE_RANK_FALLBACK_S = 1.0


_LATE_RANK_KEY = "autograder/late_rank/rank0_waits"


def _store():
    """The store the ranks met through (the runner's): shared by the ranks wherever they run."""
    return dist.distributed_c10d._get_default_store()


@contextlib.contextmanager
def _signal_on_wait():
    """While active, the first `Work.wait()` of this rank sets _LATE_RANK_KEY in the store before it blocks."""
    previous = dist.Work.wait
    store = _store()
    signalled = []

    def signal():
        if not signalled:
            signalled.append(True)
            store.set(_LATE_RANK_KEY, b"1")

    def wait(work, *args, **kwargs):
        signal()
        return previous(work, *args, **kwargs)

    dist.Work.wait = wait
    try:
        yield
    finally:
        dist.Work.wait = previous
        signal()


def _wait_for_rank0(timeout):
    store = _store()
    deadline = time.monotonic() + timeout
    while not store.check([_LATE_RANK_KEY]) and time.monotonic() < deadline:
        time.sleep(0.001)


def _ddp_rank(rank, world_size, ddp_cls, model_kw, state, dtype, xs, ys, batch, cap, micro, late_rank, backend):
    dev = rank_device(rank, backend)
    model = _build(model_kw, state, dtype, dev)
    ddp = ddp_cls(model, group=_world(), bucket_cap_mb=cap)
    rows = slice(rank * batch, (rank + 1) * batch)
    marks = []
    with CommLedger(trace_compute=True) as ledger:
        for i in range(micro):
            last = i == micro - 1
            marks.append(len(ledger.records))
            if last and late_rank and rank > 0:
                # Start the last backward only once rank 0 is blocked in wait() (or done): its buckets
                # cannot have been reduced before it calls wait(), whatever the scheduling.
                _wait_for_rank0(_LATE_RANK_FALLBACK_S)
            if last:
                _loss(ddp, xs[i][rows].to(dev), ys[i][rows].to(dev)).backward()
            else:
                with ddp.no_sync():
                    _loss(ddp, xs[i][rows].to(dev), ys[i][rows].to(dev)).backward()
        marks.append(len(ledger.records))
        if not late_rank and world_size > 1 and backend == "gloo":
            # Let every bucket's all-reduce finish before finish_gradient_synchronization() (a gloo barrier
            # completes only after all earlier work of the group): copying before wait() then gives the same
            # numbers on every run here, and only the late-rank case (check_ddp_gradients) tests the wait.
            dist.barrier(group=_world())
            del ledger.records[marks[-1]:]  # the check's own barrier is not the student's communication
        with ledger.outside():
            if late_rank and rank == 0:
                with _signal_on_wait():
                    ddp.finish_gradient_synchronization()
            else:
                ddp.finish_gradient_synchronization()
    return {"grads": _grads(model), "comm": ledger.records, "ops": ledger.ops, "marks": marks}


def _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, frozen, tied, dtype, seed, micro, late_rank,
             backend, mixed=False):
    model_kw = dict(dims=dims, unused=unused, frozen=frozen, tied=tied, mixed=mixed)
    state = _initial_state(model_kw, dtype, seed)
    xs, ys = _batches(seed, micro, batch, dims, dtype, world_size)
    late = late_rank and world_size > 1
    # the late rank's handshake needs rank 0 to launch before its peers: no collective agreement then
    outs = run_distributed(_ddp_rank, world_size, backend=backend, check_collectives=not late,
                           args=(ddp_cls, model_kw, state, dtype, xs, ys, batch, bucket_cap_mb, micro, late,
                                 backend))
    model = _build(model_kw, state, dtype, "cpu")
    for i in range(micro):  # gradient accumulation: sum over micro-steps of global-batch means
        _loss(model, xs[i], ys[i]).backward()
    return outs, _grads(model), model


def _ddp_broadcast_rank(rank, world_size, ddp_cls, model_kw, seed, backend):
    torch.manual_seed(seed + 1000 * rank)  # every rank starts from different weights
    model = ToyNet(**model_kw).to(torch.float64).to(rank_device(rank, backend))
    with CommLedger() as ledger:
        ddp_cls(model, group=_world(), bucket_cap_mb=25)
    return {"state": {k: v.cpu() for k, v in model.state_dict().items()}, "comm": ledger.records}


@one_thread
def check_ddp_broadcast(ddp_cls, *, world_size=2, dims=(5, 7, 3), frozen=True, seed=0, backend="gloo"):
    """Constructing BucketedDDP copies rank 0's parameters (frozen ones too) to every rank."""
    model_kw = dict(dims=dims, frozen=frozen)
    # the student's class goes to the ranks as an argument (never inside a closure of the check's)
    outs = run_distributed(_ddp_broadcast_rank, world_size, args=(ddp_cls, model_kw, seed, backend), backend=backend)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        expected = ToyNet(**model_kw).to(torch.float64).state_dict()
    for rank, out in enumerate(outs):
        for name, exp in expected.items():
            assert_close(out["state"][name], exp, name=f"{name} after BucketedDDP(...)", rank=rank)
    check_consistent([o["comm"] for o in outs], context="BucketedDDP broadcast")


@one_thread
def check_ddp_gradients(ddp_cls, *, world_size=2, dims=(5, 7, 3), batch=3, bucket_cap_mb=25.0, unused=False,
                        frozen=False, tied=False, mixed=False, dtype=torch.float64, seed=0, late_rank=False,
                        backend="gloo"):
    """After backward + finish_gradient_synchronization() every rank holds the global-batch gradients.

    A parameter no rank used gets zeros. `late_rank`: ranks 1.. start their
    backward only once rank 0 has called `Work.wait()` in
    finish_gradient_synchronization() (or returned from it), so rank 0's
    buckets are certainly unreduced until it waits: copying them into `.grad`
    before `wait()` gives wrong numbers on every run. This order is enforced by
    a key rank 0 sets in the ranks' store (not by timing), so the verdict is deterministic;
    a submission that waits other than by `Work.wait()` makes its peers wait
    `_LATE_RANK_FALLBACK_S` and is checked all the same.
    """
    outs, expected, _ = _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, frozen, tied, dtype,
                                 seed, 1, late_rank, backend, mixed=mixed)
    for rank, out in enumerate(outs):
        _compare_grads(out["grads"], expected, rank=rank, what="finish_gradient_synchronization()",
                       missing_is_zero=True)


def _bucket_report(buckets, model):
    params = dict(model.named_parameters())
    return "\n".join(f"    bucket {i}: {b} ({sum(params[n].numel() for n in b)} elements, "
                     f"{sum(params[n].numel() * params[n].element_size() for n in b)} bytes, "
                     f"{dtype_name(params[b[0]].dtype)})" for i, b in enumerate(buckets))


@one_thread
def check_ddp_buckets(ddp_cls, *, world_size=2, dims=(5, 7, 3), batch=3, bucket_cap_mb=25.0, unused=False,
                      frozen=False, tied=False, mixed=False, dtype=torch.float64, seed=0, backend="gloo"):
    """One async all-reduce per bucket, of the bucket's size and dtype, in bucket order, all in backward.

    And overlap: when the first bucket does not contain the first layer, its
    all-reduce must be issued before backward computes the first layer's
    weight gradient (launched as soon as it is full, not at the end). Order is
    read from the ledger's sequence numbers: CPU autograd runs backward's ops
    in one thread, in an order fixed by the graph, so it is the same every run.
    """
    outs, _, model = _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, frozen, tied, dtype,
                              seed, 1, False, backend, mixed=mixed)
    buckets = expected_buckets(model, bucket_cap_mb)
    params = dict(model.named_parameters())
    shapes = [((sum(params[n].numel() for n in b),), dtype_name(params[b[0]].dtype)) for b in buckets]
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
        got = [(tuple(r.shape), r.dtype) for r in reduces]
        if got != shapes:
            fmt = lambda xs: ", ".join(f"{fmt_shape(s)} {d}" for s, d in xs)  # noqa: E731
            raise CheckFailure(f"rank {rank}: expected {len(shapes)} all_reduce ({fmt(shapes)}: one per bucket, "
                               f"bucket order), saw {len(got)} ({fmt(got)}).\n{report}\nCommunication of rank "
                               f"{rank}:\n{format_trace(comm, rank)}")
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


@one_thread
def check_ddp_no_sync(ddp_cls, *, world_size=2, dims=(5, 7, 3), batch=3, micro_steps=3, bucket_cap_mb=25.0,
                      unused=False, dtype=torch.float64, seed=0, backend="gloo"):
    """Inside no_sync() nothing is communicated; the last micro-step all-reduces the accumulated grads.

    Which micro-step issued what is read from positions in the ledger recorded
    between micro-steps (the rank program's own order: deterministic); the
    buckets are settled by a barrier before finish_gradient_synchronization()
    (see _ddp_rank), so the numbers do not depend on gloo's threads either.
    """
    outs, expected, model = _run_ddp(ddp_cls, world_size, dims, batch, bucket_cap_mb, unused, False, False, dtype,
                                     seed, micro_steps, False, backend)
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

@one_thread
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

# Hyperparameters of the graded optimizers (lr comes from the schedule `lrs`; a parameter group may set its
# own lr scale and weight decay).
OPTIMIZER_HYPER = {
    torch.optim.AdamW: dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
    torch.optim.Adam: dict(betas=(0.8, 0.99), eps=1e-8, weight_decay=0.0),
    torch.optim.SGD: dict(momentum=0.9, weight_decay=0.01),
}
# Padding accepted in the flat buffer: a multiple of d, less than this many elements per rank
# (Megatron pads each bucket to lcm(d, 128), which is at most 128 * d).
PADDING_BOUND_PER_RANK = 128


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

    # optimizer.state, and that of inner optimizers (torch's optimizer run on the owned pieces)
    holders = [opt] + [v for v in vars(opt).values() if isinstance(v, torch.optim.Optimizer) and v is not opt]
    for holder in holders:
        state = getattr(holder, "state", None)
        if isinstance(state, dict):
            for value in state.values():
                walk("state", value)
    return summary


def param_groups(model, groups, lr):
    """The parameters of `model` for a torch optimizer: a list, or parameter groups.

    `groups`: None, or ((name suffix, lr scale, weight decay), ...): each
    parameter goes to the first group whose suffix ends its name ("" takes
    the rest). Returns (params or groups, lr scale of each group).
    """
    if groups is None:
        return list(model.parameters()), [1.0]
    members = [[] for _ in groups]
    for name, p in model.named_parameters():
        members[next(i for i, (suffix, _, _) in enumerate(groups) if name.endswith(suffix))].append(p)
    return ([{"params": ps, "lr": lr * scale, "weight_decay": wd} for ps, (_, scale, wd) in zip(members, groups)],
            [scale for _, scale, _ in groups])


def _zero_rank(rank, world_size, opt_cls, model_kw, state, dtype, xs, ys, batch, lrs, optim, backend):
    dev = rank_device(rank, backend)
    model = _build(model_kw, state, dtype, dev)
    optimizer_class, hyper, groups = optim
    params, scales = param_groups(model, groups, lrs[0])
    opt = opt_cls(params, optimizer_class=optimizer_class, group=_world(), lr=lrs[0], **hyper)
    rows = slice(rank * batch, (rank + 1) * batch)
    with CommLedger() as ledger:
        for step, lr in enumerate(lrs):
            for g, scale in zip(opt.param_groups, scales):
                g["lr"] = lr * scale  # a schedule: the optimizer must read the current value
            for p in model.parameters():
                p.grad = None
            _loss(model, xs[step][rows].to(dev), ys[step][rows].to(dev)).backward()
            with ledger.outside():
                opt.step()
    params = {name: p.detach().cpu() for name, p in model.named_parameters()}
    return {"params": params, "state": _state_summary(opt), "comm": ledger.records}


def _run_zero(opt_cls, world_size, dims, batch, lrs, unused, frozen, tied, dtype, seed, backend,
              optimizer_class=torch.optim.AdamW, groups=None):
    model_kw = dict(dims=dims, unused=unused, frozen=frozen, tied=tied)
    state = _initial_state(model_kw, dtype, seed)
    xs, ys = _batches(seed, len(lrs), batch, dims, dtype, world_size)
    optim = (optimizer_class, OPTIMIZER_HYPER[optimizer_class], groups)
    outs = run_distributed(_zero_rank, world_size, backend=backend,
                           args=(opt_cls, model_kw, state, dtype, xs, ys, batch, list(lrs), optim, backend))
    model = _build(model_kw, state, dtype, "cpu")
    params, scales = param_groups(model, groups, lrs[0])
    ref = optimizer_class(params, lr=lrs[0], **OPTIMIZER_HYPER[optimizer_class])
    for step, lr in enumerate(lrs):
        for g, scale in zip(ref.param_groups, scales):
            g["lr"] = lr * scale
        ref.zero_grad()
        _loss(model, xs[step], ys[step]).backward()
        ref.step()
    return outs, model


def _trainable_numel(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def zero_padded_size(comm, total, world_size, *, rank):
    """The student's padded buffer size: the size of the first reduce-scatter in `comm`.

    Any multiple of the group size that holds the `total` trainable elements
    with less than PADDING_BOUND_PER_RANK * d elements of padding; None when
    there is no reduce-scatter (the minimal padding is then assumed).
    """
    scatters = select(comm, op="reduce_scatter")
    if not scatters:
        return None
    size = math.prod(scatters[0].shape)
    bound = PADDING_BOUND_PER_RANK * world_size
    if size % world_size or not total <= size < total + bound:
        raise CheckFailure(f"rank {rank}: the reduce-scatter has {size} elements; the flat buffer of {total} "
                           f"trainable elements must be padded to a multiple of the group size {world_size}, with "
                           f"less than {bound} elements of padding.\n{format_trace(comm, rank)}")
    return size


def _zero_comm_expectations(comm, *, rank, world_size, total, steps, dtype, ctx):
    """Per step exactly one reduce-scatter and one all-gather of the same padded size, outside; nothing else."""
    if world_size == 1:
        expect_no_comm(comm, rank=rank, context=f"{ctx}; a group of one communicates nothing")
        return
    padded = zero_padded_size(comm, total, world_size, rank=rank) or -(-total // world_size) * world_size
    ctx = f"{ctx}, {total} trainable elements padded to {padded}"
    expect_no_comm([r for r in comm if r.phase != "outside"], rank=rank, context="forward and backward")
    expect_comm(comm, rank=rank, op="reduce_scatter", count=steps, phase="outside", shape=(padded,), dtype=dtype,
                context=ctx)
    expect_comm(comm, rank=rank, op="all_gather", count=steps, phase="outside", shape=(padded,), dtype=dtype,
                context=ctx + "; the all-gather mirrors the reduce-scatter")
    extra = {k: v for k, v in counts(comm).items() if k not in ("reduce_scatter", "all_gather")}
    if extra:
        raise CheckFailure(f"rank {rank} ({ctx}): unexpected communication {dict(extra)}:\n"
                           f"{format_trace(comm, rank)}")


def _zero_ctx(optimizer_class, groups, world_size, lrs):
    g = "" if groups is None else f", parameter groups {list(groups)} (name suffix, lr scale, weight decay)"
    return f"{optimizer_class.__name__}{g}, world size {world_size}, {len(lrs)} step(s)"


@one_thread
def check_zero_matches_optimizer(opt_cls, *, world_size=2, dims=(5, 7, 3), batch=3, lrs=(1e-2, 1e-2, 1e-2),
                                 optimizer_class=torch.optim.AdamW, param_groups=None, unused=False, frozen=False,
                                 tied=False, dtype=torch.float64, seed=0, backend="gloo"):
    """After len(lrs) steps every rank's parameters equal `optimizer_class` run by one process on the global batch.

    `lrs[i]` (times the group's lr scale) is written to each parameter
    group's "lr" before step i (a schedule). Hyperparameters: OPTIMIZER_HYPER.
    """
    outs, model = _run_zero(opt_cls, world_size, dims, batch, lrs, unused, frozen, tied, dtype, seed, backend,
                            optimizer_class, param_groups)
    ctx = _zero_ctx(optimizer_class, param_groups, world_size, lrs)
    findings = Findings()
    for rank, out in enumerate(outs):
        with findings.communication(hint=True):
            _zero_comm_expectations(out["comm"], rank=rank, world_size=world_size, total=_trainable_numel(model),
                                    steps=len(lrs), dtype=dtype, ctx=ctx)
        with findings.numbers():
            for name, p in model.named_parameters():
                assert_close(out["params"].get(name), p.detach(), name=f"{name} after {ctx}", rank=rank)
    findings.raise_if_any()
    check_consistent([o["comm"] for o in outs], context="ZeroShardedOptimizer.step")


@one_thread
def check_zero_state_sharded(opt_cls, *, world_size=2, dims=(5, 7, 3), batch=3, steps=2,
                             optimizer_class=torch.optim.AdamW, param_groups=None, unused=False, frozen=False,
                             tied=False, dtype=torch.float64, seed=0, backend="gloo"):
    """Each rank's optimizer state (tensors in `optimizer.state`, or in an inner optimizer's) covers its shard only.

    What it measures: the elements and dtypes of every tensor of dimension >= 1
    in the optimizer's `state` after `steps` steps, per state key. Each key
    must hold at most the shard (padded / d, the padding read from the
    student's reduce-scatter) and at least the elements of this rank's range
    that have gradients. Deterministic: it counts tensors, not memory.
    """
    lrs = [1e-2] * steps
    outs, model = _run_zero(opt_cls, world_size, dims, batch, lrs, unused, frozen, tied, dtype, seed, backend,
                            optimizer_class, param_groups)
    total = _trainable_numel(model)
    want = str(torch.float64 if dtype == torch.float64 else torch.float32)
    ctx = _zero_ctx(optimizer_class, param_groups, world_size, lrs)
    order = [p for g in param_groups_order(model, param_groups) for p in g]  # the flat buffer's order
    names = {p: n for n, p in model.named_parameters()}
    for rank, out in enumerate(outs):
        try:  # the student's padding (an invalid one is graded by check_zero_comm; assume the minimal here)
            padded = zero_padded_size(out["comm"], total, world_size, rank=rank)
        except CheckFailure:
            padded = None
        padded = padded or -(-total // world_size) * world_size
        shard = padded // world_size
        lo, hi = rank * shard, (rank + 1) * shard
        owned, offset = 0, 0  # elements of this rank's range that belong to parameters with a gradient
        for p in order:
            if p.requires_grad:
                if not names[p].startswith("unused"):
                    owned += max(0, min(offset + p.numel(), hi) - max(offset, lo))
                offset += p.numel()
        summary = out["state"]
        if not summary and owned:  # a rank that owns only padding (or unused parameters) has no state
            raise CheckFailure(f"rank {rank} ({ctx}): found no state tensors in optimizer.state (nor in an inner "
                               f"optimizer kept as an attribute); the optimizer's state for your range must be there.")
        for key, (numel, dtypes) in summary.items():
            if numel > shard:
                raise CheckFailure(f"rank {rank} ({ctx}): optimizer state {key!r} holds {numel} elements; the shard "
                                   f"of this rank is {shard} elements ({total} parameters padded to {padded}, over "
                                   f"{world_size} ranks). ZeRO keeps state for the owned range only.")
            if numel < owned:
                raise CheckFailure(f"rank {rank} ({ctx}): optimizer state {key!r} holds {numel} elements, but this "
                                   f"rank updates {owned} elements of its range [{lo}, {hi}) that have gradients; "
                                   f"each needs its own state.")
            if dtypes != [want]:
                raise CheckFailure(f"rank {rank} ({ctx}): optimizer state {key!r} has dtype {dtypes}, expected "
                                   f"{want} for {dtype_name(dtype)} parameters.")


def param_groups_order(model, groups):
    """The parameters in flat-buffer order: group by group, each in model order."""
    params, _ = param_groups(model, groups, 1.0)
    return [g["params"] for g in params] if groups is not None else [params]


@one_thread
def check_zero_comm(opt_cls, *, world_size=2, dims=(5, 7, 3), batch=3, steps=2, optimizer_class=torch.optim.AdamW,
                    param_groups=None, unused=False, frozen=False, tied=False, dtype=torch.float64, seed=0,
                    backend="gloo"):
    """Per step exactly one reduce-scatter and one all-gather of the padded flat size, and nothing else.

    The padded size is the student's (read from the reduce-scatter): any
    multiple of d with less than PADDING_BOUND_PER_RANK * d elements of padding.
    """
    lrs = [1e-2] * steps
    outs, model = _run_zero(opt_cls, world_size, dims, batch, lrs, unused, frozen, tied, dtype, seed, backend,
                            optimizer_class, param_groups)
    ctx = _zero_ctx(optimizer_class, param_groups, world_size, lrs)
    for rank, out in enumerate(outs):
        _zero_comm_expectations(out["comm"], rank=rank, world_size=world_size, total=_trainable_numel(model),
                                steps=steps, dtype=dtype, ctx=ctx)
    check_consistent([o["comm"] for o in outs], context="ZeroShardedOptimizer.step")


def _skipped(flag, step):
    """frozen/unused: never a grad; late: no grad at step 0 (its step counter lags behind)."""
    return flag in ("frozen", "unused") or (flag == "late" and step == 0)


def _rounding_rank(rank, world_size, opt_cls, optimizer_class, params, grads, flags, lrs, backend):
    dev = rank_device(rank, backend)
    ps = [nn.Parameter(p.clone().to(dev), requires_grad=flag != "frozen") for p, flag in zip(params, flags)]
    opt = opt_cls(ps, optimizer_class=optimizer_class, group=_world(), lr=lrs[0], **OPTIMIZER_HYPER[optimizer_class])
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        for i, p in enumerate(ps):
            p.grad = None if _skipped(flags[i], step) else grads[step][rank][i].to(dev)
        opt.step()
    return [p.detach().cpu() for p in ps]


@one_thread
def check_zero_rounding(opt_cls, *, world_size=2, shapes=((3, 5), (7,), (1,), (2, 2), (4,)),
                        flags=("", "late", "unused", "", "frozen"), lrs=(1e-2, 3e-3, 1e-2),
                        optimizer_class=torch.optim.AdamW, seed=0, backend="gloo"):
    """float32: agreement with `optimizer_class` (default torch.optim.AdamW) to rtol 1e-7.

    Gradients are small dyadic numbers, so their average over the ranks is
    exact in any summation order and any difference comes from the update
    itself: run torch's optimizer on the owned pieces (or the same operations
    in the same order).
    """
    g = torch.Generator().manual_seed(seed)
    # parameters of the size of a few updates, so a last-bit difference in the update shows in them
    params = [torch.randn(s, generator=g) * 1e-2 for s in shapes]
    grads = [[[torch.randint(-1024, 1024, s, generator=g).float() / 4096 for s in shapes] for _ in range(world_size)]
             for _ in lrs]
    outs = run_distributed(_rounding_rank, world_size, backend=backend,
                           args=(opt_cls, optimizer_class, params, grads, list(flags), list(lrs), backend))
    ref = [nn.Parameter(p.clone(), requires_grad=f != "frozen") for p, f in zip(params, flags)]
    opt = optimizer_class(ref, lr=lrs[0], **OPTIMIZER_HYPER[optimizer_class])
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        for i, p in enumerate(ref):
            p.grad = None if _skipped(flags[i], step) else sum(grads[step][r][i] for r in range(world_size)) / world_size
        opt.step()
    for rank, out in enumerate(outs):
        for i, p in enumerate(ref):
            assert_close(out[i], p.detach(), name=f"{optimizer_class.__name__}: parameter {i} {fmt_shape(shapes[i])} "
                         f"({flags[i] or 'trained'})", rank=rank, rtol=1e-7, atol=0.0)


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
