"""Data parallelism, part 2: the ZeRO sharded optimizer step and FSDP (ZeRO-3) linear layers.

Reference solutions of assignment 01 (spec section 4.1); the notebook's answer
cells are cut from this file by assignments/01_data_parallel/_build_nb.py.
Tests: .venv/bin/python -m pytest -q tests/test_data_parallel_*.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["adamw_update_", "flatten_linear_params", "unflatten_linear_params", "ZeroShardedOptimizer",
           "FullyShardedLinear", "fully_shard"]


def adamw_update_(param, grad, state, *, lr, beta1, beta2, eps, weight_decay):
    """One AdamW step on `param` (a 1-D piece of a parameter), in place; `state` is its dict.

    The operations of `torch.optim.adam._single_tensor_adam` with
    `decoupled_weight_decay=True` (what `torch.optim.AdamW` runs on a CPU), in
    the same order, so that the result agrees with torch to the last bit:
    element-wise ops give the same bits on a slice as on the whole tensor.
    The state is created on the first call (step 0, zero moments of `param`'s dtype).
    """
    ### BEGIN SOLUTION
    if "step" not in state:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)  # torch keeps a float32 step tensor
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    state["step"] += 1
    step = state["step"].item()
    param.mul_(1 - lr * weight_decay)
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (state["exp_avg_sq"].sqrt() / bias_correction2**0.5).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-step_size)
    ### END SOLUTION


def flatten_linear_params(weight, bias, world_size):
    """The flat layout of one linear layer: weight (row-major), then bias, then zero padding.

    Returns a 1-D tensor of `padded = ceil(n / world_size) * world_size`
    elements, n = weight.numel() + bias.numel(); rank r owns
    `[r * padded / world_size, (r + 1) * padded / world_size)`.
    """
    parts = [weight.detach().reshape(-1)] + ([bias.detach().reshape(-1)] if bias is not None else [])
    n = sum(p.numel() for p in parts)
    padded = -(-n // world_size) * world_size
    flat = torch.zeros(padded, dtype=weight.dtype, device=weight.device)
    torch.cat(parts, out=flat[:n])  # [out * in + out] -> [padded]
    return flat


def unflatten_linear_params(flat, out_features, in_features, has_bias):
    """Views (weight [out, in], bias [out] or None) into a flat tensor laid out as above."""
    n_weight = out_features * in_features
    weight = flat[:n_weight].view(out_features, in_features)
    bias = flat[n_weight:n_weight + out_features] if has_bias else None
    return weight, bias


class ZeroShardedOptimizer(torch.optim.Optimizer):
    """AdamW whose state is sharded over `group` (ZeRO stage 1/2 step).

    `step()`: reduce-scatter the flat gradient (averaged over the group), run
    AdamW on this rank's contiguous range of the flat parameter buffer only,
    all-gather the updated parameters. The buffer holds the trainable
    parameters in order, padded with zeros to a multiple of the group size;
    ranges ignore parameter boundaries, so a parameter may span several ranks.
    Megatron-LM: `megatron/core/optimizer/distrib_optimizer.py`
    (`DistributedOptimizer._build_model_gbuf_range`: per-parameter ranges of the
    rank's shard of `param_and_grad_buffer`, one shard tensor per range);
    PyTorch `torch.distributed.optim.ZeroRedundancyOptimizer` shards whole
    parameters instead. State lives in `self.state[param]` for the parameters
    that intersect this rank's range, for that intersection only.
    """

    def __init__(self, params, *, group, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        if not lr >= 0.0:
            raise ValueError(f"ZeroShardedOptimizer: invalid learning rate {lr}")
        if not eps >= 0.0:
            raise ValueError(f"ZeroShardedOptimizer: invalid eps {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"ZeroShardedOptimizer: invalid betas {betas}")
        if not weight_decay >= 0.0:
            raise ValueError(f"ZeroShardedOptimizer: invalid weight_decay {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        if len(self.param_groups) != 1:
            raise ValueError(f"ZeroShardedOptimizer: one parameter group expected, got {len(self.param_groups)}")
        trainable = [p for p in self.param_groups[0]["params"] if p.requires_grad]
        if len({p.dtype for p in trainable}) > 1:
            raise ValueError(f"ZeroShardedOptimizer: all trainable parameters must share one dtype, got "
                             f"{sorted(str(d) for d in {p.dtype for p in trainable})}")
        self.group = group
        self._params = trainable  # the flat buffer's parameters, in order
        ### BEGIN SOLUTION
        self.world_size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        total = sum(p.numel() for p in trainable)
        self.shard_size = -(-total // self.world_size)  # ceil: pad the buffer to a multiple of d
        self.padded_size = self.shard_size * self.world_size
        lo, hi = rank * self.shard_size, (rank + 1) * self.shard_size  # this rank's range of the buffer
        # (param, first, last) of each parameter piece inside [lo, hi), first/last relative to the parameter
        self._pieces = []
        offset = 0
        for param in trainable:
            start, end = max(offset, lo), min(offset + param.numel(), hi)
            if start < end:
                self._pieces.append((param, start - offset, end - offset))
            offset += param.numel()
        ### END SOLUTION

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce-scatter the flat gradient, AdamW on the owned range, all-gather the parameters."""
        if closure is not None:
            raise ValueError("ZeroShardedOptimizer.step: closures are not supported")
        if not self._params:
            return
        ### BEGIN SOLUTION
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
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
        shard_param = torch.zeros(self.shard_size, dtype=like.dtype, device=like.device)  # [padded/d]
        position = 0
        for param, first, last in self._pieces:
            piece = shard_param[position:position + last - first]
            piece.copy_(param.reshape(-1)[first:last])
            if param.grad is not None:  # torch.optim.AdamW skips a parameter without grad
                state = self.state[param]
                work_dtype = param.dtype if param.dtype in (torch.float32, torch.float64) else torch.float32
                grad = shard_grad[position:position + last - first].to(work_dtype)
                if work_dtype != param.dtype:  # low precision: an fp32 master copy of the piece (ZeRO, Megatron)
                    state.setdefault("master", piece.to(work_dtype))
                    target = state["master"]
                else:
                    target = piece
                adamw_update_(target, grad, state, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                              weight_decay=group["weight_decay"])
                if target is not piece:
                    piece.copy_(target)
            position += last - first
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


class _FullyShardedLinearFunction(torch.autograd.Function):
    """All-gather the flat parameter in forward; gather it again and reduce-scatter its gradient in backward.

    FSDP2 (`torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`):
    `FSDPParamGroup.pre_forward` unshards (`foreach_all_gather`),
    `post_forward` reshards (`FSDPParam.free_storage`), `pre_backward`
    unshards again, `post_backward` reduce-scatters the gradient
    (`foreach_reduce`, divided by the group size). The gathered parameters
    are not saved for backward: only the input and the shard are.
    """

    @staticmethod
    def forward(ctx, input_, flat_shard, out_features, in_features, has_bias, group):
        ### BEGIN SOLUTION
        world_size = dist.get_world_size(group)
        ctx.save_for_backward(input_, flat_shard)
        ctx.layout = (out_features, in_features, has_bias)
        ctx.group = group
        full = torch.empty(flat_shard.numel() * world_size, dtype=flat_shard.dtype, device=flat_shard.device)
        dist.all_gather_single(full, flat_shard, group=group)  # [padded/d] -> [padded]
        weight, bias = unflatten_linear_params(full, out_features, in_features, has_bias)
        output = F.linear(input_, weight, bias)  # [*, in] -> [*, out]
        full.untyped_storage().resize_(0)  # free the gathered parameters now (FSDPParam.free_storage)
        return output
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        input_, flat_shard = ctx.saved_tensors
        out_features, in_features, has_bias = ctx.layout
        world_size = dist.get_world_size(ctx.group)
        full = torch.empty(flat_shard.numel() * world_size, dtype=flat_shard.dtype, device=flat_shard.device)
        dist.all_gather_single(full, flat_shard, group=ctx.group)  # [padded/d] -> [padded], gathered again
        weight, _ = unflatten_linear_params(full, out_features, in_features, has_bias)
        grad_input = grad_output.matmul(weight) if ctx.needs_input_grad[0] else None  # [*, out] -> [*, in]
        grad_output_2d = grad_output.reshape(-1, out_features)  # [*, out] -> [T, out]
        input_2d = input_.reshape(-1, in_features)  # [*, in] -> [T, in]
        grad_full = torch.zeros_like(full)  # [padded], the layout of flatten_linear_params
        grad_weight, grad_bias = unflatten_linear_params(grad_full, out_features, in_features, has_bias)
        grad_weight.copy_(grad_output_2d.t().matmul(input_2d))  # [out, in]
        if has_bias:
            grad_bias.copy_(grad_output_2d.sum(0))  # [out]
        full.untyped_storage().resize_(0)
        grad_shard = torch.empty_like(flat_shard)
        dist.reduce_scatter_single(grad_shard, grad_full, op=dist.ReduceOp.SUM, group=ctx.group)  # [padded] -> [padded/d]
        grad_shard.div_(world_size)
        return grad_input, grad_shard, None, None, None, None
        ### END SOLUTION


class FullyShardedLinear(nn.Module):
    """An `nn.Linear` whose weight and bias live on each rank as one flat, padded shard (ZeRO-3).

    Built from a full `nn.Linear` that is the same on every rank: rank r keeps
    `flatten_linear_params(weight, bias, d)[r * padded/d : (r + 1) * padded/d]`
    as its only parameter, `self.flat_param` (FSDP1's `FlatParameter`; FSDP2
    shards each parameter on dim 0 as a `DTensor` instead).
    """

    def __init__(self, linear, *, group):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"FullyShardedLinear wraps an nn.Linear, got {type(linear).__name__}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.has_bias = linear.bias is not None
        self.group = group
        ### BEGIN SOLUTION
        world_size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        flat = flatten_linear_params(linear.weight, linear.bias, world_size)  # [padded]
        shard_size = flat.numel() // world_size
        self.flat_param = nn.Parameter(flat[rank * shard_size:(rank + 1) * shard_size].clone())  # [padded/d]
        ### END SOLUTION

    def forward(self, input_):
        ### BEGIN SOLUTION
        if dist.get_world_size(self.group) == 1:  # a group of one: no communication
            weight, bias = unflatten_linear_params(self.flat_param, self.out_features, self.in_features,
                                                   self.has_bias)
            return F.linear(input_, weight, bias)
        return _FullyShardedLinearFunction.apply(input_, self.flat_param, self.out_features, self.in_features,
                                                 self.has_bias, self.group)
        ### END SOLUTION


def fully_shard(module, *, group):
    """Replace every `nn.Linear` in `module` (or `module` itself) by a `FullyShardedLinear`; return it.

    FSDP2: `torch.distributed.fsdp.fully_shard(module, *, mesh, reshard_after_forward=True)`
    groups a module's parameters into one `FSDPParamGroup` (one all-gather,
    one reduce-scatter per module). Here each linear layer is one such group.
    Parameters outside linear layers are not supported (ValueError).
    """
    linear_params = {id(p) for m in module.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
    others = [name for name, p in module.named_parameters() if id(p) not in linear_params]
    if others:
        raise ValueError(f"fully_shard: only nn.Linear parameters can be sharded; found {others}")
    ### BEGIN SOLUTION
    if isinstance(module, nn.Linear):
        return FullyShardedLinear(module, group=group)
    for name, child in list(module.named_children()):
        setattr(module, name, fully_shard(child, group=group))
    return module
    ### END SOLUTION
