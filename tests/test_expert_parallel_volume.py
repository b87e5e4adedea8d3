"""Assignment 05's lesson numbers, computed by autograder/lessons/volume.py and checked against runs and simulations.

    .venv/bin/python -m pytest -q tests/test_expert_parallel_volume.py

- the reference dispatcher's ledger: one dispatch all-to-all holds T·k rows
  (`ep_dispatch_bytes`), and `all_to_all_traffic` agrees with the routing;
- `expected_distinct_groups` and `remote_copies_per_token` against exact
  enumeration and a Monte-Carlo simulation of uniform routing;
- the README's time table and quoted figures, recomputed from
  `ep_forward_seconds` and `autograder/lessons/hardware.py`, must appear in the README;
- the worked example of 02_dispatcher.md, run through the reference dispatcher;
- the two-hop dispatch (why M = 4 nodes) and FP8's bytes per element, from the stated figures;
- the load-imbalance table of section 5: `uniform_drop_fraction` against exact enumeration and the
  simulation, `place_experts` on cases worked by hand, and the table itself regenerated.
"""

from __future__ import annotations

import itertools
import math
import os
import random

import pytest
import torch
import torch.distributed as dist

from autograder.runtime.dist import run_distributed
from autograder.lessons.hardware import H100_NODE, compute_seconds
from autograder.runtime.ledger import CommLedger
from autograder.lessons.volume import (
    all_to_all_traffic, busiest_gpu_over_mean, capacity_drop_fraction, ep_dispatch_bytes, ep_forward_seconds,
    ep_layer_bytes, expected_distinct_groups, expert_capacity, expert_data_parallel_size, expert_load_table,
    fp8_bytes_per_element,
    moe_expert_flops, place_experts, remote_copies_per_token, simulate_expert_loads, two_hop_dispatch,
    uniform_drop_fraction,
)
from solutions.expert_parallel.layers import AllToAllTokenDispatcher, MoELayer

LESSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assignments", "05_expert_parallel")
MiB = 2**20
# DeepSeek-V3's MoE layer, the README's named configuration
T, K, H, FFN, E = 4096, 8, 7168, 2048, 256


def _readme() -> str:
    with open(os.path.join(LESSON, "README.md"), encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------
# Against the ledger of the reference
# ---------------------------------------------------------------------------

def _moe_program(rank, world_size, num_experts, k, tokens, hidden, seed):
    gen = torch.Generator().manual_seed(seed)
    wr = torch.randn(num_experts, hidden, generator=gen, dtype=torch.float32)
    experts = [(torch.randn(4, hidden, generator=gen), torch.randn(hidden, 4, generator=gen))
               for _ in range(num_experts)]
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + rank)).requires_grad_()
    layer = MoELayer(hidden, 4, num_experts, k=k, ep_group=dist.group.WORLD, master_router_weight=wr,
                     master_expert_weights=experts)
    with CommLedger() as ledger:
        out, aux = layer(x)
        (out.sum() + aux).backward()
    routing_map = torch.zeros(tokens, num_experts, dtype=torch.bool)
    top = torch.sort(x.detach() @ wr.t(), dim=-1, descending=True, stable=True).indices[:, :k]
    routing_map.scatter_(1, top, True)
    return ledger.records, routing_map


@pytest.mark.parametrize("world_size", [2, 4])
def test_dispatch_volume_and_traffic_match_the_ledger(world_size):
    num_experts, k, tokens, hidden = 2 * world_size, 2, 24, 8
    results = run_distributed(_moe_program, world_size, args=(num_experts, k, tokens, hidden, 0))
    local = num_experts // world_size
    sent_total = received_total = 0
    for rank, (records, routing_map) in enumerate(results):
        floats = [r for r in records if r.op == "all_to_all" and r.dtype == "float32"]
        dispatch, combine = floats[0], floats[1]
        # Megatron's formula: the dispatch all-to-all input is T*k rows of h elements
        want = ep_dispatch_bytes(tokens, k, hidden, world_size, bytes_per_element=4)
        assert dispatch.shape == (want["rows"], hidden) and dispatch.bytes == want["all_to_all_input"]
        # what leaves the rank: its rows for the other ranks' experts
        per_rank = [int(routing_map[:, j * local:(j + 1) * local].sum()) for j in range(world_size)]
        sent, received = all_to_all_traffic(dispatch, rank)
        assert sent == (sum(per_rank) - per_rank[rank]) * hidden * 4
        assert all_to_all_traffic(combine, rank) == (received, sent)  # combine mirrors dispatch
        backward = [r for r in records if r.op == "all_to_all" and r.phase == "backward"]
        assert sum(all_to_all_traffic(r, rank)[0] for r in backward) == sent + received  # the four all-to-alls
        sent_total += sent
        received_total += received
    assert sent_total == received_total


