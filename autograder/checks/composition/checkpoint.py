"""Public check of assignment 06, exercise 13: a checkpoint saved on one layout loads on another.

    from autograder.checks.composition import check_checkpoint_state
    check_checkpoint_state(checkpoint_state, save=dict(pp=2, dp=1, tp=2), load=dict(pp=1, dp=2, tp=2))

Two runs of the small GPT's stages (`JOB_ARGS`: 4 layers), each on its own
`(pp, dp, tp)` mesh. The stages are built here, not with your exercise 4, 5
and 9 functions: every parameter a DTensor on the stage's `(dp, tp)` mesh,
`Shard(0)` over DP (as FSDP) and the TP plan's placement over TP; the last
stage of a pipeline holds its own copy of the tied head. The first run takes
one AdamW step (so that the optimizer has state), then
`dcp.save(checkpoint_state(stage, optimizer), ...)`; the second builds its
stages with zeros (parameters and optimizer state), then
`dcp.load(checkpoint_state(stage, optimizer), ...)`. Every parameter and every
AdamW state of the second run must then equal the first run's value of the same
parameter of the whole model (the head's copy: the embedding's), gathered and
compared here.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from autograder.runtime.compare import CheckFailure
from autograder.lessons.tinygpt import ModelArgs, TransformerBlock, master_state

from .common import LR, _TIMEOUT, _close, _rank_logging_to_log_file, _student
from .job import JOB_ARGS, _init_optimizer_state
from .train import _expected_placement

__all__ = ["check_checkpoint_state"]

_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


class _Stage(nn.Module):
    """Pipeline stage `s` of `p` of a TinyGPT's parameters: global layer names, the tied head's copy on the last."""

    def __init__(self, args: ModelArgs, s: int, p: int):
        super().__init__()
        per = args.n_layers // p
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim) if s == 0 else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(s * per, (s + 1) * per)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps) if s == p - 1 else None
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False) if s == p - 1 else None
        if s == 0 and s == p - 1:
            self.output.weight = self.tok_embeddings.weight


def _model_name(stage, name: str) -> str:
    return "tok_embeddings.weight" if name == "output.weight" and stage.tok_embeddings is None else name


def _build(args, layout, state, zeros: bool):
    pp, dp, tp = layout["pp"], layout["dp"], layout["tp"]
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    sub = mesh["dp", "tp"]
    s = mesh["pp"].get_local_rank()
    stage = _Stage(args, s, pp).double()
    done = {}
    for module_name, module in stage.named_modules():
        for pname, param in list(module.named_parameters(recurse=False)):
            full_name = f"{module_name}.{pname}" if module_name else pname
            if id(param) in done:  # the tie at one stage: the same Parameter again
                setattr(module, pname, done[id(param)])
                continue
            tp_placement = _expected_placement(_model_name(stage, full_name))
            value = torch.zeros_like(param) if zeros else state[_model_name(stage, full_name)].clone()
            placements = [Shard(0), tp_placement if tp_placement is not None else Shard(0)]
            new = nn.Parameter(distribute_tensor(value, sub, placements, src_data_rank=None))
            setattr(module, pname, new)
            done[id(param)] = new
    return stage, mesh


def _gathered(stage, opt) -> dict:
    """{model name: {"param": part, "step": ..., "exp_avg": ..., "exp_avg_sq": ...}} of this rank's stage, each
    value this rank's `_part` of it (`_whole` puts the tensors together in the grader)."""
    out = {}
    for name, p in stage.named_parameters():
        entry = {"param": _part(p)}
        for key in _STATE_KEYS:
            entry[key] = _part(opt.state.get(p, {}).get(key))
        out[_model_name(stage, name)] = entry
    return out


