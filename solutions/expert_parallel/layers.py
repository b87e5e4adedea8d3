"""Reference solution, assignment 05 (part 2): the all-to-all token dispatcher, token dropping, the MoE layer.

`AllToAllTokenDispatcher` is Megatron-LM's `MoEAlltoAllTokenDispatcher`
(`megatron/core/transformer/moe/token_dispatcher.py`) without tensor
parallelism and without padding to capacity: counts first, then the tokens,
then the local expert order, and back. `apply_router_token_dropping` is
`moe_utils.apply_router_token_dropping` (drop policy "probs"), and `MoELayer`
ties router, dispatcher and experts together as `moe/moe_layer.py` `MoELayer`.
Built on solutions/expert_parallel/routing.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_expert_parallel_solutions.py
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from solutions.expert_parallel.routing import (
    ExpertMLP,
    _check_routing,
    _group_size_rank,
    all_to_all,
    exchange_token_counts,
    load_balancing_loss,
    permute,
    run_local_experts,
    sort_chunks_by_idxs,
    topk_router,
    unpermute,
)

__all__ = ["AllToAllTokenDispatcher", "apply_router_token_dropping", "MoELayer"]


# ---------------------------------------------------------------------------
# Exercise 4: the all-to-all token dispatcher
# ---------------------------------------------------------------------------

class AllToAllTokenDispatcher:
    """Send each token to the ranks of its experts and back (Megatron `MoEAlltoAllTokenDispatcher`).

    Rank r of the EP group holds experts `[r * E/w, (r + 1) * E/w)`. `dispatch`
    exchanges the token counts, then the tokens, and returns this rank's
    expert input grouped by local expert (then source rank, then token index);
    `combine` sends the expert outputs back and sums them into their tokens,
    weighted by the probabilities.
    """

    def __init__(self, num_experts, *, ep_group):
        ### BEGIN SOLUTION
        size, rank = _group_size_rank(ep_group, "AllToAllTokenDispatcher")
        if not isinstance(num_experts, int) or num_experts < 1 or num_experts % size:
            raise ValueError(f"AllToAllTokenDispatcher: num_experts ({num_experts}) must be a positive multiple "
                             f"of the EP group size ({size})")
        self.num_experts = num_experts
        self.ep_group = ep_group
        self.ep_size = size
        self.num_local_experts = num_experts // size
        self.local_expert_indices = list(range(rank * self.num_local_experts, (rank + 1) * self.num_local_experts))
        self._state = None
        ### END SOLUTION

    def dispatch(self, hidden_states, probs, routing_map):
        """`(expert_input [N, h], tokens_per_local_expert [E/w] int64)` for this rank's experts."""
        ### BEGIN SOLUTION
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
            got = list(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else hidden_states
            raise ValueError(f"dispatch: hidden_states must be [T, h], got {got!r}")
        num_tokens = hidden_states.shape[0]
        _check_routing(routing_map, num_tokens, self.num_experts, "dispatch")
        if not isinstance(probs, torch.Tensor) or tuple(probs.shape) != tuple(routing_map.shape):
            raise ValueError(f"dispatch: probs must have the routing map's shape {list(routing_map.shape)}, got "
                             f"{list(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__}")
        w, local = self.ep_size, self.num_local_experts
        num_local_tokens_per_expert = routing_map.sum(dim=0).to(torch.int64)  # [E]
        # 1. Counts first: row s = tokens rank s sends to each of my local experts.
        counts = exchange_token_counts(num_local_tokens_per_expert, group=self.ep_group)  # [w, E/w]
        input_splits = num_local_tokens_per_expert.view(w, local).sum(dim=1).tolist()  # rows to each rank
        output_splits = counts.sum(dim=1).tolist()  # rows from each rank
        # 2. Permute: expert-major, which is also destination-rank-major (experts are contiguous per rank).
        permuted, sorted_indices = permute(hidden_states, routing_map)  # [T, h] -> [N_send, h]
        # 3. The tokens: [N_send, h] -> [N_recv, h], ordered (source rank, local expert, token).
        received = all_to_all(permuted, output_split_sizes=output_splits, input_split_sizes=input_splits,
                              group=self.ep_group)
        # 4. Local expert order: chunk (s, e) sits at s * E/w + e; visit them expert-major.
        to_expert_major = torch.arange(w * local).view(w, local).t().reshape(-1).tolist()
        expert_input = sort_chunks_by_idxs(received, counts.reshape(-1).tolist(), to_expert_major)
        self._state = {"counts": counts, "input_splits": input_splits, "output_splits": output_splits,
                       "sorted_indices": sorted_indices, "probs": probs, "routing_map": routing_map,
                       "dtype": hidden_states.dtype}
        return expert_input, counts.sum(dim=0)  # [N_recv, h], [E/w]
        ### END SOLUTION

    def combine(self, expert_output):
        """The inverse of `dispatch`: `[T, h]`, each token the probability-weighted sum of its expert outputs."""
        ### BEGIN SOLUTION
        if self._state is None:
            raise RuntimeError("combine: call dispatch first (combine sends the expert outputs back to where "
                               "dispatch took the tokens from)")
        st = self._state
        w, local = self.ep_size, self.num_local_experts
        counts = st["counts"]  # [w, E/w]
        if not isinstance(expert_output, torch.Tensor) or expert_output.dim() != 2 \
                or expert_output.shape[0] != int(counts.sum()):
            got = list(expert_output.shape) if isinstance(expert_output, torch.Tensor) else expert_output
            raise ValueError(f"combine: expert_output must be [N, h] with N = {int(counts.sum())} rows (what "
                             f"dispatch returned), got {got!r}")
        # 1. Back to source-major: chunk (e, s) sits at e * w + s in the expert-major order.
        to_source_major = torch.arange(local * w).view(local, w).t().reshape(-1).tolist()
        x = sort_chunks_by_idxs(expert_output, counts.t().reshape(-1).tolist(), to_source_major)
        # 2. The reverse all-to-all: what I received from rank s goes back to rank s.
        x = all_to_all(x, output_split_sizes=st["input_splits"], input_split_sizes=st["output_splits"],
                       group=self.ep_group)  # [N_recv, h] -> [N_send, h]
        # 3. Unpermute: each token sums its k expert outputs, weighted by its probabilities.
        output = unpermute(x, st["sorted_indices"], st["probs"], st["routing_map"])  # [T, h]
        return output.to(st["dtype"])
        ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 5: token dropping with a capacity factor
# ---------------------------------------------------------------------------

def apply_router_token_dropping(probs, routing_map, *, k, capacity_factor):
    """Keep at most `ceil(T * k / E * capacity_factor)` tokens per expert: the highest-probability ones.

    Among equal probabilities the earlier token is kept. Returns
    `(probs * kept, kept)`; kept probabilities are not renormalised
    (Megatron `moe_utils.apply_router_token_dropping`, drop policy "probs").
    """
    ### BEGIN SOLUTION
    if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
        raise ValueError(f"apply_router_token_dropping: probs must be [T, E], got "
                         f"{list(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__}")
    num_tokens, num_experts = probs.shape
    _check_routing(routing_map, num_tokens, num_experts, "apply_router_token_dropping")
    if not isinstance(capacity_factor, (int, float)) or isinstance(capacity_factor, bool) or capacity_factor <= 0:
        raise ValueError(f"apply_router_token_dropping: capacity_factor must be a positive number, "
                         f"got {capacity_factor!r}")
    capacity = math.ceil(num_tokens * k / num_experts * capacity_factor)
    # Rank each expert's tokens by probability, highest first; the stable sort keeps the earlier token first on ties.
    scores = probs.detach().masked_fill(~routing_map, float("-inf"))  # [T, E]
    order = torch.sort(scores, dim=0, descending=True, stable=True).indices  # [T, E]: token at each position
    position = torch.empty_like(order).scatter_(
        0, order, torch.arange(num_tokens, device=order.device).unsqueeze(1).expand(num_tokens, num_experts))
    kept = routing_map & (position < capacity)  # [T, E]
    return probs * kept, kept
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 6: the MoE layer
# ---------------------------------------------------------------------------

class MoELayer(nn.Module):
    """Router -> (token dropping) -> dispatch -> local experts -> combine (Megatron `moe_layer.MoELayer`).

    `forward(hidden_states [T, h])` returns `(output [T, h], aux_loss)`. The
    router is replicated (`self.router`, weight `[E, h]`); this rank holds the
    experts `[r * E/w, (r + 1) * E/w)` as `self.local_experts`.
    """

    def __init__(self, hidden_size, ffn_hidden_size, num_experts, *, k, ep_group, master_router_weight,
                 master_expert_weights, capacity_factor=None):
        super().__init__()
        ### BEGIN SOLUTION
        size, rank = _group_size_rank(ep_group, "MoELayer")
        if not isinstance(num_experts, int) or num_experts < 1 or num_experts % size:
            raise ValueError(f"MoELayer: num_experts ({num_experts}) must be a positive multiple of the EP "
                             f"group size ({size})")
        if not isinstance(k, int) or not 1 <= k <= num_experts:
            raise ValueError(f"MoELayer: k must be an int in [1, num_experts] = [1, {num_experts}], got {k!r}")
        if capacity_factor is not None and (not isinstance(capacity_factor, (int, float)) or capacity_factor <= 0):
            raise ValueError(f"MoELayer: capacity_factor must be None or positive, got {capacity_factor!r}")
        if not isinstance(master_router_weight, torch.Tensor) \
                or tuple(master_router_weight.shape) != (num_experts, hidden_size):
            got = (list(master_router_weight.shape) if isinstance(master_router_weight, torch.Tensor)
                   else type(master_router_weight).__name__)
            raise ValueError(f"MoELayer: master_router_weight must be [num_experts, hidden_size] = "
                             f"[{num_experts}, {hidden_size}], got {got}")
        if len(master_expert_weights) != num_experts:
            raise ValueError(f"MoELayer: master_expert_weights must hold one (w1, w2) pair per expert "
                             f"({num_experts}), got {len(master_expert_weights)}")
        self.k = k
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(hidden_size, num_experts, bias=False, dtype=master_router_weight.dtype,
                                device=master_router_weight.device)
        with torch.no_grad():
            self.router.weight.copy_(master_router_weight)
        self.token_dispatcher = AllToAllTokenDispatcher(num_experts, ep_group=ep_group)
        local = num_experts // size
        self.local_experts = nn.ModuleList(
            ExpertMLP(hidden_size, ffn_hidden_size, master_fc1_weight=w1, master_fc2_weight=w2)
            for w1, w2 in master_expert_weights[rank * local:(rank + 1) * local])
        ### END SOLUTION

    def forward(self, hidden_states):
        ### BEGIN SOLUTION
        logits = self.router(hidden_states)  # [T, h] -> [T, E], replicated router
        probs, routing_map = topk_router(logits, k=self.k)
        aux_loss = load_balancing_loss(logits, routing_map, k=self.k)  # counts before any drop, as Megatron
        if self.capacity_factor is not None:
            probs, routing_map = apply_router_token_dropping(probs, routing_map, k=self.k,
                                                             capacity_factor=self.capacity_factor)
        expert_input, tokens_per_expert = self.token_dispatcher.dispatch(hidden_states, probs, routing_map)
        expert_output = run_local_experts(self.local_experts, expert_input, tokens_per_expert)  # [N, h]
        return self.token_dispatcher.combine(expert_output), aux_loss  # [T, h], scalar
        ### END SOLUTION
