"""The reference solution of assignment 05 (expert parallelism), tested directly and against independent code.

    .venv/bin/python -m pytest -q tests/test_expert_parallel_solutions.py

- validation needs no process group (kept apart);
- the router, the aux loss, permute/unpermute and token dropping against
  Megatron-LM's own `moe_utils` (megatron-core from PyPI runs them on CPU), the
  all-to-all against PyTorch's differentiable `all_to_all_single_autograd`, and
  a Megatron-built single-process MoE against the checks' dense reference and
  the reference MoELayer: a misunderstanding shared by the solution and the
  checks cannot pass all three;
- the public checks on cases the notebook does not use (world size 3);
- the AllToAllGuard: split sizes that disagree across ranks, and a rank that
  skips an all-to-all, fail with a clear message instead of garbage or a hang;
- exercise 7: the overlapped layer equals the plain one; its checks accept
  another correct schedule (other half first, experts recomputed in backward)
  and fail a correct but sequential one on the overlap alone; the ledger
  attributes each wait to its all-to-all; its held transport shows the rows
  only once the caller completes the work (NaN before, whenever gloo moved
  them), so experts that read before waiting fail every time, and an
  all-to-all completed another way than wait() is not in flight.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import autograder.checks.expert_parallel as checks  # noqa: E402
from autograder.checks.expert_parallel import overlap as checks_overlap  # noqa: E402
from autograder.runtime.compare import CheckFailure  # noqa: E402
from autograder.runtime.dist import DistributedError, run_distributed  # noqa: E402
from autograder.runtime.ledger import CommLedger  # noqa: E402
from solutions.expert_parallel.routing import (  # noqa: E402
    ExpertMLP, _check_split_sizes, all_to_all, exchange_token_counts, load_balancing_loss, permute,
    run_local_experts, sort_chunks_by_idxs, topk_router, unpermute,
)
from solutions.expert_parallel.layers import AllToAllTokenDispatcher, MoELayer, apply_router_token_dropping  # noqa: E402
from solutions.expert_parallel.overlap import (  # noqa: E402
    OverlappedMoELayer, _OverlappedExperts, experts_on_received, post_all_to_all,
)


def _megatron_moe_utils():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on import
        return pytest.importorskip("megatron.core.transformer.moe.moe_utils",
                                   reason="megatron-core (the course extra pins it) is not installed")


# ---------------------------------------------------------------------------
# Validation: no process group needed
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("k, shape", [(0, (4, 3)), (4, (4, 3)), (1.0, (4, 3)), (1, (12,))])
def test_topk_router_rejects_bad_arguments(k, shape):
    with pytest.raises(ValueError):
        topk_router(torch.randn(*shape), k=k)
    with pytest.raises(ValueError, match="floating"):
        topk_router(torch.ones(4, 3, dtype=torch.int64), k=1)


def test_routing_maps_are_validated():
    with pytest.raises(ValueError, match=r"\[4, 5\].*\[4, 3\]"):
        load_balancing_loss(torch.randn(4, 3), torch.zeros(4, 5, dtype=torch.bool), k=1)
    with pytest.raises(ValueError, match="bool"):
        load_balancing_loss(torch.randn(4, 3), torch.zeros(4, 3), k=1)
    with pytest.raises(ValueError, match=r"\[7, E\]"):
        permute(torch.randn(7, 2), torch.zeros(4, 3, dtype=torch.bool))
    m = torch.zeros(4, 3, dtype=torch.bool)
    m[:, 0] = True
    with pytest.raises(ValueError, match="3 sorted_indices"):
        unpermute(torch.zeros(4, 2), torch.arange(3), None, m)
    with pytest.raises(ValueError, match=r"probs has shape \[4, 2\]"):
        unpermute(torch.zeros(4, 2), torch.arange(4), torch.zeros(4, 2), m)


def test_group_and_split_sizes_are_validated():
    with pytest.raises(ValueError, match="ProcessGroup"):
        all_to_all(torch.zeros(4, 2), output_split_sizes=[4], input_split_sizes=[4], group=None)
    with pytest.raises(ValueError, match="ProcessGroup"):
        AllToAllTokenDispatcher(4, ep_group=0)
    with pytest.raises(ValueError, match="ProcessGroup"):
        exchange_token_counts(torch.zeros(4, dtype=torch.long), group="world")
    assert _check_split_sizes(torch.tensor([1, 0, 2]), 3, "s") == [1, 0, 2]
    for bad in ([1, 2], [1, -1, 0], [True, 0, 0], [1.0, 1, 1], None):
        with pytest.raises(ValueError, match="3 non-negative ints"):
            _check_split_sizes(bad, 3, "s")
    with pytest.raises(ValueError, match=r"\(2 values\)"):
        _check_split_sizes([1, 2], 3, "s")


@pytest.mark.parametrize("cf", [0, -1.0, True, "1"])
def test_capacity_factor_must_be_positive(cf):
    m = torch.zeros(4, 2, dtype=torch.bool)
    m[:, 0] = True
    with pytest.raises(ValueError, match="capacity_factor"):
        apply_router_token_dropping(m.float(), m, k=1, capacity_factor=cf)


def test_experts_and_chunks_helpers():
    with pytest.raises(ValueError, match=r"\[4, 3\]"):
        ExpertMLP(3, 4, master_fc1_weight=torch.zeros(3, 4), master_fc2_weight=torch.zeros(3, 4))
    experts = [ExpertMLP(3, 4, master_fc1_weight=torch.randn(4, 3), master_fc2_weight=torch.randn(3, 4))
               for _ in range(2)]
    with pytest.raises(ValueError, match="summing to the rows"):
        run_local_experts(experts, torch.zeros(5, 3), torch.tensor([2, 2]))
    out = run_local_experts(experts, torch.randn(0, 3), torch.tensor([0, 0]))  # a rank that received nothing
    assert out.shape == (0, 3)
    x = torch.arange(6.0).view(6, 1)
    assert sort_chunks_by_idxs(x, [1, 2, 0, 3], [3, 0, 2, 1]).flatten().tolist() == [3, 4, 5, 0, 1, 2]


# ---------------------------------------------------------------------------
# Single-process properties the lesson states
# ---------------------------------------------------------------------------

def test_ties_go_to_the_lower_expert_but_not_with_torch_topk():
    logits = torch.ones(1, 4)
    probs, routing_map = topk_router(logits, k=1)
    assert routing_map[0].nonzero().flatten().tolist() == [0]
    assert probs[0, 0].item() == 1.0
    # the trap the lesson names: torch.topk's tie order is undefined (index 2 here, on CPU)
    assert torch.topk(logits, 1).indices.item() != 0


def test_router_dtypes():
    for dtype, want in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.float64, torch.float64)):
        probs, _ = topk_router(torch.randn(5, 4).to(dtype), k=2)
        assert probs.dtype == want
        assert load_balancing_loss(torch.randn(5, 4).to(dtype), _, k=2).dtype == want


def test_aux_loss_is_one_for_a_perfectly_balanced_uniform_router():
    """The lesson's claim: 1 for a uniform, balanced router; E / k when all tokens collapse onto k experts."""
    num_tokens, num_experts, k = 8, 4, 2
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    for t in range(num_tokens):
        routing_map[t, [t % num_experts, (t + 1) % num_experts]] = True
    loss = load_balancing_loss(torch.zeros(num_tokens, num_experts), routing_map, k=k)
    assert loss.item() == pytest.approx(1.0)
    # collapsed: every token confidently on experts 0 and 1 -> E / k
    logits = torch.zeros(num_tokens, num_experts)
    logits[:, :2] = 30.0
    _, collapsed = topk_router(logits, k=k)
    assert load_balancing_loss(logits, collapsed, k=k).item() == pytest.approx(num_experts / k)


