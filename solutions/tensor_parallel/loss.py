"""Reference solution, assignment 02 (part 3): cross-entropy over vocab-parallel logits.

The output layer of a tensor-parallel model is column-parallel: rank r holds
the logits of vocabulary entries `[r*v/t, (r+1)*v/t)`. Gathering `[s, b, v]`
logits would cost far more than the loss itself, so the softmax statistics are
combined instead: three all-reduces of `[s, b]` (max, target logit, sum of
exponentials) in forward and none in backward. As Megatron-LM
`megatron/core/tensor_parallel/cross_entropy.py` (`_VocabParallelCrossEntropy`,
`vocab_parallel_cross_entropy`), without label smoothing.

Tested by:  .venv/bin/python -m pytest -q tests/test_tensor_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from solutions.tensor_parallel.mappings import _group_size_rank

__all__ = ["vocab_parallel_cross_entropy"]


# ---------------------------------------------------------------------------
# Exercise 5: vocab-parallel cross-entropy
# ---------------------------------------------------------------------------

class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of vocab-sharded logits: 3 all-reduces of [s, b] in forward, none in backward.

    Megatron-LM `cross_entropy._VocabParallelCrossEntropy`. Computed in
    float32; the input logits are never written to.
    """

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, tp_group):
        ### BEGIN SOLUTION
        size, rank = tp_group.size(), tp_group.rank()
        logits = vocab_parallel_logits.float()  # [s, b, v/t]; may alias the input: never written to
        logits_max = logits.max(dim=-1)[0]  # [s, b]
        if size > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp_group)  # [s, b], global max
        logits = logits - logits_max.unsqueeze(-1)  # [s, b, v/t], all <= 0: exp cannot overflow

        # This rank owns vocabulary entries [start, end) (Megatron VocabUtility).
        partition_vocab_size = logits.shape[-1]
        start = rank * partition_vocab_size
        end = start + partition_vocab_size
        target_mask = (target < start) | (target >= end)  # [s, b], True: another rank owns the target
        masked_target = (target - start).masked_fill(target_mask, 0)  # [s, b], a valid local index
        predicted_logits = logits.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1)  # [s, b]
        predicted_logits = predicted_logits.masked_fill(target_mask, 0.0)  # only the owner contributes
        if size > 1:
            dist.all_reduce(predicted_logits, op=dist.ReduceOp.SUM, group=tp_group)  # [s, b]

        exp_logits = logits.exp()  # [s, b, v/t]
        sum_exp_logits = exp_logits.sum(dim=-1)  # [s, b]
        if size > 1:
            dist.all_reduce(sum_exp_logits, op=dist.ReduceOp.SUM, group=tp_group)  # [s, b]

        loss = torch.log(sum_exp_logits) - predicted_logits  # [s, b] float32
        softmax = exp_logits.div_(sum_exp_logits.unsqueeze(-1))  # [s, b, v/t], this rank's slice
        ctx.save_for_backward(softmax, target_mask, masked_target)
        return loss
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        softmax, target_mask, masked_target = ctx.saved_tensors
        # d loss / d logits = softmax - one_hot(target), on this rank's slice only.
        grad_input = softmax.clone()  # [s, b, v/t]
        owned = (~target_mask).to(grad_input.dtype).unsqueeze(-1)  # [s, b, 1]
        grad_input.scatter_add_(-1, masked_target.unsqueeze(-1), -owned)
        grad_input.mul_(grad_output.unsqueeze(-1))  # [s, b, v/t] * [s, b, 1]
        return grad_input, None, None
        ### END SOLUTION


def vocab_parallel_cross_entropy(vocab_parallel_logits, target, *, tp_group):
    """Per-token loss `[s, b]` (float32) from logits `[s, b, v/t]` sharded over the vocab; target `[s, b]` global ids.

    Megatron-LM `cross_entropy.vocab_parallel_cross_entropy`: three all-reduces
    of `[s, b]` in forward (MAX, SUM, SUM), none in backward; the input is not modified.
    """
    ### BEGIN SOLUTION
    _group_size_rank(tp_group, "vocab_parallel_cross_entropy tp_group")
    if (not isinstance(vocab_parallel_logits, torch.Tensor) or vocab_parallel_logits.dim() < 1
            or not isinstance(target, torch.Tensor)
            or tuple(target.shape) != tuple(vocab_parallel_logits.shape[:-1])):
        raise ValueError(f"vocab_parallel_cross_entropy: target shape "
                         f"{tuple(getattr(target, 'shape', ()))} must equal the logits' shape without "
                         f"the vocab dim, {tuple(getattr(vocab_parallel_logits, 'shape', ()))[:-1]}")
    if target.is_floating_point() or target.is_complex():
        raise ValueError(f"vocab_parallel_cross_entropy: target must hold integer token ids, got {target.dtype}")
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, tp_group)
    ### END SOLUTION
