"""Public checks of assignment 01, exercise 5: FSDP (`fully_shard`, `gather_full_params`), readable.

    from autograder.checks.data_parallel import check_fsdp_numerics
    check_fsdp_numerics(fully_shard, world_size=2)

Each check builds a model here (a small transformer with an embedding, RMSNorm
and an output head tied to the embedding, or a stack of linear layers), runs a
rank program in `world_size` processes that applies the student's `fully_shard`
per block and then to the root (as FSDP2 is used) and trains it, and decides in
this process: against single-process training of the same model on the whole
batch, and from each rank's communication ledger.

What the checks rely on (the notebook's task text): after `fully_shard(m, ...)`
the module `m` has one new parameter, `m.flat_param`, this rank's chunk of the
flat buffer of the parameters the call took, in `named_parameters` order (a
tied parameter once), zero padded to a multiple of the group size; rank r holds
chunk r. The padded size is read from the student's own all-gathers and may be
any multiple of the group size with less than `PADDING_BOUND_PER_RANK * d`
elements of padding (Megatron pads to `lcm(d, 128)`).
"""

from __future__ import annotations

import gc
import math
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.checks import one_thread
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace, select

from .ddp_zero import PADDING_BOUND_PER_RANK

__all__ = ["MixedPrecisionPolicy", "RMSNorm", "Block", "TinyTransformer", "LinearStack", "PADDING_BOUND_PER_RANK",
           "MP_TOLERANCE", "fsdp_units", "check_fsdp_numerics", "check_fsdp_comm", "check_fsdp_memory",
           "check_fsdp_mixed_precision", "check_gather_full_params"]


# (rtol, atol) of a model computed in bfloat16/float16 against the float32 reference, for its outputs,
# gradients and trained shards. Measured on the reference implementation over world sizes 1, 2, 4, seeds
# 0-3 and both models: at these rtols it needs atol 0.039 (bfloat16) and 0.0059 (float16), the outputs
# being the worst: the atols below leave a factor 4.
MP_TOLERANCE = {torch.bfloat16: (0.1, 0.16), torch.float16: (0.02, 0.025)}


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """FSDP2's `torch.distributed.fsdp.MixedPrecisionPolicy`, the two fields this course uses.

    param_dtype: the dtype the parameters are all-gathered in and the module computes in
    (floating inputs are cast to it); None: the parameters' own dtype.
    reduce_dtype: the dtype of the gradient reduce-scatter; None: the gradient's dtype.
    The sharded parameters (master weights) and the optimizer keep their own dtype.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


# ---------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: a custom module with a plain nn.Parameter."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm transformer block: causal single-head attention, then a GeLU MLP. `[b, s, h] -> [b, s, h]`."""

    def __init__(self, hidden, ffn, seq):
        super().__init__()
        self.norm1 = RMSNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.norm2 = RMSNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).triu(1))  # a buffer: never sharded

    def forward(self, x):
        a = self.norm1(x)
        q, k, v = self.q(a), self.k(a), self.v(a)  # [b, s, h] each
        s = x.shape[1]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(x.shape[-1])  # [b, s, s]
        scores = scores.masked_fill(self.causal[:s, :s], float("-inf"))
        x = x + self.o(scores.softmax(-1) @ v)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Token ids `[b, s]` -> logits `[b, s, vocab]`: embedding + a learned position parameter, blocks, RMSNorm,
    and an output head whose weight is the embedding's (tied: one parameter, two names)."""

    def __init__(self, vocab=11, hidden=8, ffn=12, seq=5, layers=2, tied=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(0.1 * torch.randn(seq, hidden))  # a parameter of the root module itself
        self.blocks = nn.ModuleList(Block(hidden, ffn, seq) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:ids.shape[1]]  # [b, s, h]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # [b, s, vocab]


class LinearStack(nn.Module):
    """Linear layers `dims[0] -> dims[1] -> ...` with tanh between them; input `[b, dims[0]]` (float)."""

    def __init__(self, dims, bias=True):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.blocks):
            x = layer(x)
            if i < len(self.blocks) - 1:
                x = torch.tanh(x)
        return x


