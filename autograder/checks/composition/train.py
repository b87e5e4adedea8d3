"""Public checks of assignment 06 (the capstone: the dimensions composed), readable.

    import autograder.checks.composition as checks
    checks.check_rank_layout(rank_layout, 16, tp=2, pp=4, expected={...})
    checks.check_dp_tp_training(apply_tensor_parallel, apply_fsdp, local_batch, dp=2, tp=2)

Each `check_*` takes the student's functions and keyword parameters, runs a
rank program of this module on `world_size` forked CPU ranks (gloo) when
ranks are needed, and decides in the calling process: layouts against the
expected rank lists; models against single-process PyTorch training of the
same `TinyGPT` from the same master weights (float64, tolerance 1e-10); the
glue (loss, tied embedding, clipping) against the single-process quantity it
must reproduce; communication from each rank's `CommLedger`. A check returns
None or raises CheckFailure / DistributedError (which names the rank).
The planner's checks are at the end.

`torch.distributed.tensor`, `.fsdp` and `.pipelining` are imported here, in
the parent, so that the forked ranks inherit them (about 1 s each otherwise).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401 - imported once in the parent: forked ranks inherit it
import torch.distributed.pipelining  # noqa: F401
import torch.distributed.tensor  # noqa: F401
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

from autograder.runtime.compare import CheckFailure, Findings, assert_close, fmt_shape
from autograder.runtime.dist import DistributedError, run_distributed
from autograder.runtime.ledger import CommLedger, expect_no_comm, format_trace
from autograder.lessons.tinygpt import ModelArgs, TinyGPT, master_state

__all__ = [
    "TOL", "check_rank_layout", "check_rank_layout_errors", "check_process_groups", "check_device_mesh",
    "check_local_batch", "check_tensor_parallel_plan", "check_dp_tp_training", "check_loss_averaging",
    "check_tied_embedding_grads", "check_clip_grad_norm", "check_pipeline_training", "plot_rank_layout",
    "PIPELINE_FUNCTIONS", "check_memory_per_gpu", "check_step_time", "check_plan", "check_best_layouts",
]

_TIMEOUT = 60.0
# float64 throughout: a parallel run that computes the same sums in another order is equal to ~1e-15
TOL = 1e-10
LR = 1e-2


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

def _full(t):
    """A detached CPU tensor: the whole tensor for a DTensor (gathered), the tensor itself otherwise."""
    if t is None:
        return None
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone()


def _rank_logging_to_log_file() -> None:
    """In a forked rank: send Python logging to the rank's own log file, as its prints already go.

    torch's logging handlers (DTensor's redistribution notes, c10d's fallbacks) were
    created in the parent, on the parent's stderr: in a notebook kernel that is the
    cell's output stream, so a rank's warning would appear under the test cell. The
    runner captures what a rank writes to its own sys.stderr; repoint the handlers there.
    """
    import logging
    import sys

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
                    and handler.stream not in (sys.stderr, sys.stdout)):
                handler.stream = sys.stderr  # plain assignment: no flush of the parent's stream from here


def _student(fn, *args, what: str, **kwargs):
    """Call the student's `fn`; translate the one DTensor error students meet most into what to do."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        if "sharding strategy" in str(exc) and "c10d" in str(exc):
            raise RuntimeError(
                f"{what}: a torch.distributed collective was called on a DTensor ({exc}). Under TP and FSDP "
                f"parameters and gradients are DTensors: communicate their local shards, "
                f"`dist.all_reduce(grad.to_local(), ...)`.") from exc
        raise


def _run_composed(exercise: int, fn, world_size: int, **kwargs):
    """run_distributed for a test that uses functions of several exercises. A stub of another exercise is named
    with its own exercise by `checking` (the notebook's set-up cell tells it which exercise defines which
    function: autograder.runtime.report.course_notebook)."""
    return run_distributed(fn, world_size, **kwargs)


def _one_rank(program, *args, timeout: float = _TIMEOUT):
    """Run a single-process exercise in one rank process, as every check does: the student's code runs there,
    data comes back, the verdict is made here (spec 3.2; the trusted grader never runs student code itself)."""
    return run_distributed(program, 1, args=args, timeout=timeout)[0]


def _call_program(rank, world_size, fn, args, kwargs):
    return fn(*args, **kwargs)


def _close(got, expected, *, name: str, rank=None) -> None:
    assert_close(got, expected, name=name, rank=rank, rtol=TOL, atol=TOL)


def _batch(args: ModelArgs, batch: int, seq: int, seed: int):
    gen = torch.Generator().manual_seed(seed + 1000)
    tokens = torch.randint(0, args.vocab_size, (batch, seq), generator=gen)
    labels = torch.randint(0, args.vocab_size, (batch, seq), generator=gen)
    return tokens, labels


def _reference_training(args: ModelArgs, state: dict, tokens, labels, *, steps: int, max_norm: float | None):
    """Single-process float64 training on the global batch: losses and the full state after `steps` AdamW steps."""
    model = TinyGPT(args).double()
    model.load_state_dict(state)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(steps):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, grads


def _groups_of(layout_groups, rank):
    return next((g for g in layout_groups if rank in g), None)


def _check_layout_shape(name: str, groups, world_size: int, what: str) -> None:
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
        raise CheckFailure(f"{what}: layout[{name!r}] must be a list of rank lists, got {type(groups).__name__}")
    for g in groups:
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in g):
            raise CheckFailure(f"{what}: layout[{name!r}] holds a group with non-int ranks: {list(g)!r}")


# ---------------------------------------------------------------------------
# Exercise 1: rank_layout
# ---------------------------------------------------------------------------

def check_rank_layout(rank_layout, world_size: int, *, expected: dict, **sizes) -> None:
    """`rank_layout(world_size, **sizes)` returns, for every key of `expected`, exactly its rank lists.

    Order matters (the order of the groups, and of the ranks in a group), as in
    Megatron-LM's `RankGenerator`: groups list the combinations of the other
    dimensions with the innermost varying fastest; inside a group the innermost
    selected dimension varies fastest.
    """
    call = f"rank_layout({world_size}" + "".join(f", {k}={v!r}" for k, v in sizes.items()) + ")"
    got = _one_rank(_call_program, rank_layout, (world_size,), sizes)
    if not isinstance(got, dict):
        raise CheckFailure(f"{call} returned {type(got).__name__}, expected a dict {{name: [[ranks], ...]}}")
    missing = [k for k in expected if k not in got]
    if missing:
        raise CheckFailure(f"{call}: no key(s) {missing}; returned keys: {sorted(got)}")
    for name, want in expected.items():
        groups = got[name]
        _check_layout_shape(name, groups, world_size, call)
        groups = [list(g) for g in groups]
        if groups == want:
            continue
        if sorted(map(sorted, groups)) == sorted(map(sorted, want)):
            hint = ("the same groups, in another order: list the groups, and the ranks inside each group, "
                    "with the innermost dimension varying fastest")
        elif len(groups) != len(want) or any(len(g) != len(want[0]) for g in groups):
            hint = (f"{len(groups)} group(s) of size(s) {sorted({len(g) for g in groups})}; expected "
                    f"{len(want)} of size {len(want[0]) if want else 0}")
        else:
            hint = "different ranks in the groups"
        i = next((i for i, (a, b) in enumerate(zip(groups, want)) if a != b), min(len(groups), len(want)))
        raise CheckFailure(
            f"{call}[{name!r}] is wrong ({hint}).\n  expected: {want}\n  got:      {groups}\n"
            f"  first difference at group {i}: expected {want[i] if i < len(want) else 'nothing'}, "
            f"got {groups[i] if i < len(groups) else 'nothing'}")


