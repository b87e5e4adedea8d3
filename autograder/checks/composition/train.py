"""Public checks of assignment 06, exercises 4-9: the model trained with the dimensions composed.

    from autograder.checks.composition import check_dp_tp_training
    check_dp_tp_training(apply_tensor_parallel, apply_fsdp, local_batch, dp=2, tp=2)

The tensor-parallel plan, DP x TP training with FSDP2, the loss averaged exactly once, the tied
embedding across pipeline stages, clipping by the norm of the whole model, and PP x DP x TP training:
each against single-process training of the same `TinyGPT`. How every check of the assignment works:
autograder/checks/composition/__init__.py.

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

from autograder.runtime.compare import CheckFailure, Findings, fmt_shape
from autograder.runtime.dist import DistributedError, run_distributed
from autograder.runtime.ledger import CommLedger, expect_no_comm, format_trace
from autograder.lessons.tinygpt import ModelArgs, TinyGPT, master_state

from .common import (
    LR, TOL, _TIMEOUT, _batch, _close, _full, _rank_logging_to_log_file, _reference_training, _run_composed, _student,
)

__all__ = [
    "check_tensor_parallel_plan", "check_dp_tp_training", "check_loss_averaging", "check_tied_embedding_grads",
    "check_clip_grad_norm", "check_pipeline_training", "PIPELINE_FUNCTIONS",
]


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

def _student_stage(rank, fns, pp, dp, tp, args, state, microbatches):
    """This rank's part of the model as the student's exercises build it on a `(pp, dp, tp)` mesh: their stage,
    then TP, then FSDP, then their schedule. (mesh, pp_group, embedding_group, stage, schedule)."""
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
    return mesh, pp_group, embedding_group, stage, schedule


def _pp_rank(rank, world_size, fns, pp, dp, tp, args, state, tokens, labels, microbatches, steps, max_norm):
    _rank_logging_to_log_file()
    mesh, pp_group, embedding_group, stage, schedule = _student_stage(rank, fns, pp, dp, tp, args, state,
                                                                      microbatches)
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
