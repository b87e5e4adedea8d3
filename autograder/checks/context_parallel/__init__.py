"""Public checks of assignment 04 (context parallelism): the readable spec of what is graded.

Exercise -> check (the module of this package that holds it); this package re-exports them all:

    1  attention_with_lse               check_attention_with_lse                         attention.py
    2  merge_attention                  check_merge_attention, check_merge_large_logits, attention.py
                                        check_merge_fully_masked
       (worked example)                 check_ring_all_gather                            ring.py
    3  ring attention, forward          check_ring_attention, check_ring_overlap         ring.py
    4  ring attention, backward         check_attention_block_backward                   attention.py
                                        check_ring_attention(backward=True)              ring.py
    5  the zigzag layout                check_zigzag_split, check_zigzag_ring_attention, ring.py
                                        check_zigzag_balance
    6  Ulysses                          check_seq_all_to_all, check_ulysses_attention,   ulysses.py
                                        check_ulysses_errors
       (pictures, not graded)           measure_ring_layouts, plot_ring_steps,           ring.py
                                        plot_ring_flops
       (the reference)                  reference_attention, contiguous_shard,           common.py
                                        zigzag_shard

    import autograder.checks.context_parallel as checks
    checks.check_attention_with_lse(attention_with_lse, causal=True, q_offset=4, k_offset=0)
    checks.check_ring_attention(ring_attention, world_size=4, causal=True, timeout=5)

Attention tensors are `[b, s, n, d]` (batch, sequence, heads, head_dim) and
the log-sum-exp `lse` is `[b, s, n]`. The single-device exercises (attention,
merge, zigzag split, block backward) are checked in this process. The
distributed ones start ranks with `run_distributed`: every rank runs the
student's code on its shard (contiguous: positions `[r s/w, (r+1) s/w)`;
zigzag: chunks r and 2w-1-r of 2w) and sends back its outputs, gradients,
its communication ledger and, where the order of work matters, a trace of
its compute ops with their FLOPs. Verdicts are made here: element-wise
against a single-process float64 reference (`reference_attention`, explicit
softmax attention; tests/test_context_parallel_checks.py checks it against
`F.scaled_dot_product_attention`), and op by op against the expected
communication (spec 4.4). A check returns None on success and raises
`CheckFailure` (or `DistributedError` when a rank raised, crashed or hung).
"""

from .common import (
    reference_attention, reference_attention_grads, contiguous_shard, zigzag_shard,
)
from .attention import (
    check_attention_with_lse, check_merge_attention, check_merge_large_logits, check_merge_fully_masked,
    check_attention_block_backward,
)
from .ring import (
    check_ring_all_gather, check_ring_attention, check_ring_overlap, check_zigzag_split, check_zigzag_ring_attention,
    check_zigzag_balance, measure_ring_layouts, plot_ring_steps, plot_ring_flops,
)
from .ulysses import (
    check_seq_all_to_all, check_ulysses_attention, check_ulysses_errors,
)

__all__ = [
    "reference_attention", "reference_attention_grads", "contiguous_shard", "zigzag_shard", "check_attention_with_lse",
    "check_merge_attention", "check_merge_large_logits", "check_merge_fully_masked", "check_attention_block_backward",
    "check_ring_all_gather", "check_ring_attention", "check_ring_overlap", "check_zigzag_split",
    "check_zigzag_ring_attention", "check_zigzag_balance", "measure_ring_layouts", "plot_ring_steps", "plot_ring_flops",
    "check_seq_all_to_all", "check_ulysses_attention", "check_ulysses_errors",
]
