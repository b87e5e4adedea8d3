"""How long each visible test takes for a student: the solved release notebook, cell by cell (not a timed test).

    .venv/bin/python benchmarks/visible_tests.py 04_context_parallel           # ranks forked (Linux)
    .venv/bin/python benchmarks/visible_tests.py 04_context_parallel --spawn   # ranks spawned (the macOS path)
    .venv/bin/python benchmarks/visible_tests.py all --repeat 3
    .venv/bin/python benchmarks/visible_tests.py all --repeat 3 --summary   # one line per assignment

Runs the release notebook with every answer cell filled by the reference (the
visible tests only, as a student's kernel runs them) in this process, cell
after cell, and prints each graded cell's wall time and its verdict line; with
`--repeat N` the median of N runs. Measure on an idle machine: the numbers are
what a student with the same cores would wait.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def visible_times(assignment: str) -> dict[str, tuple[float, bool, str]]:
    """{grade_id: (seconds, passed, first line of its output or error)} of one run of the solved release."""
    import linecache

    from solutions.submissions import _nb_meta, reference_submission

    nb = reference_submission(assignment)
    namespace: dict = {"__name__": "__main__"}
    out: dict = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = _nb_meta(cell)
        if not meta:
            continue  # scratch and picture cells are not tests
        src = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        filename = f"<cell {meta.get('grade_id', i)}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        buf = io.StringIO()
        t0 = time.perf_counter()
        ok, line = True, ""
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(src, filename, "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - a failed cell is a result
            ok, line = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        seconds = time.perf_counter() - t0
        if meta.get("grade") and not meta.get("solution"):
            printed = buf.getvalue().strip().splitlines()
            out[meta["grade_id"]] = (seconds, ok, line or (printed[-1] if printed else ""))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignment", help="e.g. 04_context_parallel, or all")
    parser.add_argument("--spawn", action="store_true", help="spawn the ranks (AUTOGRADER_START_METHOD=spawn)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--summary", action="store_true",
                        help="one line per assignment: its cells, their total, median and slowest, those over 1 s")
    args = parser.parse_args()
    if args.spawn:
        os.environ["AUTOGRADER_START_METHOD"] = "spawn"
    from course import assignments

    names = assignments() if args.assignment == "all" else [args.assignment]
    import matplotlib

    matplotlib.use("Agg")
    how = f"{'spawned' if args.spawn else 'forked'} ranks, {os.cpu_count()} cores, median of {args.repeat}"
    if args.summary:
        print(f"visible test cells of the solved notebooks ({how}; seconds)")
        print(f"{'':22s} {'cells':>5s} {'total':>6s} {'median':>6s}  {'slowest':42s} {'> 1 s':>5s}  failed")
    for a in names:
        runs = [visible_times(a) for _ in range(args.repeat)]
        secs = {gid: statistics.median(r[gid][0] for r in runs) for gid in runs[0]}
        if args.summary:
            worst = max(secs, key=secs.get)
            failed = [g for g in runs[0] if not all(r[g][1] for r in runs)]
            print(f"{a:22s} {len(secs):5d} {sum(secs.values()):6.2f} {statistics.median(secs.values()):6.2f}  "
                  f"{worst + f' {secs[worst]:.2f}':42s} {sum(v > 1 for v in secs.values()):5d}  "
                  f"{', '.join(failed) or 'none'}")
            continue
        print(f"{a} ({how}):")
        for gid in runs[0]:
            secs = statistics.median(r[gid][0] for r in runs)
            ok = all(r[gid][1] for r in runs)
            print(f"  {gid:34s} {secs:6.2f} s  {'ok  ' if ok else 'FAIL'}  {runs[-1][gid][2][:110]}")
        total = sum(statistics.median(r[g][0] for r in runs) for g in runs[0])
        print(f"  {'(all graded cells)':34s} {total:6.2f} s")


if __name__ == "__main__":
    main()