def _build(case):
    """The case's model with its initial weights, from its seed (the caller's random state is left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])
        model = TinyTransformer(**case["model"]) if case["kind"] == "transformer" else LinearStack(**case["model"])
    return model.to(case["dtype"])


def fsdp_units(model):
    """The units `fully_shard` makes when applied to each of `model.blocks`, then to `model`.

    `[(prefix, [parameter names in flat-buffer order])]` in the order forward
    gathers them: the root first, then the blocks. Names are full names in
    `model`; a tied parameter is listed once (its first name).
    """
    names = [n for n, _ in model.named_parameters()]  # deduplicated, in registration order
    blocks = [f"blocks.{i}." for i in range(len(model.blocks))]
    units = [("", [n for n in names if not n.startswith(tuple(blocks))])]
    units += [(b[:-1], [n for n in names if n.startswith(b)]) for b in blocks]
    return [(prefix, members) for prefix, members in units if members]


def _unit_module(model, prefix):
    return model.get_submodule(prefix) if prefix else model


def _wrap(model, shard_fn, group, kwargs):
    for block in model.blocks:
        shard_fn(block, group=group, **kwargs)
    return shard_fn(model, group=group, **kwargs) or model


# ---------------------------------------------------------------------------
# What stays allocated: weak references to storages, read after gc.collect()
# ---------------------------------------------------------------------------

# How long a storage may stay allocated, after the garbage collector ran, before it counts as kept.
# gloo's worker thread holds the tensors of a finished collective a moment after wait() has returned
# (ProcessGroupGloo::runLoop resets its `workInProgress_` slot only then): a weak reference read at once
# sees them alive on some runs and not on others. A storage the program still references stays allocated
# for good, so waiting for it to go (collecting again every 10 ms) changes no verdict, only removes the race.
# (Well under the runner's 2 s idle limit: ranks that all wait here must not look deadlocked.)
_RELEASE_GRACE_S = 1.0


def _still_allocated(refs):
    """The entries of `refs` [(weakref to a storage, label)] whose storage stays allocated (see _RELEASE_GRACE_S)."""
    deadline = time.monotonic() + _RELEASE_GRACE_S
    while True:
        gc.collect()
        alive = [label for ref, label in refs if ref() is not None and ref().nbytes() > 0]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


class _GatherWatcher(TorchDispatchMode):
    """Keeps a weak reference to the storage of every all-gather output.

    A storage is freed when nothing references it any more, or it holds no
    bytes after `untyped_storage().resize_(0)` (FSDP2's `free_storage`).
    `alive()` runs the garbage collector first, so that the answer does not
    depend on when the collector last ran (a storage that survives a full
    collection is reachable from live objects), and gives gloo's worker thread
    time to drop its own reference (`_RELEASE_GRACE_S`): the same code always
    gets the same answer.
    """

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
        """Shapes of gathered outputs whose storage is still reachable and holds bytes."""
        return _still_allocated(self.storages)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def _storage_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (a view into a larger buffer counts the buffer)."""
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


# ---------------------------------------------------------------------------
# The rank program and the single-process reference
# ---------------------------------------------------------------------------

def _inputs(case, world_size):
    """Per step: the global batch (rank r gets rows [r*batch, (r+1)*batch)) and its targets."""
    g = torch.Generator().manual_seed(case["seed"] + 1)
    rows = world_size * case["batch"]
    steps = []
    for _ in range(case["steps"]):
        if case["kind"] == "transformer":
            vocab, seq = case["model"].get("vocab", 11), case["model"].get("seq", 5)
            x = torch.randint(0, vocab, (rows, seq), generator=g)
            y = torch.randint(0, vocab, (rows, seq), generator=g)
        else:
            dims = case["model"]["dims"]
            x = torch.randn(rows, dims[0], generator=g, dtype=torch.float64).to(case["dtype"])
            y = torch.randn(rows, dims[-1], generator=g, dtype=torch.float64).to(case["dtype"])
        steps.append((x, y))
    return steps


def _loss(case, out, y):
    """The local-mean loss (DDP semantics: averaging the ranks' gradients gives the global-batch one)."""
    if case["kind"] == "transformer":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
    return ((out.float() - y.float()) ** 2).mean()


def _fsdp_rank(rank, world_size, shard_fn, case, backend):
    # Objects inherited from the launching process are never garbage of this rank: keep every gc.collect()
    # below to the objects this program makes (fast, and the same answer).
    gc.freeze()
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    model = _build(case).to(dev)
    originals = [weakref.ref(p.untyped_storage()) for p in model.parameters()]
    kwargs = {"reshard_after_forward": case["reshard"]}
    if case["mp"] is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(*case["mp"])
    model = _wrap(model, shard_fn, group, kwargs)
    units = [prefix for prefix, _ in case["units"]]
    flat = {p: _unit_module(model, p)._parameters.get("flat_param") for p in units}
    measured = _still_allocated([(r, i) for i, r in enumerate(originals)]) if case["measure_memory"] else []
    result = {"originals_alive": len(measured),
              "param_bytes": _storage_bytes(list(model.parameters())),
              "n_params": len(list(model.parameters())),
              "flat_dtypes": {p: (None if f is None else dtype_name(f.dtype)) for p, f in flat.items()},
              "logits": [], "alive_after_forward": [], "alive_after_backward": []}
    missing = [p or "(root)" for p, f in flat.items() if f is None]
    if missing:
        raise CheckFailure(f"rank {rank}: after fully_shard, module(s) {missing} have no parameter named "
                           f"'flat_param' (this rank's shard of the unit's flat buffer).")
    opt = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9) if case["steps"] > 1 else None
    batch = slice(rank * case["batch"], (rank + 1) * case["batch"])
    with CommLedger() as ledger:
        for step, (x, y) in enumerate(case["data"]):
            watcher = _GatherWatcher()
            inp = x[batch].to(dev)
            if inp.is_floating_point():  # so that every unit's backward needs its parameters (the input's grad)
                inp.requires_grad_()
            with watcher:
                out = model(inp)
            # (without resharding the buffers stay to backward on purpose: nothing to measure after forward)
            measure = case["measure_memory"] and step == 0
            result["alive_after_forward"].append(watcher.alive() if measure and case["reshard"] else [])
            with watcher:
                _loss(case, out, y[batch].to(dev)).backward()
            result["alive_after_backward"].append(watcher.alive() if measure else [])
            result["logits"].append(out.detach().cpu())
            if step == 0:
                result["shard_grads"] = {p: (None if f.grad is None else f.grad.detach().cpu())
                                         for p, f in flat.items()}
                result["grad_dtypes"] = {p: (None if f.grad is None else dtype_name(f.grad.dtype))
                                         for p, f in flat.items()}
            if opt is not None:
                with ledger.outside():
                    opt.step()
                    opt.zero_grad()
            del out
    result["shards"] = {p: f.detach().cpu() for p, f in flat.items()}
    result["comm"] = ledger.records
    return result


