"""Public checks of assignment 06 (the capstone: the dimensions composed): the readable spec of what is graded.

Exercise -> check (the module of this package that holds it); this package re-exports them all:

    1  rank_layout                      check_rank_layout, check_rank_layout_errors      layout.py
    2  the groups, the DeviceMesh       check_process_groups, check_device_mesh          layout.py
    3  local_batch                      check_local_batch                                layout.py
    4  apply_tensor_parallel            check_tensor_parallel_plan                       train.py
    5  apply_fsdp, DP x TP              check_dp_tp_training                             train.py
    6  the loss, averaged once          check_loss_averaging                             train.py
    7  the tied embedding               check_tied_embedding_grads                       train.py
    8  clip_grad_norm_                  check_clip_grad_norm                             train.py
    9  PP x DP x TP                     check_pipeline_training (PIPELINE_FUNCTIONS)     train.py
    10 memory_per_gpu                   check_memory_per_gpu                             planner.py
    11 step_time                        check_step_time                                  planner.py
    12 plan, best_layouts               check_plan, check_best_layouts                   planner.py
    13 checkpoint_state                 check_checkpoint_state                           checkpoint.py
       (picture, not graded)            plot_rank_layout                                 layout.py
       (the job, not graded)            composition_job                                  job.py

    import autograder.checks.composition as checks
    checks.check_rank_layout(rank_layout, 16, tp=2, pp=4, expected={...})
    checks.check_dp_tp_training(apply_tensor_parallel, apply_fsdp, local_batch, dp=2, tp=2)

Each `check_*` takes the student's functions and keyword parameters, runs a
rank program of this module on `world_size` forked CPU ranks (gloo) when
ranks are needed, and decides in the calling process: layouts against the
expected rank lists; models against single-process PyTorch training of the
same `TinyGPT` from the same master weights (float64, tolerance 1e-10); the
glue (loss, tied embedding, clipping) against the single-process quantity it
must reproduce; communication from each rank's `CommLedger`. A check returns
None or raises CheckFailure / DistributedError (which names the rank).
The planner's checks are at the end.

`torch.distributed.tensor`, `.fsdp` and `.pipelining` are imported here, in
the parent, so that the forked ranks inherit them (about 1 s each otherwise).
"""

from .common import (
    TOL,
)
from .layout import (
    check_rank_layout, check_rank_layout_errors, check_process_groups, check_device_mesh, check_local_batch,
    plot_rank_layout,
)
from .train import (
    check_tensor_parallel_plan, check_dp_tp_training, check_loss_averaging, check_tied_embedding_grads,
    check_clip_grad_norm, check_pipeline_training, PIPELINE_FUNCTIONS,
)
from .planner import (
    check_memory_per_gpu, check_step_time, check_plan, check_best_layouts,
)

from .checkpoint import (
    check_checkpoint_state,
)

from .job import (
    composition_job, latest_checkpoint, JOB_ARGS,
)

__all__ = [
    "TOL", "check_rank_layout", "check_rank_layout_errors", "check_process_groups", "check_device_mesh",
    "check_local_batch", "plot_rank_layout", "check_tensor_parallel_plan", "check_dp_tp_training",
    "check_loss_averaging", "check_tied_embedding_grads", "check_clip_grad_norm", "check_pipeline_training",
    "PIPELINE_FUNCTIONS", "check_memory_per_gpu", "check_step_time", "check_plan", "check_best_layouts",
    "check_checkpoint_state", "composition_job", "latest_checkpoint", "JOB_ARGS",
]
