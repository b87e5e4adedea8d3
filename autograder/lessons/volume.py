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

__all__ = ["ring_factor", "bytes_sent", "tp_pair_bytes", "tp_layer_bytes", "dp_step_bytes",
           "transformer_layer_step_flops", "tp_layer_seconds", "dp_step_seconds"]


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
# Time, not only bytes (assignments 01 and 02, the "Time, not only bytes" sections)
# ---------------------------------------------------------------------------
# The volumes above turned into seconds with the stated figures of autograder/lessons/hardware.py, next to the
# compute they must hide behind. Compute is counted at `mfu` of the peak (default 1.0, the fastest compute
# the figures allow: the communication/compute ratios are then the largest, an upper bound to hide).

def transformer_layer_step_flops(s: int, b: int, h: int, *, ffn: int | None = None) -> float:
    """Matmul FLOPs of one transformer layer for a training step (forward + backward = 3x forward).

    Forward: Q, K, V and output projections 8·s·b·h², the MLP 4·s·b·h·ffn, the
    attention scores and their product with V 4·s²·b·h (with ffn = 4h:
    transformer_layer_flops below, the pipeline lesson's forward count). The
    step is Narayanan et al. (2021, eq. 2)'s 72·s·b·h²·(1 + s/6h).
    """
    ffn = 4 * h if ffn is None else ffn
    forward = 8 * s * b * h * h + 4 * s * b * h * ffn + 4 * s * s * b * h
    return 3.0 * forward


def tp_layer_seconds(s: int, b: int, h: int, t: int, *, link, node=None, bytes_per_element: int = 2,
                     mfu: float = 1.0) -> dict[str, float]:
    """One transformer layer's TP step on one rank: compute time, communication time, and their ratio.

    Compute: transformer_layer_step_flops / t at `mfu` of the node's peak.
    Communication: tp_layer_bytes, as 8 ring passes of (t-1)/t of [s, b, h]
    over `t` ranks on `link` (2 pairs x 1 all-reduce in forward and 1 in
    backward, an all-reduce being a reduce-scatter plus an all-gather; with SP
    the same 8 passes as all-gathers and reduce-scatters, the input kept for
    the weight gradient), not overlapped: the ratio says how much compute
    there is to hide them behind.
    """
    from autograder.lessons.hardware import H100_NODE, compute_seconds, ring_collective_seconds

    node = node or H100_NODE
    compute = compute_seconds(transformer_layer_step_flops(s, b, h) / t, node, mfu=mfu)
    one_pass = ring_factor("all_gather", t) * s * b * h * bytes_per_element
    assert abs(8 * one_pass - tp_layer_bytes(s, b, h, t, bytes_per_element=bytes_per_element)["total"]) < 1
    communication = 8 * ring_collective_seconds(one_pass, t, link)
    return {"compute": compute, "communication": communication, "ratio": communication / compute}


def dp_step_seconds(num_params: float, d: int, tokens_per_microbatch: int, *, link, node=None,
                    microbatches: int = 1, bytes_per_element: int = 2, scheme: str = "ddp",
                    mfu: float = 1.0) -> dict[str, float]:
    """One data-parallel step on one rank: compute time, gradient-communication time, and their ratio.

    Compute: 6 FLOPs per parameter per token (forward 2, backward 4) for
    `microbatches` accumulated micro-batches of `tokens_per_microbatch` tokens.
    Communication: dp_step_bytes once per step (no_sync: nothing in the other
    micro-steps), as ring collectives over `d` ranks on `link`. For ddp the
    ratio is 2(d-1)/d · B · peak / (6 · tokens · microbatches · bandwidth):
    the model size cancels out.
    """
    from autograder.lessons.hardware import H100_NODE, compute_seconds, ring_collective_seconds

    node = node or H100_NODE
    compute = compute_seconds(6.0 * num_params * tokens_per_microbatch * microbatches, node, mfu=mfu)
    passes = {"ddp": 2, "zero": 2, "fsdp": 3}[scheme]  # ring passes of (d-1)/d of the buffer (all-reduce: 2)
    sent = dp_step_bytes(num_params, d, bytes_per_element=bytes_per_element, scheme=scheme)
    communication = passes * ring_collective_seconds(sent / passes, d, link)
    return {"compute": compute, "communication": communication, "ratio": communication / compute}


