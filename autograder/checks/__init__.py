"""Public checks, one module per assignment: the readable spec of what is graded.

A notebook's test cells call these with the student's implementations; the
hidden tests call the same functions with other world sizes, shapes, seeds and
dtypes. Each check runs rank programs with autograder.dist.run_distributed and
computes its verdict in the calling process from what the ranks returned.
"""

import functools


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
