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


# ===========================================================================
# 06_composition (the layout planner): traffic of CP, PP and ZeRO per step.
# Owned by assignment 06 (autograder/planner.py uses these); checked in
# tests/test_composition_volume.py. Kept apart from the other assignments' sections.
# ===========================================================================

__all__ += ["ring_attention_bytes_per_layer", "pipeline_p2p_bytes", "zero_step_bytes"]


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


def pipeline_p2p_bytes(s: int, b: int, h: int, microbatches: int, *, tp: int = 1, cp: int = 1,
                       sequence_parallel: bool = True, bytes_per_element: int = 2) -> dict[str, float]:
    """Bytes a middle pipeline stage sends per step (03's lesson): one activation forward, one gradient backward,
    per micro-batch.

    The tensor crossing a stage boundary is `[s/cp, b, h]`, and `[s/(cp*tp), b, h]`
    under sequence parallelism (Megatron sends the sequence shard; so does a
    `SequenceParallel` block's `Shard(1)` output in PyTorch). The first stage
    sends only the forward ones, the last only the backward ones.
    """
    seq = s // cp // (tp if sequence_parallel else 1)
    one = seq * b * h * bytes_per_element
    return {"forward": float(microbatches * one), "backward": float(microbatches * one),
            "total": float(2 * microbatches * one)}


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
