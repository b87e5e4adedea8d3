"""Public checks, one package per assignment: the readable spec of what is graded (in the student package).

    data_parallel/  tensor_parallel/  pipeline_parallel/  context_parallel/  expert_parallel/  composition/

named like the dimensions of solutions/. Each package's __init__ lists its
exercises and the checks that grade them, and re-exports those checks (a
notebook imports them from there: `from autograder.checks.tensor_parallel
import check_mapping`); its modules split the assignment along its exercises.
A notebook's test cells call these with the student's implementations; the
hidden tests call the same functions with other world sizes, shapes, seeds and
dtypes. Each check runs rank programs with autograder.runtime.dist.run_distributed and
computes its verdict in the calling process from what the ranks returned.

Built on the runtime (runner, ledger, comparisons) and the lessons' formulas
and figures (autograder.lessons); used by the notebooks, the trusted grader
(which executes the notebooks' test cells), the site's figures and the tests.
"""

import functools


def inputs_only(case, *expected: str):
    """What a rank program may be sent of a case: the case (a dict, or a list of dicts) without its expected
    results (`expected`: their keys). Rank programs run next to the student's code; expected values stay in
    the process that decides the verdict."""
    if isinstance(case, list):
        return [inputs_only(c, *expected) for c in case]
    return {k: v for k, v in case.items() if k not in expected}


def one_thread(check):
    """Run a check with one intra-op thread in this process, then restore the setting.

    The parent's part of a check (the single-process reference) is tiny; with
    two OpenMP threads on a busy machine one of them is often descheduled
    while the other spins at a barrier, which made a 20 ms reference take
    2-3 s. With one thread its time does not depend on the machine's load, nor
    its rounding on the kernel's thread setting.
    """
    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return check(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
    return wrapper


def expect_value_errors(results: list, cases: list[tuple[str, list]], world_size: int, *,
                        communication: str = "any collective") -> None:
    """The verdict of an argument-error check, from what its rank program returned.

    `cases`: (label, the strings its message must contain) per invalid call;
    `results[rank][i]`: {"error": (type name, message) or None, "records": the
    ledger's records of that call}. On every rank each call must raise
    ValueError (not another error, not nothing), before any communication,
    and its message must name the sizes involved. `communication`: what it
    must come before, in the message ("any send or receive" for P2P code).
    """
    from autograder.runtime.compare import CheckFailure
    from autograder.runtime.ledger import format_trace

    for i, (label, must_mention) in enumerate(cases):
        for rank in range(world_size):
            res = results[rank][i]
            if res["error"] is None:
                raise CheckFailure(f"rank {rank}: {label}: expected ValueError, nothing was raised.")
            kind, msg = res["error"]
            if kind != "ValueError":
                raise CheckFailure(f"rank {rank}: {label}: expected ValueError, got {kind}: {msg}")
            comm = [r for r in res["records"] if r.op != "wait"]
            if comm:
                raise CheckFailure(f"rank {rank}: {label}: ValueError raised only after communicating; "
                                   f"validate before {communication}:\n{format_trace(comm, rank)}")
            absent = [s for s in must_mention if s not in msg]
            if absent:
                raise CheckFailure(f"rank {rank}: {label}: the ValueError should name the sizes involved "
                                   f"({', '.join(must_mention)}); its message was: {msg!r}")
