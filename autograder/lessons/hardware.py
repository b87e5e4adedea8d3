"""Stated hardware figures, and bytes and FLOPs turned into seconds with them.

    from autograder.lessons.hardware import H100_NODE, transfer_seconds, compute_seconds
    transfer_seconds(2 * 4096 * 8192 * 2, H100_NODE.nvlink)       # one bf16 [s, b, h] over NVLink
    compute_seconds(2 * 8192 * 4096 * 4096, H100_NODE, mfu=0.5)   # one bf16 matmul at 50 % of peak

Every lesson that turns a communication volume into time uses these figures,
stated once here (and printed by the lessons next to each number), so the
lessons, the capstone's planner and the tests agree. They are round public
figures for an 8-GPU H100 SXM node with one 400 Gb/s NDR InfiniBand NIC per
GPU; an estimate, not a measurement: real collectives reach 70-90 % of these
bandwidths, and latency dominates small messages (`Link.latency`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Link", "Node", "H100_NODE", "transfer_seconds", "compute_seconds", "ring_collective_seconds"]


@dataclass(frozen=True)
class Link:
    """A link as one GPU sees it: bytes per second per direction, and a per-message latency."""

    name: str
    bytes_per_s: float
    latency: float = 0.0  # seconds per message

    def describe(self) -> str:
        return f"{self.name} ({self.bytes_per_s / 1e9:g} GB/s per direction per GPU)"


@dataclass(frozen=True)
class Node:
    """One node of a cluster, with the figures the lessons use."""

    name: str
    gpus: int
    peak_flops: float         # dense bf16 FLOP/s per GPU (no sparsity)
    hbm_bytes: float          # memory per GPU
    nvlink: Link              # inside the node
    network: Link             # between nodes (per GPU)

    def link(self, *, crosses_nodes: bool) -> Link:
        """The link a group's traffic runs on: the network once the group spans nodes."""
        return self.network if crosses_nodes else self.nvlink


# H100 SXM: 989 TFLOP/s dense bf16, 80 GB HBM3; NVLink 4: 900 GB/s bidirectional
# = 450 GB/s per direction; NDR InfiniBand: 400 Gb/s = 50 GB/s per GPU (one NIC each).
H100_NODE = Node(
    name="8x H100 SXM (NVLink 4, NDR InfiniBand)",
    gpus=8,
    peak_flops=989e12,
    hbm_bytes=80e9,
    nvlink=Link("NVLink", 450e9, latency=3e-6),
    network=Link("InfiniBand NDR", 50e9, latency=5e-6),
)


def transfer_seconds(nbytes: float, link: Link, *, messages: int = 1) -> float:
    """Time to send `nbytes` (per GPU, one direction) over `link`, in `messages` messages."""
    if nbytes < 0 or messages < 0:
        raise ValueError(f"transfer_seconds: nbytes ({nbytes}) and messages ({messages}) must be >= 0")
    return nbytes / link.bytes_per_s + messages * link.latency


def ring_collective_seconds(sent_bytes: float, group_size: int, link: Link) -> float:
    """A ring collective whose ranks each send `sent_bytes` in total: bandwidth term + one latency per step.

    `sent_bytes` is what autograder.lessons.volume computes (e.g. 2(t-1)/t * N for an
    all-reduce, which runs 2(t-1) steps; an all-gather or reduce-scatter t-1).
    """
    if group_size <= 1:
        return 0.0
    return transfer_seconds(sent_bytes, link, messages=group_size - 1)


def compute_seconds(flops: float, node: Node = H100_NODE, *, mfu: float = 1.0) -> float:
    """Time for `flops` on one GPU of `node` at model-FLOPs utilisation `mfu` (0 < mfu <= 1)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"compute_seconds: mfu must be in (0, 1], got {mfu}")
    if flops < 0:
        raise ValueError(f"compute_seconds: flops must be >= 0, got {flops}")
    return flops / (node.peak_flops * mfu)
