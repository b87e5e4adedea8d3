"""Build source/04_context_parallel/context_parallel_lab.ipynb (nbgrader source notebook) from code.

    .venv/bin/python assignments/04_context_parallel/_build_nb.py
    .venv/bin/nbgrader generate_assignment 04_context_parallel --force

Answer cells are cut from solutions/context_parallel/ (ring.py, zigzag.py
and ulysses.py: one source of truth); test cells call the
public checks in autograder/checks/context_parallel/, with hidden cases.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autograder.authoring.nbbuild import NotebookBuilder, source_of  # noqa: E402
from solutions.context_parallel import ring as cp  # noqa: E402
from solutions.context_parallel import ulysses as uly  # noqa: E402
from solutions.context_parallel import zigzag as zz  # noqa: E402

ASSIGNMENT = "04_context_parallel"
LESSON = "../../assignments/04_context_parallel"
OUT = os.path.join(ROOT, "source", ASSIGNMENT, "context_parallel_lab.ipynb")


def build() -> NotebookBuilder:
    nb = NotebookBuilder(ASSIGNMENT)
    nb.markdown(f"""
    # 04 · Context parallelism (CP): ring attention and Ulysses

    Attention is the one part of a transformer layer that mixes positions:
    every query looks at every key. Context parallelism splits the
    **sequence** of q, k and v across the `w` ranks of a CP group and
    communicates only inside attention, so that each rank stores and computes
    `1/w` of a long sequence. You will implement, with real `torch.distributed`
    on several CPU processes (gloo):

    1. `attention_with_lse`: attention that also returns its log-sum-exp, with a causal mask on *global* positions;
    2. `merge_attention`: the ring attention step, merging two partial attentions by their LSEs;
    3. `ring_attention` forward: K and V travel the ring by P2P while each rank computes the block it holds;
    4. its backward: `attention_block_backward` and dK/dV travelling home with their blocks;
    5. the zigzag layout: `zigzag_split` and causal ring attention with equal work per rank;
    6. Ulysses: `seq_all_to_all` and `ulysses_attention`, CP by all-to-all over heads.

    Read first: the lesson [README.md]({LESSON}/README.md) ([the course overview](../../assignments/README.md)
    puts it beside the other dimensions). Deep dives:
    [01_online_softmax.md]({LESSON}/01_online_softmax.md) (exercises 1-2),
    [02_ring_attention.md]({LESSON}/02_ring_attention.md) (exercises 3-4),
    [03_zigzag.md]({LESSON}/03_zigzag.md) (exercise 5),
    [04_ulysses.md]({LESSON}/04_ulysses.md) (exercise 6).

    Conventions. Attention tensors are `[b, s, n, d]` (batch, sequence,
    heads, head_dim), as flash-attn's and ring-flash-attention's; the
    log-sum-exp `lse` is `[b, s, n]` (the layout of q without `head_dim`;
    flash-attn and SDPA use `[b, n, s]`). Softmax scale `d ** -0.5`. Under
    CP, rank `r` of a group of `w` holds positions `[r s/w, (r+1) s/w)`
    (contiguous) or chunks `r` and `2w-1-r` of `2w` (zigzag). Every API takes
    its process group as the keyword `cp_group=`; peers and positions use the
    rank **in that group** (`cp_group.rank()`, `group_peer=`), never the global
    rank: the tests also run a CP group inside a larger world. A group of one
    communicates nothing (a send to oneself crashes gloo). Invalid arguments
    raise `ValueError` on every rank *before* any communication.

    How the tests work: the single-device exercises run here; the
    distributed ones start N rank processes with `run_distributed`, run your
    code on every rank's shard and compare what comes back (out, lse, every
    gradient) with single-process float64 attention. A `CommLedger` records
    every send, receive, wait and collective of each rank (and, for the
    overlap rule, the compute ops in order); the expected communication is
    part of the grade. A failure names the rank, the tensor, the element,
    expected and got. Stubs read `# TODO: implement (see the task description above).`
    """)
    nb.given("setup", """
    import math

    import torch
    import torch.distributed as dist

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace
    from autograder.checks.context_parallel import (
        reference_attention, check_attention_with_lse, check_merge_attention, check_merge_large_logits,
        check_merge_fully_masked, check_ring_all_gather, check_ring_attention, check_ring_overlap,
        check_attention_block_backward, check_zigzag_split, check_zigzag_ring_attention, check_zigzag_balance,
        check_seq_all_to_all, check_ulysses_attention, check_ulysses_errors, measure_ring_layouts,
        plot_ring_steps, plot_ring_flops,
    )
    """)
    nb.markdown("""
    ## Given: argument checks

    `_group_size_rank` and `_check_divisible` implement the error contract
    (you will call them); `_check_qkv` validates q, k, v; `_accumulation_dtype`
    is the dtype partial results are kept in: float32 for 16-bit inputs (as
    flash-attention keeps `out` and `lse`), the input's own dtype otherwise.
    """)
    nb.given("helpers", source_of(cp, "_group_size_rank", "_check_divisible", "_check_qkv", "_accumulation_dtype"))

    # -- exercise 1 ----------------------------------------------------------------
    nb.exercise(1, "`attention_with_lse`", """
    `attention_with_lse(q, k, v, *, causal, q_offset=0, k_offset=0)` returns
    `(out, lse)`: `out = softmax(q k^T / sqrt(d)) v` `[b, sq, n, d]` in q's
    dtype, and `lse = log sum_j exp(q k_j^T / sqrt(d))` `[b, sq, n]`, the
    log of the softmax's denominator, in `_accumulation_dtype(q.dtype)`. The
    lse is what lets two partial attentions be merged later (exercise 2).

    - **Global positions.** With `causal=True`, query `i` sits at position
      `q_offset + i` and key `j` at `k_offset + j`; the query sees the key iff
      `k_offset + j <= q_offset + i`. Under CP a rank's queries and the keys
      it holds come from different parts of the sequence: the offsets say where.
    - **Max subtraction.** Subtract each row's max before `exp` (tests use
      logits whose lse exceeds 709, where `exp` overflows float64).
    - **Fully masked rows.** A query that sees no key gets `out = 0`,
      `lse = -inf`, and no NaN anywhere, gradients included (the row max is
      `-inf` there: `exp(-inf - (-inf))` is NaN).
    - **Explicit matmuls** (`torch.einsum` or `torch.matmul`), not
      `F.scaled_dot_product_attention`: it returns no lse, and on CPU
      `FlopCounterMode` counts 0 FLOPs for it (exercise 5 measures the work).
    - `out` must be differentiable (Ulysses back-propagates through it);
      nobody back-propagates through `lse`.

    Details: [01_online_softmax.md](../../assignments/04_context_parallel/01_online_softmax.md).
    """)
    nb.solution_from("attention", cp, "attention_with_lse")
    nb.test("test_attention_with_lse", 8,
            doc="out, lse and the gradients of out equal float64 softmax attention, causal on global positions.",
            visible="""
    check_attention_with_lse(attention_with_lse, causal=False)
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=4, k_offset=2)
    """, hidden="""
    check_attention_with_lse(attention_with_lse, causal=True, seq_q=6, seq_k=6, n_heads=2, seed=1)
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=7, k_offset=3, seq_q=3, seq_k=9,
                             n_heads=4, head_dim=2, seed=2)
    check_attention_with_lse(attention_with_lse, causal=False, dtype=torch.float32, seed=3)
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=2, k_offset=0, logit_scale=900.0, seed=4)
    """)
    nb.test("test_attention_fully_masked", 4,
            doc="A query with no visible key: out 0, lse -inf, no NaN in out, lse or any gradient.",
            visible="""
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=0, k_offset=3, expect_masked_rows=True)
    """, hidden="""
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=2, k_offset=5, seq_q=5, seq_k=4,
                             expect_masked_rows=True, seed=1)
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=0, k_offset=2, seq_q=4, seq_k=3,
                             dtype=torch.float32, expect_masked_rows=True, seed=2)
    """)

    # -- exercise 2 ----------------------------------------------------------------
    nb.exercise(2, "`merge_attention`, the ring attention step", """
    Two attentions of the same queries over disjoint key sets, `(out1, lse1)`
    and `(out2, lse2)`, combine exactly into the attention over the union:
    with `L = log(e^lse1 + e^lse2)`,
    `out = e^(lse1 - L) out1 + e^(lse2 - L) out2` and `lse = L`.
    `merge_attention(out, lse, block_out, block_lse)` returns that pair; it is
    the step a ring rank runs once per block it receives (ring-flash-attention
    `utils.update_out_and_lse`).

    - Compute it with the **max subtracted**: `m = max(lse1, lse2)`, weights
      `e^(lse1 - m)`, `e^(lse2 - m)` (never `e^lse`: lse above 709 overflows).
    - A **fully masked** row (`lse = -inf`, `out = 0`) merged into a row, a row
      merged into it, or two of them: no NaN (`m` is `-inf` when both are:
      replace it by any finite number). Merging into the empty state
      `(out = 0, lse = -inf)` returns the block.
    - The order must not matter (up to rounding): blocks arrive in a
      different order on every rank.
    - Keep the result in `torch.promote_types(_accumulation_dtype(out.dtype), block_out.dtype)`.

    Details, and ring-flash-attention's sigmoid form of the same formula:
    [01_online_softmax.md](../../assignments/04_context_parallel/01_online_softmax.md).
    """)
    nb.solution_from("merge", cp, "merge_attention")
    nb.test("test_merge_attention", 7,
            doc="Merging the attentions of key blocks, in every order, gives attention over all keys.",
            visible="""
    check_merge_attention(merge_attention)
    """, hidden="""
    check_merge_attention(merge_attention, bounds=(0, 1, 4, 6, 7), seq_q=3, n_heads=2, seed=1)
    check_merge_attention(merge_attention, causal=True, bounds=(0, 2, 4, 6), seq_q=6, seed=2)
    check_merge_attention(merge_attention, dtype=torch.float32, seed=3)
    """)
    nb.test("test_merge_large_logits", 4,
            doc="float64 logits with lse > 709: the merge subtracts the max and stays exact.",
            visible="""
    check_merge_large_logits(merge_attention)
    """, hidden="""
    check_merge_large_logits(merge_attention, seq_k=6, n_heads=2, seed=1)
    """)
    nb.test("test_merge_fully_masked", 4,
            doc="Merging into, from and between fully masked rows (lse -inf): exact, no NaN.",
            visible="""
    check_merge_fully_masked(merge_attention)
    """, hidden="""
    check_merge_fully_masked(merge_attention, seq_q=6, n_heads=2, seed=1)
    check_merge_fully_masked(merge_attention, dtype=torch.float32, seed=2)
    """)

    # -- worked example ------------------------------------------------------------
    nb.markdown("""
    ## Worked example: blocks around a ring by P2P

    The skeleton of ring attention without the attention: every rank passes
    its block of the sequence to the next rank and receives the previous
    rank's, `w - 1` times, until it has held every block. Note the pattern
    you will reuse:

    - one **`dist.batch_isend_irecv`** per step posts the send to the next rank
      and the receive from the previous one together (a lone blocking
      `dist.send` waits for its receiver, and every rank sending first
      deadlocks);
    - peers are **group ranks**: `dist.P2POp(dist.isend, t, group=cp_group, group_peer=...)`;
    - the transfer is **posted before** the block in hand is used, so that
      communication and computation overlap; then **wait** on every work
      handle, then swap;
    - the block held at step `i` came from rank `(rank - i) mod w`;
    - a receive buffer must be contiguous; a group of one sends nothing.
    """)
    nb.given("worked_example", source_of(cp, "ring_all_gather"))
    nb.given("worked_example_check", """
    check_ring_all_gather(ring_all_gather, world_size=4)
    print("ring_all_gather: passed")
    """)
    nb.code("""
    # Scratch: run your own code on 3 ranks and look at the ledger (edit freely).
    def show_ring(rank, world_size):
        x = torch.full((1, 2), float(rank))
        with CommLedger() as ledger:
            y = ring_all_gather(x, cp_group=dist.group.WORLD)
        return y, ledger.records

    for rank, (y, records) in enumerate(run_distributed(show_ring, 3)):
        print(f"rank {rank}: gathered {y.flatten().tolist()}")
        print(format_trace(records, rank))
    """)

    # -- exercise 3 ----------------------------------------------------------------
    nb.exercise(3, "ring attention, forward", """
    First `ring_send_recv(tensors, *, cp_group)`: post ONE `batch_isend_irecv`
    that sends each tensor of the list to the next rank and receives one
    tensor of the same shape and dtype for each from the previous rank into
    a new **contiguous** buffer (`torch.empty_like` keeps a view's strides:
    use `torch.empty(t.shape, ...)`); return `(works, received)` without
    waiting (ring-flash-attention `RingComm.send_recv`).

    Then `ring_attention_forward(q, k, v, *, cp_group, causal)` on contiguous
    shards `[b, s/w, n, d]` (rank `r` holds positions `[r s/w, (r+1) s/w)`):
    start from the empty state `out = 0`, `lse = -inf` (in
    `_accumulation_dtype(q.dtype)`); at step `i = 0 .. w-1` you hold the K/V
    block of rank `src = (r - i) mod w`:

    1. if `i < w - 1`: post the transfer of **K and V, as two tensors**, to the
       next rank (`ring_send_recv([k, v], ...)`) **before** computing;
    2. unless `causal` and every key of the block follows every query
       (`src > r`: skip it), `attention_with_lse` of your q against the block
       with the **global** offsets of both, merged into `(out, lse)`;
    3. wait on every work handle, then swap in the received K and V.

    Return `(out.to(q.dtype), lse)`. The answer cell ends with code that is
    already written: the autograd Function `_RingAttention` around your
    forward (and, after exercise 4, your backward), and the entry point
    `ring_attention`, which validates the arguments. Backward needs the final
    `out` and `lse`, so forward saves them; `lse` is returned for inspection
    only. Leave those two as they are. Graded: out and lse against full attention (world
    sizes 1 to 4, causal or not, a CP group inside a larger world, lse above
    709), exactly `2(w-1)` sends of `[b, s/w, n, d]` to the next group rank and
    `2(w-1)` receives from the previous one, under `causal` the work of each
    rank (`FlopCounterMode`: rank `r` may do at most `(r+1)/w` of the last
    rank's matmul FLOPs, so a fully masked block must be skipped, not
    computed), and, from the ledger's order of posts, compute and waits, that
    each transfer is in flight while a block is computed. Details: [02_ring_attention.md](../../assignments/04_context_parallel/02_ring_attention.md).
    """)
    nb.solution_from("ring_forward", cp, "ring_send_recv", "ring_attention_forward", "_RingAttention", "ring_attention")
    nb.test("test_ring_forward", 12,
            doc="ring_attention forward: out and lse equal full attention; 2(w-1) sends to the next rank, 2(w-1) receives from the previous; causal: masked blocks skipped.",
            visible="""
    check_ring_attention(ring_attention, world_size=2, causal=True)
    check_ring_attention(ring_attention, world_size=4, causal=False, timeout=5)
    # two CP groups of 2 in a world of 4: neighbours and positions are group ranks, not global ranks
    check_ring_attention(ring_attention, world_size=4, cp_size=2, causal=True, timeout=5)
    """, hidden="""
    check_ring_attention(ring_attention, world_size=1, causal=True, seed=1)
    check_ring_attention(ring_attention, world_size=3, causal=True, seq=9, n_heads=2, logit_scale=900.0, seed=2,
                         timeout=5)
    check_ring_attention(ring_attention, world_size=4, cp_size=2, causal=True, dtype=torch.float32, seed=3,
                         timeout=5)
    """)
    nb.test("test_ring_overlap", 6,
            doc="Each K/V transfer is posted before the block in hand is computed, and waited after it.",
            visible="""
    check_ring_overlap(ring_attention, world_size=2)
    """, hidden="""
    check_ring_overlap(ring_attention, world_size=4, seq=12, n_heads=2, seed=1, timeout=5)
    """)

    # -- exercise 4 ----------------------------------------------------------------
    nb.exercise(4, "ring attention, backward", """
    **The block backward.** `attention_block_backward(q, k, v, out, dout, lse, *, causal, q_offset=0, k_offset=0)`
    returns the gradients `(dq, dk, dv)` of one block of keys `k, v`
    `[b, sk, n, d]`, given the queries' **final** results over all keys:
    `out`, `dout` `[b, sq, n, d]` and `lse` `[b, sq, n]`. With
    `S = q k^T / sqrt(d)` (masked as in exercise 1) and `P = exp(S - lse)`
    (this block's columns of the *full* softmax),
    `D = rowsum(dout * out)`: `dv = P^T dout`, `dS = P * (dout v^T - D)`,
    `dq = dS k / sqrt(d)` (this block's share), `dk = dS^T q / sqrt(d)`.
    This is FlashAttention-2's backward (Dao 2023, Algorithm 2); in float32 at
    least, no NaN for a row with `lse = -inf`.
    """)
    nb.solution_from("block_backward", cp, "attention_block_backward")
    nb.test("test_attention_block_backward", 7,
            doc="Per key block, from the final out and lse: dk, dv are slices of the full gradients; the dq add up.",
            visible="""
    check_attention_block_backward(attention_block_backward)
    """, hidden="""
    check_attention_block_backward(attention_block_backward, causal=False, bounds=(0, 2, 5, 8), seed=1)
    check_attention_block_backward(attention_block_backward, causal=True, bounds=(0, 4, 6, 8), n_heads=2, seed=2)
    check_attention_block_backward(attention_block_backward, dtype=torch.float32, seed=3)
    """)
    nb.markdown("""
    **The ring backward.** `ring_attention_backward(q, k, v, out, lse, dout, *, cp_group, causal)`
    returns `(dq, dk, dv)` for this rank's shards. K and V travel the ring
    again as in forward (posted before each block's backward). Each block
    also needs the gradient contributions of **every** rank whose queries see
    it, so its dK/dV accumulator travels *with* it: at step `i`, add your
    `attention_block_backward` share (the final `out` and `lse`, the global
    offsets, skipping fully masked blocks) to the accumulator of the block
    you hold, and send the accumulator to the next rank. At step 0 the
    accumulator of your own block starts with your share; after `w` sends of
    dK and dV (one full turn) every accumulator is back with its owner: wait
    for that last one and return it. Per rank: `2(w-1)` K/V sends and `2w` dK/dV
    sends (TransformerEngine's variant with `2(w-1)` is accepted too), none
    for a group of one. Under `causal` the backward's work per rank is
    measured as the forward's (a fully masked block skipped, not computed).
    Why the final lse and not each block's own:
    [02_ring_attention.md](../../assignments/04_context_parallel/02_ring_attention.md).
    """)
    nb.solution_from("ring_backward", cp, "ring_attention_backward")
    nb.test("test_ring_backward", 13,
            doc="ring_attention backward: dq, dk, dv equal full attention; K/V sent again and dK/dV sent home (2(w-1) + 2w).",
            visible="""
    check_ring_attention(ring_attention, world_size=2, causal=True, backward=True)
    check_ring_attention(ring_attention, world_size=4, causal=False, backward=True, timeout=5)
    check_ring_attention(ring_attention, world_size=4, cp_size=2, causal=True, backward=True, timeout=5)
    """, hidden="""
    check_ring_attention(ring_attention, world_size=1, causal=False, backward=True, seed=1)
    check_ring_attention(ring_attention, world_size=3, causal=True, seq=9, n_heads=2, backward=True, seed=2,
                         timeout=5)
    check_ring_attention(ring_attention, world_size=4, cp_size=2, causal=True, backward=True, dtype=torch.float32,
                         seed=4, timeout=5)
    """)

    # -- exercise 5 ----------------------------------------------------------------
    nb.exercise(5, "the zigzag layout", """
    Under the causal mask, contiguous shards make rank `w-1` compute `w`
    blocks and rank 0 one. The zigzag layout cuts the sequence into `2w`
    chunks and gives rank `r` chunks `r` and `2w-1-r` (one early, one late),
    which balances the work (Megatron-LM `get_batch_on_this_cp_rank`,
    ring-flash-attention `zigzag_ring_flash_attn.py`).

    - `zigzag_split(x, *, cp_rank, cp_size, dim)`: rank `cp_rank`'s shard,
      chunk `cp_rank` then chunk `2 cp_size - 1 - cp_rank` along `dim`;
      `ValueError` naming both sizes if `x.shape[dim]` is not divisible by
      `2 cp_size`.
    - `zigzag_ring_attention_forward(q, k, v, *, cp_group)`: causal ring
      attention on zigzag shards, `(out, lse)` in the zigzag layout. The same
      ring as exercise 3, with the work per step chosen by where the chunks
      sit (`half = s_local // 2`):
      step 0, your own block: `causal=True` with offsets 0 (your two chunks are
      in global order, so the plain lower triangle is the right mask);
      `src < r`: your queries see `src`'s early chunk only: all of q against
      the first half of K/V; `src > r`: only your late chunk sees `src`'s
      block, all of it: the second half of q against all of K/V, merged into
      the second half of `(out, lse)`. Half a block per step, on every rank.
    - `zigzag_ring_attention_backward(q, k, v, out, lse, dout, *, cp_group)`:
      exercise 4's ring backward with the same three cases (slice `out`,
      `dout`, `lse` with q; pad a half-block dK/dV share with zeros to the
      block's shape).

    The cell ends with the Function and the entry point `zigzag_ring_attention`,
    already written (it also checks that the local length is even). Graded:
    numbers and P2P as for the contiguous ring, and equal work measured with
    `torch.utils.flop_counter.FlopCounterMode` (which counts a masked block as
    full work: skipping is what saves it). Details, and what zigzag means for
    positions (RoPE): [03_zigzag.md](../../assignments/04_context_parallel/03_zigzag.md).
    """)
    nb.solution_from("zigzag", zz, "zigzag_split", "zigzag_ring_attention_forward", "zigzag_ring_attention_backward",
                     "_ZigzagRingAttention", "zigzag_ring_attention")
    nb.test("test_zigzag_split", 4,
            doc="zigzag_split keeps chunks r and 2w-1-r in that order; a length not divisible by 2w raises ValueError.",
            visible="""
    check_zigzag_split(zigzag_split, cp_size=2)
    """, hidden="""
    check_zigzag_split(zigzag_split, cp_size=4, shape=(2, 16, 3), seed=1)
    check_zigzag_split(zigzag_split, cp_size=3, shape=(12, 2), dim=0, seed=2)
    check_zigzag_split(zigzag_split, cp_size=1, shape=(1, 3, 4), dim=2, seed=3)
    """)
    nb.test("test_zigzag_ring_attention", 10,
            doc="zigzag_ring_attention: out, lse, dq, dk, dv equal causal attention in the zigzag layout; same P2P as the ring.",
            visible="""
    check_zigzag_ring_attention(zigzag_ring_attention, world_size=2)
    check_zigzag_ring_attention(zigzag_ring_attention, world_size=4, seq=8, timeout=5)
    """, hidden="""
    check_zigzag_ring_attention(zigzag_ring_attention, world_size=1, seq=4, seed=1)
    check_zigzag_ring_attention(zigzag_ring_attention, world_size=3, seq=12, n_heads=2, seed=2, timeout=5)
    check_zigzag_ring_attention(zigzag_ring_attention, world_size=4, cp_size=2, seed=3, timeout=5)
    """)
    nb.test("test_zigzag_balance", 5,
            doc="FlopCounterMode: zigzag ranks do equal work, and its busiest rank less than the contiguous layout's.",
            visible="""
    check_zigzag_balance(zigzag_ring_attention, ring_attention, world_size=2)
    """, hidden="""
    check_zigzag_balance(zigzag_ring_attention, ring_attention, world_size=4, seq=16, seed=1, timeout=5)
    """)
    nb.markdown("""
    ### Pictures: where the work goes, measured from your run

    Both causal rings on 4 ranks. The first picture is drawn from each rank's
    forward trace: for every ring step, the FLOPs of the matmuls between two
    waits, as a fraction of one full block (`K/V of j`: the block the rank
    held at that step). The second counts each rank's FLOPs with
    `FlopCounterMode`, forward and backward. With contiguous shards the
    last rank computes every block and the first only its diagonal; with
    zigzag every rank computes its diagonal block and then half a block per
    step. Run the cell once exercises 3-5 pass.
    """)
    nb.code("""
    from IPython.display import display

    measured = measure_ring_layouts(ring_attention, zigzag_ring_attention, world_size=4, seq=16)
    display(plot_ring_steps(ring_attention, zigzag_ring_attention, measured=measured))
    plot_ring_flops(ring_attention, zigzag_ring_attention, measured=measured)
    """)

    # -- exercise 6 ----------------------------------------------------------------
    nb.exercise(6, "Ulysses: context parallelism by all-to-all", """
    DeepSpeed-Ulysses trades the sequence split for a head split: after one
    all-to-all per tensor each rank holds the **whole sequence** for `n/w`
    heads, runs ordinary attention, and a last all-to-all trades back.

    - `_all_to_all(x, group, scatter_dim, gather_dim)`: cut `x` into `w`
      pieces along `scatter_dim`, send piece `j` to rank `j`, and concatenate
      the `w` pieces received, in rank order, along `gather_dim`. One
      `dist.all_to_all_single` (on a contiguous `[w, ...]` stack of the
      pieces); nothing for a group of one.
    - `_SeqAllToAll`: that all-to-all in forward, the **inverse** one
      (scatter and gather dims swapped) in backward (DeepSpeed
      `deepspeed/sequence/layer.py` `_SeqAllToAll`).
    - `seq_all_to_all(x, *, cp_group, scatter_dim, gather_dim)`: validates
      (`ValueError` naming the sizes if `x.shape[scatter_dim]` is not
      divisible by the group size; `_group_size_rank` for the group), then
      applies the Function.
    """)
    nb.solution_from("seq_all_to_all", uly, "_all_to_all", "_SeqAllToAll", "seq_all_to_all")
    nb.test("test_seq_all_to_all", 5,
            doc="seq_all_to_all: pieces land on the right rank in rank order; backward is the inverse all-to-all.",
            visible="""
    check_seq_all_to_all(seq_all_to_all, world_size=2)
    """, hidden="""
    check_seq_all_to_all(seq_all_to_all, world_size=4, shape=(2, 8, 4, 3), scatter_dim=1, gather_dim=2, seed=2)
    check_seq_all_to_all(seq_all_to_all, world_size=3, shape=(1, 3, 6, 2), seed=3)
    """)
    nb.markdown("""
    `ulysses_attention(q, k, v, *, cp_group, causal)` on contiguous shards
    `[b, s/w, n, d]`: `ValueError` unless `n` is divisible by `w` (Ulysses'
    limit: a rank computes whole heads), then q, k and v each through
    `seq_all_to_all` (heads scattered, sequence gathered:
    `[b, s/w, n, d] -> [b, s, n/w, d]`), `attention_with_lse` on the whole
    sequence (positions 0..s-1, in order), and the output back
    (`[b, s, n/w, d] -> [b, s/w, n, d]`). Returns `out` only. Exactly 4
    all-to-alls in forward and their 4 inverses in backward. Details:
    [04_ulysses.md](../../assignments/04_context_parallel/04_ulysses.md).
    """)
    nb.solution_from("ulysses", uly, "ulysses_attention")
    nb.test("test_ulysses_attention", 8,
            doc="ulysses_attention: out, dq, dk, dv equal full attention; 4 all-to-alls forward, 4 backward.",
            visible="""
    check_ulysses_attention(ulysses_attention, world_size=2, causal=True)
    check_ulysses_attention(ulysses_attention, world_size=4, causal=False)
    """, hidden="""
    check_ulysses_attention(ulysses_attention, world_size=1, causal=True, seed=1)
    check_ulysses_attention(ulysses_attention, world_size=3, causal=True, seq=9, n_heads=6, head_dim=2, seed=3)
    """)
    nb.test("test_ulysses_errors", 3,
            doc="Heads or a scattered dim not divisible by the group size, or no ProcessGroup: ValueError before any communication.",
            visible="""
    check_ulysses_errors(ulysses_attention, seq_all_to_all, world_size=2)
    """)

    # -- what it costs at scale ----------------------------------------------------
    nb.markdown(f"""
    ## Time, not only bytes (no exercise)

    The lesson's formulas ([README.md]({LESSON}/README.md), section 4),
    computed by `autograder.lessons.volume` with the stated figures of
    `autograder.lessons.hardware` (an 8x H100 node, NVLink inside, InfiniBand
    across): per layer of a Llama-3-8B-like model, what each scheme sends per
    rank, and whether the ring's per-step transfer hides under the block's
    compute. Change the numbers and run it again.
    """)
    nb.code("""
    from IPython.display import Markdown

    from autograder.lessons.hardware import H100_NODE
    from autograder.lessons.volume import cp_comparison_table

    Markdown(cp_comparison_table(seq=131072, batch=1, hidden=4096, kv_hidden=1024, cp=8, node=H100_NODE))
    """)
    nb.nccl_checks("""
    [
        ("ring attention forward + backward", check_ring_attention, (ring_attention,),
         {"world_size": 2, "causal": True, "backward": True}),
        ("zigzag ring attention", check_zigzag_ring_attention, (zigzag_ring_attention,), {"world_size": 2}),
        ("Ulysses attention", check_ulysses_attention, (ulysses_attention,), {"world_size": 2}),
    ]
    """)
    return nb


if __name__ == "__main__":
    build().write(OUT)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
