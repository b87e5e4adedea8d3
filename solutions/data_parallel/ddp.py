"""Data parallelism, part 1: DDP gradient averaging, bucketed overlap, the ZeRO memory ledger.

Reference solutions of assignment 01 (spec section 4.1); the notebook's answer
cells are cut from this file by assignments/01_data_parallel/_build_nb.py.
ZeRO is in solutions/data_parallel/zero.py, FSDP in solutions/data_parallel/fsdp.py.
Tests: .venv/bin/python -m pytest -q tests/test_data_parallel_*.py
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["broadcast_module_states", "all_reduce_gradients", "BucketedDDP", "zero_bytes_per_param"]


def broadcast_module_states(module, *, group):
    """Copy rank 0's parameters and buffers to every rank of `group`, in place.

    What `DistributedDataParallel.__init__` does before training so that all
    replicas start equal (`torch.distributed.utils._sync_module_states`, which
    coalesces the tensors into a few large broadcasts; here: one per tensor).
    Frozen parameters (`requires_grad=False`) are broadcast too; a tied
    parameter appears once in `module.parameters()` and is sent once.
    """
    if dist.get_world_size(group) == 1:
        return  # a group of one communicates nothing
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, group_src=0, group=group)  # [*shape]: rank 0's values on every rank


def all_reduce_gradients(model, *, group):
    """Average every parameter's `.grad` over `group`, in place (DDP semantics).

    Each rank's gradient is the gradient of its local-mean loss; the result is
    the mean of those, i.e. the gradient of the global-batch mean when the
    local batches have equal sizes. As DDP's `Reducer` does
    (`mark_variable_ready_dense`: divide by the group size, then all-reduce
    SUM); Megatron-LM: `DistributedDataParallel.finish_grad_sync` with
    `gradient_scaling_factor = 1 / data_parallel_size`. A parameter whose grad
    is None (frozen or unused) is skipped; it must be None on every rank.
    """
    ### BEGIN SOLUTION
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)  # [*param.shape], summed
        param.grad.div_(world_size)
    ### END SOLUTION


class BucketedDDP(nn.Module):
    """Data parallelism with gradient buckets all-reduced asynchronously during backward.

    PyTorch `torch.nn.parallel.DistributedDataParallel`: `_build_params_for_reducer`
    (trainable, deduplicated parameters), `compute_bucket_assignment_by_size`
    (reverse order, a bucket closes once it holds >= the cap), the C++
    `Reducer` (`autograd_hook` -> `mark_bucket_ready`: launch ready buckets in
    order; `finalize_backward` queued at the end of backward) and `no_sync`.
    Megatron-LM: `megatron/core/distributed/param_and_grad_buffer.py`
    (`_ParamAndGradBucketGroup.register_grad_ready`, `start_grad_sync`,
    `finish_grad_sync`).

    `bucket_cap_mb` is in MiB (cap = bucket_cap_mb * 2**20 bytes) and may be a
    fraction. After `loss.backward()` call `finish_gradient_synchronization()`:
    it waits for every bucket and writes the averaged gradients back, so every
    trainable parameter has a `.grad` (zeros where no rank produced one).
    """

    def __init__(self, module, *, group, bucket_cap_mb=25.0):
        super().__init__()
        if not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
            raise ValueError(f"BucketedDDP: bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        self.module = module
        self.group = group
        self.bucket_cap_mb = bucket_cap_mb
        ### BEGIN SOLUTION
        self.world_size = dist.get_world_size(group)
        broadcast_module_states(module, group=group)
        cap_bytes = bucket_cap_mb * 2**20
        # Walk the trainable parameters in reverse: the last layers' gradients come first.
        self.buckets = []  # list of lists of parameters; bucket 0 holds the last parameters
        bucket, size = [], 0
        for param in reversed([p for p in module.parameters() if p.requires_grad]):
            if bucket and param.dtype != bucket[0].dtype:  # one dtype per bucket (DDP keys buckets by dtype)
                self.buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(param)
            size += param.numel() * param.element_size()
            if size >= cap_bytes:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self._bucket_of = {param: i for i, b in enumerate(self.buckets) for param in b}
        self._require_sync = True
        self._reset()
        for param in self._bucket_of:  # one hook per parameter, tied ones included once
            param.register_post_accumulate_grad_hook(self._grad_ready)
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this context backward communicates nothing; gradients accumulate in `.grad`."""
        ### BEGIN SOLUTION
        previous = self._require_sync
        self._require_sync = False
        try:
            yield
        finally:
            self._require_sync = previous
        ### END SOLUTION

    def finish_gradient_synchronization(self):
        """Wait for every launched bucket and write the averaged gradients back to `.grad`."""
        ### BEGIN SOLUTION
        for index, (work, flat) in enumerate(self._works):
            if work is not None:
                work.wait()
            self._copy_back(index, flat)
        self._reset()
        ### END SOLUTION

    # -- helpers (also yours to write) -----------------------------------------
    def _reset(self):
        ### BEGIN SOLUTION
        self._pending = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self._next_bucket = 0  # buckets are launched strictly in order
        self._works = []  # (Work or None, flat bucket) per launched bucket
        self._callback_queued = False
        ### END SOLUTION

    def _grad_ready(self, param):
        """Post-accumulate-grad hook: count the gradient, launch every full bucket in order."""
        ### BEGIN SOLUTION
        if not self._require_sync:
            return
        if not self._callback_queued:  # once per backward: launch leftovers at its end
            torch.autograd.Variable._execution_engine.queue_callback(self._launch_remaining)
            self._callback_queued = True
        self._pending[self._bucket_of[param]] -= 1
        while self._next_bucket < len(self.buckets) and self._pending[self._next_bucket] == 0:
            self._launch(self._next_bucket)
        ### END SOLUTION

    def _launch_remaining(self):
        """End-of-backward callback: launch the buckets that never filled (unused parameters)."""
        ### BEGIN SOLUTION
        while self._next_bucket < len(self.buckets):
            self._launch(self._next_bucket)
        ### END SOLUTION

    def _launch(self, index):
        ### BEGIN SOLUTION
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.buckets[index]]
        flat = torch.cat(grads)  # [sum of the bucket's numels]
        flat.div_(self.world_size)  # DDP divides before the SUM (mark_variable_ready_dense)
        work = None
        if self.world_size > 1:
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self._works.append((work, flat))
        self._next_bucket += 1
        ### END SOLUTION

    def _copy_back(self, index, flat):
        ### BEGIN SOLUTION
        offset = 0
        for param in self.buckets[index]:
            grad = flat[offset:offset + param.numel()].view_as(param)  # [numel] -> param.shape
            if param.grad is None:
                param.grad = grad.clone()
            else:
                param.grad.copy_(grad)
            offset += param.numel()
        ### END SOLUTION


def zero_bytes_per_param(stage, dp_size, *, param_bytes=2, grad_bytes=2, optim_bytes=12) -> float:
    """Bytes of model state per parameter on each rank under ZeRO stage 0-3 (ZeRO paper, Fig. 1).

    Stage 0 (DDP) replicates everything: p + g + o. Stage 1 shards the
    optimizer state: p + g + o/d. Stage 2 also the gradients: p + (g + o)/d.
    Stage 3 (FSDP) also the parameters: (p + g + o)/d. Defaults: bf16
    parameters and gradients, 12 bytes of fp32 master weight and Adam moments.
    """
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_bytes_per_param: stage must be 0, 1, 2 or 3, got {stage!r}")
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"zero_bytes_per_param: dp_size must be a positive int, got {dp_size!r}")
    ### BEGIN SOLUTION
    p, g, o, d = param_bytes, grad_bytes, optim_bytes, dp_size
    return float({0: p + g + o, 1: p + g + o / d, 2: p + (g + o) / d, 3: (p + g + o) / d}[stage])
    ### END SOLUTION
