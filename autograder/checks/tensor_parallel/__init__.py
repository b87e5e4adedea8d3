"""Public checks of assignment 02 (tensor and sequence parallelism): the readable spec of what is graded.

Exercise -> check (the module of this package that holds it); this package re-exports them all:

    1-2  the six mappings               check_mapping (MAPPINGS)                           mappings.py
    3    ColumnParallelLinear,          check_column_parallel_linear,                      layers.py
         RowParallelLinear              check_row_parallel_linear, check_argument_errors,
                                        check_tp_pair_communication
    4    ParallelMLP,                   check_parallel_mlp, check_sequence_parallel_grads  layers.py
         allreduce_sequence_parallel_grads
    5    vocab_parallel_cross_entropy   check_vocab_parallel_cross_entropy                 loss.py
    6    LinearWithAsyncAllReduce       check_async_allreduce_gradients,                   layers.py
                                        check_async_allreduce_overlap
         (picture, not graded)          plot_pair_communication                            layers.py
         (the job, not graded)          tensor_parallel_job                                job.py

    import autograder.checks.tensor_parallel as checks
    checks.check_mapping(copy_to_tensor_model_parallel_region, "copy_to_tensor_model_parallel_region", world_size=2)

Every check builds the inputs and the full ("master") weights in this process
from a seed, runs a rank program with `run_distributed` on the student's code,
gets back outputs, gradients and each rank's communication ledger, and decides
here: element-wise against a single-process PyTorch reference (`nn.Linear`
maths, `F.cross_entropy`), and collective by collective against the expected
communication (spec 4.2). A check returns None on success and raises
`CheckFailure` (or `DistributedError` when a rank raised, crashed or hung).
Activations are `[s, b, h]`. Rank programs are module-level functions (so the
spawn start method can send them) and place tensors on `cuda:<rank>` for nccl.
"""

from .mappings import (
    MAPPINGS, check_mapping,
)
from .layers import (
    check_column_parallel_linear, check_row_parallel_linear, check_argument_errors, check_tp_pair_communication,
    check_parallel_mlp, check_sequence_parallel_grads, check_async_allreduce_gradients, check_async_allreduce_overlap,
    plot_pair_communication,
)
from .loss import (
    check_vocab_parallel_cross_entropy,
)

from .job import (
    tensor_parallel_job, NEEDS,
)

__all__ = [
    "MAPPINGS", "check_mapping", "check_column_parallel_linear", "check_row_parallel_linear", "check_argument_errors",
    "check_tp_pair_communication", "check_parallel_mlp", "check_sequence_parallel_grads",
    "check_async_allreduce_gradients", "check_async_allreduce_overlap", "plot_pair_communication",
    "check_vocab_parallel_cross_entropy",
    "tensor_parallel_job", "NEEDS",
]
