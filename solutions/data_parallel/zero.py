"""Data parallelism, part 2: the ZeRO sharded optimizer step, for any torch optimizer.

Reference solution of assignment 01 (spec section 4.1); the notebook's answer
cell is cut from this file by assignments/01_data_parallel/_build_nb.py. FSDP is
in solutions/data_parallel/fsdp.py.
Tests: .venv/bin/python -m pytest -q tests/test_data_parallel_*.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ZeroShardedOptimizer"]


class ZeroShardedOptimizer(torch.optim.Optimizer):
    """Any torch optimizer, run on this rank's contiguous range of one flat parameter buffer (ZeRO-1/2 step).

    `ZeroShardedOptimizer(params, optimizer_class=torch.optim.AdamW, *, group, **defaults)`
    takes parameters or parameter groups as `torch.optim` does. `step()`:
    reduce-scatter the flat gradient (averaged over the group), run
    `optimizer_class` on the pieces of parameters inside this rank's range,
    all-gather the updated parameters. The buffer holds the trainable parameters
    in group order, padded with zeros to a multiple of the group size; ranges
    ignore parameter boundaries, so a parameter may span several ranks.

    Megatron-LM `megatron/core/optimizer/distrib_optimizer.py` (`DistributedOptimizer`:
    one shard tensor per parameter range, `_build_model_and_main_param_groups`,
    the wrapped optimizer sees only those); PyTorch
    `torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, ...)`
    has this constructor but shards whole parameters. The inner optimizer is
    `self.optimizer`; its `state` covers the owned pieces only.
    """

    def __init__(self, params, optimizer_class=torch.optim.AdamW, *, group, **defaults):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ValueError(f"ZeroShardedOptimizer: optimizer_class must be a torch.optim.Optimizer subclass, "
                             f"got {optimizer_class!r}")
        super().__init__(params, defaults)
        trainable = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if len({p.dtype for p in trainable}) > 1:
            raise ValueError(f"ZeroShardedOptimizer: all trainable parameters must share one dtype (one flat "
                             f"buffer), got {sorted(str(d) for d in {p.dtype for p in trainable})}")
        if len({id(p) for p in trainable}) != len(trainable):
            raise ValueError("ZeroShardedOptimizer: a parameter appears more than once")
        self.group = group
        self.optimizer_class = optimizer_class
        self._params = trainable  # the flat buffer's parameters, in order
        ### BEGIN SOLUTION
        self.world_size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        total = sum(p.numel() for p in trainable)
        self.shard_size = -(-total // self.world_size)  # ceil: pad the buffer to a multiple of d
        self.padded_size = self.shard_size * self.world_size
        lo, hi = rank * self.shard_size, (rank + 1) * self.shard_size  # this rank's range of the buffer
        # One piece per parameter that intersects [lo, hi): (param, first, last, position in the shard, tensor
        # the inner optimizer updates). float32/float64 parameters: a view of the parameter itself
        # (Megatron's shard_model_param); lower precision: a float32 master copy (shard_main_param).
        self._pieces = []
        inner_groups = []
        offset = 0
        for group_index, param_group in enumerate(self.param_groups):
            inner = {k: v for k, v in param_group.items() if k != "params"}
            inner["params"] = []
            for param in param_group["params"]:
                if not param.requires_grad:
                    continue
                start, end = max(offset, lo), min(offset + param.numel(), hi)
                if start < end:
                    first, last = start - offset, end - offset
                    view = param.detach().view(-1)[first:last]  # [last - first], shares the parameter's memory
                    if param.dtype not in (torch.float32, torch.float64):
                        view = view.float()  # an fp32 master copy of the piece
                    self._pieces.append((param, first, last, start - lo, view))
                    inner["params"].append(view)
                offset += param.numel()
            inner_groups.append(inner)
        self.optimizer = optimizer_class(inner_groups, **defaults)
        ### END SOLUTION

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce-scatter the flat gradient, step the inner optimizer on the owned pieces, all-gather."""
        if closure is not None:
            raise ValueError("ZeroShardedOptimizer.step: closures are not supported")
        if not self._params:
            return
        ### BEGIN SOLUTION
        # Hyperparameters may have changed (an lr schedule writes self.param_groups[i]["lr"]).
        for outer, inner in zip(self.param_groups, self.optimizer.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        like = self._params[0]
        flat_grad = torch.zeros(self.padded_size, dtype=like.dtype, device=like.device)  # [padded]
        offset = 0
        for param in self._params:
            if param.grad is not None:
                flat_grad[offset:offset + param.numel()].copy_(param.grad.reshape(-1))
            offset += param.numel()
        shard_grad = torch.empty(self.shard_size, dtype=like.dtype, device=like.device)
        if self.world_size > 1:
            dist.reduce_scatter_single(shard_grad, flat_grad, op=dist.ReduceOp.SUM, group=self.group)  # [padded] -> [padded/d]
            shard_grad.div_(self.world_size)
        else:
            shard_grad.copy_(flat_grad)
        for param, first, last, position, piece in self._pieces:
            # a parameter without a gradient gets none: torch skips it (no update, no state, no step)
            piece.grad = None if param.grad is None else shard_grad[position:position + last - first].to(piece.dtype)
        self.optimizer.step()
        shard_param = torch.zeros(self.shard_size, dtype=like.dtype, device=like.device)  # [padded/d]
        for param, first, last, position, piece in self._pieces:
            shard_param[position:position + last - first].copy_(piece)
            piece.grad = None
        flat_param = torch.empty(self.padded_size, dtype=like.dtype, device=like.device)
        if self.world_size > 1:
            dist.all_gather_single(flat_param, shard_param, group=self.group)  # [padded/d] -> [padded]
        else:
            flat_param.copy_(shard_param)
        offset = 0
        for param in self._params:
            param.copy_(flat_param[offset:offset + param.numel()].view_as(param))
            offset += param.numel()
        ### END SOLUTION