def test_unpermute_of_permute_is_x_times_k():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    routing_map = torch.rand(30, 6, generator=gen) < 0.4
    permuted, idx = permute(x, routing_map)
    out = unpermute(permuted, idx, routing_map.double(), routing_map)
    torch.testing.assert_close(out, x * routing_map.sum(1, keepdim=True))


# ---------------------------------------------------------------------------
# Against Megatron-LM's moe_utils (megatron-core on CPU)
# ---------------------------------------------------------------------------

def _logits_without_near_ties(num_tokens, num_experts, k, seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        logits = torch.randn(num_tokens, num_experts, generator=gen) * 2
        top = torch.sort(logits, dim=-1, descending=True).values
        if k == num_experts or bool(((top[:, k - 1] - top[:, k]) > 1e-3).all()):
            return logits


@pytest.mark.parametrize("k, num_experts", [(1, 4), (2, 8), (3, 6)])
def test_router_and_aux_loss_match_megatron(k, num_experts):
    mu = _megatron_moe_utils()
    logits = _logits_without_near_ties(40, num_experts, k, seed=k)  # float32: Megatron's router dtype
    probs, routing_map = topk_router(logits, k=k)
    m_probs, m_map = mu.topk_routing_with_score_function(logits, k)
    assert torch.equal(routing_map, m_map)
    torch.testing.assert_close(probs, m_probs)
    loss = load_balancing_loss(logits, routing_map, k=k)
    m_loss = mu.switch_load_balancing_loss_func(torch.softmax(logits, dim=-1, dtype=torch.float32),
                                                routing_map.sum(0), 40, k, num_experts, 1.0)
    torch.testing.assert_close(loss, m_loss)


@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_permute_and_unpermute_match_megatron(drop):
    mu = _megatron_moe_utils()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(60, 7, generator=gen, dtype=torch.float64)
    routing_map = topk_router(torch.randn(60, 8, generator=gen), k=2)[1]
    routing_map &= torch.rand(60, 8, generator=gen) >= drop
    probs = torch.rand(60, 8, generator=gen, dtype=torch.float64) * routing_map
    permuted, idx = permute(x, routing_map)
    m_permuted, _, m_idx = mu.permute(x, routing_map)
    assert torch.equal(idx, m_idx) and torch.equal(permuted, m_permuted)
    rows = torch.randn_like(permuted)
    torch.testing.assert_close(unpermute(rows, idx, probs, routing_map),
                               mu.unpermute(rows, m_idx, x.shape, probs=probs, routing_map=routing_map))
    torch.testing.assert_close(unpermute(rows, idx, None, routing_map), mu.unpermute(rows, m_idx, x.shape))


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25, 2.0])
def test_token_dropping_matches_megatron(capacity_factor):
    mu = _megatron_moe_utils()
    logits = _logits_without_near_ties(24, 6, 2, seed=5)
    probs, routing_map = topk_router(logits, k=2)
    kept_probs, kept = apply_router_token_dropping(probs, routing_map, k=2, capacity_factor=capacity_factor)
    m_probs, m_kept = mu.apply_router_token_dropping(probs, routing_map, 2, capacity_factor)
    assert torch.equal(kept, m_kept)
    torch.testing.assert_close(kept_probs, m_probs)
    assert int(kept.sum(0).max()) <= mu.get_capacity(24 * 2, 6, capacity_factor)


