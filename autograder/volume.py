"""Communication volume: the lessons' formulas, and the same quantity measured from a ledger.

    bytes_sent(records, phase="backward")            # what a ring moves per rank, from a ledger
    tp_pair_bytes(s, b, h, t, bytes_per_element=2, sequence_parallel=True, regather=True)
    dp_step_bytes(num_params, d, bytes_per_element=4, scheme="zero")

Convention (assignments/*/README.md, nccl-tests' "bus bandwidth"): bytes SENT
by each rank when a collective over a full-size buffer of N bytes runs as a
ring over a group of t ranks: all-reduce 2(t-1)/t * N, all-gather and
reduce-scatter (t-1)/t * N each. A test checks every formula here against the
ledger of the reference solutions.
"""

from __future__ import annotations

__all__ = ["ring_factor", "bytes_sent", "tp_pair_bytes", "tp_layer_bytes", "dp_step_bytes"]


def ring_factor(op: str, group_size: int) -> float:
    """Fraction of the full buffer that each rank sends in a ring collective."""
    t = group_size
    if t <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (t - 1) / t
    if op in ("all_gather", "reduce_scatter"):
        return (t - 1) / t
    raise ValueError(f"no ring formula for {op!r}")


def bytes_sent(records, *, phase: str | None = None) -> float:
    """Bytes each rank sends for the all-reduces, all-gathers and reduce-scatters in `records`."""
    return sum(ring_factor(r.op, r.group_size) * r.bytes for r in records
               if r.op in ("all_reduce", "all_gather", "reduce_scatter") and (phase is None or r.phase == phase))


def tp_pair_bytes(s: int, b: int, h: int, t: int, *, bytes_per_element: int = 2,
                  sequence_parallel: bool = False, regather: bool = True) -> dict[str, float]:
    """Bytes sent per rank by one column->row pair on activations [s, b, h] (README section 3).

    TP: one all-reduce of N = s*b*h*B in forward (g) and one in backward (f).
    TP+SP: all-gather + reduce-scatter in forward; reduce-scatter + all-gather in
    backward, plus one more all-gather when the input is re-gathered for the
    weight gradient (`regather`, Megatron-LM's way).
    """
    n = s * b * h * bytes_per_element
    if not sequence_parallel:
        fwd = ring_factor("all_reduce", t) * n
        bwd = ring_factor("all_reduce", t) * n
    else:
        half = ring_factor("all_gather", t) * n
        fwd = 2 * half
        bwd = (3 if regather else 2) * half
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def tp_layer_bytes(s: int, b: int, h: int, t: int, **kwargs) -> dict[str, float]:
    """A transformer layer has two column->row pairs (attention, MLP)."""
    pair = tp_pair_bytes(s, b, h, t, **kwargs)
    return {k: 2 * v for k, v in pair.items()}


def dp_step_bytes(num_params: int, d: int, *, bytes_per_element: int = 4, scheme: str = "ddp") -> float:
    """Bytes sent per rank in one training step over `num_params` parameters (01 README section 2).

    ddp: all-reduce of the gradients, 2(d-1)/d * P * B.
    zero (stages 1, 2): reduce-scatter of gradients + all-gather of parameters, the same.
    fsdp (ZeRO-3): all-gather in forward and in backward + reduce-scatter, 3(d-1)/d * P * B.
    For zero and fsdp, pass the padded size (a multiple of d).
    """
    n = num_params * bytes_per_element
    half = ring_factor("all_gather", d) * n
    if scheme == "ddp":
        return ring_factor("all_reduce", d) * n
    if scheme == "zero":
        return 2 * half
    if scheme == "fsdp":
        return 3 * half
    raise ValueError(f"scheme must be 'ddp', 'zero' or 'fsdp', got {scheme!r}")


# ---------------------------------------------------------------------------
# Pipeline parallelism (assignment 03, README sections 2-5); checked in tests/test_pipeline_parallel_volume.py
# ---------------------------------------------------------------------------

