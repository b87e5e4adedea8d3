"""Public checks of assignment 01 (data parallelism): the readable spec of what is graded.

Exercise -> check (the module of this package that holds it); this package re-exports them all:

    1  all_reduce_gradients           check_all_reduce_gradients                         ddp_zero.py
       (worked example)               check_broadcast_module_states                      ddp_zero.py
    2  BucketedDDP                    check_ddp_broadcast, check_ddp_gradients,          ddp_zero.py
                                      check_ddp_buckets, check_ddp_no_sync
    3  zero_bytes_per_param           check_zero_bytes_per_param                         ddp_zero.py
    4  ZeroShardedOptimizer           check_zero_matches_optimizer, check_zero_rounding, ddp_zero.py
                                      check_zero_state_sharded, check_zero_comm
    5  fully_shard,                   check_fsdp_numerics, check_fsdp_comm,              fsdp.py
       gather_full_params             check_fsdp_memory, check_fsdp_mixed_precision,
                                      check_gather_full_params
       (pictures, not graded)         plot_memory_ledger, ddp_timeline, plot_ddp_timeline  ddp_zero.py
       (the job, not graded)          data_parallel_job                                    job.py

    from autograder.checks.data_parallel import check_all_reduce_gradients
    check_all_reduce_gradients(all_reduce_gradients, world_size=2)

Each `check_*` takes the student's implementation plus keyword parameters, runs a rank program in
`world_size` processes, and decides in the calling process: the numbers against a single-process
reference, the communication from each rank's `CommLedger` (ddp_zero.py, fsdp.py say how).
"""

from .ddp_zero import (
    ToyNet, check_broadcast_module_states, check_all_reduce_gradients, check_ddp_broadcast, check_ddp_gradients,
    check_ddp_buckets, check_ddp_no_sync, check_zero_bytes_per_param, check_zero_matches_optimizer, check_zero_rounding,
    check_zero_state_sharded, check_zero_comm, expected_buckets, param_groups, zero_padded_size, OPTIMIZER_HYPER,
    PADDING_BOUND_PER_RANK, plot_memory_ledger, ddp_timeline, plot_ddp_timeline,
)
from .fsdp import (
    MixedPrecisionPolicy, RMSNorm, Block, TinyTransformer, LinearStack, MP_TOLERANCE, fsdp_units, check_fsdp_numerics,
    check_fsdp_comm, check_fsdp_memory, check_fsdp_mixed_precision, check_gather_full_params,
)

from .job import (
    data_parallel_job, STRATEGIES,
)

__all__ = [
    "ToyNet", "check_broadcast_module_states", "check_all_reduce_gradients", "check_ddp_broadcast",
    "check_ddp_gradients", "check_ddp_buckets", "check_ddp_no_sync", "check_zero_bytes_per_param",
    "check_zero_matches_optimizer", "check_zero_rounding", "check_zero_state_sharded", "check_zero_comm",
    "expected_buckets", "param_groups", "zero_padded_size", "OPTIMIZER_HYPER", "PADDING_BOUND_PER_RANK",
    "plot_memory_ledger", "ddp_timeline", "plot_ddp_timeline", "MixedPrecisionPolicy", "RMSNorm", "Block",
    "TinyTransformer", "LinearStack", "MP_TOLERANCE", "fsdp_units", "check_fsdp_numerics", "check_fsdp_comm",
    "check_fsdp_memory", "check_fsdp_mixed_precision", "check_gather_full_params",
    "data_parallel_job", "STRATEGIES",
]