def test_capacity_formula_matches_megatron():
    mu = _megatron_moe_utils()
    for tokens in (7, 12, 100):
        for k in (1, 2):
            for num_experts in (3, 4, 8):
                for cf in (0.5, 1.0, 1.1, 1.25, 2.0):
                    assert math.ceil(tokens * k / num_experts * cf) == mu.get_capacity(tokens * k, num_experts, cf)


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_three_single_process_moes_agree(capacity_factor):
    """Megatron's routing + permute/unpermute with looped experts == the checks' dense reference == our MoELayer."""
    mu = _megatron_moe_utils()
    gen = torch.Generator().manual_seed(3)
    num_tokens, hidden, ffn, num_experts, k = 16, 5, 6, 4, 2
    x = torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64)
    wr = torch.randn(num_experts, hidden, generator=gen, dtype=torch.float64)
    experts = [(torch.randn(ffn, hidden, generator=gen, dtype=torch.float64),
                torch.randn(hidden, ffn, generator=gen, dtype=torch.float64)) for _ in range(num_experts)]
    dense, _, _ = checks.dense_moe_reference(x, wr, experts, k=k, capacity_factor=capacity_factor)
    # Megatron's own pipeline, single process
    logits = x @ wr.t()
    probs, routing_map = mu.topk_routing_with_score_function(logits, k)
    if capacity_factor is not None:
        probs, routing_map = mu.apply_router_token_dropping(probs, routing_map, k, capacity_factor)
    permuted, _, idx = mu.permute(x, routing_map)
    counts = routing_map.sum(0).tolist()
    outs = [torch.nn.functional.gelu(chunk @ w1.t()) @ w2.t()
            for chunk, (w1, w2) in zip(torch.split(permuted, counts), experts)]
    megatron = mu.unpermute(torch.cat(outs), idx, x.shape, probs=probs, routing_map=routing_map)
    torch.testing.assert_close(megatron, dense, rtol=1e-5, atol=1e-5)  # Megatron's softmax is float32 even here

    def ours(rank, world_size):
        layer = MoELayer(hidden, ffn, num_experts, k=k, ep_group=dist.group.WORLD, master_router_weight=wr,
                         master_expert_weights=experts, capacity_factor=capacity_factor)
        return layer(x)[0].detach()

    torch.testing.assert_close(run_distributed(ours, 1)[0], dense)


# ---------------------------------------------------------------------------
# Against PyTorch's differentiable all-to-all
# ---------------------------------------------------------------------------

