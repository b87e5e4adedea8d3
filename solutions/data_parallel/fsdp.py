"""Data parallelism, part 3: FSDP (ZeRO-3) for any module, with mixed precision.

Reference solution of assignment 01 (spec section 4.1): `fully_shard(module, *, group,
reshard_after_forward=True, mp_policy=None)` applied per block and then to the
root, as FSDP2 is used, and `gather_full_params(module)`. The notebook's answer
cell is cut from this file by assignments/01_data_parallel/_build_nb.py.

Design (FSDP1's flat parameter, FSDP2's call pattern): each `fully_shard` call
makes one *unit*: the parameters of the module that no earlier call took,
flattened into one buffer padded to a multiple of the group size; rank r keeps
chunk r as the module's only new parameter, `module.flat_param`. A forward
pre-hook all-gathers the buffer through an autograd Function (all-gather in
forward, reduce-scatter of the gradient in backward) and puts views of it where
the parameters were; a forward hook takes them away again. Saved-tensor hooks
keep autograd from holding on to the gathered buffer: what an op saves of it is
replaced by its place in the buffer, and the first backward op that needs it
gathers the buffer again.

Tests: .venv/bin/python -m pytest -q tests/test_data_parallel_*.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autograder.checks.data_parallel import MixedPrecisionPolicy

__all__ = ["MixedPrecisionPolicy", "param_slots", "FlatLayout", "FSDPUnit", "fully_shard", "gather_full_params"]


# ---------------------------------------------------------------------------
# Given: which parameters a fully_shard call takes, and where they go in the flat buffer
# ---------------------------------------------------------------------------

def param_slots(module):
    """The parameters `fully_shard(module)` takes: `[(owner, attribute, name, parameter), ...]`.

    Every parameter registered on `module` or on a sub-module that no earlier
    `fully_shard` call took (FSDP2: a sharded sub-module keeps its own), in
    `named_parameters` order; `name` is relative to `module`. A tied parameter
    (one `nn.Parameter` at two places) has one slot per place.
    """
    slots = []

    def walk(mod, prefix):
        for attr, param in mod._parameters.items():
            if param is not None:
                slots.append((mod, attr, prefix + attr, param))
        for child_name, child in mod._modules.items():
            if child is not None and not hasattr(child, "_fsdp_unit"):
                walk(child, prefix + child_name + ".")

    walk(module, "")
    return slots


class FlatLayout:
    """Where each parameter of one unit lives in its flat buffer (FSDP1's `FlatParameter` layout).

    The distinct parameters, in slot order (a tied one once, at its first
    slot), flattened row-major one after the other, then zero padding up to
    `padded`, the smallest multiple of `multiple` (the group size; any multiple
    of it works) that holds them. `slot_index[i]` is the parameter slot i shows.
    """

    def __init__(self, slots, multiple):
        self.shapes, self.slot_index, seen = [], [], {}
        for _, _, _, param in slots:
            if id(param) not in seen:
                seen[id(param)] = len(self.shapes)
                self.shapes.append(tuple(param.shape))
            self.slot_index.append(seen[id(param)])
        self.numels = [int(torch.Size(s).numel()) for s in self.shapes]
        self.numel = sum(self.numels)
        self.padded = -(-self.numel // multiple) * multiple

    def flatten(self, tensors, dtype=None):
        """One tensor per distinct parameter -> the flat buffer `[padded]`, zero padded."""
        dtype = dtype or tensors[0].dtype
        flat = torch.zeros(self.padded, dtype=dtype, device=tensors[0].device)
        if self.numel:
            torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors], out=flat[:self.numel])
        return flat

    def views(self, flat):
        """The flat buffer `[padded]` -> one view per distinct parameter, in its shape (autograd-friendly)."""
        pieces = flat[:self.numel].split(self.numels)  # [padded] -> [numel_i] ...
        return [piece.view(shape) for piece, shape in zip(pieces, self.shapes)]


# ---------------------------------------------------------------------------
# Exercise 5: fully_shard and gather_full_params
# ---------------------------------------------------------------------------

class _AllGatherParams(torch.autograd.Function):
    """All-gather the unit's flat shard in forward; reduce-scatter (average) its gradient in backward.

    FSDP2 `FSDPParamGroup.unshard` (`foreach_all_gather`) and `post_backward`
    (`foreach_reduce`). The output is the whole flat buffer `[padded]` in the
    compute dtype; its gradient, assembled by autograd from every view the
    module used, reaches backward once the module's backward is done.
    """

    @staticmethod
    def forward(ctx, flat_shard, unit):
        ### BEGIN SOLUTION
        ctx.unit = unit
        return unit.all_gather(flat_shard)  # [padded/d] -> [padded], param_dtype
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_full):
        ### BEGIN SOLUTION
        unit = ctx.unit
        unit.regathered = None  # post-backward: free the parameters gathered again for backward
        return unit.reduce_scatter(grad_full), None  # [padded] -> [padded/d], averaged
        ### END SOLUTION


class _ParamRef:
    """What a saved-tensor pack hook keeps instead of a view of the gathered buffer: its place in it."""

    __slots__ = ("offset", "shape", "stride")

    def __init__(self, t):
        self.offset, self.shape, self.stride = t.storage_offset(), tuple(t.shape), tuple(t.stride())


class FSDPUnit:
    """One `fully_shard` call: the flat shard of a module's parameters and the hooks that gather it.

    FSDP2 `FSDPParamGroup`. Keeps no reference to the original parameters
    (only their layout): at rest a rank holds its shard and nothing more.
    """

    def __init__(self, module, *, group, reshard_after_forward, mp_policy):
        self.group = group
        self.reshard_after_forward = reshard_after_forward
        self.mp_policy = mp_policy or MixedPrecisionPolicy()
        slots = param_slots(module)
        ### BEGIN SOLUTION
        self.world_size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        self.layout = FlatLayout(slots, self.world_size)  # padded to a multiple of d
        self.slots = [(owner, attr, name) for owner, attr, name, _ in slots]  # no parameter kept
        self.shard_size = self.layout.padded // self.world_size
        distinct = [slots[self.layout.slot_index.index(i)][3] for i in range(len(self.layout.shapes))]
        self.flat_param = None
        if distinct:
            flat = self.layout.flatten(distinct)  # [padded], every rank holds the same full values
            self.flat_param = nn.Parameter(flat[rank * self.shard_size:(rank + 1) * self.shard_size].clone())
        for owner, attr, _ in self.slots:  # the original parameters leave the module (and memory)
            owner._parameters.pop(attr, None)
        self.full = None  # the gathered buffer, during forward only
        self.regathered = None  # the buffer gathered again for backward, until post-backward
        self._saved_hooks = None
        ### END SOLUTION

    # -- collectives -------------------------------------------------------------
    def all_gather(self, flat_shard):
        """`[padded/d]` (any dtype) -> `[padded]` in the compute dtype (mp_policy.param_dtype)."""
        ### BEGIN SOLUTION
        dtype = self.mp_policy.param_dtype or flat_shard.dtype
        local = flat_shard.detach().to(dtype)  # [padded/d], cast before the all-gather (FSDP2 does)
        if self.world_size == 1:
            return local.clone()
        full = torch.empty(self.layout.padded, dtype=dtype, device=local.device)
        dist.all_gather_single(full, local, group=self.group)  # [padded/d] -> [padded]
        return full
        ### END SOLUTION

    def reduce_scatter(self, grad_full):
        """`[padded]` gradient -> this rank's averaged `[padded/d]`, reduced in mp_policy.reduce_dtype."""
        ### BEGIN SOLUTION
        dtype = self.mp_policy.reduce_dtype or grad_full.dtype
        grad = grad_full.to(dtype).contiguous()  # [padded]
        if self.world_size == 1:
            return grad.to(self.flat_param.dtype)
        shard = torch.empty(self.shard_size, dtype=dtype, device=grad.device)
        dist.reduce_scatter_single(shard, grad, op=dist.ReduceOp.SUM, group=self.group)  # [padded] -> [padded/d]
        shard.div_(self.world_size)
        return shard.to(self.flat_param.dtype)  # the gradient of the float32 master shard
        ### END SOLUTION

    # -- forward hooks -------------------------------------------------------------
    def pre_forward(self, module, args, kwargs):
        """Cast floating inputs to param_dtype, gather the parameters, put their views in place."""
        ### BEGIN SOLUTION
        dtype = self.mp_policy.param_dtype
        if dtype is not None:  # FSDP2 MixedPrecisionPolicy.cast_forward_inputs (top-level tensors here)
            cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
            args, kwargs = tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
        if self.flat_param is None:
            return args, kwargs
        self.full = _AllGatherParams.apply(self.flat_param, self)  # [padded/d] -> [padded]
        views = self.layout.views(self.full)
        for (owner, attr, _), index in zip(self.slots, self.layout.slot_index):
            setattr(owner, attr, views[index])  # a plain tensor attribute while forward runs
        if self.reshard_after_forward:  # autograd must not keep the gathered buffer alive
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_hooks.__enter__()
        return args, kwargs
        ### END SOLUTION

    def post_forward(self, module, args, kwargs, output):
        """Take the views away and drop the gathered buffer (reshard)."""
        ### BEGIN SOLUTION
        if self.flat_param is None:
            return output
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        for owner, attr, _ in self.slots:
            owner.__dict__.pop(attr, None)
        self.full = None  # with reshard_after_forward=False autograd's saved views keep it to backward
        return output
        ### END SOLUTION

    # -- saved-tensor hooks (reshard_after_forward=True) ------------------------------
    def _pack(self, tensor):
        """Pack hook: a tensor autograd saves; a view of the gathered buffer becomes its place in it (`_ParamRef`)."""
        ### BEGIN SOLUTION
        full = self.full
        if (full is not None and tensor.dtype == full.dtype and tensor.device == full.device
                and tensor.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()):
            return _ParamRef(tensor)  # a view of the gathered parameters: keep only where it is
        return tensor
        ### END SOLUTION

    def _unpack(self, packed):
        """Unpack hook, in backward: the first place asked for gathers the buffer again; return the view."""
        ### BEGIN SOLUTION
        if not isinstance(packed, _ParamRef):
            return packed
        if self.regathered is None:  # the first backward op that needs the parameters gathers them again
            self.regathered = self.all_gather(self.flat_param)  # [padded/d] -> [padded]
        return self.regathered.as_strided(packed.shape, packed.stride, packed.offset)
        ### END SOLUTION


def fully_shard(module, *, group, reshard_after_forward=True, mp_policy=None):
    """Shard the parameters of `module` that no earlier call took over `group`; return `module`.

    FSDP2 `torch.distributed.fsdp.fully_shard(module, *, mesh, reshard_after_forward, mp_policy)`:
    call it on each block, then on the root. Afterwards `module.flat_param` is
    this rank's `[padded/d]` shard (float32 master weights when the parameters
    are float32, whatever `mp_policy.param_dtype` computes in); the original
    parameters are gone from the module. Per forward: one all-gather; per
    backward: one all-gather (none with `reshard_after_forward=False`) and one
    reduce-scatter.
    """
    if hasattr(module, "_fsdp_unit"):
        raise ValueError(f"fully_shard: this {type(module).__name__} is already sharded")
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"fully_shard: reshard_after_forward must be True or False here, got "
                         f"{reshard_after_forward!r} (FSDP2 also takes an int: a smaller group to reshard to)")
    slots = param_slots(module)
    dtypes = sorted({str(p.dtype) for *_, p in slots})
    if len(dtypes) > 1:
        raise ValueError(f"fully_shard: the parameters of one unit must share one dtype (one flat buffer), "
                         f"got {dtypes}")
    if any(attr == "flat_param" for owner, attr, *_ in slots if owner is module):
        raise ValueError("fully_shard: the module already has a parameter named 'flat_param'")
    ### BEGIN SOLUTION
    unit = FSDPUnit(module, group=group, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    module._fsdp_unit = unit
    if unit.flat_param is not None:
        module.register_parameter("flat_param", unit.flat_param)
    module.register_forward_pre_hook(unit.pre_forward, with_kwargs=True)
    module.register_forward_hook(unit.post_forward, with_kwargs=True)
    return module
    ### END SOLUTION


def gather_full_params(module):
    """The full, unsharded state dict on every rank: `{name: tensor}` as the unsharded `module.state_dict()`.

    One all-gather per unit, in the master dtype (FSDP2: `get_model_state_dict(model,
    options=StateDictOptions(full_state_dict=True))`). Tied parameters appear
    under each of their names; buffers and parameters no unit took are copied.
    """
    ### BEGIN SOLUTION
    result, flat_params = {}, set()
    for prefix, sub in module.named_modules():
        unit = getattr(sub, "_fsdp_unit", None)
        if unit is None or unit.flat_param is None:
            continue
        flat_params.add(id(unit.flat_param))
        with torch.no_grad():
            if unit.world_size == 1:
                full = unit.flat_param.detach().clone()
            else:
                full = torch.empty(unit.layout.padded, dtype=unit.flat_param.dtype, device=unit.flat_param.device)
                dist.all_gather_single(full, unit.flat_param.detach(), group=unit.group)  # [padded/d] -> [padded]
        views = unit.layout.views(full)
        for (_, _, name), index in zip(unit.slots, unit.layout.slot_index):
            result[prefix + ("." if prefix else "") + name] = views[index].clone()
    for name, param in module.named_parameters():
        if id(param) not in flat_params:
            result[name] = param.detach().clone()
    for name, buf in module.named_buffers():
        result[name] = buf.detach().clone()
    return result
    ### END SOLUTION