def _errors_program(rank, world_size, fn, cases):
    out = []
    for args, kwargs, _ in cases:
        try:
            result = fn(*args, **kwargs)
            out.append(("returned", type(result).__name__, ""))
        except NotImplementedError:
            raise  # a stub: reported as such
        except Exception as exc:  # noqa: BLE001 - sent back as data, judged in the parent
            out.append(("raised", type(exc).__name__, str(exc)[:1000]))
    return out


def check_rank_layout_errors(rank_layout, cases) -> None:
    """Every case `(args, kwargs, mentions)` raises ValueError whose message names the sizes in `mentions`."""
    cases = [(tuple(a), dict(k), tuple(m)) for a, k, m in cases]
    sent = [(args, kwargs, ()) for args, kwargs, _ in cases]  # what the message must name stays here
    for (args, kwargs, mentions), (what, kind, text) in zip(cases, _one_rank(_errors_program, rank_layout, sent)):
        call = "rank_layout(" + ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]) + ")"
        if what == "returned":
            raise CheckFailure(f"{call}: expected a ValueError naming {', '.join(mentions) or 'the sizes'} (these "
                               f"sizes and order cannot be laid out as Megatron does), got a {kind}")
        if kind != "ValueError":
            raise CheckFailure(f"{call} raised {kind}: {text}; expected a ValueError naming the sizes")
        absent = [m for m in mentions if m not in text]
        if absent:
            raise CheckFailure(f"{call} raised ValueError({text!r}), which does not name {absent}: say which "
                               f"sizes do not fit")


# ---------------------------------------------------------------------------
# Exercise 2: the process groups, and the DeviceMesh
# ---------------------------------------------------------------------------

def _groups_rank(rank, world_size, fn, layout):
    _rank_logging_to_log_file()
    groups = _student(fn, layout, what="build_process_groups")
    if not isinstance(groups, dict):
        raise CheckFailure(f"rank {rank}: build_process_groups returned {type(groups).__name__}, expected a dict")
    out = {}
    for name in layout:
        pg = groups.get(name)
        if pg is None:
            out[name] = None
            continue
        if not isinstance(pg, dist.ProcessGroup):
            raise CheckFailure(f"rank {rank}: build_process_groups()[{name!r}] is a {type(pg).__name__}, "
                               f"expected a torch.distributed.ProcessGroup")
        members = dist.get_process_group_ranks(pg)
        total = torch.tensor([float(rank)], dtype=torch.float64)
        dist.all_reduce(total, group=pg)
        out[name] = (members, total.item())
    return out


def check_process_groups(build_process_groups, layout: dict, *, world_size: int,
                         timeout: float = 20.0) -> None:
    """Every rank gets, for every name of `layout`, the group that contains it, and the group works.

    Checked on each rank: the group's ranks (`dist.get_process_group_ranks`) are
    this rank's group of the layout; an all-reduce of the ranks' numbers over it
    sums exactly its members; a name whose groups leave this rank out (the
    embedding group on a middle stage) has no group. Groups created in a
    different order on different ranks hang in `new_group`: the runner stops
    them (after `timeout` seconds at most) and reports the line each rank was
    blocked on. Creating the groups takes about a second.
    """
    for name, groups in layout.items():
        _check_layout_shape(name, groups, world_size, "check_process_groups")
    results = run_distributed(_groups_rank, world_size, args=(build_process_groups, layout), timeout=timeout)
    for rank, out in enumerate(results):
        for name, groups in layout.items():
            want = _groups_of(groups, rank)
            got = out[name]
            if want is None:
                if got is not None:
                    raise CheckFailure(f"rank {rank}: layout[{name!r}] has no group containing rank {rank}, yet "
                                       f"build_process_groups returned one with ranks {got[0]}")
                continue
            if got is None:
                raise CheckFailure(f"rank {rank}: build_process_groups()[{name!r}] is missing; expected the group "
                                   f"{want}")
            members, total = got
            if sorted(members) != sorted(want):
                raise CheckFailure(f"rank {rank}: build_process_groups()[{name!r}] has ranks {members}, expected "
                                   f"{want} (this rank's group of layout[{name!r}])")
            if total != sum(want):
                raise CheckFailure(f"rank {rank}: an all-reduce over build_process_groups()[{name!r}] summed to "
                                   f"{total:g}, expected {sum(want)} (the sum of its ranks {want})")


def _mesh_rank(rank, world_size, fn, sizes, order):
    _rank_logging_to_log_file()
    mesh = _student(fn, order=order, what="build_device_mesh", **sizes)
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    groups = {n: mesh[n].mesh.flatten().tolist() for n in names}
    return {"names": names, "shape": tuple(mesh.mesh.shape), "groups": groups, "type": type(mesh).__name__}


def check_device_mesh(build_device_mesh, *, world_size: int, order: str, expected: dict,
                      timeout: float = _TIMEOUT, **sizes) -> None:
    """The mesh has one named dimension per token of `order`, outermost first, and `mesh[name]` is this
    rank's group of `expected[name]` on every rank."""
    want_names = tuple(reversed(order.split("-")))
    results = run_distributed(_mesh_rank, world_size, args=(build_device_mesh, sizes, order), timeout=timeout)
    call = f"build_device_mesh({', '.join(f'{k}={v}' for k, v in sizes.items())}, order={order!r})"
    for rank, out in enumerate(results):
        if out["type"] != "DeviceMesh":
            raise CheckFailure(f"rank {rank}: {call} returned a {out['type']}, expected a DeviceMesh")
        if out["names"] != want_names:
            raise CheckFailure(f"rank {rank}: {call} has dimensions {out['names']} (shape {out['shape']}); "
                               f"expected {want_names}: the order's tokens reversed, because a DeviceMesh's last "
                               f"dimension is the innermost (adjacent ranks)")
        for name, groups in expected.items():
            want = _groups_of(groups, rank)
            if out["groups"][name] != want:
                raise CheckFailure(f"rank {rank}: {call}[{name!r}] spans ranks {out['groups'][name]}, expected "
                                   f"{want} (rank_layout's {name} group of rank {rank}, order {order!r})")


# ---------------------------------------------------------------------------
# Exercise 3: the data of each rank
# ---------------------------------------------------------------------------

def _batch_rank(rank, world_size, fn, shape, names, tokens, labels):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out = _student(fn, tokens, labels, mesh=mesh, what="local_batch")
    if not isinstance(out, dict) or not {"tokens", "labels", "positions"} <= set(out):
        raise CheckFailure(f"rank {rank}: local_batch returned {type(out).__name__} "
                           f"{sorted(out) if isinstance(out, dict) else ''}; expected a dict with keys "
                           f"'tokens', 'labels', 'positions'")
    coords = {n: mesh[n].get_local_rank() for n in names}
    return {"coords": coords, **{k: torch.as_tensor(out[k]).clone() for k in ("tokens", "labels", "positions")}}


def _zigzag_positions(seq: int, cp: int, c: int) -> torch.Tensor:
    """Chunks c and 2*cp-1-c of 2*cp equal chunks (Megatron's get_batch_on_this_cp_rank)."""
    chunks = torch.arange(seq).chunk(2 * cp)
    return torch.cat([chunks[c], chunks[2 * cp - 1 - c]]) if cp > 1 else torch.arange(seq)