def _a2a_against_torch(rank, world_size, splits):
    import torch.distributed._functional_collectives as fc

    ins = splits[rank]
    outs = [splits[j][rank] for j in range(world_size)]
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(sum(ins), 3, generator=gen, dtype=torch.float64)
    g = torch.randn(sum(outs), 3, generator=gen, dtype=torch.float64)
    a = x.clone().requires_grad_()
    ya = all_to_all(a, output_split_sizes=outs, input_split_sizes=ins, group=dist.group.WORLD)
    ya.backward(g)
    b = x.clone().requires_grad_()
    yb = fc.wait_tensor(fc.all_to_all_single_autograd(b, outs, ins, dist.group.WORLD))
    yb.backward(g)
    return ya.detach(), a.grad, yb.detach(), b.grad


def test_all_to_all_matches_torch_functional_autograd():
    splits = [[1, 0, 3], [2, 2, 0], [0, 4, 1]]  # uneven, with empty blocks
    for ya, ga, yb, gb in run_distributed(_a2a_against_torch, 3, args=(splits,)):
        assert torch.equal(ya, yb) and torch.equal(ga, gb)


def functional_all_to_all(input_, *, output_split_sizes, input_split_sizes, group):
    """A correct all_to_all written with PyTorch's functional collectives: it returns an AsyncCollectiveTensor
    (the collective may still be in flight), which a check must accept (issue 20: it was refused as "not plain
    data")."""
    import torch.distributed._functional_collectives as fc

    size = group.size()
    outs = _check_split_sizes(output_split_sizes, size, "output_split_sizes")
    ins = _check_split_sizes(input_split_sizes, size, "input_split_sizes")
    if sum(ins) != input_.shape[0]:
        raise ValueError(f"input_split_sizes {ins} sum to {sum(ins)}, but the input has {input_.shape[0]} rows")
    if size == 1:
        return input_
    return fc.all_to_all_single_autograd(input_, outs, ins, group)


def test_checks_accept_an_all_to_all_that_returns_an_async_collective_tensor():
    def probe(rank, world_size):
        x = torch.randn(4, 3, requires_grad=True)
        return type(functional_all_to_all(x, output_split_sizes=[2, 2], input_split_sizes=[2, 2],
                                          group=dist.group.WORLD)).__name__

    assert run_distributed(probe, 2) == ["AsyncCollectiveTensor"] * 2  # what the check must cope with
    checks.check_all_to_all(functional_all_to_all, world_size=2)
    checks.check_all_to_all(functional_all_to_all, world_size=4, pattern="receive_nothing", seed=1)
    checks.check_all_to_all(functional_all_to_all, world_size=4, ep_size=2, dtype=torch.float32, seed=2)


# ---------------------------------------------------------------------------
# The public checks on cases the notebook does not use
# ---------------------------------------------------------------------------

def test_checks_pass_the_reference_on_three_ranks():
    checks.check_all_to_all(all_to_all, world_size=3, seed=7)
    checks.check_dispatch(AllToAllTokenDispatcher, world_size=3, num_experts=6, num_tokens=20, k=2, seed=7)
    checks.check_dispatcher_communication(AllToAllTokenDispatcher, world_size=3, num_experts=3, num_tokens=9, k=2)
    checks.check_moe_layer(MoELayer, world_size=3, num_experts=6, k=2, num_tokens=9, capacity_factor=1.25, seed=7)


def test_checks_reject_a_dispatcher_that_sends_probabilities_twice():
    """One extra all-to-all of probabilities is allowed; a second one is not (it is traffic for nothing)."""

    class Chatty(AllToAllTokenDispatcher):
        def dispatch(self, hidden_states, probs, routing_map):
            out = super().dispatch(hidden_states, probs, routing_map)
            st = self._state
            permuted_probs = probs.t().contiguous().masked_select(routing_map.t().contiguous())
            for _ in range(2):
                all_to_all(permuted_probs, output_split_sizes=st["output_splits"],
                           input_split_sizes=st["input_splits"], group=self.ep_group)
            return out

    with pytest.raises(CheckFailure, match="expected these float all-to-alls in forward"):
        checks.check_dispatch(Chatty, world_size=2)


# ---------------------------------------------------------------------------
# The guard
# ---------------------------------------------------------------------------

def _mismatched(rank, world_size, bad):
    outs = {0: [2, 2 if bad else 1], 1: [1, 3]}  # rank 0 expects 2 rows from rank 1, which sends 1
    ins = {0: [2, 1], 1: [1, 3]}
    x = torch.ones(sum(ins[rank]), 2)
    y = torch.empty(sum(outs[rank]), 2)
    with CommLedger(), checks.AllToAllGuard():
        dist.all_to_all_single(y, x, output_split_sizes=outs[rank], input_split_sizes=ins[rank])
        pieces = [torch.empty(2) for _ in range(world_size)]
        dist.all_to_all(pieces, [torch.full((2,), float(rank)) for _ in range(world_size)])  # the list API
    return y, pieces


