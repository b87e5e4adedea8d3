"""Grade submissions in this process, the garbage collector set as asked; print the verdicts as JSON.

    python tests/determinism_worker.py '{"gc": [700, 10, 10], "jobs": [{"assignment": "01_data_parallel",
                                          "mutant": null, "only": ["test_fsdp_frees"]}]}'

Used by tests/test_determinism.py, which starts one such process per run
with another PYTHONHASHSEED (fixed when an interpreter starts) and other
collector thresholds; forked rank processes inherit both.
"""

from __future__ import annotations

import gc
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from solutions import submissions  # noqa: E402


def _mutant(assignment: str, name: str):
    for m in submissions.mutants_of(assignment):
        if m.name == name:
            return m
    raise KeyError(f"{assignment}: no mutant {name!r}")


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["gc"] == "disabled":
        gc.disable()
    else:
        gc.set_threshold(*spec["gc"])
    out = {}
    for job in spec["jobs"]:
        a, name = job["assignment"], job["mutant"]
        nb = submissions.reference_submission(a) if name is None else submissions.mutant_submission(a, _mutant(a, name))
        only = set(job["only"]) if job.get("only") else None
        results = submissions.run_graded_cells(nb, a, only=only)
        out[f"{a}/{name or 'reference'}"] = {k: v.passed for k, v in results.items()}
    sys.stdout.write("\nVERDICTS " + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
