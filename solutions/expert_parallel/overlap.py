"""Reference solution, assignment 05 (part 3): the overlapped MoE layer (exercise 7).

The tokens of a step are cut in two halves (DeepSeek-V3's two micro-batches,
report sec. 3.4: "overlapping the attention and MoE of one micro-batch with the
dispatch and combine of another"). Each half is routed, dispatched, computed
by the local experts and combined as in `MoELayer`, but every all-to-all is
posted asynchronously and waited only after the OTHER half's experts have
computed:

    forward:   post dispatch(0), post dispatch(1) | wait dispatch(0), experts(0), post combine(0)
               | wait dispatch(1), experts(1), post combine(1) | wait combine(0), wait combine(1)
    backward:  the mirror, half 1 first: post the two combine backwards | wait, experts'
               backward of half 1, post its dispatch backward | wait, experts' backward of half 0, ...

so dispatch(1) travels while experts(0) compute, and combine(0) while experts(1)
compute; the same in backward. The expert computation of each half runs behind
a detached boundary, and its backward is called explicitly where the schedule
wants it: Megatron-LM's `ScheduleNode` (`megatron/core/pipeline_parallel/utils.py`:
inputs detached with `requires_grad`, backward by `run_backward` on the node's
outputs, the inputs' `.grad` returned) and DualPipe's `run_backward`
(`dualpipe/utils.py`). Built on solutions/expert_parallel/routing.py and layers.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_expert_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from solutions.expert_parallel.layers import MoELayer, apply_router_token_dropping
from solutions.expert_parallel.routing import (
    exchange_token_counts,
    load_balancing_loss,
    permute,
    run_local_experts,
    sort_chunks_by_idxs,
    topk_router,
    unpermute,
)

__all__ = ["post_all_to_all", "OverlappedMoELayer"]


# ---------------------------------------------------------------------------
# Exercise 7: the overlapped MoE layer
# ---------------------------------------------------------------------------

def post_all_to_all(input_, *, output_split_sizes, input_split_sizes, group):
    """Start an all-to-all of the rows of `input_` and return at once: `(output, work)`.

    `output` (`sum(output_split_sizes)` rows) holds the received rows only after
    `work.wait()`. Not differentiable: `_OverlappedExperts` posts the backward's
    all-to-alls itself. A group of one: `(input_, None)`, nothing to wait for.
    """
    ### BEGIN SOLUTION
    if group.size() == 1:
        return input_, None
    input_ = input_.contiguous()
    output = input_.new_empty((sum(output_split_sizes),) + tuple(input_.shape[1:]))
    work = dist.all_to_all_single(output, input_, output_split_sizes=list(output_split_sizes),
                                  input_split_sizes=list(input_split_sizes), group=group, async_op=True)
    return output, work
    ### END SOLUTION


def experts_on_received(local_experts, received, plan):
    """The local experts on the rows one half's dispatch delivered: `[N_recv, h]` -> `[N_recv, h]`.

    `received` is ordered (source rank, local expert, token), as the all-to-all
    delivers it; the experts want (local expert, source rank, token); the result
    goes back in the received order, ready for the combine all-to-all
    (exercise 4's steps 4 and its inverse). `plan["counts"]` is the half's
    `[w, E/w]` count matrix. Differentiable.
    """
    ### BEGIN SOLUTION
    counts = plan["counts"]  # [w, E/w]
    w, local = counts.shape
    to_expert_major = torch.arange(w * local).view(w, local).t().reshape(-1).tolist()
    expert_input = sort_chunks_by_idxs(received, counts.reshape(-1).tolist(), to_expert_major)
    expert_output = run_local_experts(local_experts, expert_input, counts.sum(dim=0))  # [N_recv, h]
    to_source_major = torch.arange(local * w).view(local, w).t().reshape(-1).tolist()
    return sort_chunks_by_idxs(expert_output, counts.t().reshape(-1).tolist(), to_source_major)
    ### END SOLUTION


class _OverlappedExperts(torch.autograd.Function):
    """Dispatch -> experts -> combine of two halves, each all-to-all in flight while the other half computes.

    `apply(local_experts, plans, rows0, rows1)` -> `(back0, back1)`: `rows_j` is
    half j's permuted rows `[N_j, h]` (what dispatch sends), `back_j` their expert
    outputs back at the source, in the same order. In backward the same two
    halves in reverse: the gradients travel to the experts (combine's backward),
    the experts' backward runs (input and weight gradients), the input gradients
    travel home (dispatch's backward); each all-to-all in flight while the other
    half's experts run their backward.
    """

    @staticmethod
    def forward(ctx, local_experts, plans, *rows):
        ### BEGIN SOLUTION
        group = plans[0]["group"]
        # Both dispatches posted first: half 1's rows travel while half 0's experts compute.
        dispatched = [post_all_to_all(x, output_split_sizes=p["recv"], input_split_sizes=p["send"], group=group)
                      for x, p in zip(rows, plans)]  # [N_send_j, h] -> [N_recv_j, h]
        ctx.received, ctx.outputs, combined = [], [], []
        for (received, work), plan in zip(dispatched, plans):
            if work is not None:
                work.wait()
            # The boundary (Megatron's ScheduleNode): autograd stops here, backward() picks up from here.
            received = received.detach().requires_grad_()
            with torch.enable_grad():
                out = experts_on_received(local_experts, received, plan)
            ctx.received.append(received)
            ctx.outputs.append(out)
            # Its combine posted at once: it travels while the other half's experts compute.
            combined.append(post_all_to_all(out.detach(), output_split_sizes=plan["send"],
                                            input_split_sizes=plan["recv"], group=group))  # -> [N_send_j, h]
        for _, work in combined:
            if work is not None:
                work.wait()
        ctx.plans = plans
        return tuple(back for back, _ in combined)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, *grads):
        ### BEGIN SOLUTION
        plans, group = ctx.plans, ctx.plans[0]["group"]
        order = (1, 0)  # the last half of forward comes back first
        # Combine's backward (towards the experts), both posted first.
        arrived = {j: post_all_to_all(grads[j].contiguous(), output_split_sizes=plans[j]["recv"],
                                      input_split_sizes=plans[j]["send"], group=group) for j in order}
        home = {}
        for j in order:
            grad_out, work = arrived[j]
            if work is not None:
                work.wait()
            # The experts' backward: the input gradient, and the weight gradients into .grad.
            torch.autograd.backward(ctx.outputs[j], grad_out)
            # Dispatch's backward (home to the source) posted at once, in flight during the other half's backward.
            home[j] = post_all_to_all(ctx.received[j].grad, output_split_sizes=plans[j]["send"],
                                      input_split_sizes=plans[j]["recv"], group=group)
        for j in order:
            if home[j][1] is not None:
                home[j][1].wait()
        return None, None, home[0][0], home[1][0]
        ### END SOLUTION


class OverlappedMoELayer(MoELayer):
    """`MoELayer` whose two token halves hide each other's all-to-alls, in forward and in backward.

    Same constructor, same parameters, same numbers: `forward(hidden_states [T, h])`
    returns `(output [T, h], aux_loss)` equal to `MoELayer`'s. Routing, the aux
    loss and token dropping are computed on all T tokens (as the plain layer);
    then the tokens are cut with `hidden_states.tensor_split(2)` (half 0: the
    first ceil(T/2) tokens) and each half is dispatched, computed and combined
    by `_OverlappedExperts`.
    """

    def __init__(self, hidden_size, ffn_hidden_size, num_experts, *, k, ep_group, master_router_weight,
                 master_expert_weights, capacity_factor=None):
        ### BEGIN SOLUTION
        super().__init__(hidden_size, ffn_hidden_size, num_experts, k=k, ep_group=ep_group,
                         capacity_factor=capacity_factor, master_router_weight=master_router_weight,
                         master_expert_weights=master_expert_weights)
        self.ep_group = ep_group
        ### END SOLUTION

    def forward(self, hidden_states):
        ### BEGIN SOLUTION
        logits = self.router(hidden_states)  # [T, h] -> [T, E]
        probs, routing_map = topk_router(logits, k=self.k)
        aux_loss = load_balancing_loss(logits, routing_map, k=self.k)  # counts before any drop
        if self.capacity_factor is not None:  # capacity per source rank, over all T tokens (as MoELayer)
            probs, routing_map = apply_router_token_dropping(probs, routing_map, k=self.k,
                                                             capacity_factor=self.capacity_factor)
        w = self.ep_group.size()
        plans = []
        for x, m in zip(hidden_states.tensor_split(2), routing_map.tensor_split(2)):  # two halves of the tokens
            per_expert = m.sum(dim=0).to(torch.int64)  # [E]
            counts = exchange_token_counts(per_expert, group=self.ep_group)  # [w, E/w]
            permuted, sorted_indices = permute(x, m)  # [T_j, h] -> [N_send_j, h], expert-major
            plans.append({"group": self.ep_group, "counts": counts, "permuted": permuted,
                          "sorted_indices": sorted_indices, "send": per_expert.view(w, -1).sum(dim=1).tolist(),
                          "recv": counts.sum(dim=1).tolist()})
        backs = _OverlappedExperts.apply(self.local_experts, plans, *(p["permuted"] for p in plans))
        outs = [unpermute(back, p["sorted_indices"], pr, m)  # [N_send_j, h] -> [T_j, h], weighted
                for back, p, pr, m in zip(backs, plans, probs.tensor_split(2), routing_map.tensor_split(2))]
        return torch.cat(outs).to(hidden_states.dtype), aux_loss  # [T, h], scalar
        ### END SOLUTION