def test_layer_bytes_formula():
    one = ep_dispatch_bytes(T, K, H, 8)
    assert one["all_to_all_input"] == 448 * MiB and one["rows"] == 32768
    layer = ep_layer_bytes(T, K, H, 8)
    assert layer["forward"] == layer["backward"] == 2 * one["sent_to_other_ranks"]
    assert layer["total"] == pytest.approx(4 * T * K * H * 2 * 7 / 8)


# ---------------------------------------------------------------------------
# De-duplication: exact enumeration and simulation
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_experts, groups, k", [(8, 4, 2), (12, 3, 4), (6, 2, 3), (8, 8, 1)])
def test_expected_distinct_groups_by_enumeration(num_experts, groups, k):
    per = num_experts // groups
    subsets = list(itertools.combinations(range(num_experts), k))
    exact = sum(len({e // per for e in s}) for s in subsets) / len(subsets)
    assert expected_distinct_groups(num_experts, groups, k) == pytest.approx(exact)


def test_remote_copies_by_simulation():
    rng = random.Random(0)
    nodes, per_node = 8, E // 8
    hits = 0
    trials = 20000
    for _ in range(trials):
        experts = rng.sample(range(E), K)
        own = rng.randrange(nodes)
        hits += len({e // per_node for e in experts} - {own})
    assert remote_copies_per_token(E, K, nodes, dedup=True) == pytest.approx(hits / trials, rel=0.01)
    assert remote_copies_per_token(E, K, nodes) == K * 7 / 8
    assert remote_copies_per_token(E, K, nodes, dedup=True, max_groups=4) == 3.5
    with pytest.raises(ValueError):
        remote_copies_per_token(E, K, nodes, max_groups=4)  # node limits only make sense with de-duplication


# ---------------------------------------------------------------------------
# The README's time table, recomputed
# ---------------------------------------------------------------------------

TABLE = [
    ("EP 8 (one node), Megatron all-to-all", dict(ep_size=8)),
    ("EP 8 (one node), DeepEP (one copy per rank)", dict(ep_size=8, dedup=True)),
    ("EP 64 (8 nodes), Megatron all-to-all", dict(ep_size=64)),
    ("EP 64 (8 nodes), DeepEP (one copy per node)", dict(ep_size=64, dedup=True)),
    ("EP 64, DeepEP + node-limited routing (M = 4)", dict(ep_size=64, dedup=True, max_nodes=4)),
    ("the same with FP8 dispatch (1 byte + a 4-byte scale per 128 elements)",
     dict(ep_size=64, dedup=True, max_nodes=4, dispatch_bytes_per_element=fp8_bytes_per_element())),
]


def test_readme_time_table_is_what_the_functions_compute():
    readme = _readme()
    for name, kwargs in TABLE:
        r = ep_forward_seconds(T, K, H, FFN, E, **kwargs)
        row = (f"| {name} | {r['dispatch'] * 1e3:.2f} ms | {r['combine'] * 1e3:.2f} ms | {r['experts'] * 1e3:.2f} ms "
               f"| {r['comm_over_compute']:.2f} |")
        assert row in readme, f"README section 4 should contain:\n{row}"


def test_time_estimate_by_hand():
    """The first and third rows from the stated figures directly."""
    experts = 2 * 3 * T * K * H * FFN / (989e12 * 0.5)
    assert moe_expert_flops(T, K, H, FFN) == 2 * 3 * T * K * H * FFN
    assert compute_seconds(moe_expert_flops(T, K, H, FFN), H100_NODE, mfu=0.5) == pytest.approx(experts)
    intra = T * K * 7 / 8 * H * 2 / 450e9 + 7 * 3e-6
    assert ep_forward_seconds(T, K, H, FFN, E, ep_size=8)["dispatch"] == pytest.approx(intra)
    across = T * K * 56 / 64 * H * 2 / 50e9 + 56 * 5e-6
    assert ep_forward_seconds(T, K, H, FFN, E, ep_size=64)["dispatch"] == pytest.approx(across)
    with pytest.raises(ValueError):
        ep_forward_seconds(T, K, H, FFN, E, ep_size=12)  # neither inside a node nor whole nodes


def test_readme_quoted_figures():
    readme = _readme()
    assert "448 MiB" in readme and ep_dispatch_bytes(T, K, H, 8)["all_to_all_input"] == 448 * MiB
    assert f"{remote_copies_per_token(E, K, 8, dedup=True):.2f}" in readme  # 4.63
    assert "3.5 with node-limited routing" in readme
    assert f"Megatron $k \\frac{{G-1}}{{G}}$ = {remote_copies_per_token(E, K, 8):.1f}" in readme
    ratio = H100_NODE.nvlink.bytes_per_s / H100_NODE.network.bytes_per_s
    assert f"network is {ratio:.0f}x slower" in readme
    assert expert_data_parallel_size(16, ep=8) == 2 and "EDP = 2" in readme
    assert expert_data_parallel_size(2048, ep=64, pp=16) == 2 and "EP 64 x EDP 2" in readme
    with pytest.raises(ValueError, match="not divisible"):
        expert_data_parallel_size(12, ep=8)


# ---------------------------------------------------------------------------
# The worked example of 02_dispatcher.md
# ---------------------------------------------------------------------------

ROUTES = {0: [[0, 2], [1, 2], [0, 3]], 1: [[1, 3], [0, 1], [0, 1]]}


def _example(rank, world_size):
    routing_map = torch.zeros(3, 4, dtype=torch.bool)
    for t, experts in enumerate(ROUTES[rank]):
        routing_map[t, experts] = True
    x = torch.tensor([[10.0 * rank + t] for t in range(3)])  # token t of rank r carries 10 r + t
    dispatcher = AllToAllTokenDispatcher(4, ep_group=dist.group.WORLD)
    with CommLedger() as ledger:
        expert_input, tokens_per_expert = dispatcher.dispatch(x, routing_map.double(), routing_map)
    names = ["ab"[int(v) // 10] + str(int(v) % 10) for v in expert_input.flatten().tolist()]
    token_a2a = [r for r in ledger.records if r.dtype == "float32"][0]
    return names, tokens_per_expert.tolist(), list(token_a2a.input_split_sizes), list(token_a2a.output_split_sizes)


def test_the_worked_example_of_the_dispatcher_deep_dive():
    with open(os.path.join(LESSON, "02_dispatcher.md"), encoding="utf-8") as f:
        text = f.read()
    (names0, tpe0, in0, out0), (names1, tpe1, in1, out1) = run_distributed(_example, 2)
    assert names0 == ["a0", "a2", "b1", "b2", "a1", "b0", "b1", "b2"] and tpe0 == [4, 4]
    assert names1 == ["a0", "a1", "a2", "b0"] and tpe1 == [2, 2]
    assert (in0, out0, in1, out1) == ([3, 3], [3, 5], [5, 1], [3, 1])
    for line in ("rank 0 expert_input [a0 a2 b1 b2 | a1 b0 b1 b2]", "rank 1 expert_input [a0 a1 | a2 b0]",
                 "rank 0\n`[3, 3]`, rank 1 `[5, 1]`", "(rank 0 `[3, 5]`, rank 1 `[3, 1]`)",
                 "(rank 0 `[4, 4]`, rank 1 `[2, 2]`)"):
        assert line in text, line
    assert math.isclose(sum(tpe0) + sum(tpe1), 12)  # 6 tokens x k = 2


# ---------------------------------------------------------------------------
# Section 4: the two-hop dispatch and FP8; section 5: load imbalance
# ---------------------------------------------------------------------------

def test_two_hop_dispatch_and_why_four_nodes():
    readme = _readme()
    # DeepSeek-V3's H800 figures (report sec. 3.2.2): NVLink 160 GB/s, InfiniBand 50 GB/s per GPU
    h800 = two_hop_dispatch(K, 4, nvlink_bytes_per_s=160e9, network_bytes_per_s=50e9)
    assert h800["bandwidth_ratio"] == pytest.approx(3.2) and h800["max_experts_same_cost"] == pytest.approx(12.8)
    assert h800["experts_per_node"] == 2 and h800["network_bound"] and h800["network_copies"] == 4
    assert "$4 \\times 3.2 = 12.8$" in readme and "a maximum of 13 experts" in readme and "uses 2 per node" in readme
    h100 = two_hop_dispatch(K, 4, nvlink_bytes_per_s=H100_NODE.nvlink.bytes_per_s,
                            network_bytes_per_s=H100_NODE.network.bytes_per_s)
    assert h100["bandwidth_ratio"] == 9 and "the ratio is 9" in readme
    # two nodes would need 4 experts per node: more than NVLink forwards in the time of one network copy
    assert not two_hop_dispatch(K, 2, nvlink_bytes_per_s=160e9, network_bytes_per_s=50e9)["network_bound"]
    with pytest.raises(ValueError):
        two_hop_dispatch(K, 9, nvlink_bytes_per_s=160e9, network_bytes_per_s=50e9)


def test_fp8_bytes_per_element():
    """DeepEP's fp32 scale per 128 elements and MXFP8's one-byte E8M0 scale per 32 (Megatron's 'mxfp8',
    TransformerEngine's MXFP8BlockScaling) cost the same 3 %; the README attributes each format to its source."""
    assert fp8_bytes_per_element() == 1 + 4 / 128 == 1.03125
    assert fp8_bytes_per_element(block=32, scale_bytes=1) == fp8_bytes_per_element()
    readme = " ".join(_readme().split())
    assert "3 % more bytes" in readme
    assert "one fp32 scale per 128 elements" in readme and "one E8M0 scale (a power of two in one byte) per 32 elements" \
        in readme


def test_exercise_7_quotes_the_readme_ratios():
    """Exercise 7's text (the 05 notebook, English and its Chinese catalog) gives the all-to-alls' share of the experts'
    time inside a node and across nodes as the README's table computes it: not "about as long as" inside a node."""
    inside = [ep_forward_seconds(T, K, H, FFN, E, **kw)["comm_over_compute"] for _, kw in TABLE if kw["ep_size"] == 8]
    across = [ep_forward_seconds(T, K, H, FFN, E, **kw)["comm_over_compute"] for _, kw in TABLE if kw["ep_size"] == 64]
    low, high = [f"{min(x):.2f}" for x in (inside, across)], [f"{max(x):.2f}" for x in (inside, across)]
    assert (low, high) == (["0.21", "1.08"], ["0.32", "2.91"])
    root = os.path.dirname(os.path.dirname(LESSON))
    english = " ".join(open(os.path.join(LESSON, "_build_nb.py"), encoding="utf-8").read().split())
    chinese = open(os.path.join(root, "zh", "notebooks", "05_expert_parallel.md"), encoding="utf-8").read()
    assert f"{low[0]} to {high[0]} times its experts' time inside a node, and {low[1]} to {high[1]} times " \
           f"across nodes" in english
    assert f"{low[0]} 到 {high[0]} 倍" in chinese and f"{low[1]} 到 {high[1]} 倍" in chinese
    assert "about as long as" not in english


def _enumerated_drop_fraction(tokens, k, num_experts, capacity_factor):
    """The expected drop fraction by enumerating every routing of `tokens` tokens, each to k distinct experts."""
    capacity = math.ceil(tokens * k / num_experts * capacity_factor)
    choices = list(itertools.combinations(range(num_experts), k))
    dropped = 0
    for routing in itertools.product(choices, repeat=tokens):
        loads = [0] * num_experts
        for experts in routing:
            for e in experts:
                loads[e] += 1
        dropped += sum(max(x - capacity, 0) for x in loads)
    return dropped / (len(choices) ** tokens * tokens * k)


def test_expert_capacity_is_megatrons_get_capacity():
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils",
                                    reason="megatron-core (the course extra pins it) is not installed")
    for tokens, k, num_experts, cf in ((T, K, E, 1.0), (T, K, E, 1.25), (T, K, E, 1.1), (7, 2, 3, 0.9), (5, 1, 4, 2.0)):
        assert expert_capacity(tokens, k, num_experts, cf) == moe_utils.get_capacity(
            num_tokens=tokens * k, num_experts=num_experts, capacity_factor=cf), (tokens, k, num_experts, cf)


@pytest.mark.parametrize("tokens, k, num_experts, cf", [(4, 2, 4, 1.0), (5, 1, 3, 1.0), (4, 2, 4, 0.5), (3, 3, 5, 1.2)])
def test_uniform_drop_fraction_is_exact(tokens, k, num_experts, cf):
    assert uniform_drop_fraction(tokens, k, num_experts, cf) == pytest.approx(
        _enumerated_drop_fraction(tokens, k, num_experts, cf), rel=1e-12)


def test_the_simulation_agrees_with_the_exact_drop_fraction_of_a_balanced_router():
    loads = simulate_expert_loads(T, K, E, num_ranks=16, bias_std=0.0, seed=7)
    assert loads.shape == (16, E) and int(loads.sum()) == 16 * T * K and (loads.sum(1) == T * K).all()
    exact = uniform_drop_fraction(T, K, E, 1.0)
    assert 0.0346 < exact < 0.0347 and "3.47 %" in _readme()
    assert capacity_drop_fraction(loads, num_tokens=T, k=K, capacity_factor=1.0) == pytest.approx(exact, rel=0.05)
    # a biased router drops more, and more as the bias grows; a larger capacity drops less
    biased = [capacity_drop_fraction(simulate_expert_loads(T, K, E, num_ranks=4, bias_std=s), num_tokens=T, k=K,
                                     capacity_factor=1.25) for s in (0.0, 0.1, 0.2)]
    assert biased == sorted(biased) and biased[0] < 0.001 < biased[1]
    assert torch.equal(simulate_expert_loads(64, 2, 8, num_ranks=2, bias_std=0.3),
                       simulate_expert_loads(64, 2, 8, num_ranks=2, bias_std=0.3))   # seeded


def test_place_experts_by_hand():
    # packing only: heaviest first, each to the lightest GPU with a free slot
    assert place_experts([4, 4, 1, 1], 2) == [[0, 2], [1, 3]]
    assert busiest_gpu_over_mean([4, 4, 1, 1], [[0, 2], [1, 3]]) == 1.0
    assert busiest_gpu_over_mean([4, 4, 1, 1], [[0, 1], [2, 3]]) == 1.6    # contiguous: 8 against a mean of 5
    # one redundant replica goes to the hottest expert, which then has two replicas of load 3
    gpus = place_experts([6, 1, 1], 2, num_redundant=1)
    assert sorted(map(sorted, gpus)) == [[0, 1], [0, 2]] and busiest_gpu_over_mean([6, 1, 1], gpus) == 1.0
    with pytest.raises(ValueError):
        place_experts([1, 2, 3], 2)                  # 3 experts do not fill 2 GPUs' equal slots
    with pytest.raises(ValueError):
        busiest_gpu_over_mean([1, 2], [[0], [0]])    # expert 1 hosted nowhere


def test_readme_load_imbalance_table_is_what_the_simulation_gives():
    readme = _readme()
    table = expert_load_table()
    assert table in readme, f"README section 5 is stale; regenerate:\n{table}"
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    # the prose quotes the 0.2 row: hottest 3.5x, 8 % dropped at cf 1.25, 1 % at cf 2; 1.36 -> 1.04 -> 1.02
    bias02 = rows[2]
    assert bias02[1] == "3.50" and bias02[3].startswith("8.") and bias02[5].startswith("1.")
    assert [round(float(x.strip(" |")), 2) for x in bias02[6:9]] == [1.36, 1.04, 1.02]
    for phrase in ("3.5 times the mean", "drops 8 % of the rows", "drops 1 %", "36 % more rows",
                   "1.36 becomes\n  1.04 with packing alone and 1.02 with 32 redundant experts"):
        assert phrase in readme, phrase
