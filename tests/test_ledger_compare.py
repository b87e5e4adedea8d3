"""The communication ledger and the comparison helpers.

    .venv/bin/python -m pytest -q tests/test_ledger_compare.py
"""

import pytest
import torch
import torch.distributed as dist

from autograder.runtime.compare import TOLERANCES, CheckFailure, assert_close
from autograder.runtime.dist import run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, counts, expect_comm, expect_no_comm, select


class _AllReduceInBackward(torch.autograd.Function):
    """Identity in forward, async all-reduce in backward (like Megatron's f)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        work = dist.all_reduce(grad, async_op=True)
        work.wait()
        return grad


def _program(rank, world_size):
    from torch.distributed import all_reduce as early_imported_all_reduce  # imported before tracing

    with CommLedger(trace_compute=True) as ledger:
        x = torch.ones(4, 3, dtype=torch.float64, requires_grad=True)
        y = _AllReduceInBackward.apply(x * 2)
        z = y.detach().clone()
        early_imported_all_reduce(z)
        y.sum().backward()
        with ledger.outside():
            out = torch.empty(4 * world_size, 3)
            dist.all_gather_single(out, torch.ones(4, 3))
            shard = torch.empty(2, 3)
            dist.reduce_scatter_single(shard, torch.ones(2 * world_size, 3))
        pieces = [torch.empty(2, 3) for _ in range(world_size)]
        dist.all_gather(pieces, torch.ones(2, 3))  # the list API: recorded as the full [2w, 3]
        a = torch.empty(4, 3)
        dist.all_to_all_single(a, torch.ones(4, 3), [2, 2], [2, 2])
        ops = [dist.P2POp(dist.isend, torch.ones(5), (rank + 1) % world_size),
               dist.P2POp(dist.irecv, torch.empty(5), (rank - 1) % world_size)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return ledger.records, ledger.ops


def test_ledger_records_ops_shapes_and_phases():
    results = run_distributed(_program, 2)
    records, ops = results[1]
    ar = select(records, op="all_reduce")
    assert [(r.phase, r.shape, r.dtype, r.group_size, r.async_op) for r in ar] == [
        ("forward", (4, 3), "float64", 2, False),
        ("backward", (4, 3), "float64", 2, True),
    ]
    gathers = select(records, op="all_gather")
    assert [(g.shape, g.phase, g.bytes) for g in gathers] == [((8, 3), "outside", 96), ((4, 3), "forward", 48)]
    assert select(records, op="reduce_scatter")[0].shape == (4, 3)  # the full input
    a2a = select(records, op="all_to_all")[0]
    assert a2a.input_split_sizes == (2, 2) and a2a.output_split_sizes == (2, 2)
    send, recv = select(records, op="send")[0], select(records, op="recv")[0]
    assert (send.peer, recv.peer, send.bytes) == (0, 0, 20)
    waits = select(records, op="wait")
    assert [w.phase for w in waits] == ["backward", "forward", "forward"]  # internal waits excluded
    assert counts(records, "backward") == {"all_reduce": 1}
    assert any(op.name == "mul" for op in ops)
    # the backward all-reduce precedes its wait in the shared sequence
    bwd = select(records, op="all_reduce", phase="backward")[0]
    assert bwd.seq < waits[0].seq
    check_consistent([r for r, _ in results])


def test_expect_comm_messages_name_rank_op_shape_and_show_trace():
    records, _ = run_distributed(_program, 2)[0]
    expect_comm(records, rank=0, op="all_reduce", phase="backward", count=1, shape=(4, 3), dtype=torch.float64)
    with pytest.raises(CheckFailure) as info:
        expect_comm(records, rank=0, op="all_reduce", phase="forward", count=2, shape=(8, 2, 16),
                    dtype=torch.float64)
    msg = str(info.value)
    assert "rank 0: expected 2 all_reduce of [8, 2, 16] float64 in forward, saw 0" in msg
    assert "all_reduce | rank 0 | [4, 3] float64 | group of 2 | forward" in msg
    with pytest.raises(CheckFailure, match="expected no communication in backward"):
        expect_no_comm(records, rank=0, phase="backward")


def _mismatched(rank, world_size):
    with CommLedger() as ledger:
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.all_reduce(torch.ones(2, 2))  # same bytes: gloo returns without an error
    return ledger.records


def test_check_consistent_names_the_first_divergence():
    ledgers = run_distributed(_mismatched, 2, check_collectives=False)
    with pytest.raises(CheckFailure, match=r"collective #1 .* rank 0 issued all_reduce \| \[4\] .*rank 1 issued "
                                           r"all_reduce \| \[2, 2\]"):
        check_consistent(ledgers)


def test_group_of_one_is_recorded_with_its_size():
    def prog(rank, world_size):
        groups = [dist.new_group([r]) for r in range(world_size)]
        with CommLedger() as ledger:
            dist.all_reduce(torch.ones(2), group=groups[rank])
        return ledger.records

    recs = run_distributed(prog, 2)
    assert recs[0][0].group_size == 1


def test_assert_close_names_rank_tensor_index_and_tolerance():
    expected = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    got = expected.clone()
    got[2, 1] += 0.5
    got[0, 0] += 1e-3
    with pytest.raises(CheckFailure) as info:
        assert_close(got, expected, name="grad of weight shard", rank=1)
    msg = str(info.value)
    assert msg.startswith("rank 1: grad of weight shard: 2 of 12 elements differ; worst at index (2, 1)")
    assert "expected 9, got 9.5" in msg
    rtol, atol = TOLERANCES[torch.float64]
    assert f"rtol={rtol:g}, atol={atol:g}" in msg


@pytest.mark.parametrize("got, match", [
    (None, "is None; expected a tensor of shape \\[2\\]"),
    (torch.zeros(3), "shape \\[3\\], expected \\[2\\]"),
    (torch.zeros(2, dtype=torch.float64), "dtype float64, expected float32"),
    ([0.0, 0.0], "expected a torch.Tensor, got list"),
    (torch.tensor([0.0, float("nan")]), "1 of 2 elements differ; worst at index \\(1,\\)"),
])
def test_assert_close_rejects_wrong_kinds(got, match):
    with pytest.raises(CheckFailure, match=match):
        assert_close(got, torch.zeros(2), name="out")


def test_assert_close_accepts_rounding_and_matching_infinities():
    e = torch.tensor([1.0, -float("inf"), 3.0])
    assert_close(e + torch.tensor([1e-7, 0, 0]), e, name="lse")
    assert_close(torch.tensor([1, 2]), torch.tensor([1, 2]), name="counts")
    with pytest.raises(CheckFailure, match="compared exactly"):
        assert_close(torch.tensor([1, 3]), torch.tensor([1, 2]), name="counts")


def test_findings_name_every_wrong_tensor_in_the_first_lines():
    """A wrong lse is named even when out (the first in detail) is wrong too, on every rank it is wrong on."""
    from autograder.runtime.compare import Findings

    findings = Findings()
    for rank in range(3):
        with findings.numbers():
            assert_close(torch.zeros(3), torch.ones(3) if rank == 1 else torch.zeros(3),
                         name="ring_attention(q, k, v) on contiguous shards, group rank 1: out", rank=rank)
        with findings.numbers():
            assert_close(torch.zeros(2), torch.ones(2), name="ring_attention(q, k, v), group rank 1: lse", rank=rank)
    with pytest.raises(CheckFailure) as info:
        findings.raise_if_any()
    lines = str(info.value).splitlines()
    assert lines[0] == "Wrong: lse on ranks 0, 1, 2; out on rank 1; the first in detail:", lines
    assert lines[1].startswith("rank 0: ring_attention(q, k, v), group rank 1: lse: 2 of 2 elements differ"), lines
