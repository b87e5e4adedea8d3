"""The ledger's record of the all-to-alls (assignment 05 needs them exact).

    .venv/bin/python -m pytest -q tests/test_expert_parallel_ledger.py

A list `dist.all_to_all` is recorded at its full size (all pieces
concatenated, one split per piece), as list all-gathers and reduce-scatters
are; `all_to_all_single` keeps its record (the input, the given splits).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autograder.runtime.dist import run_distributed
from autograder.runtime.ledger import CommLedger
from autograder.lessons.volume import all_to_all_traffic


def _program(rank, world_size):
    with CommLedger() as ledger:
        pieces = [torch.full((2, 3), float(rank)) for _ in range(world_size)]  # gloo: equal pieces only
        out = [torch.empty(2, 3) for _ in range(world_size)]
        dist.all_to_all(out, pieces)
        flat = [torch.full((5,), float(rank)) for _ in range(world_size)]
        dist.all_to_all([torch.empty(5) for _ in range(world_size)], flat)
        ins = [1, 2, 0][:world_size] if rank == 0 else [2, 1, 3][:world_size]
        dist.all_to_all_single(torch.empty(sum([1, 2] if rank == 0 else [2, 1]), 4), torch.ones(sum(ins), 4),
                               output_split_sizes=[1, 2] if rank == 0 else [2, 1], input_split_sizes=ins)
    return ledger.records, [o[0, 0].item() for o in out]


def test_list_all_to_all_is_recorded_at_full_size():
    results = run_distributed(_program, 2)
    for rank, (records, received) in enumerate(results):
        assert received == [0.0, 1.0]
        listed, flat, single = records
        assert (listed.op, listed.shape, listed.bytes) == ("all_to_all", (4, 3), 4 * 3 * 4)
        assert listed.input_split_sizes == (2, 2) and listed.output_split_sizes == (2, 2)
        assert (flat.shape, flat.input_split_sizes) == ((10,), (5, 5))
        want_in = (1, 2) if rank == 0 else (2, 1)
        assert (single.shape, single.input_split_sizes) == ((3, 4), want_in)
        # what leaves the rank: the pieces for the other rank only
        assert all_to_all_traffic(listed, rank) == (2 * 3 * 4, 2 * 3 * 4)
        assert all_to_all_traffic(single, rank) == (want_in[1 - rank] * 16, 2 * 16)