# ---------------------------------------------------------------------------
# Pipeline parallelism (assignment 03, README sections 2-5); checked in tests/test_pipeline_parallel_volume.py
# ---------------------------------------------------------------------------

__all__ += ["pp_bubble_fraction", "pp_boundary_bytes", "pp_step_p2p_bytes", "pp_peak_outputs", "transformer_layer_flops",
            "pp_stage_seconds", "pp_bubble_seconds", "pp_step_seconds", "activation_bytes_per_layer",
            "pp_stage_activation_bytes", "pp_bubble_time", "zb_readme_bubble_rate"]


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
    from autograder.lessons.hardware import H100_NODE, compute_seconds

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


def pp_bubble_time(schedule: str, num_stages: int, *, forward: float, backward: float, weight: float = 0.0,
                   pair: float | None = None) -> float:
    """Idle time per rank of one step, as its source states it: F (`forward`), B (`backward`, the whole backward)
    and W (`weight`, the weight-gradient part of B) are one stage's times on one micro-batch.

    "1f1b": (p - 1)(F + B); "zb-h1": (p - 1)(F + B - 2W) (Qi et al. 2024, ZB-H1; the ZB1P row of DualPipe's
    README); "zb-h2": (p - 1)(F + B - 3W) (the paper's Table 2, T_F + T_B - 2 T_W with its B the input gradient
    only: 0 when F = B - W = W; not simulated, the course has no ZB-H2 list); "dualpipe": (PP/2 - 1)(F&B + B - 3W), DualPipe's README (DeepSeek-V3 report, Table 2), where
    `num_stages` is its PP (stages, not ranks: DualPipeV runs PP stages on PP/2 ranks), F, B, W are the times
    of one of those stages and F&B (`pair`, default F + B: no overlap) the time of an overlapped forward and
    backward pair. The course's simulator (`simulate_schedules`) reproduces the first two exactly (03's
    exercise 7), and the third with `pairs="joint"` when F = B - W >= W (tests/test_pipeline_zero_bubble.py).
    """
    p, f, b, w = num_stages, forward, backward, weight
    if p < 1:
        raise ValueError(f"pp_bubble_time: num_stages must be >= 1, got {p}")
    if schedule == "1f1b":
        return (p - 1) * (f + b)
    if schedule == "zb-h1":
        return (p - 1) * (f + b - 2 * w)
    if schedule == "zb-h2":
        return (p - 1) * (f + b - 3 * w)
    if schedule == "dualpipe":
        if p % 2:
            raise ValueError(f"pp_bubble_time: DualPipe's PP (num_stages) must be even, got {p}")
        return (p // 2 - 1) * ((f + b if pair is None else pair) + b - 3 * w)
    raise ValueError(f"pp_bubble_time: schedule must be '1f1b', 'zb-h1', 'zb-h2' or 'dualpipe', got {schedule!r}")


def zb_readme_bubble_rate(schedule: str, num_stages: int, num_microbatches: int) -> float:
    """The bubble rates of the zero-bubble authors' README (sail-sg/zero-bubble-pipeline-parallelism, "Comparision
    of Schedules", assuming T_F = T_B = T_W): 1F1B (p - 1)/(m + p - 1) =: R, ZB1P R/3, ZB2P and ZBV 0, V-Half
    R/2, V-Min 2R/3 (the README adds an O(n) overhead it does not size: left out here). R/3 is a third of 1F1B's
    bubble over 1F1B's step; ZB-H1's idle fraction of its own, shorter step is (p - 1)/(3m + p - 1)."""
    p, m = num_stages, num_microbatches
    if min(p, m) < 1:
        raise ValueError(f"zb_readme_bubble_rate: p ({p}) and m ({m}) must be >= 1")
    rate = (p - 1) / (m + p - 1)
    factors = {"1f1b": 1.0, "zb1p": 1 / 3, "zb2p": 0.0, "zbv": 0.0, "v-half": 1 / 2, "v-min": 2 / 3}
    if schedule not in factors:
        raise ValueError(f"zb_readme_bubble_rate: schedule must be one of {sorted(factors)}, got {schedule!r}")
    return rate * factors[schedule]


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
    autograder/lessons/hardware.py's stated figures; an estimate with uniform routing.
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


# ---------------------------------------------------------------------------
# Expert parallelism: the two-hop dispatch, and load imbalance (README sections 4-5)
# ---------------------------------------------------------------------------

__all__ += ["two_hop_dispatch", "fp8_bytes_per_element", "simulate_expert_loads", "expert_capacity",
            "capacity_drop_fraction",
            "uniform_drop_fraction", "place_experts", "busiest_gpu_over_mean", "expert_load_table"]


def two_hop_dispatch(k: int, max_nodes: int, *, nvlink_bytes_per_s: float, network_bytes_per_s: float) -> dict:
    """DeepSeek-V3's cross-node dispatch (report sec. 3.2.2), per token, with node-limited routing.

    A token crosses the network once per target node, to the GPU with its own
    in-node index, which forwards it over NVLink to the GPUs of its experts in
    that node. In the time the network carries one copy, NVLink carries
    nvlink / network copies: a token may use that many experts per node, and
    max_nodes times that in all, at the cost of its network copies alone.
    """
    if not 1 <= max_nodes <= k:
        raise ValueError(f"two_hop_dispatch: need 1 <= max_nodes ({max_nodes}) <= k ({k})")
    ratio = nvlink_bytes_per_s / network_bytes_per_s
    return {"network_copies": max_nodes, "bandwidth_ratio": ratio, "experts_per_node": k / max_nodes,
            "max_experts_same_cost": max_nodes * ratio, "network_bound": k / max_nodes <= ratio}


def fp8_bytes_per_element(block: int = 128, scale_bytes: int = 4) -> float:
    """Bytes per element of an FP8 (e4m3) token with one fp32 scale per `block` elements: DeepEP V1's
    `Buffer.dispatch` takes `[T, h]` float8 plus `[T, h / 128]` float scales."""
    return 1 + scale_bytes / block


def simulate_expert_loads(num_tokens: int, k: int, num_experts: int, *, num_ranks: int = 1,
                          bias_std: float = 0.0, bias_seed: int = 0, seed: int = 1):
    """Rows each expert receives from each source rank in one step: int64 `[num_ranks, num_experts]`.

    A model of a router: each token's logits are a per-expert bias (the
    router's standing preference, `bias_std * z_e` with z ~ N(0, 1), drawn
    from `bias_seed`, the same on every rank and every step) plus independent
    N(0, 1) noise per token (drawn from `seed`); each token takes its top k.
    bias_std = 0 is a perfectly balanced router: only sampling noise is left.
    DeepSeek-V3's auxiliary-loss-free balancing learns the bias that cancels
    such a preference. Seeded: the same arguments give the same loads.
    """
    import torch

    if not 1 <= k <= num_experts or min(num_tokens, num_ranks) < 1 or bias_std < 0:
        raise ValueError(f"simulate_expert_loads: need 1 <= k ({k}) <= E ({num_experts}), tokens and ranks >= 1, "
                         f"bias_std >= 0 ({bias_std})")
    bias = bias_std * torch.randn(num_experts, generator=torch.Generator().manual_seed(bias_seed))
    noise = torch.Generator().manual_seed(seed)
    loads = torch.zeros(num_ranks, num_experts, dtype=torch.int64)
    for r in range(num_ranks):
        logits = bias + torch.randn(num_tokens, num_experts, generator=noise)                          # [T, E]
        chosen = logits.topk(k, dim=1).indices                                                         # [T, k]
        loads[r] = torch.bincount(chosen.flatten(), minlength=num_experts)
    return loads


def expert_capacity(num_tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    """Rows an expert accepts from one source rank: ceil(T k / E * cf), the lesson's formula (Megatron's
    `moe_utils.get_capacity`, with T k routed rows)."""
    import math

    return math.ceil(num_tokens * k / num_experts * capacity_factor)


def capacity_drop_fraction(loads, *, num_tokens: int, k: int, capacity_factor: float) -> float:
    """Fraction of all routed (token, expert) rows dropped when every expert keeps at most
    `expert_capacity` rows from each source rank (applied per rank before dispatch, as Megatron's
    `apply_router_token_dropping` does). `loads`: `[ranks, E]` rows per source rank."""
    kept = expert_capacity(num_tokens, k, loads.shape[-1], capacity_factor)
    return float((loads - kept).clamp(min=0).sum() / loads.sum())


def uniform_drop_fraction(num_tokens: int, k: int, num_experts: int, capacity_factor: float) -> float:
    """The exact expected drop fraction of a perfectly balanced router.

    A token takes k distinct experts uniformly at random, so it includes a
    given expert with probability k/E, independently of the other tokens: an
    expert's load from one rank is Binomial(T, k/E), and the fraction dropped
    is E[(X - capacity)^+] / (T k / E).
    """
    import math

    p = k / num_experts
    kept = expert_capacity(num_tokens, k, num_experts, capacity_factor)
    log_norm = math.lgamma(num_tokens + 1)
    excess = 0.0
    for x in range(kept + 1, num_tokens + 1):
        log_pmf = (log_norm - math.lgamma(x + 1) - math.lgamma(num_tokens - x + 1)
                   + x * math.log(p) + (num_tokens - x) * math.log1p(-p))
        excess += math.exp(log_pmf) * (x - kept)
    return excess / (num_tokens * p)


def place_experts(expert_loads, num_gpus: int, num_redundant: int = 0) -> list[list[int]]:
    """The experts each GPU hosts, balanced on `expert_loads` (`[E]`), as DeepSeek's EPLB does it.

    Two greedy steps (deepseek-ai/EPLB `eplb.py`: `replicate_experts`, then
    `balanced_packing`): each of the `num_redundant` extra replicas goes to the
    expert with the highest load per replica; then the replicas, heaviest
    first (an expert's load split evenly over its replicas), each go to the
    least-loaded GPU that still has one of its (E + R) / G slots free.
    """
    loads = [float(x) for x in expert_loads]
    num_experts = len(loads)
    if num_gpus < 1 or num_redundant < 0 or (num_experts + num_redundant) % num_gpus:
        raise ValueError(f"place_experts: E + R ({num_experts} + {num_redundant}) must be divisible by the "
                         f"number of GPUs ({num_gpus})")
    replicas = [1] * num_experts
    for _ in range(num_redundant):
        e = max(range(num_experts), key=lambda i: (loads[i] / replicas[i], -i))
        replicas[e] += 1
    items = sorted(((loads[e] / replicas[e], e) for e in range(num_experts) for _ in range(replicas[e])),
                   key=lambda item: (-item[0], item[1]))
    slots = (num_experts + num_redundant) // num_gpus
    weight, gpus = [0.0] * num_gpus, [[] for _ in range(num_gpus)]
    for w, e in items:
        g = min((i for i in range(num_gpus) if len(gpus[i]) < slots), key=lambda i: (weight[i], i))
        weight[g] += w
        gpus[g].append(e)
    return gpus


def busiest_gpu_over_mean(expert_loads, gpus: list[list[int]]) -> float:
    """Rows on the busiest GPU over the mean, each expert's rows split evenly over its replicas."""
    loads = [float(x) for x in expert_loads]
    replicas = [0] * len(loads)
    for hosted in gpus:
        for e in hosted:
            replicas[e] += 1
    if any(n == 0 for n in replicas):
        raise ValueError("busiest_gpu_over_mean: every expert must be hosted by at least one GPU")
    per_gpu = [sum(loads[e] / replicas[e] for e in hosted) for hosted in gpus]
    return max(per_gpu) / (sum(per_gpu) / len(per_gpu))


def expert_load_table(*, num_tokens: int = 4096, k: int = 8, num_experts: int = 256, ep_size: int = 32,
                      bias_stds=(0.0, 0.1, 0.2), capacity_factors=(1.0, 1.25, 1.5, 2.0),
                      num_redundant: int = 32) -> str:
    """The README's load-imbalance table (section 5), simulated by `simulate_expert_loads`.

    One step of an EP group of `ep_size` ranks, each routing `num_tokens`
    tokens: the hottest expert's rows over the mean (whole group), the drop
    fraction at each capacity factor (capacity per source rank), and the
    busiest GPU over the mean without dropping: experts placed contiguously
    (Megatron: rank r holds experts [r E/w, (r+1) E/w)), placed by EPLB's
    packing, and with `num_redundant` redundant experts. Placements are
    planned on one step's loads and measured on the next step's (a new
    `seed`, the same router bias), as a deployment plans from past counts.
    """
    if num_experts % ep_size:
        raise ValueError(f"expert_load_table: E ({num_experts}) must be divisible by the EP size ({ep_size})")
    per_gpu = num_experts // ep_size
    head = ("| router bias std | hottest expert / mean | "
            + " | ".join(f"dropped at cf {cf:g}" for cf in capacity_factors)
            + f" | busiest GPU / mean: contiguous | EPLB packing | + {num_redundant} redundant |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for std in bias_stds:
        step = simulate_expert_loads(num_tokens, k, num_experts, num_ranks=ep_size, bias_std=std, seed=1)
        following = simulate_expert_loads(num_tokens, k, num_experts, num_ranks=ep_size, bias_std=std,
                                          seed=2).sum(0)
        total = step.sum(0)
        hottest = float(total.max()) / float(total.float().mean())
        drops = [capacity_drop_fraction(step, num_tokens=num_tokens, k=k, capacity_factor=cf)
                 for cf in capacity_factors]
        contiguous = [list(range(g * per_gpu, (g + 1) * per_gpu)) for g in range(ep_size)]
        placed = [busiest_gpu_over_mean(following, contiguous),
                  busiest_gpu_over_mean(following, place_experts(total, ep_size)),
                  busiest_gpu_over_mean(following, place_experts(total, ep_size, num_redundant))]
        lines.append(f"| {std:g} | {hottest:.2f} | " + " | ".join(f"{100 * d:.2f} %" for d in drops)
                     + " | " + " | ".join(f"{x:.3f}" for x in placed) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Context parallelism (assignment 04, README sections 3-4): bytes per rank and time
# ---------------------------------------------------------------------------
# One attention layer, one micro-batch, activations [b, s, h]; K and V are
# [b, s, kv_hidden] (kv_hidden = n_kv_heads * head_dim: smaller than h with GQA).
# Bytes are SENT by each rank (it receives as much). Time uses the stated
# figures of autograder/lessons/hardware.py; tests/test_context_parallel_volume.py checks
# the byte formulas against the ledgers of the reference solutions.

__all__ += ["cp_ring_bytes", "cp_ulysses_bytes", "cp_allgather_bytes", "cp_bytes_sent", "attention_flops",
            "ring_step_seconds", "ring_overlap_min_tokens", "cp_attention_seconds", "cp_comparison_table",
            "cp_winner_grid"]

def cp_ring_bytes(s: int, b: int, kv_hidden: int, w: int, *, bytes_per_element: int = 2,
                  grad_bytes_per_element: int | None = None, dkv_sends: str = "ring") -> dict[str, float]:
    """Ring attention (P2P): forward sends K and V blocks [b, s/w, kv] w - 1 times each; backward sends them
    again, plus the dK/dV accumulators w times (a full turn home, `dkv_sends="ring"`) or w - 1 ("te")."""
    if w <= 1:
        return {"forward": 0.0, "backward": 0.0, "total": 0.0}
    if dkv_sends not in ("ring", "te"):
        raise ValueError(f"dkv_sends must be 'ring' or 'te', got {dkv_sends!r}")
    gbytes = bytes_per_element if grad_bytes_per_element is None else grad_bytes_per_element
    block = b * (s // w) * kv_hidden  # elements of one K (or V) block
    fwd = 2 * (w - 1) * block * bytes_per_element
    turns = w if dkv_sends == "ring" else w - 1
    bwd = fwd + 2 * turns * block * gbytes
    return {"forward": float(fwd), "backward": float(bwd), "total": float(fwd + bwd)}


def cp_ulysses_bytes(s: int, b: int, hidden: int, kv_hidden: int, w: int, *,
                     bytes_per_element: int = 2) -> dict[str, float]:
    """Ulysses: all-to-alls of q, k, v, out ([b, s/w, .] each); a rank keeps 1/w of each and sends (w-1)/w.
    Backward: the four inverse all-to-alls (of dout, dq, dk, dv), the same bytes."""
    if w <= 1:
        return {"forward": 0.0, "backward": 0.0, "total": 0.0}
    local = b * (s // w) * (2 * hidden + 2 * kv_hidden) * bytes_per_element
    fwd = (w - 1) / w * local
    return {"forward": fwd, "backward": fwd, "total": 2 * fwd}


def cp_allgather_bytes(s: int, b: int, kv_hidden: int, w: int, *, bytes_per_element: int = 2,
                       regather: bool = True) -> dict[str, float]:
    """All-gathered K/V (Megatron `--cp-comm-type all_gather`, Llama 3): all-gather K and V to [b, s, kv] in
    forward; in backward reduce-scatter dK and dV, after gathering K and V again (`regather`, as
    TransformerEngine's AttnFuncWithCPAndKVAllGather does to save memory) or keeping them from forward."""
    if w <= 1:
        return {"forward": 0.0, "backward": 0.0, "total": 0.0}
    full = b * s * kv_hidden * bytes_per_element
    fwd = 2 * ring_factor("all_gather", w) * full
    bwd = (fwd if regather else 0.0) + 2 * ring_factor("reduce_scatter", w) * full
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def cp_bytes_sent(records, *, phase: str | None = None) -> float:
    """Bytes a rank sent by P2P and all-to-all in `records` (a send: its tensor; an all-to-all: (t-1)/t of its
    input), plus its ring collectives (`bytes_sent`)."""
    total = bytes_sent(records, phase=phase)
    for r in records:
        if phase is not None and r.phase != phase:
            continue
        if r.op == "send":
            total += r.bytes
        elif r.op == "all_to_all" and r.group_size > 1:
            total += (r.group_size - 1) / r.group_size * r.bytes
    return total


def attention_flops(s_q: int, s_k: int, b: int, hidden: int, *, phase: str = "forward") -> float:
    """Matmul FLOPs of softmax attention of s_q queries over s_k keys (hidden = n_heads * head_dim): forward
    q k^T and p v, 2 * 2 b s_q s_k h; backward (FlashAttention-2, scores recomputed) 5 matmuls, 2.5x forward."""
    fwd = 4.0 * b * s_q * s_k * hidden
    if phase == "forward":
        return fwd
    if phase == "backward":
        return 2.5 * fwd
    raise ValueError(f"phase must be 'forward' or 'backward', got {phase!r}")


def ring_step_seconds(s_local: int, b: int, hidden: int, kv_hidden: int, *, link, node=None, mfu: float = 0.5,
                      bytes_per_element: int = 2, grad_bytes_per_element: int = 4, phase: str = "forward",
                      work_fraction: float = 1.0) -> dict[str, float]:
    """One ring step on the busiest rank: the block's attention compute against the transfer posted with it.

    Forward: compute one block (s_local x s_local; `work_fraction` 0.5 for a zigzag half block) while K and V
    blocks travel. Backward: the block's backward while K/V and the dK/dV accumulators (in
    `grad_bytes_per_element`, float32 in ring-flash-attention) travel.
    """
    from .hardware import H100_NODE, compute_seconds, transfer_seconds

    node = node or H100_NODE
    flops = attention_flops(s_local, s_local, b, hidden, phase=phase) * work_fraction
    block = b * s_local * kv_hidden
    nbytes = 2 * block * bytes_per_element + (2 * block * grad_bytes_per_element if phase == "backward" else 0)
    messages = 2 if phase == "forward" else 4
    return {"compute": compute_seconds(flops, node, mfu=mfu),
            "transfer": transfer_seconds(nbytes, link, messages=messages)}


def ring_overlap_min_tokens(hidden: int, kv_hidden: int, *, link, node=None, mfu: float = 0.5, b: int = 1,
                            bytes_per_element: int = 2, grad_bytes_per_element: int = 4, phase: str = "forward",
                            work_fraction: float = 1.0) -> int:
    """The smallest sequence length per rank (s/w) at which a ring step's transfer hides under its compute.

    Compute grows as (s/w)^2 and the transfer as s/w (plus a latency per message), so above this length the
    ring's communication is free; below it the ring waits on the link. Solves c x^2 = a x + L for x.
    """
    import math

    one = ring_step_seconds(1, b, hidden, kv_hidden, link=link, node=node, mfu=mfu,
                            bytes_per_element=bytes_per_element, grad_bytes_per_element=grad_bytes_per_element,
                            phase=phase, work_fraction=work_fraction)
    messages = 2 if phase == "forward" else 4
    latency = messages * link.latency
    c, a = one["compute"], one["transfer"] - latency  # seconds per token^2, per token
    x = (a + math.sqrt(a * a + 4 * c * latency)) / (2 * c)
    return math.ceil(x)


def cp_attention_seconds(s: int, b: int, hidden: int, kv_hidden: int, w: int, *, scheme: str, link, node=None,
                         mfu: float = 0.5, bytes_per_element: int = 2) -> dict[str, float]:
    """Forward time of one non-causal attention layer on a rank of a CP group of w: compute, and the
    communication that is NOT hidden under it.

    ring: w steps of one block each; each of the first w - 1 steps takes max(compute, transfer), so the
    exposed communication is (w - 1) * max(0, transfer - compute). ulysses: the same compute (the whole
    sequence for n/w heads); its all-to-alls come before and after it: all exposed.
    """
    from .hardware import H100_NODE, transfer_seconds

    node = node or H100_NODE
    step = ring_step_seconds(s // w, b, hidden, kv_hidden, link=link, node=node, mfu=mfu,
                             bytes_per_element=bytes_per_element)
    compute = w * step["compute"]
    if w <= 1:
        exposed = 0.0
    elif scheme == "ring":
        exposed = (w - 1) * max(0.0, step["transfer"] - step["compute"])
    elif scheme == "ulysses":
        sent = cp_ulysses_bytes(s, b, hidden, kv_hidden, w, bytes_per_element=bytes_per_element)["forward"]
        exposed = transfer_seconds(sent, link, messages=4 * (w - 1))
    else:
        raise ValueError(f"scheme must be 'ring' or 'ulysses', got {scheme!r}")
    return {"compute": compute, "exposed": exposed, "total": compute + exposed}


def cp_comparison_table(*, seq: int, batch: int, hidden: int, kv_hidden: int, cp: int, node=None,
                        mfu: float = 0.5, bytes_per_element: int = 2) -> str:
    """README section 4: bytes per rank of the three schemes, and the forward time of ring and Ulysses
    inside a node (NVLink) and across nodes (InfiniBand), with the s/w above which the ring's transfers hide.
    A markdown table (the README quotes it verbatim; a test regenerates it)."""
    from .hardware import H100_NODE

    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("kv_hidden", kv_hidden), ("cp", cp)):
        positive_int = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not positive_int:
            raise ValueError(f"cp_comparison_table: {name} must be a positive int, got {value!r}")
    if seq % cp:
        raise ValueError(f"cp_comparison_table: seq ({seq}) must be divisible by cp ({cp}): each rank holds s / cp "
                         f"tokens")
    node = node or H100_NODE
    ring = cp_ring_bytes(seq, batch, kv_hidden, cp, bytes_per_element=bytes_per_element)
    uly = cp_ulysses_bytes(seq, batch, hidden, kv_hidden, cp, bytes_per_element=bytes_per_element)
    agk = cp_allgather_bytes(seq, batch, kv_hidden, cp, bytes_per_element=bytes_per_element)
    mib = 2 ** 20
    lines = [f"s = {seq}, b = {batch}, h = {hidden}, kv = {kv_hidden}, CP = {cp}, {8 * bytes_per_element}-bit, "
             f"MFU {mfu:g}. Forward bytes sent per rank: ring {ring['forward'] / mib:.0f} MiB, Ulysses "
             f"{uly['forward'] / mib:.0f} MiB, all-gathered K/V {agk['forward'] / mib:.0f} MiB.",
             "",
             "| CP group on | ring step: compute | ring step: transfer | ring hides above s/w | ring forward | "
             "Ulysses forward |",
             "|---|---|---|---|---|---|"]
    for link in (node.nvlink, node.network):
        step = ring_step_seconds(seq // cp, batch, hidden, kv_hidden, link=link, node=node, mfu=mfu,
                                 bytes_per_element=bytes_per_element)
        tokens = ring_overlap_min_tokens(hidden, kv_hidden, link=link, node=node, mfu=mfu, b=batch,
                                         bytes_per_element=bytes_per_element)
        r = cp_attention_seconds(seq, batch, hidden, kv_hidden, cp, scheme="ring", link=link, node=node, mfu=mfu,
                                 bytes_per_element=bytes_per_element)
        u = cp_attention_seconds(seq, batch, hidden, kv_hidden, cp, scheme="ulysses", link=link, node=node,
                                 mfu=mfu, bytes_per_element=bytes_per_element)
        lines.append(f"| {link.describe()} | {step['compute'] * 1e3:.2f} ms | {step['transfer'] * 1e3:.2f} ms | "
                     f"{tokens} | {r['total'] * 1e3:.1f} ms | {u['total'] * 1e3:.1f} ms |")
    return "\n".join(lines)


def cp_winner_grid(*, hidden: int, kv_hidden: int, seqs, cps, link, node=None, batch: int = 1, mfu: float = 0.5,
                   bytes_per_element: int = 2) -> str:
    """README section 4: forward time of ring vs Ulysses for sequence lengths x CP sizes on one link, as a
    markdown table: each cell `ring ms / Ulysses ms: faster`."""
    header = "| s \\ CP (ring / Ulysses, ms) | " + " | ".join(str(c) for c in cps) + " |"
    lines = [header, "|---" * (len(cps) + 1) + "|"]
    for s in seqs:
        cells = []
        for w in cps:
            r = cp_attention_seconds(s, batch, hidden, kv_hidden, w, scheme="ring", link=link, node=node, mfu=mfu,
                                     bytes_per_element=bytes_per_element)["total"] * 1e3
            u = cp_attention_seconds(s, batch, hidden, kv_hidden, w, scheme="ulysses", link=link, node=node,
                                     mfu=mfu, bytes_per_element=bytes_per_element)["total"] * 1e3
            cells.append(f"{r:.3g} / {u:.3g}: **{'ring' if r <= u else 'Ulysses'}**")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    if cp > 1 and s % cp:
        raise ValueError(f"ring_attention_bytes_per_layer: the sequence ({s}) is not divisible by cp ({cp})")
    return cp_ring_bytes(s, b, kv_dim, cp, bytes_per_element=bytes_per_element,
                         dkv_sends="ring" if dkv_full_ring else "te")


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