def _reference(case, world_size):
    """Single-process training on the whole batch: logits per step, gradients of step 0, final parameters."""
    model = _build(case)
    ref_dtype = torch.float32 if case["mp"] is not None else case["dtype"]
    model = model.to(ref_dtype)
    opt = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9)
    logits, grads = [], None
    for step, (x, y) in enumerate(case["data"]):
        out = model(x.to(ref_dtype) if x.is_floating_point() else x)
        per_rank = out.chunk(world_size, dim=0)  # equal local batches: the global mean is the mean of local means
        loss = sum(_loss(case, o, t) for o, t in zip(per_rank, y.chunk(world_size, dim=0))) / world_size
        loss.backward()
        logits.append(out.detach())
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if case["steps"] > 1:
            opt.step()
            opt.zero_grad()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return logits, grads, params


def _case(kind, model_kw, *, world_size, batch, steps, dtype, reshard, mp, seed, lr=0.1, measure_memory=False):
    case = {"kind": kind, "model": dict(model_kw), "batch": batch, "steps": steps, "dtype": dtype,
            "reshard": reshard, "mp": mp, "seed": seed, "lr": lr, "measure_memory": measure_memory}
    case["units"] = fsdp_units(_build(case))
    case["data"] = _inputs(case, world_size)
    return case


