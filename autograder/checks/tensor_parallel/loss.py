"""Public checks of assignment 02, exercise 5: the vocab-parallel cross-entropy.

    from autograder.checks.tensor_parallel import check_vocab_parallel_cross_entropy
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=2)

The logits are split along the vocabulary; every rank's loss and logits gradient are compared with
`F.cross_entropy` on the whole logits in float64.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autograder.checks import one_thread
from autograder.runtime.compare import CheckFailure, assert_close, dtype_name
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm

from .common import _TIMEOUT, _check_output_type, _chunk, _cpu, _expect_phase, _require_divisible

__all__ = ["check_vocab_parallel_cross_entropy"]


# ---------------------------------------------------------------------------
# Vocab-parallel cross-entropy
# ---------------------------------------------------------------------------

def _ce_rank(rank, world_size, fn, logits, target, grad, backend):
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    x = logits[rank].to(dev).clone().requires_grad_()
    before = x.detach().clone()
    with CommLedger() as ledger:
        loss = fn(x, target.to(dev), tp_group=group)
        _check_output_type(loss, "vocab_parallel_cross_entropy", rank, target.shape)
        loss.backward(grad.to(device=dev, dtype=loss.dtype))
    return {"loss": _cpu(loss), "grad": _cpu(x.grad), "modified": not torch.equal(x.detach(), before),
            "records": ledger.records}


@one_thread
def check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, *, world_size: int = 2, seq: int = 4,
                                       batch: int = 3, vocab: int = 8, dtype=torch.float32, seed: int = 0,
                                       extreme: bool = False, backend: str = "gloo",
                                       timeout: float = _TIMEOUT) -> None:
    """Per-token loss and logit gradients against F.cross_entropy; three all-reduces of [s, b].

    Rank r holds logits `[s, b, v/t]` for vocabulary entries `[r*v/t, (r+1)*v/t)`;
    targets fall in every rank's partition. With extreme=True the logits sit
    near +1e4 or -1e4 (some tokens mix both), so a softmax without the max
    subtraction overflows. Checked: the loss (float32 `[s, b]`), the logits'
    gradient, that the input is not modified, and the communication: exactly
    three all-reduces of `[s, b]` float32 in forward, none in backward (none at
    all for a group of size 1).
    """
    t = world_size
    _require_divisible(vocab, t, "vocab")
    if seq * batch < t:
        raise ValueError("check parameters: need seq * batch >= world_size to put a target in every partition")
    gen = torch.Generator().manual_seed(seed)
    L = 2.0 * torch.randn(seq, batch, vocab, generator=gen, dtype=torch.float64)
    if extreme:
        sign = torch.where(torch.rand(seq, batch, 1, generator=gen) < 0.5, -1.0, 1.0).double()
        L = L + 1e4 * sign
        mixed = torch.rand(seq, batch, generator=gen) < 0.4  # some tokens: half the vocab at -1e4
        L[..., vocab // 2:] = torch.where(mixed.unsqueeze(-1), L[..., vocab // 2:] - 2e4 * (sign > 0),
                                          L[..., vocab // 2:])
    L = L.to(dtype)
    target = torch.randint(0, vocab, (seq, batch), generator=gen)
    part = vocab // t
    flat = target.view(-1)
    for r in range(t):  # at least one target in every rank's partition
        flat[r * (seq * batch) // t] = r * part + int(torch.randint(0, part, (1,), generator=gen))
    grad = torch.rand(seq, batch, generator=gen, dtype=torch.float32) + 0.5
    ref = L.detach().float().double().requires_grad_()  # the loss is computed in float32 (spec 4.2)
    loss_ref = F.cross_entropy(ref.reshape(-1, vocab), target.reshape(-1), reduction="none").view(seq, batch)
    loss_ref.backward(grad.double())
    shards = [_chunk(L, t, r, -1) for r in range(t)]
    results = run_distributed(_ce_rank, t, args=(vocab_parallel_cross_entropy, shards, target, grad, backend),
                              timeout=timeout, backend=backend)
    ctx = (f"vocab_parallel_cross_entropy, world size {t}, [s, b, v] = [{seq}, {batch}, {vocab}], "
           f"{dtype_name(dtype)} logits{' near +-1e4' if extreme else ''}")
    check_consistent([r["records"] for r in results], context=ctx)
    for rank, res in enumerate(results):
        assert_close(res["loss"], loss_ref.detach().float(), name=f"{ctx}: loss [s, b] (float32)", rank=rank)
        assert_close(res["grad"], _chunk(ref.grad, t, rank, -1).to(dtype),
                     name=f"{ctx}: gradient of the logits shard", rank=rank)
        if res["modified"]:
            raise CheckFailure(f"rank {rank} ({ctx}): the input logits were modified in place; "
                               f"work on a copy (Megatron's in-place subtraction is not allowed here)")
    for rank, res in enumerate(results):
        if t == 1:
            expect_no_comm(res["records"], rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
            continue
        _expect_phase(res["records"], rank=rank, phase="forward",
                      expected=[("all_reduce", {3}, (seq, batch), None, torch.float32)], context=ctx)
        _expect_phase(res["records"], rank=rank, phase="backward", expected=[], context=ctx)