def _part(t):
    """(the ranks that hold parts of `t`, this rank's values, their offset in the whole tensor, its shape), or None.

    A DTensor's offset is DTensor's own (`compute_local_shape_and_global_offset`, as DCP writes its shards): the
    grader puts the whole tensor together from every rank's part, without a collective per tensor in the ranks
    (`full_tensor()` of each parameter and AdamW state was most of the check's time)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if t is None:
        return None
    if isinstance(t, DTensor):
        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return (tuple(t.device_mesh.mesh.flatten().tolist()), t.to_local().detach().cpu().clone(), tuple(offset),
                tuple(t.shape))
    import torch.distributed as dist

    return ((dist.get_rank(),), t.detach().cpu().clone(), (0,) * t.dim(), tuple(t.shape))


def _whole(parts: list[dict]) -> list[dict]:
    """Each rank's `_gathered` with every part replaced by its whole tensor: the parts of the same name held by the
    same ranks put together (the embedding and the last stage's copy of the head share a name, not their ranks)."""
    pieces: dict = {}
    for part in parts:
        for name, entry in part.items():
            for key, value in entry.items():
                if value is not None:
                    pieces.setdefault((name, key, value[0]), []).append(value[1:])
    whole = {}
    for (name, key, ranks), found in pieces.items():
        shape = found[0][2]
        full = torch.full(shape, float("nan"), dtype=found[0][0].dtype)
        covered = torch.zeros(shape, dtype=torch.bool)
        for local, offset, _ in found:
            where = tuple(slice(o, o + n) for o, n in zip(offset, local.shape))
            full[where] = local
            covered[where] = True
        if not bool(covered.all()):
            raise RuntimeError(f"checkpoint check: the parts of {name} {key} on ranks {ranks} do not cover it")
        whole[(name, key, ranks)] = full
    return [{name: {key: None if value is None else whole[(name, key, value[0])] for key, value in entry.items()}
             for name, entry in part.items()} for part in parts]


def _save_rank(rank, world_size, fn, args, layout, state, grads, path):
    _rank_logging_to_log_file()
    stage, mesh = _build(args, layout, state, zeros=False)
    opt = torch.optim.AdamW(stage.parameters(), lr=LR)
    for name, p in stage.named_parameters():
        p.grad = distribute_tensor(grads[_model_name(stage, name)].clone(), p.device_mesh, p.placements,
                                   src_data_rank=None)
    opt.step()
    to_save = _student(fn, stage, opt, what="checkpoint_state")
    _check_values(to_save, stage, opt, rank)
    dcp.save(to_save, checkpoint_id=path)
    return _gathered(stage, opt)


def _load_rank(rank, world_size, fn, args, layout, state, path, saved_at):
    _rank_logging_to_log_file()
    stage, mesh = _build(args, layout, state, zeros=True)
    opt = torch.optim.AdamW(stage.parameters(), lr=LR)
    _init_optimizer_state(opt)
    to_load = _student(fn, stage, opt, what="checkpoint_state")
    _check_values(to_load, stage, opt, rank)
    try:
        dcp.load(to_load, checkpoint_id=path)
    except CheckpointException as exc:  # every rank's failure, gathered by DCP's coordinator
        missing = sorted({str(e).strip() for e, _trace in exc.failures.values() if "Missing key" in str(e)})
        if not missing:
            raise
        raise CheckFailure(
            f"rank {rank}: dcp.load on {_layout_text(layout)} asked for keys the checkpoint written on {saved_at} "
            f"does not have ({' '.join(missing)}). The keys must not depend on the layout: every parameter under "
            f"its name in the whole model, and the last stage's copy of the tied head under the embedding's key "
            f"(a run with one stage has no other)") from None
    return _gathered(stage, opt)


def _check_values(state: dict, stage, opt, rank: int) -> None:
    """Every value must be a live tensor of the stage or its optimizer (DCP loads in place), all of them present."""
    if not isinstance(state, dict):
        raise CheckFailure(f"rank {rank}: checkpoint_state returned {type(state).__name__}, expected a dict "
                           f"{{flat key: tensor}}")
    live = {id(p): f"parameter {n}" for n, p in stage.named_parameters()}
    for n, p in stage.named_parameters():
        for key, value in opt.state.get(p, {}).items():
            live[id(value)] = f"optimizer state {key!r} of {n}"
    seen = set()
    for key, value in state.items():
        if not isinstance(key, str):
            raise CheckFailure(f"rank {rank}: checkpoint_state: key {key!r} is not a string")
        if id(value) not in live:
            kind = type(value).__name__
            local = " (a plain tensor: under TP and FSDP it is this rank's shard, which DCP would take for the " \
                    "whole tensor)" if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) else ""
            raise CheckFailure(f"rank {rank}: checkpoint_state[{key!r}] is a {kind}{local} that is neither a "
                               f"parameter of the stage nor a tensor of the optimizer's state: the values must be "
                               f"those tensors themselves, which dcp.load fills in place")
        seen.add(id(value))
    left = sorted(what for i, what in live.items() if i not in seen)
    if left:
        raise CheckFailure(f"rank {rank}: checkpoint_state leaves out {', '.join(left[:4])}"
                           f"{' and more' if len(left) > 4 else ''}: the checkpoint must hold every parameter of the "
                           f"stage and every tensor of its AdamW state, or a resumed run starts from zeros there")