def _describe(case, world_size):
    what = "TinyTransformer (embedding, RMSNorm, tied head)" if case["kind"] == "transformer" else \
        f"LinearStack{tuple(case['model']['dims'])}"
    mp = "" if case["mp"] is None else f", mp_policy(param_dtype={dtype_name(case['mp'][0])}, " \
                                       f"reduce_dtype={dtype_name(case['mp'][1]) if case['mp'][1] else None})"
    return (f"{what}, fully_shard per block then root, world size {world_size}, "
            f"reshard_after_forward={case['reshard']}{mp}, {dtype_name(case['dtype'])}")


def _run(shard_fn, world_size, kind, model_kw, *, batch=2, steps=1, dtype=torch.float64, reshard=True, mp=None,
         seed=0, backend="gloo", measure_memory=False):
    case = _case(kind, model_kw, world_size=world_size, batch=batch, steps=steps, dtype=dtype, reshard=reshard,
                 mp=mp, seed=seed, measure_memory=measure_memory)
    outs = run_distributed(_fsdp_rank, world_size, args=(shard_fn, case, backend), backend=backend)
    return case, outs


# ---------------------------------------------------------------------------
# The student's layout, read from the ledger
# ---------------------------------------------------------------------------

def _numel(model, names):
    params = dict(model.named_parameters())
    return sum(params[n].numel() for n in names)


def padded_sizes(comm, case, world_size, *, rank):
    """Each unit's padded flat size, from this rank's forward all-gathers (one per unit, root first).

    Raises CheckFailure unless there is one forward all-gather per unit whose
    size is a multiple of d holding the unit's parameters with less than
    PADDING_BOUND_PER_RANK * d elements of padding.
    """
    model = _build(case)
    gathers = select(comm, op="all_gather", phase="forward")
    units = case["units"]
    if len(gathers) < len(units):
        raise CheckFailure(f"rank {rank}: expected one all-gather per fully_shard unit in forward ({len(units)}: "
                           f"{[p or '(root)' for p, _ in units]}), saw {len(gathers)}. Communication of rank "
                           f"{rank}:\n{format_trace(comm, rank)}")
    sizes = []
    for (prefix, names), record in zip(units, gathers):
        n = _numel(model, names)
        size = math.prod(record.shape)
        bound = PADDING_BOUND_PER_RANK * world_size
        if size % world_size or not n <= size < n + bound:
            raise CheckFailure(f"rank {rank}: the forward all-gather of unit {prefix or '(root)'} has {size} "
                               f"elements; its {n} parameter elements must be padded to a multiple of the group "
                               f"size {world_size}, with less than {bound} elements of padding (in order: root "
                               f"first, then the blocks). Communication of rank {rank}:\n{format_trace(comm, rank)}")
        sizes.append(size)
    return sizes


def _unit_comm_expectations(comm, case, world_size, *, rank, steps, mp_dtypes, ctx):
    """Per unit and step: forward 1 all-gather; backward 1 all-gather (0 without resharding) + 1 reduce-scatter.

    Shapes are the unit's padded size (the student's layout); the reduce-scatter
    mirrors the forward all-gather (same size): forward/backward symmetry.
    """
    if world_size == 1:
        expect_no_comm(comm, rank=rank, context=f"{ctx}; a group of one communicates nothing")
        return
    sizes = padded_sizes(comm, case, world_size, rank=rank)
    gather_dtype, reduce_dtype = mp_dtypes
    regather = 1 if case["reshard"] else 0
    expected = {"forward": {}, "backward": {}}
    for size in sizes:
        key = (size,)
        expected["forward"][("all_gather", key, gather_dtype)] = expected["forward"].get(
            ("all_gather", key, gather_dtype), 0) + steps
        if regather:
            expected["backward"][("all_gather", key, gather_dtype)] = expected["backward"].get(
                ("all_gather", key, gather_dtype), 0) + steps
        expected["backward"][("reduce_scatter", key, reduce_dtype)] = expected["backward"].get(
            ("reduce_scatter", key, reduce_dtype), 0) + steps
    for phase, want in expected.items():
        got = {}
        for r in comm:
            if r.op != "wait" and r.phase == phase:
                got[(r.op, tuple(r.shape), r.dtype)] = got.get((r.op, tuple(r.shape), r.dtype), 0) + 1
        if got != want:
            def fmt(d):
                return ", ".join(f"{n} {op} of [{s[0]}] {dt}" for (op, s, dt), n in sorted(d.items())) or "none"
            raise CheckFailure(
                f"rank {rank} ({ctx}): in {phase} expected {fmt(want)}; saw {fmt(got)}. Per unit (padded sizes "
                f"{sizes}): forward 1 all-gather; backward {'1 all-gather + ' if regather else ''}1 reduce-scatter "
                f"of the same size (the all-gather's mirror), in dtypes all-gather {gather_dtype}, "
                f"reduce-scatter {reduce_dtype}.\nCommunication of rank {rank}:\n{format_trace(comm, rank)}")


