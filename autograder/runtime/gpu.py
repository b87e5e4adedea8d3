"""Optional NCCL runs of the same checks on a GPU node (never graded).

    from autograder.runtime import run_nccl_checks
    run_nccl_checks([("column layer", check_column_parallel_linear, (ColumnParallelLinear,), {"world_size": 2})])

On a machine with at least `world_size` CUDA devices each check runs again
with `backend="nccl"` (ranks spawned, tensors on `cuda:<rank>`); elsewhere each
is reported as skipped with the reason. Nothing here raises: the verdicts are
printed, and no points depend on them (spec 5).
"""

from __future__ import annotations

import os
import sys
import time

from autograder.runtime.messages import localize


# what a Linux machine with an NVIDIA driver has (WSL 2: /dev/dxg); without any, torch sees no CUDA device either
_DRIVER_PATHS = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg")


def nccl_status(world_size: int) -> tuple[bool, str]:
    """(available, reason) for running `world_size` NCCL ranks on this machine (on Linux without an NVIDIA
    driver, said without importing torch: 1.3 CPU-seconds of every grading command's start)."""
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in _DRIVER_PATHS):
        return False, "no CUDA device on this machine (the checks above ran with gloo on CPU)"
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover
        return False, f"torch is not importable: {exc}"
    if not torch.cuda.is_available():
        return False, "no CUDA device on this machine (the checks above ran with gloo on CPU)"
    if not dist.is_nccl_available():
        return False, "this torch build has no NCCL backend"
    n = torch.cuda.device_count()
    if n < world_size:
        return False, f"this machine has {n} CUDA device(s); these NCCL checks need {world_size}"
    return True, f"{n} CUDA device(s), NCCL available"


def run_nccl_checks(checks, *, verbose: bool = True) -> dict[str, str]:
    """Run each (label, check, args, kwargs) with backend="nccl" where possible; return label -> verdict."""
    verdicts = {}
    for label, check, args, kwargs in checks:
        world_size = int(kwargs.get("world_size", 2))
        ok, reason = nccl_status(world_size)
        if not ok:
            verdicts[label] = f"skipped: {reason}"
        else:
            t0 = time.monotonic()
            try:
                check(*args, backend="nccl", **kwargs)
                verdicts[label] = f"passed on NCCL ({time.monotonic() - t0:.1f} s)"
            except Exception as exc:  # noqa: BLE001 - reported, not raised: no points depend on it
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                verdicts[label] = f"FAILED on NCCL: {first}"
        if verbose:
            print(localize(f"{label}: {verdicts[label]}"))
    return verdicts