def _layout_text(layout: dict) -> str:
    return "PP {pp} x DP {dp} x TP {tp}".format(**layout)


def check_checkpoint_state(checkpoint_state, *, save: dict, load: dict, args: ModelArgs = JOB_ARGS, seed: int = 0,
                           timeout: float = _TIMEOUT) -> None:
    """Saved with `checkpoint_state` on the `save` layout, loaded with it on the `load` layout: every parameter and
    AdamW state of the loaded stages equals the saved one (the whole model's, at 1e-10; float64)."""
    for name, layout in (("save", save), ("load", load)):
        if set(layout) != {"pp", "dp", "tp"} or args.n_layers % layout["pp"]:
            raise ValueError(f"check_checkpoint_state: {name} must be dict(pp=, dp=, tp=) with pp dividing "
                             f"{args.n_layers} layers, got {layout}")
    from autograder.runtime.dist import run_distributed

    state = master_state(args, seed=seed)
    gen = torch.Generator().manual_seed(seed + 17)
    grads = {n: torch.randn(v.shape, generator=gen, dtype=torch.float64) for n, v in state.items()
             if n != "output.weight"}
    folder = tempfile.mkdtemp(prefix="course-ckpt-")
    path = os.path.join(folder, "step_1")
    try:
        saved_parts = run_distributed(_save_rank, save["pp"] * save["dp"] * save["tp"], timeout=timeout,
                                      args=(checkpoint_state, args, save, state, grads, path))
        loaded_parts = run_distributed(_load_rank, load["pp"] * load["dp"] * load["tp"], timeout=timeout,
                                       args=(checkpoint_state, args, load, state, path, _layout_text(save)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    saved = {}
    for part in _whole(saved_parts):
        saved.update(part)
    loaded_parts = _whole(loaded_parts)
    ctx = f"checkpoint_state, saved on {_layout_text(save)}, loaded on {_layout_text(load)}"
    for rank, part in enumerate(loaded_parts):
        for name, entry in part.items():
            want = saved[name]
            for key in ("param",) + _STATE_KEYS:
                got = entry[key]
                label = name if key == "param" else f"AdamW {key} of {name}"
                if got is None or want[key] is None:
                    raise CheckFailure(f"rank {rank} ({ctx}): {label} has no value after loading")
                if key == "param" and not torch.any(got) and torch.any(want[key]):
                    raise CheckFailure(f"rank {rank} ({ctx}): after dcp.load, {label} still holds its initial zeros: "
                                       f"nothing was loaded into it")
                _close(got.double(), want[key].double(), name=f"{ctx}: {label} after loading", rank=rank)