def _mp_dtypes(case):
    base = dtype_name(case["dtype"])
    if case["mp"] is None:
        return base, base
    param_dtype, reduce_dtype = case["mp"]
    return dtype_name(param_dtype or case["dtype"]), dtype_name(reduce_dtype or param_dtype or case["dtype"])


def _expected_flat(ref, names, size):
    flat = torch.cat([ref[n].reshape(-1) for n in names])
    return torch.cat([flat, flat.new_zeros(size - flat.numel())])


# ---------------------------------------------------------------------------
# The graded checks
# ---------------------------------------------------------------------------

@one_thread
def check_fsdp_numerics(shard_fn, *, world_size=2, kind="transformer", model=None, batch=2, steps=2,
                        dtype=torch.float64, reshard=True, seed=0, backend="gloo"):
    """Outputs of every step, each rank's averaged shard gradients and the trained shards match one process.

    `steps` SGD steps (momentum 0.9) on `model.parameters()` (the shards); the
    reference trains the unsharded model on the whole batch. The student's
    shards of all ranks are put together here, in rank order, and compared
    with the reference's flat buffer of each unit.
    """
    model = model or ({"vocab": 11, "hidden": 8, "ffn": 12, "seq": 5, "layers": 2} if kind == "transformer"
                      else {"dims": (5, 7, 3)})
    case, outs = _run(shard_fn, world_size, kind, model, batch=batch, steps=steps, dtype=dtype, reshard=reshard,
                      seed=seed, backend=backend)
    logits, grads, params = _reference(case, world_size)
    ctx = _describe(case, world_size)
    findings = Findings()
    for rank, out in enumerate(outs):
        with findings.communication(hint=True):
            _unit_comm_expectations(out["comm"], case, world_size, rank=rank, steps=steps, mp_dtypes=_mp_dtypes(case),
                                    ctx=ctx)
        with findings.numbers():
            for step, got in enumerate(out["logits"]):
                exp = logits[step].chunk(world_size, dim=0)[rank]
                assert_close(got, exp, name=f"{ctx}: output of step {step}", rank=rank)
    with findings.numbers():
        for i, (prefix, names) in enumerate(case["units"]):
            unit = prefix or "(root)"
            shards = [out["shards"][prefix] for out in outs]
            size = sum(s.numel() for s in shards)
            if any(s.numel() != shards[0].numel() for s in shards) or size % world_size:
                raise CheckFailure(f"unit {unit}: flat_param shards of sizes {[s.numel() for s in shards]} on "
                                   f"ranks 0..{world_size - 1}; every rank must hold an equal chunk.")
            for rank, out in enumerate(outs):
                part = slice(rank * shards[0].numel(), (rank + 1) * shards[0].numel())
                g = _expected_flat(grads, names, size)[part]
                assert_close(out["shard_grads"][prefix], g, name=f"{ctx}: grad of unit {unit}'s flat_param "
                             f"(its chunk of [{', '.join(names)}], padded to {size}) after step 0", rank=rank)
            full = torch.cat(shards)
            exp = _expected_flat(params, names, size)
            assert_close(full[:exp.numel()], exp, name=f"{ctx}: unit {unit}'s shards of all ranks, in rank order, "
                         f"after {steps} step(s) (flat order: {', '.join(names)})")
    findings.raise_if_any()
    check_consistent([o["comm"] for o in outs], context="fully_shard")