def pp_bubble_fraction(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> float:
    """Idle fraction of a rank over one step, (p - 1) / (v m + p - 1): GPipe and 1F1B (v = 1), interleaved 1F1B."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if min(p, m, v) < 1:
        raise ValueError(f"pp_bubble_fraction: p ({p}), m ({m}) and v ({v}) must be >= 1")
    return (p - 1) / (v * m + p - 1)


def pp_boundary_bytes(s: int, b: int, h: int, *, bytes_per_element: int = 2, tp: int = 1,
                      sequence_parallel: bool = False) -> float:
    """Bytes one rank sends across one stage boundary for one micro-batch, in one direction.

    The activation [s, b, h] forward, its gradient (same size) backward. With
    sequence parallelism each of the t TP ranks holds and sends its sequence
    shard [s/t, b, h] (Megatron-LM `schedules.py` divides the P2P tensor
    shape's dim 0 by the TP size under `sequence_parallel`).
    """
    n = s * b * h * bytes_per_element
    return n / tp if sequence_parallel else n


def pp_step_p2p_bytes(s: int, b: int, h: int, num_stages: int, stage: int, num_microbatches: int,
                      num_chunks: int = 1, **kwargs) -> dict[str, float]:
    """Bytes a rank sends per step: m activations forward and m gradients backward per chunk boundary it owns."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if p == 1:
        return {"forward": 0.0, "backward": 0.0, "total": 0.0}
    n = pp_boundary_bytes(s, b, h, **kwargs)
    fwd = n * m * (v - 1 if stage == p - 1 else v)  # the last virtual stage sends no activation
    bwd = n * m * (v - 1 if stage == 0 else v)  # the first virtual stage sends no gradient
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def pp_peak_outputs(schedule: str, num_stages: int, stage: int, num_microbatches: int, num_chunks: int = 1) -> int:
    """Most stage (or chunk) outputs a rank holds at once: GPipe m, 1F1B min(p - s, m), interleaved min(w + 1, v m)."""
    p, s, m, v = num_stages, stage, num_microbatches, num_chunks
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - s, m)
    if schedule == "interleaved":
        warmup = min((p - s - 1) * 2 + (v - 1) * p, v * m)
        return min(warmup + 1, v * m)
    raise ValueError(f"schedule must be 'gpipe', '1f1b' or 'interleaved', got {schedule!r}")


def transformer_layer_flops(s: int, b: int, h: int) -> float:
    """Forward FLOPs of one transformer layer (4h MLP): 24 s b h^2 + 4 s^2 b h (Narayanan et al. 2021, sec. 5.1)."""
    return 24 * s * b * h * h + 4 * s * s * b * h


def pp_stage_seconds(layers: int, s: int, b: int, h: int, *, tp: int = 1, mfu: float = 0.5, node=None) -> dict[str, float]:
    """Forward and backward time of one stage (`layers` layers) on one micro-batch; backward = 2 x forward."""
    from autograder.hardware import H100_NODE, compute_seconds

    forward = compute_seconds(layers * transformer_layer_flops(s, b, h) / tp, node or H100_NODE, mfu=mfu)
    return {"forward": forward, "backward": 2 * forward}


def pp_bubble_seconds(num_stages: int, forward_s: float, backward_s: float, num_chunks: int = 1) -> float:
    """Idle time per rank per step: (p - 1) (t_f + t_b) / v, with t_f, t_b a whole stage's times."""
    return (num_stages - 1) * (forward_s + backward_s) / num_chunks


def pp_step_seconds(num_stages: int, num_microbatches: int, forward_s: float, backward_s: float,
                    num_chunks: int = 1) -> float:
    """Step time of an ideal pipeline: m (t_f + t_b) of work plus the bubble."""
    return num_microbatches * (forward_s + backward_s) + pp_bubble_seconds(num_stages, forward_s, backward_s,
                                                                           num_chunks)


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, *, tp: int = 1, sequence_parallel: bool = False,
                               selective_recompute: bool = False) -> float:
    """Activation bytes one transformer layer keeps for backward, 16-bit (Korthikanti et al. 2022, Table 2).

    s b h (34 + 5 a s / h) without parallelism; with TP s b h (10 + 24/t + 5 a s / (h t)); with TP + SP
    s b h / t (34 + 5 a s / h). Selective recomputation (attention's softmax and dropout recomputed, as
    flash attention does) drops the 5 a s / h term.
    """
    attention = 0.0 if selective_recompute else 5 * a * s / h
    if sequence_parallel:
        return s * b * h / tp * (34 + attention)
    return s * b * h * (10 + 24 / tp + attention / tp)


