"""Public checks of assignment 05 (expert parallelism, MoE all-to-all): the readable spec of what is graded.

Exercise -> check (the module of this package that holds it); this package re-exports them all:

    1  topk_router,                     check_topk_router, check_load_balancing_loss     routing.py
       load_balancing_loss
    2  permute, unpermute               check_permute, check_unpermute                   routing.py
       (worked example)                 check_exchange_token_counts                      dispatch.py
    3  all_to_all                       check_all_to_all                                 dispatch.py
    4  AllToAllTokenDispatcher          check_dispatch, check_combine,                   dispatch.py
                                        check_dispatcher_communication
    5  token dropping                   check_token_dropping                             routing.py
    6  MoELayer                         check_moe_layer                                  moe_layer.py
                                        check_argument_errors                            dispatch.py
    7  the overlapped MoE layer         check_overlapped_moe_layer, check_moe_overlap    overlap.py
       (pictures, not graded)           plot_dispatch, print_overlap_timeline            moe_layer.py, overlap.py
       (the guard, the reference)       AllToAllGuard, dense_moe_reference               common.py

    import autograder.checks.expert_parallel as checks
    checks.check_topk_router(topk_router, num_tokens=8, num_experts=4, k=2)
    checks.check_dispatch(AllToAllTokenDispatcher, world_size=2)

The router, the auxiliary loss, `permute`/`unpermute` and token dropping are
single-process functions: their checks call the student's function here and
compare with an independent reference (plain Python loops for every choice:
which experts, which order, which tokens are kept). The distributed checks
build every rank's tokens, routing and full ("master") weights in this
process, run a rank program with `run_distributed`, and decide here from what
the ranks returned: expert inputs, outputs, every gradient (input, expert
weights, the router weight through the probabilities), and each rank's
communication ledger, against a dense single-process MoE (every token through
its top-k experts, weighted) (spec 4.5). Rank programs also run under an
`AllToAllGuard`, which compares the split sizes of every all-to-all across the
ranks before gloo runs it (gloo returns garbage, or aborts, when they disagree).
Tokens are `[T, h]`; rank r of an EP group of w holds experts `[r E/w, (r+1) E/w)`.
"""

from .common import (
    AllToAllGuard, dense_moe_reference,
)
from .routing import (
    check_topk_router, check_load_balancing_loss, check_permute, check_unpermute, check_token_dropping,
)
from .dispatch import (
    check_exchange_token_counts, check_all_to_all, check_argument_errors, check_dispatch, check_combine,
    check_dispatcher_communication,
)
from .moe_layer import (
    check_moe_layer, plot_dispatch,
)
from .overlap import (
    check_overlapped_moe_layer, check_moe_overlap, print_overlap_timeline, halves,
)

__all__ = [
    "AllToAllGuard", "dense_moe_reference", "check_topk_router", "check_load_balancing_loss", "check_permute",
    "check_unpermute", "check_token_dropping", "check_exchange_token_counts", "check_all_to_all",
    "check_argument_errors", "check_dispatch", "check_combine", "check_dispatcher_communication", "check_moe_layer",
    "plot_dispatch", "check_overlapped_moe_layer", "check_moe_overlap", "print_overlap_timeline", "halves",
]