def test_guard_passes_consistent_splits_and_reports_inconsistent_ones():
    y, pieces = run_distributed(_mismatched, 2, args=(False,))[1]
    assert y.shape == (4, 2) and [p[0].item() for p in pieces] == [0.0, 1.0]
    with pytest.raises(DistributedError) as info:
        run_distributed(_mismatched, 2, args=(True,))
    text = str(info.value)
    assert "rank 0 expects 2 row(s) from rank 1" in text and "rank 1 sends it 1" in text
    assert "exchange the token counts first" in text


def _skips(rank, world_size):
    with checks.AllToAllGuard():
        if rank == 0:
            dist.all_to_all_single(torch.empty(2), torch.ones(2))


def test_guard_reports_a_rank_that_skips_an_all_to_all():
    with pytest.raises(DistributedError, match=r"rank\(s\) \[1\] returned from the rank program without calling it"):
        run_distributed(_skips, 2, timeout=10)


class MegatronStyleDispatcher(AllToAllTokenDispatcher):
    """A correct dispatcher written differently, as Megatron-LM now does it: counts all-gathered (not
    all-to-all'ed), the probabilities sent along with the tokens (before them, here) and applied at the
    expert side, `unpermute` without probabilities. The checks must accept it."""

    def dispatch(self, hidden_states, probs, routing_map):
        w, local = self.ep_size, self.num_local_experts
        rank = self.ep_group.rank()
        mine = routing_map.sum(dim=0).to(torch.int64)  # [E]
        everyone = torch.empty(w * self.num_experts, dtype=torch.int64)
        dist.all_gather_single(everyone, mine, group=self.ep_group)  # [w * E]
        counts = everyone.view(w, self.num_experts)[:, rank * local:(rank + 1) * local]  # [w, E/w]
        input_splits = mine.view(w, local).sum(1).tolist()
        output_splits = counts.sum(1).tolist()
        permuted, sorted_indices = permute(hidden_states, routing_map)
        permuted_probs = probs.t().contiguous().masked_select(routing_map.t().contiguous())
        got_probs = all_to_all(permuted_probs, output_split_sizes=output_splits, input_split_sizes=input_splits,
                               group=self.ep_group)
        received = all_to_all(permuted, output_split_sizes=output_splits, input_split_sizes=input_splits,
                              group=self.ep_group)
        order = torch.arange(w * local).view(w, local).t().reshape(-1).tolist()
        sizes = counts.reshape(-1).tolist()
        self._state = {"counts": counts, "input_splits": input_splits, "output_splits": output_splits,
                       "sorted_indices": sorted_indices, "routing_map": routing_map, "dtype": hidden_states.dtype,
                       "probs": sort_chunks_by_idxs(got_probs.unsqueeze(-1), sizes, order)}
        return sort_chunks_by_idxs(received, sizes, order), counts.sum(0)

    def combine(self, expert_output):
        st = self._state
        w, local = self.ep_size, self.num_local_experts
        weighted = expert_output * st["probs"]  # probabilities applied at the expert side
        back = torch.arange(local * w).view(local, w).t().reshape(-1).tolist()
        x = sort_chunks_by_idxs(weighted, st["counts"].t().reshape(-1).tolist(), back)
        x = all_to_all(x, output_split_sizes=st["input_splits"], input_split_sizes=st["output_splits"],
                       group=self.ep_group)
        return unpermute(x, st["sorted_indices"], None, st["routing_map"]).to(st["dtype"])


def test_checks_accept_a_megatron_style_dispatcher():
    checks.check_dispatch(MegatronStyleDispatcher, world_size=2, num_experts=4, num_tokens=12, k=2)
    checks.check_dispatch(MegatronStyleDispatcher, world_size=4, ep_size=2, num_experts=4, num_tokens=20, k=2,
                          pattern="one_way")
    checks.check_combine(MegatronStyleDispatcher, world_size=2, num_experts=4, num_tokens=12, k=2)
    checks.check_dispatcher_communication(MegatronStyleDispatcher, world_size=4, num_experts=8, num_tokens=16, k=2)

    class Layer(MoELayer):
        def __init__(self, *args, ep_group, **kwargs):
            super().__init__(*args, ep_group=ep_group, **kwargs)
            self.token_dispatcher = MegatronStyleDispatcher(self.token_dispatcher.num_experts, ep_group=ep_group)

    checks.check_moe_layer(Layer, world_size=2, num_experts=4, k=2, num_tokens=12)
    checks.check_moe_layer(Layer, world_size=2, num_experts=4, k=2, num_tokens=12, capacity_factor=1.0)