@one_thread
def check_fsdp_comm(shard_fn, *, world_size=2, kind="transformer", model=None, batch=2, reshard=True, mp=None,
                    dtype=torch.float64, seed=0, backend="gloo"):
    """Per unit and step: forward 1 all-gather, backward 1 all-gather (none when reshard_after_forward=False)
    and 1 reduce-scatter of the same padded size (the all-gather's mirror), in the policy's dtypes.

    The forward all-gathers are matched to the units in the order forward
    runs them (the root's pre-hook first, then each block), which is the
    program's own order: the same on every run. In the graded models every
    unit's backward needs its parameters (floating inputs require grad), so a
    unit that gathers again lazily, on first use, and one that gathers before
    its backward issue the same count.
    """
    model = model or ({"vocab": 11, "hidden": 8, "ffn": 12, "seq": 5, "layers": 2} if kind == "transformer"
                      else {"dims": (5, 7, 3)})
    case, outs = _run(shard_fn, world_size, kind, model, batch=batch, steps=1, dtype=dtype, reshard=reshard, mp=mp,
                      seed=seed, backend=backend)
    ctx = _describe(case, world_size)
    for rank, out in enumerate(outs):
        _unit_comm_expectations(out["comm"], case, world_size, rank=rank, steps=1, mp_dtypes=_mp_dtypes(case),
                                ctx=ctx)
    check_consistent([o["comm"] for o in outs], context="fully_shard")


@one_thread
def check_fsdp_memory(shard_fn, *, world_size=2, kind="transformer", model=None, batch=2, reshard=True,
                      dtype=torch.float64, seed=0, backend="gloo"):
    """At rest a rank holds its shards only; no gathered parameter survives forward (resharding) or backward.

    What it measures, and why the verdict is deterministic: (1) after
    fully_shard, the bytes of the distinct storages behind
    `model.parameters()` (a view into a larger buffer counts the whole
    buffer), which must equal the sum of the units' padded sizes / d; (2) weak
    references to the storages of the original parameters and (3) of every
    all-gather output, read right after forward and after backward, each time
    after `gc.collect()`: a storage that survives a full collection is
    reachable, whatever the collector did before; one that is still allocated
    `_RELEASE_GRACE_S` later is not merely waiting for gloo's worker thread to
    let go of a finished collective. So the same code always gets the same
    answer. A storage resized to 0 bytes counts as freed.
    """
    model = model or ({"vocab": 11, "hidden": 8, "ffn": 12, "seq": 5, "layers": 2} if kind == "transformer"
                      else {"dims": (5, 7, 3)})
    case, outs = _run(shard_fn, world_size, kind, model, batch=batch, steps=1, dtype=dtype, reshard=reshard,
                      seed=seed, backend=backend, measure_memory=True)
    ctx = _describe(case, world_size)
    itemsize = torch.empty((), dtype=dtype).element_size()
    for rank, out in enumerate(outs):  # memory, not numbers: the first finding is the message
        if out["originals_alive"]:
            raise CheckFailure(f"rank {rank} ({ctx}): after fully_shard, {out['originals_alive']} of the "
                               f"original full parameters are still in memory. Keep only this rank's shard "
                               f"(no reference to the original parameters).")
        if world_size > 1:
            sizes = padded_sizes(out["comm"], case, world_size, rank=rank)
            want = sum(sizes) // world_size * itemsize
            if out["param_bytes"] != want:
                raise CheckFailure(f"rank {rank} ({ctx}): at rest the model's parameters hold "
                                   f"{out['param_bytes']} bytes; this rank's shards are {want} bytes (padded "
                                   f"unit sizes {sizes} / {world_size} x {itemsize} bytes). Each unit keeps one "
                                   f"flat_param of padded/d elements, its own storage, and nothing else.")
        for when in ("after_forward", "after_backward"):
            alive = out[f"alive_{when}"][0]
            if when == "after_forward" and not case["reshard"]:
                continue  # reshard_after_forward=False keeps them to backward, on purpose
            if alive:
                raise CheckFailure(
                    f"rank {rank} ({ctx}): {when.replace('_', ' ')}, {len(alive)} gathered parameter buffer(s) "
                    f"of shape {alive} are still reachable (after gc.collect(), for {_RELEASE_GRACE_S:g} s). "
                    + ("Free them after forward: drop every reference (autograd's saved tensors included: "
                       "saved-tensor hooks) or resize their storage to 0, and gather again in backward."
                       if when == "after_forward" else
                       "Free the buffer gathered for backward once the reduce-scatter has run."))


