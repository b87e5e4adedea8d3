"""What a student's visible test runs: the bottom layer, in the student package.

Used by every notebook (its set-up cell), by the checks (autograder.checks)
and by the trusted grader (autograder.grading.trusted), which runs the same
rank programs in the submission's sandbox.

    dist        run_distributed: N rank processes with torch.distributed (gloo), a deadlock reported in seconds
    agreement   every rank of a group must call the same collective (a mismatch named, not a hang)
    ledger      CommLedger: every collective and P2P op a rank issued, by phase; expectations on it
    compare     assert_close and tolerances: which rank, tensor, element, by how much
    report      checking(...): a graded cell's one pass line, or its verdict and the student's own frames
    gpu         run_nccl_checks: the optional, ungraded NCCL runs on a GPU node
    plaindata   safe_load: what a process that ran student code sends back, loaded as data only

The names a notebook imports, stable whatever module defines them:

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace, run_nccl_checks

Each is imported on first use, so that importing one module of this package
(compare, from a check) does not import torch through the ledger. Imports
nothing from the other layers.
"""

import importlib

# name -> the module of this package that defines it
_EXPORTS = {
    "run_distributed": "dist",
    "checking": "report",
    "show_internals": "report",
    "course_notebook": "report",
    "CommLedger": "ledger",
    "format_trace": "ledger",
    "run_nccl_checks": "gpu",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