# ---------------------------------------------------------------------------
# Exercise 7: the overlapped layer, its checks, and the ledger they read
# ---------------------------------------------------------------------------

def _two_layers(rank, world_size, num_tokens, capacity_factor):
    gen = torch.Generator().manual_seed(11)
    hidden, ffn, num_experts = 5, 7, 2 * world_size
    wr = torch.randn(num_experts, hidden, generator=gen, dtype=torch.float64)
    experts = [(torch.randn(ffn, hidden, generator=gen, dtype=torch.float64),
                torch.randn(hidden, ffn, generator=gen, dtype=torch.float64)) for _ in range(num_experts)]
    xs = [torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64) for _ in range(world_size)]
    gs = [torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64) for _ in range(world_size)]
    out = []
    for cls in (MoELayer, OverlappedMoELayer):
        layer = cls(hidden, ffn, num_experts, k=2, ep_group=dist.group.WORLD, master_router_weight=wr,
                    master_expert_weights=experts, capacity_factor=capacity_factor)
        x = xs[rank].clone().requires_grad_()
        y, aux = layer(x)
        ((y * gs[rank]).sum() + aux).backward()
        out.append([y.detach(), aux.detach(), x.grad, layer.router.weight.grad]
                   + [p.grad for p in layer.local_experts.parameters()])
    return out


@pytest.mark.parametrize("world_size, num_tokens, capacity_factor", [(2, 12, None), (3, 9, 1.0), (2, 1, None)])
def test_overlapped_layer_equals_the_plain_layer(world_size, num_tokens, capacity_factor):
    """Directly against MoELayer (no check in between): output, aux loss and every gradient; an odd T, one token
    (an empty half) and a capacity factor."""
    for plain, overlapped in run_distributed(_two_layers, world_size, args=(num_tokens, capacity_factor)):
        for a, b in zip(plain, overlapped):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_overlap_checks_pass_the_reference_on_three_ranks():
    checks_overlap.check_overlapped_moe_layer(OverlappedMoELayer, world_size=3, num_experts=6, num_tokens=9, seed=7)
    checks_overlap.check_moe_overlap(OverlappedMoELayer, world_size=3, num_experts=6, num_tokens=13, seed=7)


class SequentialHalves(MoELayer):
    """Each half through the plain dispatcher, one after the other: right numbers and each half's own
    all-to-alls, but every all-to-all synchronous, so nothing overlaps."""

    def __init__(self, *args, ep_group, **kwargs):
        super().__init__(*args, ep_group=ep_group, **kwargs)
        self.group = ep_group

    def forward(self, hidden_states):
        logits = self.router(hidden_states)
        probs, routing_map = topk_router(logits, k=self.k)
        aux = load_balancing_loss(logits, routing_map, k=self.k)
        if self.capacity_factor is not None:
            probs, routing_map = apply_router_token_dropping(probs, routing_map, k=self.k,
                                                             capacity_factor=self.capacity_factor)
        outs = []
        for x, p, m in zip(hidden_states.tensor_split(2), probs.tensor_split(2), routing_map.tensor_split(2)):
            dispatcher = AllToAllTokenDispatcher(routing_map.shape[1], ep_group=self.group)
            rows, per_expert = dispatcher.dispatch(x, p, m)
            outs.append(dispatcher.combine(run_local_experts(self.local_experts, rows, per_expert)))
        return torch.cat(outs), aux


def test_sequential_halves_compute_right_and_lose_only_the_overlap():
    checks_overlap.check_overlapped_moe_layer(SequentialHalves, world_size=4, num_experts=8, num_tokens=12)
    with pytest.raises(CheckFailure, match=r"half 1.s dispatch all-to-all \(#\d+\) was synchronous: it returned only once"):
        checks_overlap.check_moe_overlap(SequentialHalves, world_size=4, num_experts=8, num_tokens=12)
    with pytest.raises(CheckFailure, match="expected in forward, besides the integer counts"):
        checks_overlap.check_overlapped_moe_layer(MoELayer, world_size=2)  # one dispatch for all tokens


