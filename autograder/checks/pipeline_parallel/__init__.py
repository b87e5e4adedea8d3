"""Public checks of assignment 03 (pipeline parallelism): the readable spec of what is graded.

Exercise -> check (the module of this package that holds it); this package re-exports them all:

    1  the P2P helpers                  check_p2p_helpers                                executor.py
    2  GPipe and 1F1B as data           check_gpipe_schedule, check_one_f_one_b_schedule schedules.py
    3  the bubble                       check_bubble_fraction                            schedules.py
    4  run_pipeline                     check_run_pipeline, check_pipeline_memory,       executor.py
                                        check_run_pipeline_errors
    5  interleaved 1F1B                 check_interleaved_schedule                       schedules.py
                                        (and check_run_pipeline with num_chunks)         executor.py
    6  the split backward               check_split_backward,                            split_backward.py
                                        check_split_backward_memory
    7  ZB-H1 as data                    check_zb_h1_schedule                             zero_bubble.py
    8  DualPipeV as data                check_dualpipev_schedule                         zero_bubble.py
    9  run_pipeline_zb                  check_run_pipeline_zb, check_pipeline_zb_memory  zero_bubble.py
       (given, pictures, not graded)    TaggedStage, show_schedules,                     executor.py,
                                        plot_pipeline_timelines, plot_zb_timelines,      schedules.py,
                                        torch_schedule_fn                                zero_bubble.py
       (the job, not graded)            pipeline_job                                     job.py

    from autograder.checks.pipeline_parallel import check_one_f_one_b_schedule, check_run_pipeline
    check_one_f_one_b_schedule(one_f_one_b_schedule)
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=2, num_microbatches=3)

Schedules are pure functions, checked without any rank (schedules.py); the executors run in real gloo
ranks on stages built by the checks (executor.py, zero_bubble.py say how).
"""

from .schedules import (
    simulate_schedules, show_schedules, format_actions, in_flight_peak, pending_peak, stage_of, owner_of,
    check_gpipe_schedule, check_one_f_one_b_schedule, check_interleaved_schedule, check_bubble_fraction,
)
from .executor import (
    TaggedStage, check_p2p_helpers, check_run_pipeline, check_pipeline_memory, check_run_pipeline_errors,
    record_timeline, measured_idle_fraction, plot_pipeline_timelines,
)
from .split_backward import (
    check_split_backward, check_split_backward_memory,
)
from .zero_bubble import (
    torch_schedule, torch_schedule_fn, check_zb_h1_schedule, check_dualpipev_schedule, check_run_pipeline_zb,
    check_pipeline_zb_memory, record_zb_timeline, plot_zb_timelines,
)

from .job import (
    pipeline_job, SCHEDULES,
)

__all__ = [
    "simulate_schedules", "show_schedules", "format_actions", "in_flight_peak", "pending_peak", "stage_of", "owner_of",
    "check_gpipe_schedule", "check_one_f_one_b_schedule", "check_interleaved_schedule", "check_bubble_fraction",
    "TaggedStage", "check_p2p_helpers", "check_run_pipeline", "check_pipeline_memory", "check_run_pipeline_errors",
    "record_timeline", "measured_idle_fraction", "plot_pipeline_timelines", "check_split_backward",
    "check_split_backward_memory", "torch_schedule", "torch_schedule_fn", "check_zb_h1_schedule",
    "check_dualpipev_schedule", "check_run_pipeline_zb", "check_pipeline_zb_memory", "record_zb_timeline",
    "plot_zb_timelines",
    "pipeline_job", "SCHEDULES",
]
