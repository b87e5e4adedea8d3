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