class _RecomputingExperts(torch.autograd.Function):
    """Another correct schedule: half 1 first in forward, half 0 first in backward, and the experts' forward
    recomputed in backward (nothing but the received rows kept), as activation recomputation would."""

    @staticmethod
    def forward(ctx, local_experts, plans, *rows):
        group = plans[0]["group"]
        sent = {j: post_all_to_all(rows[j], output_split_sizes=plans[j]["recv"], input_split_sizes=plans[j]["send"],
                                   group=group) for j in (1, 0)}
        back = {}
        for j in (1, 0):
            received, work = sent[j]
            if work is not None:
                work.wait()
            out = experts_on_received(local_experts, received, plans[j])  # no graph: recomputed in backward
            back[j] = post_all_to_all(out, output_split_sizes=plans[j]["send"], input_split_sizes=plans[j]["recv"],
                                      group=group)
        for j in (1, 0):
            if back[j][1] is not None:
                back[j][1].wait()
        ctx.local_experts, ctx.plans, ctx.received = local_experts, plans, [sent[0][0], sent[1][0]]
        return back[0][0], back[1][0]

    @staticmethod
    def backward(ctx, *grads):
        plans, group = ctx.plans, ctx.plans[0]["group"]
        arrived = {j: post_all_to_all(grads[j].contiguous(), output_split_sizes=plans[j]["recv"],
                                      input_split_sizes=plans[j]["send"], group=group) for j in (0, 1)}
        home = {}
        for j in (0, 1):
            grad, work = arrived[j]
            if work is not None:
                work.wait()
            leaf = ctx.received[j].detach().requires_grad_()
            with torch.enable_grad():
                out = experts_on_received(ctx.local_experts, leaf, plans[j])
            out.backward(grad)
            home[j] = post_all_to_all(leaf.grad, output_split_sizes=plans[j]["send"],
                                      input_split_sizes=plans[j]["recv"], group=group)
        for j in (0, 1):
            if home[j][1] is not None:
                home[j][1].wait()
        return None, None, home[0][0], home[1][0]


def test_overlap_checks_accept_another_correct_schedule(monkeypatch):
    import solutions.expert_parallel.overlap as overlap

    monkeypatch.setattr(overlap, "_OverlappedExperts", _RecomputingExperts)  # forked ranks inherit the patch
    checks_overlap.check_overlapped_moe_layer(OverlappedMoELayer, world_size=4, num_experts=8, num_tokens=12)
    checks_overlap.check_moe_overlap(OverlappedMoELayer, world_size=4, num_experts=8, num_tokens=12)
    checks_overlap.check_moe_overlap(OverlappedMoELayer, world_size=2, num_experts=4, num_tokens=11, seed=1)


def _waits_out_of_order(rank, world_size):
    ledger = checks_overlap._OverlapLedger()
    with ledger:
        x = torch.full((4, 2), float(rank))
        dist.all_to_all_single(torch.empty(4, 2), x)  # synchronous: its internal wait is not recorded
        first = dist.all_to_all_single(torch.empty(4, 2), x, async_op=True)
        second = dist.all_to_all_single(torch.empty(4, 2), x, async_op=True)
        ledger.mark("compute", 0, 0, 4, None)
        second.wait()
        first.wait()
        dist.all_reduce(torch.ones(1), async_op=True).wait()  # another op's Work
    return [(r.op, r.seq) for r in ledger.records], ledger.waited, ledger.marks


def test_overlap_ledger_knows_which_all_to_all_a_wait_is_for():
    records, waited, marks = run_distributed(_waits_out_of_order, 2)[0]
    a2a = [seq for op, seq in records if op == "all_to_all"]
    waits = [seq for op, seq in records if op == "wait"]
    assert len(a2a) == 3 and len(waits) == 3  # the synchronous call's own wait is not one of them
    assert [waited[w] for w in waits] == [a2a[2], a2a[1], None]
    assert marks[0]["seq"] == a2a[2] + 1 and marks[0]["phase"] == "forward"


# The check's held transport: an asynchronous float all-to-all's output holds NaN until the caller completes its work

def _held_transport(rank, world_size):
    ledger = checks_overlap._OverlapLedger()
    x = torch.arange(4.0, dtype=torch.float64).view(4, 1) + 10 * rank
    seen, outs = {}, {}
    with ledger:
        out = torch.empty(4, 1, dtype=torch.float64)
        work = dist.all_to_all_single(out, x, async_op=True)
        ledger._orig_wait(work)  # the transfer itself is over (gloo has moved the rows) ...
        seen["before"] = out.clone()  # ... and the caller still sees the poison: it has not waited
        work.wait()
        seen["after"] = out.clone()
        for how in ("is_completed", "get_future", "synchronize", "result", "barrier"):
            o = torch.empty(4, 1, dtype=torch.float64)
            w = dist.all_to_all_single(o, x, async_op=True)
            dist.barrier() if how == "barrier" else getattr(w, how)()
            outs[how] = o.clone()
            w.wait()
        pieces = [torch.empty(2, 1, dtype=torch.float64) for _ in range(2)]
        w = dist.all_to_all(pieces, list(x.split(2)), async_op=True)  # the list API is held too
        seen["list before"] = torch.cat(pieces).clone()
        w.wait()
        seen["list after"] = torch.cat(pieces).clone()
        counts = torch.empty(4, dtype=torch.int64)
        dist.all_to_all_single(counts, x.view(-1).long(), async_op=True).wait()  # integers: not held
        seen["counts"] = counts
        seen["sync"] = torch.empty(4, 1, dtype=torch.float64)
        dist.all_to_all_single(seen["sync"], x)  # synchronous: not held
    return seen, outs, {seq: how for seq, (_, how) in ledger.released.items()}, len(ledger.held)


