"""How fast the grading machinery is, measured side by side in one run (not a timed test).

    .venv/bin/python benchmarks/runner_overhead.py            # runner vs spawn, and autograde times
    .venv/bin/python benchmarks/runner_overhead.py --no-nbgrader

1. Median wall time of one `run_distributed` call (fork, FileStore rendezvous,
   gloo init, one all-reduce, results back) for world sizes 2, 4 and 8, against
   `torch.multiprocessing.spawn` running the same rank function (each spawned
   rank re-imports torch), and the ratio.
2. The time `nbgrader autograde` takes on the reference submission of each
   assignment (a scratch copy of the course; nbgrader's own start-up included),
   and the in-process grading time of the same notebook.
Targets on 2 cores (issue 2): world size 4 at least 20x faster than spawn; each
assignment autograded in under 30 s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from autograder.runtime.dist import run_distributed  # noqa: E402


def _work(rank, world_size):
    t = torch.ones(16) * rank
    dist.all_reduce(t)
    return float(t[0])


def _spawned(rank, world_size, store_path):
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    _work(rank, world_size)
    dist.destroy_process_group()


def time_runner(world_size: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_distributed(_work, world_size)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_spawn(world_size: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            tmp.spawn(_spawned, args=(world_size, os.path.join(d, "store")), nprocs=world_size, join=True)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_autograde() -> list[tuple[str, float, float]]:
    from course import assignments, copy_course, nbgrader
    import nbformat
    from solutions import submissions

    out = []
    with tempfile.TemporaryDirectory() as root:
        copy_course(root)
        for a in assignments():
            nbgrader(root, "generate_assignment", a, "--force")
            nb = submissions.reference_submission(a)
            folder = os.path.join(root, "submitted", "reference", a)
            os.makedirs(folder, exist_ok=True)
            nbformat.write(nb, os.path.join(folder, os.path.basename(submissions.notebook_path("release", a))))
            t0 = time.perf_counter()
            proc = nbgrader(root, "autograde", a, "--force")
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(proc.stdout + proc.stderr)
            t0 = time.perf_counter()
            results = submissions.run_graded_cells(nb, a)
            in_process = time.perf_counter() - t0
            assert all(r.passed for r in results.values()), [r for r in results.values() if not r.passed]
            out.append((a, elapsed, in_process))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spawn-repeats", type=int, default=3)
    parser.add_argument("--no-nbgrader", action="store_true")
    args = parser.parse_args()
    torch.randn(256, 256) @ torch.randn(256, 256)  # a warm parent, as in a notebook kernel

    print(f"cores: {os.cpu_count()}, torch {torch.__version__}, python {sys.version.split()[0]}")
    print(f"{'world size':>10}  {'run_distributed':>16}  {'mp.spawn':>10}  {'ratio':>7}")
    for ws in (2, 4, 8):
        ours = time_runner(ws, args.repeats)
        theirs = time_spawn(ws, args.spawn_repeats)
        print(f"{ws:>10}  {ours * 1000:>13.0f} ms  {theirs:>8.2f} s  {theirs / ours:>6.1f}x", flush=True)
    if not args.no_nbgrader:
        print()
        print(f"{'assignment':<22}  {'nbgrader autograde':>18}  {'in-process cells':>16}")
        for a, elapsed, in_process in time_autograde():
            print(f"{a:<22}  {elapsed:>16.1f} s  {in_process:>14.1f} s", flush=True)


if __name__ == "__main__":
    main()