def check_local_batch(local_batch, *, mesh_shape: tuple, mesh_dim_names: tuple, batch: int = 4, seq: int = 8,
                      seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """Each rank's tokens, labels and positions on a mesh with dims among dp, cp, tp, pp.

    DP rank d of D: rows [d*B/D, (d+1)*B/D); CP rank c of C: the zigzag chunks c
    and 2C-1-c of the sequence, positions their global positions; TP ranks and
    pipeline stages: identical data. The checks name which rule a rank broke.
    """
    world_size = math.prod(mesh_shape)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1000, (batch, seq), generator=gen)
    labels = torch.randint(0, 1000, (batch, seq), generator=gen)
    results = run_distributed(_batch_rank, world_size, args=(local_batch, tuple(mesh_shape), tuple(mesh_dim_names),
                                                             tokens, labels), timeout=timeout)
    size = dict(zip(mesh_dim_names, mesh_shape))
    D, C = size.get("dp", 1), size.get("cp", 1)
    for rank, out in enumerate(results):
        d, c = out["coords"].get("dp", 0), out["coords"].get("cp", 0)
        where = f"rank {rank} (mesh coordinates {out['coords']})"
        rows = slice(d * batch // D, (d + 1) * batch // D)
        pos = _zigzag_positions(seq, C, c)
        if not torch.equal(out["positions"].reshape(-1).long(), pos):
            raise CheckFailure(f"{where}: positions {out['positions'].tolist()}, expected {pos.tolist()} "
                               f"(CP rank {c} of {C} keeps sequence chunks {c} and {2 * C - 1 - c} of {2 * C})")
        for key, full in (("tokens", tokens), ("labels", labels)):
            want = full[rows][:, pos]
            got = out[key]
            if tuple(got.shape) != tuple(want.shape):
                raise CheckFailure(f"{where}: {key} has shape {fmt_shape(got.shape)}, expected {fmt_shape(want.shape)} "
                                   f"([B/dp, S/cp] = [{batch}/{D}, {seq}/{C}])")
            if not torch.equal(got, want):
                same_rows = [r for r in range(batch) if torch.equal(full[r][pos], got[0])]
                hint = (f"its first row is global row {same_rows[0]}, expected row {rows.start} (DP rank {d} of {D}: "
                        f"rows {rows.start}..{rows.stop - 1}; use the DP coordinate, not the global rank)"
                        if same_rows else "the values are not the global batch's at these rows and positions")
                raise CheckFailure(f"{where}: wrong {key}: {hint}")


# ---------------------------------------------------------------------------
# Exercise 4: the tensor-parallel plan
# ---------------------------------------------------------------------------

# the module a parameter belongs to (its name's second-last part) -> its placement on the TP mesh under the plan
_TP_PLACEMENTS = {
    "tok_embeddings": Shard(0), "output": Shard(0), "wq": Shard(0), "wk": Shard(0), "wv": Shard(0), "w1": Shard(0),
    "w3": Shard(0), "wo": Shard(1), "w2": Shard(1), "attention_norm": Replicate(), "ffn_norm": Replicate(),
    "norm": Replicate(),
}


def _expected_placement(name: str):
    parts = name.split(".")
    return _TP_PLACEMENTS.get(parts[-2]) if len(parts) >= 2 else None


def _tp_rank(rank, world_size, fn, args, state, tokens, labels):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    model = TinyGPT(args).double()
    model.load_state_dict(state)
    out = _student(fn, model, mesh["tp"], what="apply_tensor_parallel")
    model = out if isinstance(out, nn.Module) else model
    tied = model.output.weight is model.tok_embeddings.weight
    placements = {n: (tuple(str(pl) for pl in p.placements) if isinstance(p, DTensor) else None)
                  for n, p in model.named_parameters()}  # strings: data only goes back to the parent
    with CommLedger() as ledger:
        with loss_parallel():
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
    return {"tied": tied, "placements": placements, "logits": _full(logits), "loss": _full(loss),
            "grads": {n: _full(p.grad) for n, p in model.named_parameters()}, "records": ledger.records,
            "logits_type": type(logits).__name__}


def check_tensor_parallel_plan(apply_tensor_parallel, *, world_size: int = 2, args: ModelArgs = ModelArgs(),
                               batch: int = 2, seq: int = 8, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """The TP + SP plan on a TP mesh: placements, the tie, logits, loss and every gradient, forward comm.

    Every parameter must be a DTensor with the plan's placement (column-parallel
    weights `Shard(0)`, row-parallel `Shard(1)`, the vocabulary-sharded embedding
    and head `Shard(0)`, norms `Replicate()` under `SequenceParallel`); the head
    and the embedding one Parameter again; the logits a `Shard(-1)` DTensor;
    under `loss_parallel()` the full logits, the loss and every gradient equal
    single-process; forward communicates no all-reduce of a `[b, s, h]` activation
    (sequence parallelism: all-gathers and reduce-scatters instead).
    """
    state = master_state(args, seed=seed)
    tokens, labels = _batch(args, batch, seq, seed)
    ref = TinyGPT(args).double()
    ref.load_state_dict(state)
    ref_logits = ref(tokens)
    ref_loss = F.cross_entropy(ref_logits.flatten(0, 1), labels.flatten())
    ref_loss.backward()
    results = run_distributed(_tp_rank, world_size, args=(apply_tensor_parallel, args, state, tokens, labels),
                              timeout=timeout)
    ctx = f"apply_tensor_parallel, TP {world_size}, TinyGPT {args}"
    findings = Findings()
    for rank, out in enumerate(results):
        if not out["tied"]:
            raise CheckFailure(f"rank {rank} ({ctx}): after apply_tensor_parallel, model.output.weight is not "
                               f"model.tok_embeddings.weight: parallelize_module replaced both by new DTensor "
                               f"Parameters and so untied them; tie them again "
                               f"(model.output.weight = model.tok_embeddings.weight)")
        for name, placement in out["placements"].items():
            want = _expected_placement(name)
            if want is None:
                continue
            if placement is None:
                raise CheckFailure(f"rank {rank} ({ctx}): {name} is a plain tensor, expected a DTensor with placement "
                                   f"{want} on the TP mesh (is its module in the plan? norms need SequenceParallel())")
            if placement != (str(want),):
                raise CheckFailure(f"rank {rank} ({ctx}): {name} has placement {placement}, expected ({want},): "
                                   f"column-parallel (q, k, v, w1, w3; the vocabulary-sharded embedding and head) "
                                   f"is Shard(0) of the [out, in] weight, row-parallel (wo, w2) Shard(1)")
        if out["logits_type"] != "DTensor":
            raise CheckFailure(f"rank {rank} ({ctx}): the model returned a {out['logits_type']}; expected the logits "
                               f"as a DTensor sharded over the vocabulary (ColwiseParallel(..., "
                               f"output_layouts=Shard(-1), use_local_output=False)) for loss_parallel()")
        with findings.numbers():
            _close(out["logits"], ref_logits.detach(), name=f"{ctx}: logits (gathered)", rank=rank)
            _close(out["loss"], ref_loss.detach(), name=f"{ctx}: loss", rank=rank)
            for name, p in ref.named_parameters():
                _close(out["grads"].get(name), p.grad, name=f"{ctx}: gradient of {name}", rank=rank)
        with findings.communication():
            # loss_parallel's all-reduces are per token ([b * s]); anything larger is an activation
            big = [r for r in out["records"] if r.op == "all_reduce" and r.phase == "forward"
                   and math.prod(r.shape) > batch * seq]
            if big:
                shapes = ", ".join(sorted({fmt_shape(r.shape) for r in big}))
                raise CheckFailure(
                    f"rank {rank} ({ctx}): forward all-reduced an activation {len(big)} time(s) ({shapes}): with "
                    f"sequence parallelism the only forward all-reduces are the loss's, per token; a row-parallel "
                    f"output is reduce-scattered along the sequence (RowwiseParallel(output_layouts=Shard(1))), a "
                    f"column-parallel one stays sharded. Communication of rank {rank}:\n"
                    f"{format_trace(out['records'], rank)}")
    findings.raise_if_any()


# ---------------------------------------------------------------------------
# Exercise 5: DP x TP training with FSDP2
# ---------------------------------------------------------------------------

def _dp_tp_rank(rank, world_size, apply_tp, apply_fsdp, local_batch, dp, tp, args, state, tokens, labels, steps):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = TinyGPT(args).double()
    model.load_state_dict(state)
    model = _student(apply_tp, model, mesh["tp"], what="apply_tensor_parallel") or model
    tied = model.output.weight is model.tok_embeddings.weight
    model = _student(apply_fsdp, model, mesh["dp"], what="apply_fsdp") or model
    meshes = {n: (p.device_mesh.mesh_dim_names if isinstance(p, DTensor) else None)
              for n, p in model.named_parameters()}
    batch = _student(local_batch, tokens, labels, mesh=mesh, what="local_batch")
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    dp_group = mesh["dp"].get_group()
    losses, records = [], []
    for step in range(steps):
        with CommLedger() as ledger:
            with loss_parallel():
                logits = model(batch["tokens"])
                loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
                loss.backward()
        if step == 0:
            records = ledger.records
        value = _full(loss).reshape(())
        dist.all_reduce(value, op=dist.ReduceOp.AVG, group=dp_group)
        losses.append(value.item())
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "state": {n: _full(p) for n, p in model.named_parameters()}, "meshes": meshes,
            "records": records, "dp_group": str(dp_group.group_name), "tied": tied,
            "batch": _cpu_batch(batch), "coords": (mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank())}


def _cpu_batch(batch) -> dict:
    return {k: torch.as_tensor(batch[k]).clone() for k in ("tokens", "labels") if isinstance(batch, dict) and k in batch}


def _same_data_in_tp_groups(results, ctx: str) -> None:
    """Ranks that differ only in their TP coordinate must have been given the same rows (local_batch)."""
    groups = {}
    for rank, out in enumerate(results):
        key = out["coords"][:-1]  # every coordinate but TP's (the last)
        groups.setdefault(key, []).append((rank, out["batch"].get("tokens")))
    for members in groups.values():
        (r0, t0), *rest = members
        for r, t in rest:
            if t0 is None or t is None or t0.shape != t.shape or not torch.equal(t0, t):
                raise CheckFailure(f"rank {r} ({ctx}): local_batch gave rank {r} other tokens than rank {r0}, although "
                                   f"both are one TP group: TP ranks must compute on the same data (slice by the DP "
                                   f"coordinate, not the global rank; exercise 3)")


def check_dp_tp_training(apply_tensor_parallel, apply_fsdp, local_batch, *, dp: int = 2, tp: int = 2,
                         args: ModelArgs = ModelArgs(), batch: int = 4, seq: int = 8, steps: int = 3, seed: int = 0,
                         timeout: float = _TIMEOUT) -> None:
    """DP x TP with SP: the loss curve and every full parameter after `steps` AdamW steps equal single-process.

    The rank program (readable below): a `(dp, tp)` mesh; the TinyGPT from the
    master weights; `apply_tensor_parallel(model, mesh["tp"])`, then
    `apply_fsdp(model, mesh["dp"])`; this rank's data from `local_batch`; per
    step the forward and `F.cross_entropy` inside `loss_parallel()`, backward,
    AdamW. Also checked: every parameter is a DTensor on both mesh dimensions
    (FSDP on top of TP), and forward all-gathers once per FSDP unit on the DP
    group (one per block, one for the root).
    """
    state = master_state(args, seed=seed)
    tokens, labels = _batch(args, batch, seq, seed)
    ref_losses, ref_state, _ = _reference_training(args, state, tokens, labels, steps=steps, max_norm=None)
    results = _run_composed(5, _dp_tp_rank, dp * tp, timeout=timeout,
                              args=(apply_tensor_parallel, apply_fsdp, local_batch, dp, tp, args, state, tokens,
                                    labels, steps))
    ctx = f"DP {dp} x TP {tp} (SP), {steps} AdamW steps, global batch [{batch}, {seq}]"
    findings = Findings()
    units = args.n_layers + 1
    _same_data_in_tp_groups(results, ctx)
    for rank, out in enumerate(results):
        if not out["tied"]:
            raise CheckFailure(f"rank {rank} ({ctx}): after apply_tensor_parallel the head is not tied to the embedding "
                               f"any more (parallelize_module replaced both parameters): tie them again before FSDP")
        for name, names in out["meshes"].items():
            if names is None or set(names) != {"dp", "tp"}:
                raise CheckFailure(f"rank {rank} ({ctx}): parameter {name} lives on mesh dimensions {names}, expected "
                                   f"both ('dp', 'tp'): TP first (apply_tensor_parallel), then FSDP over the DP "
                                   f"dimension (apply_fsdp)")
        with findings.communication():
            gathers = [r for r in out["records"] if r.op == "all_gather" and r.phase == "forward"
                       and r.group_name == out["dp_group"]]
            if dp > 1 and len(gathers) != units:
                raise CheckFailure(
                    f"rank {rank} ({ctx}): forward issued {len(gathers)} all-gather(s) of parameters on the DP group, "
                    f"expected {units}: one per FSDP unit, i.e. fully_shard on each of the {args.n_layers} blocks, "
                    f"then on the root (embedding, final norm, head). DP-group communication of rank {rank}:\n"
                    f"{format_trace([r for r in out['records'] if r.group_name == out['dp_group']], rank)}")
        with findings.numbers():
            for step, (got, want) in enumerate(zip(out["losses"], ref_losses)):
                _close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), name=f"{ctx}: loss of step {step + 1} (mean over DP)",
                       rank=rank)
            for name, want in ref_state.items():
                if name == "output.weight":
                    continue  # tied: the embedding's
                _close(out["state"].get(name), want, name=f"{ctx}: {name} after {steps} steps (gathered)", rank=rank)
    findings.raise_if_any()


