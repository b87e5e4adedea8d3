"""Reference solution, assignment 05 (part 1): routing, permutation and the differentiable all-to-all.

The single-process half of a Mixture-of-Experts layer and its one communication
op, as in Megatron-LM's `megatron/core/transformer/moe/moe_utils.py`
(`topk_routing_with_score_function`, `switch_load_balancing_loss_func`,
`permute`, `unpermute`, `sort_chunks_by_idxs`) and
`megatron/core/tensor_parallel/mappings.py` (`_AllToAll`, `all_to_all`).
Tokens are flattened to `[T, h]`; a routing map is a bool `[T, E]`. Every
communication op takes its process group explicitly and issues nothing for a
group of size 1. The dispatcher and the layer: solutions/expert_parallel/layers.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_expert_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "topk_router", "load_balancing_loss", "permute", "unpermute", "all_to_all",
    "exchange_token_counts", "sort_chunks_by_idxs", "ExpertMLP", "run_local_experts",
]


# ---------------------------------------------------------------------------
# Given helpers (no exercise): argument checks, chunk sorting, the experts
# ---------------------------------------------------------------------------

def _group_size_rank(group, what: str) -> tuple[int, int]:
    """(size, rank) of `group`; ValueError unless it is a torch.distributed.ProcessGroup."""
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{what}: the group must be a torch.distributed.ProcessGroup "
                         f"(e.g. dist.group.WORLD or dist.new_group(...)), got {type(group).__name__}")
    return group.size(), group.rank()


def _check_split_sizes(splits, group_size: int, what: str) -> list[int]:
    """`splits` as a list of ints; ValueError unless it has one non-negative int per rank of the group."""
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    if not isinstance(splits, (list, tuple)) or len(splits) != group_size \
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in splits):
        count = f" ({len(splits)} values)" if isinstance(splits, (list, tuple)) else ""
        raise ValueError(f"{what} must be a list of {group_size} non-negative ints (one per rank of the "
                         f"group), got {splits!r}{count}")
    return [int(s) for s in splits]


def _check_routing(routing_map, num_tokens: int, num_experts: int | None, what: str) -> None:
    """ValueError unless `routing_map` is a bool `[num_tokens, num_experts]` tensor."""
    if not isinstance(routing_map, torch.Tensor) or routing_map.dtype != torch.bool or routing_map.dim() != 2:
        got = (f"{routing_map.dtype} {list(routing_map.shape)}" if isinstance(routing_map, torch.Tensor)
               else type(routing_map).__name__)
        raise ValueError(f"{what}: routing_map must be a bool tensor [T, E], got {got}")
    if routing_map.shape[0] != num_tokens or (num_experts is not None and routing_map.shape[1] != num_experts):
        want = f"[{num_tokens}, {num_experts if num_experts is not None else 'E'}]"
        raise ValueError(f"{what}: routing_map has shape {list(routing_map.shape)}, expected {want}")


def sort_chunks_by_idxs(input_, split_sizes, sorted_idxs):
    """Cut dim 0 into chunks of `split_sizes` rows and concatenate them in the order `sorted_idxs`.

    Megatron-LM `moe_utils.sort_chunks_by_idxs` (without its fused kernel).
    Chunks may be empty. `split_sizes` and `sorted_idxs` are lists of ints.
    """
    chunks = torch.split(input_, list(split_sizes), dim=0)
    return torch.cat([chunks[i] for i in sorted_idxs], dim=0)


class ExpertMLP(nn.Module):
    """One expert: `linear_fc2(gelu(linear_fc1(x)))`, no biases (Megatron `transformer/mlp.py` MLP).

    `master_fc1_weight` is `[ffn, h]`, `master_fc2_weight` `[h, ffn]`; the expert keeps copies.
    """

    def __init__(self, hidden_size, ffn_hidden_size, *, master_fc1_weight, master_fc2_weight):
        super().__init__()
        for name, w, shape in (("master_fc1_weight", master_fc1_weight, (ffn_hidden_size, hidden_size)),
                               ("master_fc2_weight", master_fc2_weight, (hidden_size, ffn_hidden_size))):
            if not isinstance(w, torch.Tensor) or tuple(w.shape) != shape:
                got = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ValueError(f"ExpertMLP: {name} must have shape {list(shape)}, got {got}")
        self.linear_fc1 = nn.Linear(hidden_size, ffn_hidden_size, bias=False, dtype=master_fc1_weight.dtype,
                                    device=master_fc1_weight.device)
        self.linear_fc2 = nn.Linear(ffn_hidden_size, hidden_size, bias=False, dtype=master_fc2_weight.dtype,
                                    device=master_fc2_weight.device)
        with torch.no_grad():
            self.linear_fc1.weight.copy_(master_fc1_weight)
            self.linear_fc2.weight.copy_(master_fc2_weight)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))  # [n, h] -> [n, ffn] -> [n, h]


def run_local_experts(local_experts, expert_input, tokens_per_local_expert):
    """Local expert e gets the next `tokens_per_local_expert[e]` rows (Megatron `experts.SequentialMLP`).

    Every expert runs, also on zero rows, so an expert that received no token
    still gets a (zero) gradient.
    """
    splits = [int(n) for n in torch.as_tensor(tokens_per_local_expert).tolist()]
    if len(splits) != len(local_experts) or sum(splits) != expert_input.shape[0]:
        raise ValueError(f"run_local_experts: tokens_per_local_expert {splits} must have one count per local "
                         f"expert ({len(local_experts)}) summing to the rows of expert_input "
                         f"({expert_input.shape[0]})")
    chunks = torch.split(expert_input, splits, dim=0)  # one [n_e, h] chunk per local expert
    return torch.cat([expert(chunk) for expert, chunk in zip(local_experts, chunks)], dim=0)


# ---------------------------------------------------------------------------
# Exercise 1: the router and the auxiliary load-balancing loss
# ---------------------------------------------------------------------------

def topk_router(logits, *, k):
    """Top-k routing: `(probs [T, E], routing_map [T, E] bool)` (Megatron `topk_routing_with_score_function`).

    The k largest logits of each token are selected, ties toward the lower
    expert index; `probs` is the softmax over the k selected logits (zero
    elsewhere), computed and returned in `torch.promote_types(logits.dtype, torch.float32)`.
    """
    ### BEGIN SOLUTION
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"topk_router: logits must be a floating-point [T, E] tensor, got "
                         f"{list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    num_tokens, num_experts = logits.shape
    if not isinstance(k, int) or not 1 <= k <= num_experts:
        raise ValueError(f"topk_router: k must be an int in [1, E] = [1, {num_experts}], got {k!r}")
    # A stable sort keeps equal logits in expert order: ties go to the lower index (torch.topk's order is undefined).
    top_indices = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]  # [T, k]
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    top_probs = torch.softmax(logits.gather(1, top_indices).to(compute_dtype), dim=-1)  # [T, k]
    probs = torch.zeros(num_tokens, num_experts, dtype=compute_dtype, device=logits.device)
    probs = probs.scatter(1, top_indices, top_probs)  # [T, E], differentiable w.r.t. the logits
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=logits.device)
    routing_map = routing_map.scatter(1, top_indices, True)  # [T, E]
    return probs, routing_map
    ### END SOLUTION


def load_balancing_loss(logits, routing_map, *, k):
    """Switch-Transformer auxiliary loss `E / (k T^2) * sum_i P_i * count_i` over this rank's tokens.

    `P_i` sums the softmax over ALL E logits (in at least float32) over the
    tokens; `count_i` is how many tokens `routing_map` sends to expert i (no
    gradient flows through it). Megatron `switch_load_balancing_loss_func`.
    """
    ### BEGIN SOLUTION
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"load_balancing_loss: logits must be a [T, E] tensor, got "
                         f"{list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    num_tokens, num_experts = logits.shape
    _check_routing(routing_map, num_tokens, num_experts, "load_balancing_loss")
    if not isinstance(k, int) or not 1 <= k <= num_experts:
        raise ValueError(f"load_balancing_loss: k must be an int in [1, E] = [1, {num_experts}], got {k!r}")
    scores = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # [T, E]
    tokens_per_expert = routing_map.sum(dim=0).to(scores.dtype)  # [E], an integer count: no gradient
    return (scores.sum(dim=0) * tokens_per_expert).sum() * (num_experts / (k * num_tokens * num_tokens))
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 2: permute and unpermute
# ---------------------------------------------------------------------------

def permute(tokens, routing_map):
    """One row per (token, selected expert), expert-major: `(permuted [N, h], sorted_indices [N])`.

    All rows of expert 0 first, then expert 1, ...; within an expert the
    tokens keep their order (a stable sort). `sorted_indices[i]` is the token
    of row i (Megatron `moe_utils.permute`).
    """
    ### BEGIN SOLUTION
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"permute: tokens must be a [T, h] tensor, got "
                         f"{list(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    _check_routing(routing_map, tokens.shape[0], None, "permute")
    token_ids, expert_ids = routing_map.nonzero(as_tuple=True)  # token-major pairs, [N] each
    order = torch.argsort(expert_ids, stable=True)  # expert-major; tokens keep their order within an expert
    sorted_indices = token_ids[order]  # [N]
    return tokens.index_select(0, sorted_indices), sorted_indices  # [T, h] -> [N, h]
    ### END SOLUTION


def unpermute(permuted_tokens, sorted_indices, probs, routing_map):
    """Scatter rows back to their tokens and sum the copies, each weighted by its probability: `[T, h]`.

    Row i belongs to token `sorted_indices[i]` and to an expert given by the
    expert-major order of `permute`; its weight is `probs[token, expert]`.
    With `probs=None` the copies are summed unweighted (Megatron `moe_utils.unpermute`).
    """
    ### BEGIN SOLUTION
    num_tokens, num_experts = routing_map.shape
    _check_routing(routing_map, num_tokens, num_experts, "unpermute")
    if sorted_indices.shape[0] != permuted_tokens.shape[0]:
        raise ValueError(f"unpermute: {permuted_tokens.shape[0]} permuted rows but {sorted_indices.shape[0]} "
                         f"sorted_indices")
    if probs is not None:
        if tuple(probs.shape) != tuple(routing_map.shape):
            raise ValueError(f"unpermute: probs has shape {list(probs.shape)}, expected "
                             f"{list(routing_map.shape)} (the routing map's)")
        # The probability of each row, in permute's order: expert-major, tokens in order within an expert.
        permuted_probs = probs.t().contiguous().masked_select(routing_map.t().contiguous())  # [N]
        permuted_tokens = permuted_tokens * permuted_probs.unsqueeze(-1)  # [N, h]
    output = permuted_tokens.new_zeros((num_tokens, permuted_tokens.shape[-1]))
    return output.index_add(0, sorted_indices, permuted_tokens)  # [N, h] -> [T, h], the k copies summed
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Worked example: exchange the token counts (integers, no autograd)
# ---------------------------------------------------------------------------

def exchange_token_counts(num_local_tokens_per_expert, *, group):
    """Tell every rank how many of my tokens each of ITS experts gets: an all-to-all of counts.

    Input: `[E]` integers, how many of this rank's tokens go to each expert
    (`routing_map.sum(0)`). Experts `[j*E/w, (j+1)*E/w)` live on rank j, so
    piece j of the input (E/w counts) goes to rank j. Output: `[w, E/w]` int64,
    row s = how many tokens rank s sends to each of this rank's local experts.
    (Megatron all-gathers the whole `[E]` of every rank instead: `preprocess` of
    `MoEAlltoAllTokenDispatcher`.) Counts carry no gradient: no autograd here.
    """
    size, _ = _group_size_rank(group, "exchange_token_counts")
    counts = torch.as_tensor(num_local_tokens_per_expert).to(torch.int64).contiguous()
    if counts.dim() != 1 or counts.numel() % size:
        raise ValueError(f"exchange_token_counts: expected [E] counts with E divisible by the group size "
                         f"({size}), got shape {list(counts.shape)}")
    if size == 1:
        return counts.view(1, -1)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)  # w pieces of [E/w]: piece j -> rank j
    return received.view(size, -1)  # [w, E/w]


# ---------------------------------------------------------------------------
# Exercise 3: the differentiable all-to-all
# ---------------------------------------------------------------------------

class _AllToAll(torch.autograd.Function):
    """All-to-all with split sizes in forward, the same all-to-all with the splits swapped in backward.

    Megatron-LM `tensor_parallel/mappings.py` `_AllToAll`. Row block j of the
    input (`input_split_sizes[j]` rows) goes to rank j; the output stacks the
    blocks received from ranks 0, 1, ... (`output_split_sizes[i]` rows from rank i).
    """

    @staticmethod
    def forward(ctx, input_, output_split_sizes, input_split_sizes, group):
        ### BEGIN SOLUTION
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        if group.size() == 1:
            return input_
        input_ = input_.contiguous()
        output = input_.new_empty((sum(output_split_sizes),) + tuple(input_.shape[1:]))
        dist.all_to_all_single(output, input_, output_split_sizes=output_split_sizes,
                               input_split_sizes=input_split_sizes, group=group)  # [sum(in), h] -> [sum(out), h]
        return output
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        # The gradient of a received row lives where the row went: send it back, the splits swapped.
        grad_input = _AllToAll.apply(grad_output, ctx.input_split_sizes, ctx.output_split_sizes, ctx.group)
        return grad_input, None, None, None
        ### END SOLUTION


def all_to_all(input_, *, output_split_sizes, input_split_sizes, group):
    """Differentiable all-to-all of the rows of `input_` (Megatron `mappings.all_to_all`)."""
    ### BEGIN SOLUTION
    size, _ = _group_size_rank(group, "all_to_all")
    if not isinstance(input_, torch.Tensor) or input_.dim() < 1:
        raise ValueError(f"all_to_all: expected a tensor with at least one dimension, got "
                         f"{list(input_.shape) if isinstance(input_, torch.Tensor) else type(input_).__name__}")
    output_split_sizes = _check_split_sizes(output_split_sizes, size, "all_to_all: output_split_sizes")
    input_split_sizes = _check_split_sizes(input_split_sizes, size, "all_to_all: input_split_sizes")
    if sum(input_split_sizes) != input_.shape[0]:
        raise ValueError(f"all_to_all: input_split_sizes {input_split_sizes} sum to {sum(input_split_sizes)}, "
                         f"but the input has {input_.shape[0]} rows")
    return _AllToAll.apply(input_, output_split_sizes, input_split_sizes, group)
    ### END SOLUTION