def pp_stage_activation_bytes(schedule: str, num_stages: int, stage: int, num_microbatches: int, layers: int,
                              per_layer_bytes: float, num_chunks: int = 1) -> float:
    """Peak activation bytes of a stage of `layers` layers: its peak outputs held, each `layers / v` layers deep."""
    outputs = pp_peak_outputs(schedule, num_stages, stage, num_microbatches, num_chunks)
    return outputs * (layers / num_chunks) * per_layer_bytes


# ---------------------------------------------------------------------------
# Expert parallelism (assignment 05): all-to-all traffic, the dispatcher's volume, time against compute.
# assignments/05_expert_parallel/README.md section 4 quotes these; tests/test_expert_parallel_volume.py
# checks them against the ledger of the reference dispatcher and against a simulation.
# ---------------------------------------------------------------------------

__all__ += ["all_to_all_traffic", "ep_dispatch_bytes", "ep_layer_bytes", "expected_distinct_groups",
            "remote_copies_per_token", "moe_expert_flops", "ep_forward_seconds", "expert_data_parallel_size"]


def all_to_all_traffic(record, group_rank: int) -> tuple[int, int]:
    """(bytes sent to other ranks, bytes received from other ranks) by one all-to-all of a ledger.

    A rank's own piece never leaves it. Without split sizes (equal splits), each
    of the w pieces is 1/w of the input, and the output has the input's size.
    """
    import math

    import torch

    if record.op != "all_to_all":
        raise ValueError(f"all_to_all_traffic: not an all-to-all record: {record.op}")
    w = record.group_size
    rows = record.shape[0] if record.shape else 0
    row_bytes = math.prod(record.shape[1:]) * torch.empty((), dtype=getattr(torch, record.dtype)).element_size()
    ins = list(record.input_split_sizes or ()) or [rows // w] * w
    outs = list(record.output_split_sizes or ()) or [rows // w] * w
    sent = sum(n for j, n in enumerate(ins) if j != group_rank) * row_bytes
    received = sum(n for j, n in enumerate(outs) if j != group_rank) * row_bytes
    return sent, received


def ep_dispatch_bytes(num_tokens: int, k: int, hidden: int, ep_size: int, *,
                      bytes_per_element: int = 2) -> dict[str, float]:
    """One dispatch of Megatron's all-to-all dispatcher on one rank (a combine moves the same bytes back).

    The all-to-all input holds one row per (token, selected expert): T*k rows of
    h elements, whichever rank each expert lives on. With uniform routing a
    fraction (ep-1)/ep of them goes to other ranks. Probabilities and counts
    (T*k and E numbers) are left out, as in Megatron's own estimate.
    """
    rows = num_tokens * k
    full = rows * hidden * bytes_per_element
    return {"rows": rows, "all_to_all_input": full, "sent_to_other_ranks": full * (ep_size - 1) / ep_size}


def ep_layer_bytes(num_tokens: int, k: int, hidden: int, ep_size: int, *,
                   bytes_per_element: int = 2) -> dict[str, float]:
    """Bytes one rank sends to other ranks per MoE layer and micro-batch: dispatch + combine, and their mirrors."""
    one = ep_dispatch_bytes(num_tokens, k, hidden, ep_size, bytes_per_element=bytes_per_element)
    sent = one["sent_to_other_ranks"]
    return {"forward": 2 * sent, "backward": 2 * sent, "total": 4 * sent}


def expected_distinct_groups(num_experts: int, num_groups: int, k: int) -> float:
    """Expected number of the `num_groups` equal groups of experts (ranks, nodes) hit by k distinct experts
    chosen uniformly: G * (1 - C(E - E/G, k) / C(E, k))."""
    from math import comb

    if num_groups < 1 or num_experts % num_groups or not 1 <= k <= num_experts:
        raise ValueError(f"expected_distinct_groups: need E ({num_experts}) divisible by the number of groups "
                         f"({num_groups}) and 1 <= k ({k}) <= E")
    per_group = num_experts // num_groups
    return num_groups * (1 - comb(num_experts - per_group, k) / comb(num_experts, k))


def remote_copies_per_token(num_experts: int, k: int, num_groups: int, *, dedup: bool = False,
                            max_groups: int | None = None) -> float:
    """Copies of one token that leave its group (rank or node) in a dispatch, uniform routing.

    Without de-duplication (Megatron's all-to-all) every (token, expert) pair is a
    row: k (G-1)/G of them go to other groups. With de-duplication (DeepEP) a token
    goes once to each other group hosting one of its experts: (G-1) P(a group is hit).
    With node-limited routing (DeepSeek-V3: M = 4 nodes per token), the token's
    experts are assumed to span exactly `max_groups` distinct groups, its own
    with probability M/G: M (G-1)/G copies.
    """
    if max_groups is not None:
        if not dedup or not 1 <= max_groups <= num_groups:
            raise ValueError(f"remote_copies_per_token: max_groups ({max_groups}) needs dedup=True and "
                             f"1 <= max_groups <= {num_groups}")
        return max_groups * (num_groups - 1) / num_groups
    if not dedup:
        return k * (num_groups - 1) / num_groups
    return expected_distinct_groups(num_experts, num_groups, k) * (num_groups - 1) / num_groups


def moe_expert_flops(num_tokens: int, k: int, hidden: int, ffn: int, *, matrices: int = 3) -> float:
    """Forward FLOPs of the routed experts on one rank with balanced load: T*k token-expert pairs, each
    `matrices` [h x ffn] matmuls (3 for SwiGLU, as DeepSeek-V3; 2 for the course's GeLU MLP)."""
    return 2.0 * matrices * num_tokens * k * hidden * ffn


def ep_forward_seconds(num_tokens: int, k: int, hidden: int, ffn: int, num_experts: int, *, ep_size: int,
                       node=None, dedup: bool = False, max_nodes: int | None = None,
                       dispatch_bytes_per_element: int = 2, combine_bytes_per_element: int = 2,
                       mfu: float = 0.5, matrices: int = 3) -> dict[str, float]:
    """Dispatch, combine and expert time of one MoE layer's forward on one rank (the lesson's section 4).

    Inside a node (ep_size <= node.gpus) tokens go over NVLink; across nodes the
    copies for other nodes go over the network (one NIC per GPU) while the rest
    goes over NVLink at the same time: the slower of the two is the time. Uses
    autograder/hardware.py's stated figures; an estimate with uniform routing.
    """
    from .hardware import H100_NODE, compute_seconds, transfer_seconds

    node = node or H100_NODE
    if ep_size < 1 or num_experts % ep_size:
        raise ValueError(f"ep_forward_seconds: num_experts ({num_experts}) must be divisible by ep_size ({ep_size})")
    if ep_size > node.gpus and ep_size % node.gpus:
        raise ValueError(f"ep_forward_seconds: ep_size ({ep_size}) must fit in a node ({node.gpus} GPUs) or be a "
                         f"multiple of it")

    def one_direction(bytes_per_element):
        row = hidden * bytes_per_element
        if ep_size <= node.gpus:
            copies = remote_copies_per_token(num_experts, k, ep_size, dedup=dedup)
            return transfer_seconds(num_tokens * copies * row, node.nvlink, messages=ep_size - 1)
        nodes = ep_size // node.gpus
        net = remote_copies_per_token(num_experts, k, nodes, dedup=dedup, max_groups=max_nodes)
        # the copies for the other GPUs of this node: (g-1)/ep of the rows (Megatron), forwarded per rank by DeepEP
        local = k * (node.gpus - 1) / ep_size
        # one message per remote GPU (Megatron), or per remote node (DeepEP: one RDMA peer per node)
        messages = nodes - 1 if dedup else ep_size - node.gpus
        return max(transfer_seconds(num_tokens * net * row, node.network, messages=messages),
                   transfer_seconds(num_tokens * local * row, node.nvlink, messages=node.gpus - 1))

    experts = compute_seconds(moe_expert_flops(num_tokens, k, hidden, ffn, matrices=matrices), node, mfu=mfu)
    dispatch = one_direction(dispatch_bytes_per_element)
    combine = one_direction(combine_bytes_per_element)
    return {"dispatch": dispatch, "combine": combine, "experts": experts,
            "comm_over_compute": (dispatch + combine) / experts}


def expert_data_parallel_size(world_size: int, *, ep: int, etp: int = 1, pp: int = 1) -> int:
    """The expert-data-parallel size of Megatron's MoE parallel folding: world / (ETP x EP x PP)."""
    if world_size % (etp * ep * pp):
        raise ValueError(f"expert_data_parallel_size: world size {world_size} is not divisible by "
                         f"ETP x EP x PP = {etp} x {ep} x {pp}")
    return world_size // (etp * ep * pp)


# ===========================================================================
# 06_composition (the layout planner): traffic of CP and of ZeRO per step (PP's is 03's
# pp_boundary_bytes above). Owned by assignment 06 (its planner uses these); checked in
# tests/test_composition_volume.py and tests/test_composition_planner.py.
# ===========================================================================

__all__ += ["ring_attention_bytes_per_layer", "zero_step_bytes"]


def ring_attention_bytes_per_layer(s: int, b: int, kv_dim: int, cp: int, *, bytes_per_element: int = 2,
                                   dkv_full_ring: bool = False) -> dict[str, float]:
    """Bytes one rank sends per layer and micro-batch in ring attention over `cp` ranks (04's lesson).

    A K or a V block is `[b, s/cp, kv_dim]` (`kv_dim` per rank: divide by the TP
    size first). Forward: K and V each travel cp - 1 hops: 2(cp-1) blocks.
    Backward: K and V again, 2(cp-1) blocks, plus the dK and dV accumulators:
    2(cp-1) blocks (TransformerEngine's scheme), or 2cp when they travel a full
    ring back to their owner (`dkv_full_ring`, the course's and ring-flash-attention's).
    """
    if cp <= 1:
        return {"forward": 0.0, "backward": 0.0, "total": 0.0}
    if s % cp:
        raise ValueError(f"ring_attention_bytes_per_layer: the sequence ({s}) is not divisible by cp ({cp})")
    block = b * (s // cp) * kv_dim * bytes_per_element
    fwd = 2 * (cp - 1) * block
    bwd = 2 * (cp - 1) * block + (2 * cp if dkv_full_ring else 2 * (cp - 1)) * block
    return {"forward": float(fwd), "backward": float(bwd), "total": float(fwd + bwd)}


def zero_step_bytes(num_params: float, d: int, *, stage: int, param_bytes: int = 2, grad_bytes: int = 4,
                    microbatches: int = 1) -> dict[str, float]:
    """Bytes one rank sends per step for data parallelism over `d` ranks, per ZeRO stage (01's lesson).

    `reduce`: the gradients (`grad_bytes` each); `gather`: the parameters
    (`param_bytes` each). Stage 0 (DDP): one all-reduce of the gradients,
    2(d-1)/d P. Stages 1 and 2: a reduce-scatter of the gradients and an
    all-gather of the updated parameters, (d-1)/d P each. Stage 3 (FSDP):
    per micro-batch, all-gathers in forward and in backward and a reduce-scatter
    of the gradients. `dp_step_bytes` is the case param_bytes == grad_bytes.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_step_bytes: stage must be 0, 1, 2 or 3, got {stage!r}")
    half = ring_factor("all_gather", d) * num_params
    if stage == 0:
        reduce, gather = ring_factor("all_reduce", d) * num_params * grad_bytes, 0.0
    elif stage in (1, 2):
        reduce, gather = half * grad_bytes, half * param_bytes
    else:
        reduce, gather = microbatches * half * grad_bytes, microbatches * 2 * half * param_bytes
    return {"reduce": float(reduce), "gather": float(gather), "total": float(reduce + gather)}