@one_thread
def check_fsdp_mixed_precision(shard_fn, *, world_size=2, kind="transformer", model=None, batch=2, steps=2,
                               param_dtype=torch.bfloat16, reduce_dtype=torch.float32, seed=0, backend="gloo"):
    """Mixed precision (FSDP2 MixedPrecisionPolicy): float32 master shards, compute and all-gather in
    param_dtype, reduce-scatter in reduce_dtype; outputs, gradients and trained shards close to float32.

    Tolerances (`MP_TOLERANCE`) are those of a model computed in param_dtype
    against the float32 reference; the dtypes are checked exactly.
    """
    model = model or ({"vocab": 11, "hidden": 8, "ffn": 12, "seq": 5, "layers": 2} if kind == "transformer"
                      else {"dims": (5, 7, 3)})
    case, outs = _run(shard_fn, world_size, kind, model, batch=batch, steps=steps, dtype=torch.float32,
                      reshard=True, mp=(param_dtype, reduce_dtype), seed=seed, backend=backend)
    logits, grads, params = _reference(case, world_size)
    ctx = _describe(case, world_size)
    rtol, atol = MP_TOLERANCE[param_dtype]
    findings = Findings()
    gather_dtype, reduce_dtype_name = _mp_dtypes(case)
    for rank, out in enumerate(outs):
        with findings.communication(hint=True):  # counts and sizes: graded by check_fsdp_comm
            _unit_comm_expectations(out["comm"], case, world_size, rank=rank, steps=steps,
                                    mp_dtypes=_mp_dtypes(case), ctx=ctx)
        with findings.communication():
            wrong = [r for r in out["comm"] if (r.op == "all_gather" and r.dtype != gather_dtype)
                     or (r.op == "reduce_scatter" and r.dtype != reduce_dtype_name)]
            if wrong:
                raise CheckFailure(f"rank {rank} ({ctx}): parameters are all-gathered in param_dtype "
                                   f"({gather_dtype}) and gradients reduce-scattered in reduce_dtype "
                                   f"({reduce_dtype_name}); {len(wrong)} collective(s) used another dtype:\n"
                                   f"{format_trace(wrong, rank)}")
        with findings.numbers():
            for prefix, dt in out["flat_dtypes"].items():
                if dt != "float32":
                    raise CheckFailure(f"rank {rank} ({ctx}): unit {prefix or '(root)'}'s flat_param is {dt}; the "
                                       f"sharded master weights stay float32 (only the gathered copy is "
                                       f"{dtype_name(param_dtype)}).")
            for prefix, dt in out["grad_dtypes"].items():
                if dt != "float32":
                    raise CheckFailure(f"rank {rank} ({ctx}): unit {prefix or '(root)'}'s flat_param.grad is {dt}; "
                                       f"the gradient of a float32 master shard is float32.")
            for step, got in enumerate(out["logits"]):
                if got.dtype != param_dtype:
                    raise CheckFailure(f"rank {rank} ({ctx}): the output of step {step} is {dtype_name(got.dtype)}; "
                                       f"the model computes in param_dtype {dtype_name(param_dtype)} (cast the "
                                       f"floating inputs, gather the parameters in it).")
                exp = logits[step].chunk(world_size, dim=0)[rank]
                assert_close(got, exp, name=f"{ctx}: output of step {step}", rank=rank, rtol=rtol, atol=atol,
                             check_dtype=False)
            for prefix, names in case["units"]:
                shards = [o["shards"][prefix] for o in outs]
                size = sum(s.numel() for s in shards)
                part = slice(rank * shards[0].numel(), (rank + 1) * shards[0].numel())
                assert_close(out["shard_grads"][prefix], _expected_flat(grads, names, size)[part],
                             name=f"{ctx}: grad of unit {prefix or '(root)'}'s flat_param after step 0", rank=rank,
                             rtol=rtol, atol=atol, check_dtype=False)
                if rank == 0:
                    exp = _expected_flat(params, names, size)
                    assert_close(torch.cat(shards)[:exp.numel()], exp, rtol=rtol, atol=atol, check_dtype=False,
                                 name=f"{ctx}: unit {prefix or '(root)'}'s shards after {steps} step(s)")
    findings.raise_if_any()


