"""Plausible wrong implementations of assignment 04 (context parallelism), kept as tests.

Each mutant edits one answer cell of source/04_context_parallel/context_parallel_lab.ipynb;
`must_fail` is exactly the set of graded cells it fails (tests/test_context_parallel_notebook.py
runs them). The demo mutant (`make demo`) builds the causal mask from local instead of
global positions: the ring's off-diagonal blocks are masked as if they were diagonal.
"""

from solutions.submissions import mutant

MUTANTS = [
    # -- exercise 1: attention_with_lse -------------------------------------------------------
    mutant(
        "attention_nan_masked_rows", "attention",
        [("row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)",
          "row_max = row_max")],
        must_fail={"test_attention_fully_masked"},
        why="a query with no visible key: its row max is -inf and exp(-inf - (-inf)) is NaN",
    ),
    mutant(
        "attention_lse_transposed", "attention",
        [(".squeeze(-1).transpose(1, 2)  # [b, n, sq] -> [b, sq, n]", ".squeeze(-1)  # [b, n, sq] -> [b, sq, n]")],
        must_fail={"test_attention_with_lse", "test_attention_fully_masked", "test_ring_forward", "test_ring_overlap",
                   "test_ring_backward", "test_zigzag_ring_attention", "test_zigzag_balance"},
        why="lse returned as [b, n, s] (flash-attn's layout) instead of the course's [b, s, n]",
    ),
    # -- exercise 2: merge_attention ----------------------------------------------------------
    mutant(
        "merge_no_max_subtraction", "merge",
        [("m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both sides fully masked: any finite shift",
          "m = torch.zeros_like(m)  # both sides fully masked: any finite shift")],
        must_fail={"test_merge_large_logits", "test_ring_forward"},
        why="merges with exp(lse) directly: inf / inf = NaN once lse exceeds 709 in float64",
    ),
    mutant(
        "merge_nan_fully_masked", "merge",
        [("m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both sides fully masked: any finite shift",
          "m = m  # both sides fully masked: any finite shift")],
        must_fail={"test_merge_fully_masked", "test_merge_attention"},
        why="two fully masked rows: m = -inf and exp(-inf - (-inf)) is NaN",
    ),
    # -- exercise 3: ring forward --------------------------------------------------------------
    mutant(
        "ring_reversed_one_side", "ring_forward",
        [("send_to, recv_from = (rank + 1) % size, (rank - 1) % size",
          "send_to, recv_from = (rank + 1) % size, (rank + 1) % size")],
        must_fail={"test_ring_forward", "test_ring_overlap", "test_ring_backward", "test_zigzag_ring_attention",
                   "test_zigzag_balance"},
        why="receives from the next rank instead of the previous one: right at w = 2, a deadlock at w >= 3",
    ),
    mutant(
        "ring_stale_block", "ring_forward",
        [("            k, v = next_k, next_v\n", "            pass\n")],
        must_fail={"test_ring_forward", "test_ring_backward"},
        why="K/V received but never swapped in: every step computes with the rank's own block",
    ),
    mutant(
        "ring_post_after_compute", "ring_forward",
        [("        if step + 1 < size:  # the next block travels while this one is computed\n"
          "            works, (next_k, next_v) = ring_send_recv([k, v], cp_group=cp_group)\n", ""),
         ("        if step + 1 < size:\n            for work in works:",
          "        if step + 1 < size:\n            works, (next_k, next_v) = ring_send_recv([k, v], cp_group=cp_group)\n"
          "            for work in works:")],
        must_fail={"test_ring_overlap"},
        why="posts the next transfer only after computing the block: right numbers, nothing overlapped",
    ),
    mutant(
        "causal_local_positions", "ring_forward",
        [("q_offset=rank * s_local,\n                                                      k_offset=src * s_local)",
          "q_offset=0, k_offset=0)")],
        must_fail={"test_ring_forward", "test_ring_backward"},
        why="the causal mask on local positions: a block from an earlier rank is masked like the diagonal",
        demo=True,
    ),
    mutant(
        "ring_global_rank", "ring_forward",
        [("size, rank = cp_group.size(), cp_group.rank()\n    b, s_local, n, d = q.shape",
          "size, rank = cp_group.size(), dist.get_rank()\n    b, s_local, n, d = q.shape")],
        must_fail={"test_ring_forward", "test_ring_backward"},
        why="positions from the global rank: wrong as soon as the CP group is not the whole world",
    ),
    mutant(
        "ring_masked_blocks_computed", "ring_forward",
        [("        if not causal or src <= rank:  # src > rank: every key follows every query, fully masked",
          "        if True:  # src > rank: every key follows every query, fully masked")],
        must_fail={"test_ring_forward", "test_ring_backward"},
        why="computes the fully masked blocks of later ranks under the causal mask instead of skipping them: "
            "right numbers, every rank does the last rank's work (FlopCounterMode)",
    ),
    # -- exercise 4: backward -------------------------------------------------------------------
    mutant(
        "block_backward_no_delta", "block_backward",
        [("ds = p * (dp - delta)", "ds = p * dp")],
        must_fail={"test_attention_block_backward", "test_ring_backward", "test_zigzag_ring_attention"},
        why="the softmax backward without D = rowsum(dout * out)",
    ),
    mutant(
        "backward_block_lse", "ring_backward",
        [("            block_dq, block_dk, block_dv = attention_block_backward(\n"
          "                q, k, v, out, dout, lse, causal=causal,",
          "            _, block_lse = attention_with_lse(q, k, v, causal=causal, q_offset=rank * s_local,\n"
          "                                              k_offset=src * s_local)\n"
          "            block_dq, block_dk, block_dv = attention_block_backward(\n"
          "                q, k, v, out, dout, block_lse, causal=causal,")],
        must_fail={"test_ring_backward"},
        why="backward recomputes each block's own LSE instead of using the final one: per-block softmaxes",
    ),
    mutant(
        "dkv_not_returned", "ring_backward",
        [("        if size > 1:  # pass the accumulator on", "        if size > 1 and step + 1 < size:  # pass the accumulator on"),
         ("    if size > 1:\n        for work in dkv_works:\n            work.wait()\n        dk, dv = next_dk, next_dv\n",
          "")],
        must_fail={"test_ring_backward"},
        why="the dK/dV accumulators stop one step short: each rank returns its successor's gradients",
    ),
    mutant(
        "ring_backward_masked_blocks_computed", "ring_backward",
        [("        if not causal or src <= rank:\n            block_dq, block_dk, block_dv",
          "        if True:\n            block_dq, block_dk, block_dv")],
        must_fail={"test_ring_backward"},
        why="the backward computes the gradients of fully masked blocks (zeros) instead of skipping them: "
            "right numbers, every rank does the last rank's work",
    ),
    # -- exercise 5: zigzag ---------------------------------------------------------------------
    mutant(
        "zigzag_wrong_order", "zigzag",
        [("torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]], dim=dim)",
          "torch.cat([chunks[2 * cp_size - 1 - cp_rank], chunks[cp_rank]], dim=dim)")],
        must_fail={"test_zigzag_split"},
        why="the zigzag chunks in the wrong order: the late chunk first",
    ),
    mutant(
        "zigzag_no_length_check", "zigzag",
        [("if x.shape[dim] % (2 * cp_size) != 0:", "if False:")],
        must_fail={"test_zigzag_split"},
        why="a length not divisible by 2w is split unevenly instead of rejected",
    ),
    mutant(
        "zigzag_wasted_work", "zigzag",
        [("            block_out, block_lse = attention_with_lse(q[:, half:], k, v, causal=False)\n",
          "            block_out, block_lse = attention_with_lse(q, k, v, causal=False)\n"
          "            block_out, block_lse = block_out[:, half:], block_lse[:, half:]\n")],
        must_fail={"test_zigzag_balance"},
        why="computes all queries against a later rank's block and keeps half: right numbers, unequal work",
    ),
    # -- exercise 6: Ulysses --------------------------------------------------------------------
    mutant(
        "a2a_backward_not_inverse", "seq_all_to_all",
        [("_all_to_all(grad_output, ctx.group, ctx.gather_dim, ctx.scatter_dim)",
          "_all_to_all(grad_output, ctx.group, ctx.scatter_dim, ctx.gather_dim)")],
        must_fail={"test_seq_all_to_all", "test_ulysses_attention"},
        why="backward repeats the forward all-to-all instead of its inverse",
    ),
    mutant(
        "ulysses_dims_swapped", "ulysses",
        [("seq_all_to_all(t, cp_group=cp_group, scatter_dim=2, gather_dim=1)",
          "seq_all_to_all(t, cp_group=cp_group, scatter_dim=1, gather_dim=2)")],
        must_fail={"test_ulysses_attention"},
        why="the q/k/v all-to-all with scatter and gather dims swapped: sequence scattered, heads gathered",
    ),
]
