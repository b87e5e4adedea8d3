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
# The volumes above turned into seconds with the stated figures of autograder/hardware.py, next to the
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
    from autograder.hardware import H100_NODE, compute_seconds, ring_collective_seconds

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
    from autograder.hardware import H100_NODE, compute_seconds, ring_collective_seconds

    node = node or H100_NODE
    compute = compute_seconds(6.0 * num_params * tokens_per_microbatch * microbatches, node, mfu=mfu)
    passes = {"ddp": 2, "zero": 2, "fsdp": 3}[scheme]  # ring passes of (d-1)/d of the buffer (all-reduce: 2)
    sent = dp_step_bytes(num_params, d, bytes_per_element=bytes_per_element, scheme=scheme)
    communication = passes * ring_collective_seconds(sent / passes, d, link)
    return {"compute": compute, "communication": communication, "ratio": communication / compute}


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