# ---------------------------------------------------------------------------
# Exercise 6: the loss, averaged exactly once
# ---------------------------------------------------------------------------

def _loss_rank(rank, world_size, loss_fn, reduce_fn, dp, tp, logits, labels, microbatches):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    d, t = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    rows = logits.shape[0] // dp
    mine = logits[d * rows:(d + 1) * rows].chunk(tp, dim=-1)[t].contiguous()
    targets = labels[d * rows:(d + 1) * rows]
    leaves = [x.clone().requires_grad_() for x in mine.chunk(microbatches, dim=0)]  # one per micro-batch
    losses = []
    with CommLedger() as ledger:
        with loss_parallel():
            for leaf, y in zip(leaves, targets.chunk(microbatches, dim=0)):
                x = DTensor.from_local(leaf, mesh["tp"], [Shard(2)], run_check=False)  # the head's output
                loss = _student(loss_fn, x, y, what="pipeline_loss_fn")
                loss.backward()
                losses.append(loss)
    logged = _student(reduce_fn, losses, dp_group=mesh["dp"].get_group(), what="reduce_loss_for_logging")
    return {"losses": [float(_full(x).reshape(())) for x in losses], "grad": torch.cat([l.grad for l in leaves]),
            "logged": logged, "records": ledger.records, "coords": (d, t)}


