"""Build source/05_expert_parallel/expert_parallel_lab.ipynb (nbgrader source notebook) from code.

    .venv/bin/python assignments/05_expert_parallel/_build_nb.py
    .venv/bin/nbgrader generate_assignment 05_expert_parallel --force

Answer cells are cut from solutions/expert_parallel/ (routing.py, layers.py
and overlap.py: one source of truth); test cells call the public checks in
autograder/checks/expert_parallel/ (overlap.py for the last exercise), with
hidden cases.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autograder.authoring.nbbuild import NotebookBuilder, source_of  # noqa: E402
from solutions.expert_parallel import routing as ep  # noqa: E402
from solutions.expert_parallel import layers  # noqa: E402
from solutions.expert_parallel import overlap  # noqa: E402

ASSIGNMENT = "05_expert_parallel"
LESSON = "../../assignments/05_expert_parallel"
OUT = os.path.join(ROOT, "source", ASSIGNMENT, "expert_parallel_lab.ipynb")


def build() -> NotebookBuilder:
    nb = NotebookBuilder(ASSIGNMENT)
    nb.markdown(f"""
    # 05 · Expert parallelism: the MoE all-to-all

    A Mixture-of-Experts (MoE) layer replaces the MLP of a transformer layer
    by `E` expert MLPs and a router that sends each token to `k` of them.
    Expert parallelism (EP) places the experts on different ranks, so tokens
    must travel to their experts and back: an **all-to-all** called
    *dispatch*, the experts, and the inverse all-to-all called *combine*.
    You will implement, with real `torch.distributed` on several CPU
    processes (gloo), the core of Megatron-LM's
    `megatron/core/transformer/moe/`:

    1. `topk_router` and `load_balancing_loss`: which experts, with which weights, and the auxiliary loss;
    2. `permute` / `unpermute`: tokens grouped by expert, and back, weighted;
    3. `all_to_all`: the differentiable all-to-all with split sizes (its backward is itself, splits swapped);
    4. `AllToAllTokenDispatcher`: counts, tokens, local expert order, and back (`dispatch` / `combine`);
    5. `apply_router_token_dropping`: a capacity factor, dropping the lowest-probability tokens;
    6. `MoELayer`: router -> dispatch -> experts -> combine, checked against a dense single-process MoE;
    7. `OverlappedMoELayer`: the same layer on two halves of the tokens, each half's all-to-alls in flight while
       the other half's experts compute, in forward and in backward (as DeepSeek serves V3, with two micro-batches).

    Read first: the lesson [README.md]({LESSON}/README.md) ([the course overview](../../assignments/README.md)
    puts it beside the other dimensions). Deep dives:
    [01_routing.md]({LESSON}/01_routing.md) (exercises 1, 5),
    [02_dispatcher.md]({LESSON}/02_dispatcher.md) (exercises 2-4, 6),
    [03_overlap.md]({LESSON}/03_overlap.md) (exercise 7: hiding the all-to-alls behind the other half's experts).

    Conventions. Tokens are flattened to `[T, h]`; a routing map is a bool
    `[T, E]`; rank r of an EP group of w ranks holds experts
    `[r*E/w, (r+1)*E/w)` (its *local* experts). Every API takes its process
    group as a keyword argument (`group=` for `all_to_all`, `ep_group=` for
    the dispatcher and the layer); use the group's own rank
    (`group.rank()`), never the global one: tests run EP groups that are
    subgroups of a larger world. A group of one communicates nothing.
    Invalid arguments raise `ValueError` *before* any communication, naming
    the sizes. Use `dist.all_to_all_single(output, input, output_split_sizes=..., input_split_sizes=..., group=...)`
    (split sizes: lists of ints; the list version `dist.all_to_all` needs
    equal pieces on gloo).

    How the tests work: single-process functions are compared here with an
    independent reference (plain Python loops for every choice). Distributed
    tests start N rank processes with `run_distributed`, run your code on
    every rank, and compare what the ranks send back (expert inputs, outputs,
    every gradient) with a dense single-process MoE built from the same
    weights. A `CommLedger` records every collective (op, shape, dtype,
    split sizes, phase), and an `AllToAllGuard` compares the split sizes of
    each all-to-all across ranks *before* gloo runs it (gloo silently returns
    garbage when they disagree): a failure says who sends what to whom.
    Stubs read `# TODO: implement (see the task description above).`
    """)
    nb.given("setup", """
    import math

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace
    from autograder.checks.expert_parallel import (
        AllToAllGuard, check_topk_router, check_load_balancing_loss, check_permute, check_unpermute,
        check_exchange_token_counts, check_all_to_all, check_argument_errors, check_dispatch, check_combine,
        check_dispatcher_communication, check_token_dropping, check_moe_layer, plot_dispatch,
        check_overlapped_moe_layer, check_moe_overlap, print_overlap_timeline,
    )
    """)
    nb.markdown("""
    ## Given: argument checks

    Read these; you will call them. They implement the error contract:
    `ValueError` naming the sizes, raised before any communication.
    """)
    nb.given("helpers", source_of(ep, "_group_size_rank", "_check_split_sizes", "_check_routing"))

    # -- exercise 1 ----------------------------------------------------------------
    nb.exercise(1, "the router and the auxiliary load-balancing loss", """
    The router is a linear layer `[h] -> [E]` (exercise 6 owns it); here you
    turn its logits `[T, E]` into routing decisions, as Megatron-LM's
    `moe_utils.topk_routing_with_score_function` (softmax after top-k):

    - `topk_router(logits, *, k)` returns `(probs, routing_map)`.
      `routing_map[t, e]` is True for the k largest logits of token t. **Ties
      go to the lower expert index**: sort with `stable=True`
      (`torch.topk`'s tie order is undefined; on CPU `topk([1, 1, 1, 1], 1)`
      picks index 2). `probs[t, e]` is the softmax over token t's k selected
      logits, 0 elsewhere, computed and returned in
      `torch.promote_types(logits.dtype, torch.float32)` (Megatron computes
      the router softmax in float32; float64 stays float64 here). `probs`
      must stay differentiable w.r.t. the logits: that is how the router
      learns. `ValueError` unless logits is a floating `[T, E]` tensor and
      `1 <= k <= E`.
    - `load_balancing_loss(logits, routing_map, *, k)` is the Switch
      Transformer auxiliary loss, Megatron `switch_load_balancing_loss_func`:
      `E / (k T^2) * sum_i P_i * count_i`, where `P_i` sums the softmax over
      **all E** logits for expert i over the tokens, and `count_i` is how
      many tokens `routing_map` sends to expert i (an integer: no gradient).
      Use the given map; do not recompute the top-k. A 0-d tensor in the
      same dtype as `probs`. `ValueError` if the map's shape differs.

    Why softmax after top-k, why this loss is minimal for a uniform
    routing, and what DeepSeek-V3 does instead:
    [01_routing.md](../../assignments/05_expert_parallel/01_routing.md).
    """)
    nb.solution_from("router", ep, "topk_router", "load_balancing_loss")
    nb.test("test_topk_router", 7,
            doc="topk_router: the k largest logits (ties to the lower index), softmax over them, its gradient.",
            visible="""
    check_topk_router(topk_router, num_tokens=8, num_experts=4, k=2)
    check_topk_router(topk_router, num_tokens=6, num_experts=4, k=2, ties=True, seed=1)
    """, hidden="""
    check_topk_router(topk_router, num_tokens=7, num_experts=5, k=1, dtype=torch.float32, seed=2)
    check_topk_router(topk_router, num_tokens=10, num_experts=8, k=3, ties=True, seed=3)
    check_topk_router(topk_router, num_tokens=9, num_experts=6, k=2, dtype=torch.float32, seed=4)
    """)
    nb.test("test_load_balancing_loss", 5,
            doc="load_balancing_loss: E / (k T^2) sum_i P_i count_i over the given routing map, and its gradient.",
            visible="""
    check_load_balancing_loss(load_balancing_loss, num_tokens=8, num_experts=4, k=2)
    """, hidden="""
    check_load_balancing_loss(load_balancing_loss, num_tokens=11, num_experts=6, k=1, dtype=torch.float32, seed=1)
    check_load_balancing_loss(load_balancing_loss, num_tokens=20, num_experts=8, k=3, seed=2)
    """)

    # -- exercise 2 ----------------------------------------------------------------
    nb.exercise(2, "`permute` and `unpermute`", """
    Before tokens can travel, each (token, selected expert) pair becomes one
    row, and rows are grouped by expert (Megatron `moe_utils.permute` /
    `unpermute`):

    - `permute(tokens [T, h], routing_map [T, E])` returns
      `(permuted [N, h], sorted_indices [N])`, N = the number of True entries
      of the map: all rows of expert 0 first, then expert 1, ...; **within an
      expert the tokens keep their order** (a stable sort: an unstable one
      keeps the order for ~16 elements on CPU, and the tests route ~100 rows).
      `sorted_indices[i]` is the token of row i. Because each rank's experts
      are contiguous, this expert-major order is also destination-rank-major:
      exactly what the all-to-all needs. `ValueError` if the map does not have
      T rows.
    - `unpermute(permuted [N, h], sorted_indices [N], probs [T, E] or None, routing_map [T, E])`
      returns `[T, h]`: each row is added to its token, weighted by
      `probs[token, expert]` (the expert of row i follows from permute's
      order: `probs.t()` masked by `routing_map.t()` lists the row weights in
      exactly that order), then the k copies of a token are **summed**
      (`index_add`; `out[idx] += rows` loses duplicates). With `probs=None`
      the copies are summed unweighted. Keep it differentiable w.r.t. the
      rows and `probs`.

    Round trip: `unpermute(*permute(x, m), ones, m)` is `x` times each token's
    number of experts. Details:
    [02_dispatcher.md](../../assignments/05_expert_parallel/02_dispatcher.md).
    """)
    nb.solution_from("permutation", ep, "permute", "unpermute")
    nb.test("test_permute", 6,
            doc="permute: rows grouped by expert, tokens in order within an expert (stable), and the gradient.",
            visible="""
    check_permute(permute, num_tokens=50, num_experts=4, k=2, hidden=3)
    """, hidden="""
    check_permute(permute, num_tokens=40, num_experts=8, k=3, hidden=2, drop=0.3, dtype=torch.float32, seed=1)
    check_permute(permute, num_tokens=100, num_experts=3, k=1, hidden=4, seed=2)
    """)
    nb.test("test_unpermute", 6,
            doc="unpermute: each token sums its rows weighted by probs (or not); gradients of rows and probs.",
            visible="""
    check_unpermute(unpermute, num_tokens=50, num_experts=4, k=2, hidden=3)
    """, hidden="""
    check_unpermute(unpermute, num_tokens=40, num_experts=8, k=3, hidden=2, drop=0.3, dtype=torch.float32, seed=1)
    check_unpermute(unpermute, num_tokens=30, num_experts=3, k=1, hidden=4, seed=2)
    """)

    # -- worked example -------------------------------------------------------------
    nb.markdown("""
    ## Worked example: exchange the token counts

    Before any token moves, every rank must learn how many rows it will
    receive from each rank: the receiver sizes its buffer, and the
    all-to-all needs `output_split_sizes`. So the dispatcher first exchanges
    **integer counts**. Rank r knows `routing_map.sum(0)`: how many of its
    tokens go to each of the E experts. Piece j of that `[E]` vector (the
    counts for rank j's E/w experts) is exactly what rank j needs: one
    all-to-all with equal splits delivers it. The result on rank r is
    `[w, E/w]`: row s = how many tokens rank s sends to each of r's local
    experts. Its row sums are the rows r receives from each rank; its column
    sums the tokens each local expert processes. Counts carry no gradient: no
    autograd Function here. (Megatron-LM all-gathers the whole `[E]` of every
    rank instead, in `MoEAlltoAllTokenDispatcher.preprocess`; the checks
    accept both.) Run the check, then the scratch cell: it shows the counts and
    what the ledger records.
    """)
    nb.given("worked_example", source_of(ep, "exchange_token_counts"))
    nb.given("worked_example_check", """
    check_exchange_token_counts(exchange_token_counts, world_size=2)
    print("exchange_token_counts: passed")
    """)
    nb.code("""
    # Scratch: 2 ranks, 4 experts (2 per rank); edit freely.
    def show_counts(rank, world_size):
        routing_map = torch.rand(6, 4, generator=torch.Generator().manual_seed(rank)) < 0.5
        with CommLedger() as ledger:
            counts = exchange_token_counts(routing_map.sum(0), group=dist.group.WORLD)
        return routing_map.sum(0), counts, ledger.records

    for rank, (mine, counts, records) in enumerate(run_distributed(show_counts, 2)):
        print(f"rank {rank}: sends {mine.tolist()} to experts 0-3; receives, per source rank x local expert, "
              f"{counts.tolist()}")
        print(format_trace(records, rank))
    """)

    # -- exercise 3 ----------------------------------------------------------------
    nb.exercise(3, "the differentiable `all_to_all`", """
    `all_to_all(input_, *, output_split_sizes, input_split_sizes, group)`:
    rank i cuts its input's rows into blocks of `input_split_sizes[j]` rows
    and sends block j to rank j; it receives `output_split_sizes[j]` rows
    from rank j, stacked in rank order. Split sizes may be uneven and zero.
    As an autograd Function (Megatron `tensor_parallel/mappings.py`
    `_AllToAll`): the gradient of a received row belongs to the rank that
    sent it, so **the backward is the same all-to-all with the splits
    swapped**. Implement `_AllToAll.forward` / `.backward` (allocate the
    output with `sum(output_split_sizes)` rows; call
    `dist.all_to_all_single` on contiguous tensors; a group of one returns
    the input), and the wrapper `all_to_all`, which validates before
    `.apply`: the group (`_group_size_rank`), both split lists
    (`_check_split_sizes`), and that `input_split_sizes` sums to the input's
    rows (`ValueError` naming both). Graded: the numbers, and exactly one
    all-to-all with your splits in forward and one with them swapped in
    backward.
    """)
    nb.solution_from("all_to_all", ep, "_AllToAll", "all_to_all")
    nb.test("test_all_to_all", 8,
            doc="all_to_all: uneven and empty blocks, the gradient, one all-to-all forward and its mirror backward.",
            visible="""
    check_all_to_all(all_to_all, world_size=3)
    """, hidden="""
    check_all_to_all(all_to_all, world_size=4, pattern="receive_nothing", seed=1)
    check_all_to_all(all_to_all, world_size=4, ep_size=2, dtype=torch.float32, hidden=5, seed=2)
    check_all_to_all(all_to_all, world_size=1, seed=3)
    """)

    # -- exercise 4 ----------------------------------------------------------------
    nb.markdown("""
    ## Given: `sort_chunks_by_idxs`

    Megatron's helper for the *local expert order*: cut the rows into chunks
    of `split_sizes` rows and concatenate them in the order `sorted_idxs`.
    After the all-to-all, a rank holds its rows ordered (source rank, local
    expert, token): chunk (s, e) of `counts[s, e]` rows. The experts want
    them ordered (local expert, source rank, token).
    """)
    nb.given("sort_chunks", source_of(ep, "sort_chunks_by_idxs"))
    nb.exercise(4, "`AllToAllTokenDispatcher`: dispatch and combine", """
    Megatron-LM `token_dispatcher.MoEAlltoAllTokenDispatcher`, without tensor
    parallelism. `AllToAllTokenDispatcher(num_experts, *, ep_group)`
    (`ValueError` unless `num_experts` is a multiple of the group size):

    **`dispatch(hidden_states [T, h], probs [T, E], routing_map [T, E])`** returns
    `(expert_input [N, h], tokens_per_local_expert [E/w] int64)`:

    1. `routing_map.sum(0)` -> `exchange_token_counts` -> `counts [w, E/w]`;
       `input_split_sizes` = rows you send to each rank (your counts summed per
       destination rank's experts), `output_split_sizes` = `counts.sum(1)`;
    2. `permute(hidden_states, routing_map)` (expert-major = destination-major);
    3. `all_to_all` of the permuted rows;
    4. the local expert order with `sort_chunks_by_idxs`: the received chunks
       are (source s, local expert e) with `counts[s, e]` rows, at index
       `s * E/w + e`; visit them expert-major (for e, for s);
    5. remember what `combine` needs (on `self`), return the rows and `counts.sum(0)`.

    **`combine(expert_output [N, h])`** returns `[T, h]` in `hidden_states`' dtype: undo 4
    (the chunks are now (e, s) with `counts[s, e]` rows, at `e * w + s`), the
    reverse all-to-all (the splits swapped), then
    `unpermute(rows, sorted_indices, probs, routing_map)`: probabilities are
    applied here, at the source. `ValueError` if `expert_output` does not have
    the N rows `dispatch` returned.

    Graded: which rows each rank receives and in which order (local expert,
    then source rank, then token index), the counts, the round trip
    (`probs = 1` gives `x * k`), the weighting and its gradients, and the
    communication: the integer counts first, one float all-to-all per
    direction, each mirrored in backward with the splits swapped (the count
    exchange is not: integers have no gradient). Walk-through with the
    figures: [02_dispatcher.md](../../assignments/05_expert_parallel/02_dispatcher.md).
    """)
    nb.solution_from("dispatcher", layers, "AllToAllTokenDispatcher")
    nb.test("test_dispatch", 10,
            doc="dispatch: each rank's rows (local expert, source rank, token order), counts, counts-then-tokens comm.",
            visible="""
    check_dispatch(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=12, k=2)
    """, hidden="""
    check_dispatch(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=50, k=2, pattern="starve_rank", seed=1)
    check_dispatch(AllToAllTokenDispatcher, world_size=4, ep_size=2, num_experts=4, num_tokens=50, k=2,
                   pattern="one_way", dtype=torch.float32, seed=2)
    check_dispatch(AllToAllTokenDispatcher, world_size=2, num_experts=6, num_tokens=9, k=1, pattern="starve_expert", seed=3)
    check_dispatch(AllToAllTokenDispatcher, world_size=2, num_experts=4, num_tokens=10, k=3, pattern="dropped", seed=4)
    check_dispatch(AllToAllTokenDispatcher, world_size=1, num_experts=3, num_tokens=7, k=2, seed=5)
    """)
    nb.test("test_combine", 8,
            doc="combine: the round trip (probs = 1 gives x * k), the probability weighting, gradients of x and probs.",
            visible="""
    check_combine(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=12, k=2)
    """, hidden="""
    check_combine(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=16, k=2, pattern="dropped",
                  dtype=torch.float32, seed=1)
    check_combine(AllToAllTokenDispatcher, world_size=4, ep_size=2, num_experts=4, num_tokens=12, k=2,
                  pattern="starve_rank", seed=2)
    check_combine(AllToAllTokenDispatcher, world_size=2, num_experts=6, num_tokens=9, k=1, pattern="one_way", seed=3)
    """)
    nb.test("test_dispatcher_communication", 7,
            doc="Counts exchanged once; each float all-to-all of forward mirrored in backward with its splits swapped.",
            visible="""
    check_dispatcher_communication(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=12, k=2)
    """, hidden="""
    check_dispatcher_communication(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=16, k=2,
                                   pattern="one_way", seed=1)
    check_dispatcher_communication(AllToAllTokenDispatcher, world_size=4, ep_size=2, num_experts=6, num_tokens=10,
                                   k=2, pattern="starve_expert", seed=2)
    check_dispatcher_communication(AllToAllTokenDispatcher, world_size=1, num_experts=2, num_tokens=5, k=1, seed=3)
    """)
    nb.markdown("""
    ### Picture: one dispatch of your dispatcher

    Four ranks, eight experts, expert 0 hot and expert 7 idle. Left: how many
    tokens each source rank sent to each expert, read from what every rank's
    `expert_input` actually holds (each row carries its source rank). Right:
    the bytes each rank sent to and received from *other* ranks, in dispatch
    and in combine, from the ledgers (`autograder.lessons.volume.all_to_all_traffic`).
    Combine mirrors dispatch: what a rank received in dispatch it sends in
    combine. A hot expert makes its rank receive (and compute) the most: the
    reason for the load-balancing loss. Run it once exercise 4 passes.
    """)
    nb.code("""
    plot_dispatch(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=24, k=2)
    """)

    # -- exercise 5 ----------------------------------------------------------------
    nb.exercise(5, "token dropping with a capacity factor", """
    Without a limit, a popular expert receives any number of tokens (dropless
    MoE: variable shapes, possible memory spikes). With a capacity factor
    `cf`, each expert keeps at most `capacity = ceil(T * k / E * cf)` tokens
    of this rank (`math.ceil(T * k / E * capacity_factor)`, in this order, as
    Megatron's `get_capacity`), **the highest-probability ones**; among equal
    probabilities the earlier token is kept (a stable sort). Implement
    `apply_router_token_dropping(probs, routing_map, *, k, capacity_factor)`
    returning `(probs * kept, kept)` (Megatron `moe_utils.apply_router_token_dropping`,
    drop policy "probs"): kept probabilities are **not** renormalised, and a
    token whose experts all dropped it simply gets nothing from them.
    `ValueError` unless `capacity_factor > 0`. Hint: per expert (column),
    sort the probabilities of its routed tokens in descending order (others
    `-inf`), and keep the first `capacity` positions. Details:
    [01_routing.md](../../assignments/05_expert_parallel/01_routing.md).
    """)
    nb.solution_from("token_dropping", layers, "apply_router_token_dropping")
    nb.test("test_token_dropping", 6,
            doc="Each expert keeps its ceil(T k / E cf) highest-probability tokens (earlier on ties), no renormalising.",
            visible="""
    check_token_dropping(apply_router_token_dropping, num_tokens=12, num_experts=4, k=2, capacity_factor=1.0)
    check_token_dropping(apply_router_token_dropping, num_tokens=20, num_experts=4, k=2, capacity_factor=1.0,
                         ties=True, seed=5)
    """, hidden="""
    check_token_dropping(apply_router_token_dropping, num_tokens=18, num_experts=4, k=2,
                         capacity_factor=0.5, ties=True, seed=4)
    check_token_dropping(apply_router_token_dropping, num_tokens=24, num_experts=6, k=2, capacity_factor=1.0,
                         ties=True, dtype=torch.float32, seed=3)
    check_token_dropping(apply_router_token_dropping, num_tokens=20, num_experts=8, k=2, capacity_factor=1.25,
                         dtype=torch.float32, seed=2)
    check_token_dropping(apply_router_token_dropping, num_tokens=15, num_experts=3, k=1, capacity_factor=1.5, seed=3)
    """)

    # -- exercise 6 ----------------------------------------------------------------
    nb.markdown("""
    ## Given: the experts

    An expert is a small MLP without biases, `linear_fc2(gelu(linear_fc1(x)))`
    (`ExpertMLP`). `run_local_experts` is Megatron's `SequentialMLP`: local
    expert e takes the next `tokens_per_local_expert[e]` rows, which is why
    `dispatch` groups rows by local expert. Every expert runs, also on zero
    rows, so an expert that received nothing gets a zero gradient (not None).
    """)
    nb.given("experts", source_of(ep, "ExpertMLP", "run_local_experts"))
    nb.exercise(6, "`MoELayer`", """
    `MoELayer(hidden_size, ffn_hidden_size, num_experts, *, k, ep_group, master_router_weight, master_expert_weights, capacity_factor=None)`,
    as Megatron-LM's `moe_layer.MoELayer`:

    - `self.router`: `nn.Linear(hidden_size, num_experts, bias=False)` holding a
      copy of `master_router_weight` `[E, h]` (replicated on every rank);
    - `self.token_dispatcher`: your `AllToAllTokenDispatcher(num_experts, ep_group=ep_group)`;
    - `self.local_experts`: an `nn.ModuleList` of `ExpertMLP`, for this rank's
      experts `[r*E/w, (r+1)*E/w)` (r = the rank **in `ep_group`**), from
      `master_expert_weights`, a list of `(w1 [ffn, h], w2 [h, ffn])` per expert;
    - `forward(hidden_states [T, h])` returns `(output [T, h], aux_loss)`:
      logits = router(x); `topk_router`; `load_balancing_loss` on the routing
      **before** any drop (as Megatron); with a capacity factor,
      `apply_router_token_dropping`; `dispatch`; `run_local_experts`; `combine`.
    - `ValueError` (before any communication): `num_experts` not a multiple of
      the group size, `k` outside `[1, E]`, a router weight not `[E, h]`, not
      one weight pair per expert, a capacity factor that is not positive.

    Graded against a dense single-process MoE (every token through its top-k
    experts, weighted): the output, the aux loss, the gradients of the input,
    of every local expert (summed over all ranks' tokens) and of the router
    weight, which learns through the probabilities (k >= 2) and the aux
    loss; experts and ranks that receive no token; exact ties; and the
    communication of the whole layer.
    """)
    nb.solution_from("moe_layer", layers, "MoELayer")
    nb.test("test_moe_layer", 11,
            doc="MoELayer equals a dense MoE: output, aux loss, input/expert/router gradients, and its communication.",
            visible="""
    check_moe_layer(MoELayer, world_size=4, num_experts=8, k=2, num_tokens=12)
    check_moe_layer(MoELayer, world_size=4, ep_size=2, num_experts=6, k=2, num_tokens=10, seed=6)
    """, hidden="""
    check_moe_layer(MoELayer, world_size=4, num_experts=8, k=2, num_tokens=12, pattern="starve_rank", seed=1)
    check_moe_layer(MoELayer, world_size=2, num_experts=4, k=1, num_tokens=10, pattern="starve_expert", seed=2)
    check_moe_layer(MoELayer, world_size=2, num_experts=6, k=2, num_tokens=12, pattern="ties", seed=3)
    check_moe_layer(MoELayer, world_size=4, ep_size=2, num_experts=4, k=2, num_tokens=10, dtype=torch.float32,
                    hidden=5, ffn=6, seed=4)
    check_moe_layer(MoELayer, world_size=1, num_experts=3, k=2, num_tokens=8, seed=5)
    """)
    nb.test("test_moe_capacity", 7,
            doc="MoELayer with a capacity factor: the lowest-probability tokens dropped, aux loss counted before drops.",
            visible="""
    check_moe_layer(MoELayer, world_size=4, ep_size=2, num_experts=6, k=2, num_tokens=12, capacity_factor=1.0)
    """, hidden="""
    check_moe_layer(MoELayer, world_size=4, num_experts=8, k=2, num_tokens=16, capacity_factor=0.75, seed=1)
    check_moe_layer(MoELayer, world_size=2, num_experts=4, k=1, num_tokens=12, capacity_factor=1.5, seed=2)
    check_moe_layer(MoELayer, world_size=4, ep_size=2, num_experts=4, k=2, num_tokens=10, capacity_factor=1.25,
                    seed=3)
    """)
    nb.markdown("""
    ### The error contract, for every exercise

    Invalid arguments of every exercise (1 to 6) raise `ValueError` on every
    rank, before any communication, with a message naming the sizes
    involved. This last test of exercise 6 checks them all.
    """)
    nb.test("test_argument_errors", 4,
            doc="Invalid arguments raise ValueError on every rank before any communication, naming the sizes.",
            visible="""
    impls = {name: globals()[name] for name in (
        "topk_router", "load_balancing_loss", "permute", "all_to_all", "AllToAllTokenDispatcher", "MoELayer",
        "apply_router_token_dropping")}
    check_argument_errors(impls, world_size=2)
    """)

    # -- exercise 7 ----------------------------------------------------------------
    nb.exercise(7, "the overlapped MoE layer", """
    A MoE layer's dispatch and combine take 0.21 to 0.32 times its experts'
    time inside a node, and 1.08 to 2.91 times across nodes (DeepSeek-V3's
    layer on H100s: the lesson's README, section 4), and nothing inside one
    batch can hide them: the experts need the dispatched rows, combine needs
    the experts' output. To serve V3, DeepSeek cuts the work in two
    micro-batches and hides the all-to-alls of one behind the computation of
    the other (prefilling and decoding, its report's sec. 3.4); to train it,
    DualPipe pairs one micro-batch's forward with another's backward. You do
    it inside the layer: the tokens of a step become **two
    halves**, and every all-to-all of one half is **in flight while the other
    half's experts compute**, in forward and in backward. The lesson:
    [03_overlap.md](../../assignments/05_expert_parallel/03_overlap.md).

    `OverlappedMoELayer(MoELayer)` has `MoELayer`'s constructor, parameters and
    numbers. `forward(hidden_states [T, h])` returns `(output, aux_loss)`:

    1. route **all T tokens** as `MoELayer` does: router, `topk_router`,
       `load_balancing_loss`, and with a capacity factor
       `apply_router_token_dropping` (its capacity is that of all T tokens);
    2. cut the tokens, probabilities and routing map with `.tensor_split(2)`
       (half 0: the first ceil(T/2) tokens); for each half a *plan*: its counts
       (`exchange_token_counts`), its splits (rows sent to / received from
       each rank) and its permuted rows (`permute`), as in `dispatch`;
    3. `_OverlappedExperts.apply(self.local_experts, plans, rows0, rows1)`
       returns each half's expert outputs back at the source, in permuted order;
    4. `unpermute` each half with its probabilities and concatenate.

    Three pieces do the overlap:

    - `post_all_to_all(input_, *, output_split_sizes, input_split_sizes, group)` starts
      `dist.all_to_all_single(output, input_, ..., async_op=True)` and returns
      `(output, work)` at once; `output` is valid after `work.wait()`. A group of
      one returns `(input_, None)`. (gloo runs the collective on its own thread:
      `async_op=True` is all it takes; a thread of your own would hide the
      all-to-all from the ledger.)
    - `experts_on_received(local_experts, received, plan)`: exercise 4's local
      expert order, `run_local_experts`, and back to the received order.
    - `_OverlappedExperts`, an autograd Function whose forward runs this schedule:

    | step | posted or waited | in flight meanwhile | computed |
    |---|---|---|---|
    | 1 | post dispatch(0), post dispatch(1) | | |
    | 2 | wait dispatch(0) | dispatch(1) | experts(0) |
    | 3 | post combine(0), wait dispatch(1) | combine(0) | experts(1) |
    | 4 | post combine(1), wait combine(0), wait combine(1) | | |

    A Function's forward runs without autograd, so each half's experts run
    behind a **boundary**, as Megatron-LM's `ScheduleNode` does:
    `received = received.detach().requires_grad_()`, then
    `with torch.enable_grad(): out = experts_on_received(...)`; keep `received`
    and `out` on `ctx`. The backward is the mirror, and you call each half's
    backward where the schedule wants it: post both halves' combine-backward
    all-to-alls (each gradient travels to the experts with its dispatch's
    splits), wait for half 1's, `torch.autograd.backward(out_1, grad)` (the
    experts' input gradient lands in `received_1.grad`, their weight gradients
    in their `.grad`), post half 1's dispatch-backward (home, with the
    combine's splits) at once, then the same for half 0; wait for both and
    return the two input gradients (`None` for the other arguments).

    Graded: `test_overlapped_moe_layer`, the numbers (against the same dense
    MoE as exercise 6) and each half's all-to-alls with its own splits,
    mirrored in backward; `test_moe_overlap`, the schedule, from each rank's
    ledger in order. Per phase, with F the half whose experts compute first and
    S the other: S's all-to-all towards the experts must be posted before F's
    experts start and waited after they end; F's all-to-all home must be posted
    before S's experts start and waited after they end; and each half's experts
    run only after that half's own all-to-all towards them is waited. The ledger
    records which all-to-all each `wait()` is for, and hooks on the local
    experts mark their compute (call them as modules: `run_local_experts`
    does). Both cells run your layer on the check's own transport, which
    **holds** every asynchronous all-to-all: its output buffer holds NaN until
    your code completes the work, by `wait()` or any other way
    (`is_completed()`, `get_future()`, `synchronize()`, `result()`, a barrier),
    and gets the rows only then. Rows read before the wait are NaN every time,
    however fast the machine (a race the real transport usually wins), and an
    all-to-all completed early is no longer in flight, wherever you call
    `wait()`. A layer that waits at once computes right and loses only the
    overlap cell.
    """)
    nb.solution_from("moe_overlap", overlap, "post_all_to_all", "experts_on_received", "_OverlappedExperts",
                     "OverlappedMoELayer")
    nb.test("test_overlapped_moe_layer", 8,
            doc="OverlappedMoELayer equals the dense MoE (as MoELayer): numbers, each half's all-to-alls, mirrored.",
            visible="""
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=4, num_experts=8, k=2, num_tokens=12)
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=4, ep_size=2, num_experts=6, k=2, num_tokens=12,
                               capacity_factor=1.0)
    """, hidden="""
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=2, num_experts=4, k=1, num_tokens=10,
                               pattern="starve_expert", seed=2)
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=2, num_experts=6, k=2, num_tokens=11, pattern="ties",
                               seed=3)
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=4, ep_size=2, num_experts=4, k=2, num_tokens=10,
                               dtype=torch.float32, hidden=5, ffn=6, seed=4)
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=4, num_experts=8, k=2, num_tokens=16,
                               capacity_factor=0.75, seed=1)
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=1, num_experts=3, k=2, num_tokens=8, seed=5)
    """)
    nb.test("test_moe_overlap", 7,
            doc="Each half's all-to-alls are in flight while the other half's experts compute, forward and backward.",
            visible="""
    check_moe_overlap(OverlappedMoELayer, world_size=4, num_experts=8, k=2, num_tokens=12)
    """, hidden="""
    check_moe_overlap(OverlappedMoELayer, world_size=2, num_experts=4, k=2, num_tokens=11, seed=1)
    check_moe_overlap(OverlappedMoELayer, world_size=4, ep_size=2, num_experts=4, k=2, num_tokens=10,
                      dtype=torch.float32, seed=2)
    check_moe_overlap(OverlappedMoELayer, world_size=4, num_experts=8, k=2, num_tokens=16, seed=3)
    check_moe_overlap(OverlappedMoELayer, world_size=2, num_experts=4, k=1, num_tokens=14, seed=5)
    check_moe_overlap(OverlappedMoELayer, world_size=1, num_experts=2, k=2, num_tokens=6, seed=4)
    """)
    nb.markdown("""
    ### Picture: your layer's schedule

    What rank 0 of your layer did, in order: each all-to-all (which half,
    which direction) when it was posted, each wait and the all-to-all it was
    for, and when each half's experts computed, in forward and in backward:
    the record `test_moe_overlap` judges. Run it once exercise 7 computes.
    """)
    nb.code("""
    print_overlap_timeline(OverlappedMoELayer, world_size=2)
    """)
    nb.nccl_checks("""
    [
        ("all_to_all", check_all_to_all, (all_to_all,), {"world_size": 2}),
        ("dispatch", check_dispatch, (AllToAllTokenDispatcher,), {"world_size": 2}),
        ("dispatch -> combine -> backward", check_dispatcher_communication, (AllToAllTokenDispatcher,),
         {"world_size": 2}),
        ("MoE layer", check_moe_layer, (MoELayer,), {"world_size": 2}),
        ("overlapped MoE layer", check_overlapped_moe_layer, (OverlappedMoELayer,), {"world_size": 2}),
        ("its schedule", check_moe_overlap, (OverlappedMoELayer,), {"world_size": 2}),
    ]
    """)
    return nb


if __name__ == "__main__":
    build().write(OUT)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