def _gather_rank(rank, world_size, shard_fn, gather_fn, case, target, backend):
    dev = rank_device(rank, backend)
    model = _build(case).to(dev)
    model = _wrap(model, shard_fn, dist.group.WORLD, {})
    with torch.no_grad():  # new values in every shard (as training would write), in the flat layout of the spec
        for prefix, names in case["units"]:
            flat = _unit_module(model, prefix)._parameters.get("flat_param")
            if flat is None:
                raise CheckFailure(f"rank {rank}: after fully_shard, module {prefix or '(root)'} has no parameter "
                                   f"named 'flat_param'.")
            full = _expected_flat(target, names, flat.numel() * world_size)
            flat.copy_(full[rank * flat.numel():(rank + 1) * flat.numel()])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with CommLedger() as ledger:
        with ledger.outside():
            state = gather_fn(model)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    changed = [n for n in before if n not in after or not torch.equal(before[n], after[n])]
    if not isinstance(state, dict):
        raise CheckFailure(f"rank {rank}: gather_full_params returned {type(state).__name__}, expected a dict "
                           f"{{name: tensor}}.")
    return {"state": {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in state.items()},
            "changed": changed, "comm": ledger.records}


@one_thread
def check_gather_full_params(shard_fn, gather_fn, *, world_size=2, kind="transformer", model=None,
                             dtype=torch.float64, seed=0, backend="gloo"):
    """gather_full_params(model) on every rank equals the unsharded model's state_dict(), for the current shards.

    The check writes new values into every rank's flat_param (the parameters
    scaled and shifted, in the flat layout), then compares: same names (a tied
    parameter under each of its names, buffers included), shapes, dtypes and
    values; the shards unchanged; one all-gather per unit, outside forward and
    backward.
    """
    model = model or ({"vocab": 11, "hidden": 8, "ffn": 12, "seq": 5, "layers": 2} if kind == "transformer"
                      else {"dims": (5, 7, 3)})
    case = _case(kind, model, world_size=world_size, batch=1, steps=1, dtype=dtype, reshard=True, mp=None, seed=seed)
    ref = _build(case)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(1.5).add_(0.25)
    target = {n: p.detach().clone() for n, p in ref.named_parameters()}
    outs = run_distributed(_gather_rank, world_size, args=(shard_fn, gather_fn, case, target, backend),
                           backend=backend)
    expected = ref.state_dict()
    ctx = _describe(case, world_size)
    findings = Findings()
    for rank, out in enumerate(outs):
        with findings.communication():
            if world_size == 1:
                expect_no_comm(out["comm"], rank=rank, context=f"{ctx}; a group of one communicates nothing")
            else:
                units = len(case["units"])
                got = [r for r in out["comm"] if r.op != "wait"]
                if len(got) != units or any(r.op != "all_gather" or r.phase != "outside" for r in got):
                    raise CheckFailure(f"rank {rank} ({ctx}): gather_full_params should issue exactly one "
                                       f"all-gather per unit ({units}), saw:\n{format_trace(out['comm'], rank)}")
        with findings.numbers():
            state = out["state"]
            missing = [k for k in expected if k not in state]
            extra = [k for k in state if k not in expected]
            if missing or extra:
                raise CheckFailure(f"rank {rank} ({ctx}): gather_full_params keys differ from the unsharded "
                                   f"model's state_dict(): missing {missing}, unexpected {extra}.")
            for name, exp in expected.items():
                assert_close(state[name], exp, name=f"{ctx}: gather_full_params()[{name!r}]", rank=rank)
            if out["changed"]:
                raise CheckFailure(f"rank {rank} ({ctx}): gather_full_params changed the model's parameters "
                                   f"{out['changed']}; it must leave the shards as they are.")
    findings.raise_if_any()
