"""Exports of the graded records: Gradescope's results.json per submission, nbgrader's CSV.

    python -m autograder.grade export 02_tensor_parallel --gradescope out/ --csv grades.csv

Gradescope (its autograder specification, "results.json"): one test per
graded cell, named by its exercise and what it checks, with its score and
maximum. A failure in the visible checks shows the check's message (what the
notebook showed the student); a failure in a hidden case shows only that a
hidden case failed: no test source, no hidden case's data. The CSV is
nbgrader's own `nbgrader export`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

__all__ = ["gradescope_results", "cell_titles", "export"]

HIDDEN_FAILURE = ("Passed the visible checks; failed a hidden case (other world sizes, shapes, dtypes or edge "
                  "cases). Re-read the exercise's contract.")


def cell_titles(source: dict) -> dict[str, str]:
    """grade_id -> "Exercise 3 · ColumnParallelLinear equals nn.Linear ..." (from `with checking(label, doc):`)."""
    out = {}
    for cell in source["cells"]:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if not meta.get("grade") or meta.get("solution"):
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        title = meta["grade_id"]
        try:
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "checking" and len(node.args) >= 2:
                    title = f"{ast.literal_eval(node.args[0])} \u00b7 {ast.literal_eval(node.args[1])}"
                    break
        except (SyntaxError, ValueError):
            pass
        out[meta["grade_id"]] = title
    return out


def gradescope_results(record: dict, titles: dict[str, str]) -> dict:
    """Gradescope's results.json for one graded record."""
    tests = []
    for i, c in enumerate(record["cells"], 1):
        if record["status"] != "graded":
            output = f"Not graded: {record['reason']}"
        elif c["passed"]:
            output = "Passed."
        elif c.get("visible_passed"):
            output = HIDDEN_FAILURE
        else:
            output = c["message"]
        tests.append({"name": titles.get(c["grade_id"], c["grade_id"]), "number": str(i),
                      "score": c["points"], "max_score": c["max_points"], "output": output,
                      "status": "passed" if c["passed"] else "failed", "visibility": "visible"})
    notes = list(record.get("warnings", []))
    return {"score": record["score"], "execution_time": int(record.get("timings", {}).get("total", 0)),
            "output": "\n".join(notes) if notes else "Graded by the course's trusted grader.",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def export(root: str, assignments: list[str], *, gradescope: str | None = None, csv: str | None = None):
    from autograder.grading.classrun import read_results, source_notebook

    if gradescope:
        for a in assignments:
            with open(source_notebook(root, a), encoding="utf-8") as f:
                titles = cell_titles(json.load(f))
            records = read_results(root, a)
            for student, rec in records.items():
                folder = os.path.join(gradescope, a, student)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as f:
                    json.dump(gradescope_results(rec, titles), f, indent=1)
            yield f"{a}: {len(records)} results.json written under {os.path.join(gradescope, a)}/<student>/"
    if csv:
        exe = os.path.join(os.path.dirname(sys.executable), "nbgrader")
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        proc = subprocess.run([exe if os.path.exists(exe) else "nbgrader", "export", f"--to={os.path.abspath(csv)}",
                               "--log-level=ERROR"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"nbgrader export failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        yield f"wrote {csv} (nbgrader export: one row per student and assignment)"