def test_held_transport_delivers_rows_only_when_the_caller_completes_the_work():
    """What the layer sees of an all-to-all does not depend on when gloo moved the data: NaN until the caller's
    wait (or is_completed, get_future, synchronize, result, a barrier: each completes it where it is called)."""
    for rank, (seen, outs, released, held) in enumerate(run_distributed(_held_transport, 2)):
        want = torch.cat([torch.arange(4.0, dtype=torch.float64).view(4, 1)[2 * rank:2 * rank + 2] + 10 * s
                          for s in range(2)])
        assert torch.isnan(seen["before"]).all() and torch.isnan(seen["list before"]).all()
        for got in [seen["after"], seen["list after"], seen["sync"], *outs.values()]:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(seen["counts"], want.view(-1).long(), rtol=0, atol=0)
        assert held == 7  # the six single ones and the list one; not the integers, not the synchronous one
        assert sorted(released.values()) == sorted(["wait()", "wait()", "is_completed()", "get_future()",
                                                     "synchronize()", "result()",
                                                     "a barrier of its group (dist.barrier)"])


class _ExpertsBeforeWait(_OverlappedExperts):
    """The reference's forward with each half's experts run on its receive buffer BEFORE its dispatch is waited
    (its backward the reference's): on an idle machine the rows have usually arrived by then, the race that the
    held transport always loses."""

    @staticmethod
    def forward(ctx, local_experts, plans, *rows):
        group = plans[0]["group"]
        sent = [post_all_to_all(x, output_split_sizes=p["recv"], input_split_sizes=p["send"], group=group)
                for x, p in zip(rows, plans)]
        ctx.received, ctx.outputs, back = [], [], []
        for (received, work), plan in zip(sent, plans):
            received = received.detach().requires_grad_()
            with torch.enable_grad():
                out = experts_on_received(local_experts, received, plan)
            work.wait()
            ctx.received.append(received)
            ctx.outputs.append(out)
            back.append(post_all_to_all(out.detach(), output_split_sizes=plan["send"],
                                        input_split_sizes=plan["recv"], group=group))
        for _, work in back:
            work.wait()
        ctx.plans = plans
        return tuple(b for b, _ in back)


def test_experts_that_read_the_buffer_before_waiting_fail_both_cells_every_time(monkeypatch):
    import solutions.expert_parallel.overlap as overlap

    monkeypatch.setattr(overlap, "_OverlappedExperts", _ExpertsBeforeWait)  # forked ranks inherit the patch
    with pytest.raises(CheckFailure, match=r"(?s)got nan.*is the check's poison: rows of an all-to-all were read "
                                           r"before its work was waited"):
        checks_overlap.check_overlapped_moe_layer(OverlappedMoELayer, world_size=2, num_experts=4, num_tokens=12)
    with pytest.raises(CheckFailure, match=r"forward: local expert \d computed \(#\d+\) on rows that had not "
                                           r"arrived: its input held NaN.*half 0's dispatch \(posted #\d+, "
                                           r"completed at #\d+ by wait\(\)\)"):
        checks_overlap.check_moe_overlap(OverlappedMoELayer, world_size=2, num_experts=4, num_tokens=12)


def test_an_all_to_all_completed_by_polling_is_no_longer_in_flight(monkeypatch):
    """Completing every all-to-all at once another way than wait() (here a loop on is_completed()) and calling
    wait() where the reference does: right numbers, nothing in flight while the other half computes."""
    import solutions.expert_parallel.overlap as overlap

    def post_and_poll(input_, **kwargs):
        output, work = post_all_to_all(input_, **kwargs)
        while work is not None and not work.is_completed():
            pass
        return output, work

    monkeypatch.setattr(overlap, "post_all_to_all", post_and_poll)
    checks_overlap.check_overlapped_moe_layer(OverlappedMoELayer, world_size=2, num_experts=4, num_tokens=12)
    with pytest.raises(CheckFailure, match=r"forward: half 1's dispatch all-to-all must be in flight while half 0's "
                                           r"experts compute .* completed at #\d+ \(by is_completed\(\), before "
                                           r"they ended\)"):
        checks_overlap.check_moe_overlap(OverlappedMoELayer, world_size=2, num_experts=4, num_tokens=12)