def check_loss_averaging(pipeline_loss_fn, reduce_loss_for_logging, *, dp: int = 2, tp: int = 2,
                         microbatches: int = 2, batch: int = 4, seq: int = 3, vocab: int = 8, seed: int = 0,
                         timeout: float = _TIMEOUT) -> None:
    """Micro-batch losses, their gradient, and the logged loss: the global batch's mean, averaged once.

    Each rank of a `(dp, tp)` mesh holds its DP rows of the logits, sharded over
    the vocabulary (a `Shard(2)` DTensor, as the head's output), cut into
    micro-batches as the schedule does. Per micro-batch, under `loss_parallel()`,
    `pipeline_loss_fn(logits, labels)` must be the mean cross-entropy of that
    micro-batch's tokens; its gradient, divided by the number of micro-batches
    (the schedule's `scale_grads=True`) and by the DP size (FSDP's average),
    must be the gradient of the global batch's mean loss; and
    `reduce_loss_for_logging(losses, dp_group=...)` must return the global mean
    on every rank.
    """
    if batch % (dp * microbatches):
        raise ValueError(f"check parameters: batch ({batch}) must be divisible by dp * microbatches "
                         f"({dp} * {microbatches})")
    gen = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(batch, seq, vocab, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    ref = logits.clone().requires_grad_()
    ref_loss = F.cross_entropy(ref.flatten(0, 1), labels.flatten())
    ref_loss.backward()
    results = run_distributed(_loss_rank, dp * tp, timeout=timeout,
                              args=(pipeline_loss_fn, reduce_loss_for_logging, dp, tp, logits, labels, microbatches))
    ctx = f"DP {dp} x TP {tp}, {microbatches} micro-batches, global batch [{batch}, {seq}], vocab {vocab}"
    rows = batch // dp
    mb = rows // microbatches
    for rank, out in enumerate(results):
        d, t = out["coords"]
        for i, got in enumerate(out["losses"]):
            lo = d * rows + i * mb
            want = F.cross_entropy(logits[lo:lo + mb].flatten(0, 1), labels[lo:lo + mb].flatten())
            if not math.isclose(got, want.item(), rel_tol=TOL, abs_tol=TOL):
                factor = want.item() / got if got else float("inf")
                raise CheckFailure(
                    f"rank {rank} ({ctx}): pipeline_loss_fn on micro-batch {i} returned {got:.10g}, expected "
                    f"{want.item():.10g}, the mean cross-entropy of its {mb * seq} tokens (ratio {factor:.4g}). "
                    f"The schedule already divides the gradients by the number of micro-batches and FSDP "
                    f"averages over DP: the loss of one micro-batch is averaged over its own tokens only.")
        expected_grad = ref.grad[d * rows:(d + 1) * rows].chunk(tp, dim=-1)[t] * microbatches * dp
        _close(out["grad"], expected_grad, name=f"{ctx}: gradient of this rank's logits shard, summed over its "
               f"micro-batches (before the schedule's 1/{microbatches} and FSDP's 1/{dp})", rank=rank)
        logged = out["logged"]
        if isinstance(logged, torch.Tensor):
            logged = float(_full(logged).reshape(()))
        if not isinstance(logged, (int, float)):
            raise CheckFailure(f"rank {rank} ({ctx}): reduce_loss_for_logging returned {type(logged).__name__}, "
                               f"expected a float")
        if not math.isclose(logged, ref_loss.item(), rel_tol=TOL, abs_tol=TOL):
            ratio = ref_loss.item() / logged if logged else float("inf")
            raise CheckFailure(
                f"rank {rank} ({ctx}): reduce_loss_for_logging returned {logged:.10g}, expected {ref_loss.item():.10g}, "
                f"the mean loss of the global batch (ratio expected/got {ratio:.4g}: averaged more than once, or "
                f"summed?). Mean over the micro-batches, then the mean over the DP group, each once.")


# ---------------------------------------------------------------------------
# Exercise 7: the tied embedding across pipeline stages
# ---------------------------------------------------------------------------

class _StageStub(nn.Module):
    """A pipeline stage with only the tied weight: the embedding on the first stage, the head on the last."""

    def __init__(self, first: bool, last: bool, vocab: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleDict()
        self.tok_embeddings = nn.Embedding(vocab, dim) if first else None
        self.norm = nn.RMSNorm(dim) if last else None
        self.output = nn.Linear(dim, vocab, bias=False) if last else None
        if first and last:
            self.output.weight = self.tok_embeddings.weight


def _embedding_group(mesh, rank: int, pp: int):
    """This rank's embedding group (first and last stage of its pipeline), created on every rank in one order.

    None on a middle stage; a group of one rank when there is one stage.
    """
    mine = None
    if pp == 1:
        return dist.new_group([rank])
    for pp_ranks in mesh.mesh.reshape(pp, -1).t().tolist():  # every pipeline: (dp, tp) fixed, pp varying
        group = dist.new_group([pp_ranks[0], pp_ranks[-1]])
        if rank in (pp_ranks[0], pp_ranks[-1]):
            mine = group
    return mine


def _tied_rank(rank, world_size, fn, pp, tp, grads, vocab, dim):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", (pp, world_size // (pp * tp), tp), mesh_dim_names=("pp", "dp", "tp"))
    group = _embedding_group(mesh, rank, pp)
    s = mesh["pp"].get_local_rank()
    first, last = s == 0, s == pp - 1
    stage = _StageStub(first, last, vocab, dim)
    weight = None
    if first or last:
        placements = [Shard(0), Shard(0)]  # FSDP over dp, the vocabulary over tp
        sub = mesh["dp", "tp"]
        weight = nn.Parameter(distribute_tensor(torch.zeros(vocab, dim, dtype=torch.float64), sub, placements,
                                                src_data_rank=None))
        weight.grad = distribute_tensor(grads[s].clone(), sub, placements, src_data_rank=None)
        if first:
            stage.tok_embeddings.weight = weight
        if last:
            stage.output.weight = weight
    with CommLedger() as ledger:
        _student(fn, stage, embedding_group=group, what="allreduce_tied_embedding_grads")
    return {"grad": _full(weight.grad) if weight is not None else None, "stage": s, "records": ledger.records}


def check_tied_embedding_grads(allreduce_tied_embedding_grads, *, pp: int = 2, dp: int = 1, tp: int = 2,
                               vocab: int = 8, dim: int = 4, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """After the pipeline step, both copies of the tied weight hold the SUM of their gradients.

    Each rank of a `(pp, dp, tp)` mesh holds one pipeline stage: the first stage
    the embedding, the last the head (a copy of the same weight), the middle
    ones neither, the weight and its gradient DTensors on the `(dp, tp)` mesh
    (FSDP x TP: `Shard(0)` twice). The embedding group of a pipeline is its first
    and last rank; middle stages get `embedding_group=None`, and with one stage
    the group has one rank. Checked: the first and last stage's gradients become
    their sum, and each issues exactly one all-reduce over a group of 2; middle
    stages and a single stage communicate nothing and keep their gradient.
    """
    world_size = pp * dp * tp
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(vocab, dim, generator=gen, dtype=torch.float64) for _ in range(pp)]
    results = run_distributed(_tied_rank, world_size, args=(allreduce_tied_embedding_grads, pp, tp, grads, vocab, dim),
                              timeout=timeout)
    ctx = f"allreduce_tied_embedding_grads, PP {pp} x DP {dp} x TP {tp}"
    expected_sum = grads[0] + grads[-1] if pp > 1 else grads[0]
    findings = Findings()
    for rank, out in enumerate(results):
        s = out["stage"]
        if s not in (0, pp - 1):
            with findings.communication():
                expect_no_comm(out["records"], rank=rank, context=f"{ctx}; stage {s} holds no embedding")
            continue
        with findings.numbers():
            _close(out["grad"], expected_sum, name=f"{ctx}: stage {s}'s gradient of the tied weight (expected the "
                   f"sum of the embedding's and the head's)", rank=rank)
        with findings.communication():
            if pp == 1:
                expect_no_comm(out["records"], rank=rank, context=f"{ctx}; one stage: the weight is tied in one module")
                continue
            ars = [r for r in out["records"] if r.op == "all_reduce"]
            others = [r for r in out["records"] if r.op not in ("all_reduce", "wait")]
            if len(ars) != 1 or ars[0].group_size != 2 or others:
                raise CheckFailure(f"rank {rank} ({ctx}): expected exactly one all-reduce over the embedding group "
                                   f"(2 ranks: the first and last stage), saw:\n{format_trace(out['records'], rank)}")
    findings.raise_if_any()


# ---------------------------------------------------------------------------
# Exercise 8: clipping by the norm of the whole model
# ---------------------------------------------------------------------------

def _clip_specs(pp: int, vocab: int, dim: int) -> list:
    """(name, stage, shape, placements on (dp, tp), shared) of a TinyGPT-like model split over `pp` stages."""
    S0, S1, R = Shard(0), Shard(1), Replicate()
    specs = [("tok_embeddings.weight", 0, (vocab, dim), (S0, S0), False)]
    for s in range(pp):
        specs += [(f"layers.{s}.attention_norm.weight", s, (dim,), (S0, R), False),
                  (f"layers.{s}.attention.wq.weight", s, (dim, dim), (S0, S0), False),
                  (f"layers.{s}.attention.wo.weight", s, (dim, dim), (S0, S1), False)]
    specs += [("norm.weight", pp - 1, (dim,), (S0, R), False),
              ("output.weight", pp - 1, (vocab, dim), (S0, S0), pp > 1)]  # pp == 1: the same Parameter
    return specs


def _clip_rank(rank, world_size, fn, pp, dp, tp, specs, grads, max_norm):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    sub = mesh["dp", "tp"]
    s = mesh["pp"].get_local_rank()
    params, names = [], []
    for (name, stage, shape, placements, shared) in specs:
        if stage != s or (name == "output.weight" and not shared and pp == 1):
            continue
        p = nn.Parameter(distribute_tensor(torch.zeros(shape, dtype=torch.float64), sub, list(placements),
                                           src_data_rank=None))
        p.grad = distribute_tensor(grads[name].clone(), sub, list(placements), src_data_rank=None)
        if shared:
            p.shared = True
        params.append(p)
        names.append(name)
    with CommLedger() as ledger:
        norm = _student(fn, params, max_norm, pp_group=mesh["pp"].get_group(), what="clip_grad_norm_")
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return {"norm": float(norm), "grads": {n: _full(p.grad) for n, p in zip(names, params)}, "stage": s,
            "records": ledger.records}


def check_clip_grad_norm(clip_grad_norm_, *, pp: int = 2, dp: int = 2, tp: int = 2, max_norm: float = 1.0,
                         vocab: int = 8, dim: int = 4, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """The norm of the whole model's gradient, from DTensor shards on a `(pp, dp, tp)` mesh, and the clipped gradients.

    Each stage's parameters are DTensors on the `(dp, tp)` mesh (FSDP `Shard(0)`
    on dp; TP `Shard(0)`, `Shard(1)`, or `Replicate()` for the norm scales);
    with pp > 1 the last stage holds the tied head's copy, marked
    `.shared = True`. Expected: the 2-norm over every distinct parameter once
    (`torch.nn.utils.clip_grad_norm_` on the single-process model, where the tie
    is one Parameter), returned on every rank; every gradient multiplied by
    `max_norm / (norm + 1e-6)` when that is below 1, else unchanged.
    """
    world_size = pp * dp * tp
    specs = _clip_specs(pp, vocab, dim)
    gen = torch.Generator().manual_seed(seed)
    grads = {name: torch.randn(shape, generator=gen, dtype=torch.float64) for name, _, shape, _, _ in specs}
    grads["output.weight"] = grads["tok_embeddings.weight"]  # the tie: its gradient after the embedding all-reduce
    unique = [g for name, g in grads.items() if name != "output.weight"]
    ref_norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in unique])).item()
    coef = max_norm / (ref_norm + 1e-6)
    results = run_distributed(_clip_rank, world_size, args=(clip_grad_norm_, pp, dp, tp, specs, grads, max_norm),
                              timeout=timeout)
    ctx = f"clip_grad_norm_, PP {pp} x DP {dp} x TP {tp}, max_norm {max_norm:g}"
    replicated = sum(g.numel() for n, g in grads.items() if "norm" in n)
    for rank, out in enumerate(results):
        got = out["norm"]
        if not math.isclose(got, ref_norm, rel_tol=TOL, abs_tol=TOL):
            raise CheckFailure(
                f"rank {rank} ({ctx}): returned norm {got:.10g}, expected {ref_norm:.10g}, the norm of the whole "
                f"model's gradient. Count every distinct element once: each shard once, a piece replicated over a "
                f"mesh dimension (the {replicated} norm-scale elements, Replicate() over TP) once and not once per "
                f"replica, every pipeline stage (sum the squares over pp_group), and the tied head's copy "
                f"(.shared) not at all.")
        for name, g in out["grads"].items():
            want = grads[name] * coef if coef < 1 else grads[name]
            _close(g, want, name=f"{ctx}: clipped gradient of {name} (stage {out['stage']})", rank=rank)


