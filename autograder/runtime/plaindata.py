"""Loading what a process that ran student code sent back: plain data only, never code.

    results.append(safe_load(data))     # bytes a rank (or the grader's zygote) wrote with torch.save

A rank program's result comes back to `run_distributed` (and a zygote's to
the trusted grader, autograder.grading.trusted) as bytes written by a
process that ran the student's code. `torch.load(weights_only=True)` rebuilds
tensors, numbers, strings and containers, and the dataclasses of the course's
own modules (the ledger's records, the checks' result records) field by
field; a pickle that would run code is refused.
"""

from __future__ import annotations

import dataclasses
import io
import sys

__all__ = ["safe_load"]


def _safe_classes() -> list:
    """Classes a rank may send back besides tensors and containers: the dataclasses of the course's own
    modules (the ledger's records, the checks' result records), rebuilt field by field, no code run."""
    names = tuple(name for name, module in list(sys.modules.items())
                  if module is not None and (name == "autograder" or name.startswith("autograder.")))
    if _SAFE_CACHE.get("names") != names:  # computed again only when a course module was imported since
        out = []
        for name in names:
            out += [c for c in vars(sys.modules[name]).values() if isinstance(c, type)
                    and dataclasses.is_dataclass(c) and c.__module__ == name]
        _SAFE_CACHE.update(names=names, classes=out)
    return _SAFE_CACHE["classes"]


_SAFE_CACHE: dict = {}


def safe_load(data: bytes):
    """torch.load with weights_only=True: data from a process that ran student code can run no code here."""
    import torch

    with torch.serialization.safe_globals(_safe_classes()):
        return torch.load(io.BytesIO(data), weights_only=True)