# ---------------------------------------------------------------------------
# Exercise 9: PP x DP x TP training
# ---------------------------------------------------------------------------

def _pp_rank(rank, world_size, fns, pp, dp, tp, args, state, tokens, labels, microbatches, steps, max_norm):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_group = mesh["pp"].get_group()
    embedding_group = _embedding_group(mesh, rank, pp)
    model = TinyGPT(args).double()
    model.load_state_dict(state)
    stage = _student(fns["split_model_for_pipeline"], model, pp_rank=pp_group.rank(), pp_size=pp,
                     what="split_model_for_pipeline")
    stage = _student(fns["apply_tensor_parallel"], stage, mesh["tp"], what="apply_tensor_parallel") or stage
    stage = _student(fns["apply_fsdp"], stage, mesh["dp"], reshard_after_forward=False, what="apply_fsdp") or stage
    schedule = _student(fns["build_schedule"], stage, pp_group=pp_group, n_microbatches=microbatches,
                        loss_fn=fns["pipeline_loss_fn"], what="build_schedule")
    batch = _student(fns["local_batch"], tokens, labels, mesh=mesh, what="local_batch")
    opt = torch.optim.AdamW(stage.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        losses.append(_student(fns["pipeline_train_step"], schedule, batch, stage_module=stage, optimizer=opt,
                               pp_group=pp_group, dp_group=mesh["dp"].get_group(), embedding_group=embedding_group,
                               max_norm=max_norm, what="pipeline_train_step"))
    return {"losses": losses, "state": {n: _full(p) for n, p in stage.named_parameters()}, "stage": pp_group.rank(),
            "batch": _cpu_batch(batch),
            "coords": (mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank())}


PIPELINE_FUNCTIONS = ("split_model_for_pipeline", "apply_tensor_parallel", "apply_fsdp", "build_schedule",
                      "pipeline_loss_fn", "local_batch", "pipeline_train_step")


def check_pipeline_training(functions: dict, *, pp: int = 2, dp: int = 2, tp: int = 2,
                            args: ModelArgs = ModelArgs(), batch: int = 4, seq: int = 8, microbatches: int = 2,
                            steps: int = 3, max_norm: float = 1.0, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """PP x DP x TP: the loss curve (last stage) and every parameter of every stage equal single-process training.

    `functions` maps the names in `PIPELINE_FUNCTIONS` to the student's
    functions. The rank program (readable below) builds a `(pp, dp, tp)` mesh
    and the embedding groups, then: `split_model_for_pipeline`,
    `apply_tensor_parallel`, `apply_fsdp(..., reshard_after_forward=False)`,
    `build_schedule(..., loss_fn=pipeline_loss_fn)`, `local_batch`, and
    `steps` times `pipeline_train_step`. The reference trains the whole model in
    one process on the global batch with `clip_grad_norm_(max_norm)` and AdamW;
    `max_norm` is small enough that every step clips.
    """
    missing = [n for n in PIPELINE_FUNCTIONS if n not in functions]
    if missing:
        raise ValueError(f"check_pipeline_training: functions is missing {missing}")
    state = master_state(args, seed=seed)
    tokens, labels = _batch(args, batch, seq, seed)
    ref_losses, ref_state, _ = _reference_training(args, state, tokens, labels, steps=steps, max_norm=max_norm)
    results = _run_composed(9, _pp_rank, pp * dp * tp, timeout=timeout,
                              args=(dict(functions), pp, dp, tp, args, state, tokens, labels, microbatches, steps,
                                    max_norm))
    ctx = f"PP {pp} x DP {dp} x TP {tp}, {microbatches} micro-batches, {steps} steps, clipped at {max_norm:g}"
    findings = Findings()
    _same_data_in_tp_groups(results, ctx)
    for rank, out in enumerate(results):
        last = out["stage"] == pp - 1
        with findings.numbers():
            for step, (got, want) in enumerate(zip(out["losses"], ref_losses)):
                if not last:
                    if got is not None:
                        raise CheckFailure(f"rank {rank} ({ctx}): pipeline_train_step returned {got!r} on stage "
                                           f"{out['stage']}; only the last stage has the loss (return None elsewhere)")
                    continue
                if not isinstance(got, (int, float)):
                    raise CheckFailure(f"rank {rank} ({ctx}): pipeline_train_step returned {type(got).__name__} on the "
                                       f"last stage; expected the loss of the global batch as a float")
                _close(torch.tensor(float(got), dtype=torch.float64), torch.tensor(want, dtype=torch.float64), name=f"{ctx}: logged loss of step {step + 1}",
                       rank=rank)
            if not out["state"]:
                raise CheckFailure(f"rank {rank} ({ctx}): stage {out['stage']} has no parameters")
            for name, got in out["state"].items():
                want = ref_state.get(name)
                if want is None:
                    raise CheckFailure(f"rank {rank} ({ctx}): stage {out['stage']} has a parameter {name!r} the "
                                       f"model does not have")
                what = ("the tied head's copy on the last stage: its gradient must be summed with the embedding's "
                        "(allreduce_tied_embedding_grads) before clipping" if name == "output.weight" else name)
                _close(got, want, name=f"{ctx}: {what} after {steps} steps (stage {out['stage']})", rank=rank)
    findings.raise_if_any()


# ---------------------------------------------------------------------------
# Pictures
# ---------------------------------------------------------------------------

def plot_rank_layout(layout: dict, *, gpus_per_node: int = 8, names=("tp", "cp", "pp", "dp"), title: str = ""):
    """One row per dimension, one cell per rank, coloured by the rank's group; node boundaries drawn.

    A glance shows which groups stay inside a node (fast NVLink) and which
    cross nodes (InfiniBand).
    """
    from matplotlib import colormaps

    from autograder.lessons.plots import new_figure, picture

    if not isinstance(gpus_per_node, int) or isinstance(gpus_per_node, bool) or gpus_per_node < 1:
        raise ValueError(f"plot_rank_layout: gpus_per_node must be a positive int, got {gpus_per_node!r}")
    shown = [n for n in names if n in layout]
    if not shown:
        raise ValueError(f"plot_rank_layout: layout has none of the dimensions {tuple(names)}: its keys are "
                         f"{list(layout)}")
    names = shown
    world = 1 + max(r for groups in layout.values() for g in groups for r in g)
    fig, ax = new_figure(figsize=(min(14, 1.2 + 0.45 * world), 0.8 + 0.6 * len(names)))
    cmap = colormaps["tab20"]
    for row, name in enumerate(names):
        for gi, group in enumerate(layout[name]):
            for r in group:
                ax.add_patch(_rect(r, row, cmap(gi % 20)))
                ax.text(r + 0.5, row + 0.5, str(gi), ha="center", va="center", fontsize=7)
    for boundary in range(0, world + 1, gpus_per_node):
        ax.axvline(boundary, color="black", linewidth=2)
    ax.set_xlim(0, world)
    ax.set_ylim(0, len(names))
    ax.set_yticks([i + 0.5 for i in range(len(names))], [f"{n} ({len(layout[n][0])})" for n in names])
    ax.set_xticks([r + 0.5 for r in range(world)], [str(r) for r in range(world)], fontsize=7)
    ax.set_xlabel(f"global rank (thick lines: nodes of {gpus_per_node} GPUs); the number in a cell is its group")
    ax.set_title(title or "rank layout: one colour per group")
    ax.invert_yaxis()
    return picture(fig)


def _rect(x, y, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=color, edgecolor="white")


# ---------------------------------------------------------------------------
# Exercises 10-12: the planner (no ranks: arithmetic against hand-computed numbers and published layouts)
# ---------------------------------------------------------------------------

def _describe_case(model, layout, training, cluster=None) -> str:
    where = f" on {cluster.num_gpus} GPUs" if cluster is not None else ""
    return (f"{model.name}, {layout.name}{where}, micro-batch {layout.micro_batch}, seq {training.seq_len}, "
            f"global batch {training.global_batch}")


def _expect_numbers(got, expected: dict, *, what: str, unit: str, scale: float) -> None:
    if not isinstance(got, dict):
        raise CheckFailure(f"{what}: returned {type(got).__name__}, expected a dict with keys {sorted(expected)}")
    missing = [k for k in expected if k not in got]
    if missing:
        raise CheckFailure(f"{what}: no key(s) {missing}; returned keys {sorted(got)}")
    wrong = []
    for key, want in expected.items():
        value = got[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise CheckFailure(f"{what}: [{key!r}] is a {type(value).__name__}, expected a number")
        if not math.isclose(float(value), float(want), rel_tol=1e-9, abs_tol=1e-12 * max(1.0, abs(want))):
            ratio = f", ratio {value / want:.6g}" if want else ""
            wrong.append(f"[{key!r}]: expected {want / scale:.6g} {unit}, got {value / scale:.6g} {unit}{ratio}")
    if wrong:
        raise CheckFailure(f"{what}: " + "; ".join(wrong))


def check_memory_per_gpu(memory_per_gpu, model, layout, training, *, expected: dict | None = None,
                         total_between: tuple | None = None) -> None:
    """`memory_per_gpu(model, layout, training)` equals the hand-computed bytes (relative 1e-9) and names the
    worst stage; or, for a published model, its total lies within `total_between` = (low, high) bytes."""
    got = _one_rank(_call_program, memory_per_gpu, (model, layout, training), {})
    what = f"memory_per_gpu({_describe_case(model, layout, training)})"
    expected = dict(expected or {})
    stage = expected.pop("stage", None)
    _expect_numbers(got, expected, what=what, unit="GB", scale=1e9)
    if stage is not None and got.get("stage") != stage:
        raise CheckFailure(f"{what}: the worst stage is {stage}, got {got.get('stage')!r}")
    if total_between is not None:
        _expect_numbers(got, {}, what=what, unit="GB", scale=1e9)
        total = got.get("total")
        if not isinstance(total, (int, float)) or not total_between[0] <= total <= total_between[1]:
            parts = ", ".join(f"{k} {got[k] / 1e9:.2f}" for k in ("params", "grads", "optimizer", "activations")
                              if isinstance(got.get(k), (int, float)))
            raise CheckFailure(f"{what}: expected between {total_between[0] / 1e9:g} and {total_between[1] / 1e9:g} "
                               f"GB on the worst GPU, got {total if not isinstance(total, float) else total / 1e9:.4g}"
                               f"{' GB' if isinstance(total, float) else ''} ({parts})")


def check_step_time(step_time, model, cluster, layout, training, *, expected: dict) -> None:
    """`step_time(model, cluster, layout, training)` equals the hand-computed seconds (relative 1e-9)."""
    got = _one_rank(_call_program, step_time, (model, cluster, layout, training), {})
    _expect_numbers(got, expected, what=f"step_time({_describe_case(model, layout, training, cluster)})",
                    unit="s", scale=1.0)


def check_plan(plan, model, cluster, layout, training, *, feasible: bool, reason: str | None = None,
               memory_gb: tuple | None = None, check_mfu: bool = False) -> None:
    """`plan(...)` judges a layout as given: feasible or not, a reason containing `reason`, the worst GPU's
    memory within `memory_gb` = (low, high); with `check_mfu`, its `mfu` is the model's FLOPs of the step
    (global batch x seq x flops_per_token(seq), no recomputation) over the plan's own total time x GPUs x peak
    (relative 1e-9: a wrong step time is exercise 11's to grade, not this)."""
    from autograder.lessons.planner import Plan

    what = f"plan({_describe_case(model, layout, training, cluster)})"
    p = _one_rank(_call_program, plan, (model, cluster, layout, training), {})
    if not isinstance(p, Plan):
        raise CheckFailure(f"{what}: returned {type(p).__name__}, expected an autograder.lessons.planner.Plan")
    if memory_gb is not None:
        gb = p.memory["total"] / 1e9
        if not memory_gb[0] <= gb <= memory_gb[1]:
            raise CheckFailure(f"{what}: {gb:.1f} GB on the worst GPU, expected between {memory_gb[0]} and "
                               f"{memory_gb[1]} GB (breakdown: " + ", ".join(
                                   f"{k} {p.memory[k] / 1e9:.2f}" for k in ("params", "grads", "optimizer",
                                                                           "activations")) + ")")
    if bool(p.feasible) != feasible:
        raise CheckFailure(f"{what}: judged {'feasible' if p.feasible else 'infeasible'} ({p.reasons}), expected "
                           f"{'feasible' if feasible else 'infeasible'}")
    if feasible and p.reasons:
        raise CheckFailure(f"{what}: feasible, yet with reasons {p.reasons}")
    if reason is not None and not any(reason in r for r in p.reasons):
        raise CheckFailure(f"{what}: expected a reason mentioning {reason!r}, got {p.reasons}")
    if check_mfu:
        got, total = p.mfu, p.time.get("total") if isinstance(p.time, dict) else None
        if not isinstance(total, (int, float)) or total <= 0:
            raise CheckFailure(f"{what}: time['total'] is {total!r}, expected a positive number of seconds")
        step_flops = training.global_batch * training.seq_len * model.flops_per_token(training.seq_len)
        want = step_flops / (total * cluster.num_gpus * cluster.node.peak_flops)
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isclose(got, want, rel_tol=1e-9):
            shown = f"{got:.6g}" if isinstance(got, (int, float)) else repr(got)
            raise CheckFailure(f"{what}: mfu {shown}, expected {want:.6g}: the model's FLOPs of the step, "
                               f"{step_flops:.6g} (global batch x seq x flops_per_token, no recomputation), over "
                               f"total seconds x GPUs x peak FLOP/s = {total:.6g} x {cluster.num_gpus} x "
                               f"{cluster.node.peak_flops:g}")


def check_best_layouts(best_layouts, model, cluster, training, *, expected: list, top: int = 3, zero_stages=(1,),
                       recompute=("none", "full"), micro_batch: int = 1) -> None:
    """`best_layouts` returns, fastest first, exactly the `expected` layouts: the `top` fastest feasible ones
    of the whole candidate space as the course's reference planner judges them (the builder computes
    `expected` with it), so a search that ranks with wrong memory or time numbers does not pass; every plan
    it returns is feasible. `micro_batch` is passed on (the default is not: a search that has no such
    argument fails); every returned layout has that micro-batch."""
    from autograder.lessons.planner import Plan

    what = (f"best_layouts({model.name}, {cluster.num_gpus} GPUs, seq {training.seq_len}, global batch "
            f"{training.global_batch}, top={top}" + (f", micro_batch={micro_batch}" if micro_batch != 1 else "") + ")")
    kwargs = dict(zero_stages=tuple(zero_stages), recompute=tuple(recompute), top=top)
    if micro_batch != 1:
        kwargs["micro_batch"] = micro_batch
    got = _one_rank(_call_program, best_layouts, (model, cluster, training), kwargs)
    if not isinstance(got, list) or not all(isinstance(p, Plan) for p in got):
        raise CheckFailure(f"{what}: expected a list of Plan, got {type(got).__name__}")
    have = [p.layout for p in got]
    other = sorted({p.layout.micro_batch for p in got} - {micro_batch})
    if other:
        raise CheckFailure(f"{what}: returned layouts with micro-batch {other}, expected {micro_batch} for every "
                           f"candidate: build each Layout with the micro_batch you were given (it changes the "
                           f"micro-batch count, the memory in flight, the bubble and every volume)")
    if have != list(expected):
        def names(layouts):
            return [lay.name + (f", micro-batch {lay.micro_batch}" if lay.micro_batch != 1 else "")
                    for lay in layouts]
        raise CheckFailure(f"{what}: expected the {top} fastest feasible layouts, fastest first, as the course's "
                           f"reference planner ranks them: {names(expected)}; got {names(have)}. A search that is "
                           f"right ranks wrong when memory_per_gpu, step_time or plan are off: check those first.")
    for p in got:
        if not p.feasible:
            raise CheckFailure(f"{what}: returned an infeasible plan: {p.layout.name} ({p.reasons})")
