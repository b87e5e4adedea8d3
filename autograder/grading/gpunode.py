"""The GPU grading node's check (cluster/gpu-check.sh): can this node run the course's NCCL cases, and do they pass?

    cluster/gpu-check.sh [ASSIGNMENT ...]          # = .venv/bin/python -m autograder.grading.gpunode [ASSIGNMENT ...]

1. The node (seconds): torch's build and the devices it sees. It stops at once, saying why and what to do,
   where NCCL cannot run: a CPU-only torch build (`torch.version.cuda is None`: which wheel to install), a
   CUDA build that sees no device (`torch.cuda.device_count() == 0`: the driver, CUDA_VISIBLE_DEVICES), a build
   without NCCL. Then it says which of the course's NCCL cases this many devices can run (NCCL puts one rank
   on each device: a case of k ranks needs k devices) and runs a 1-rank NCCL all-reduce on cuda:0.
2. With one device it stops there: no NCCL case of the course can run on one GPU (each test cell's first
   distributed check runs 2 ranks or more, and a cell's NCCL run stops at its first case that needs more
   devices than the node has).
3. With two or more: `make demo`'s class (reference, untouched, one wrong edit of each assignment) is graded
   with `--nccl on` in a scratch copy of the course (in the temporary folder; removed afterwards): never the
   course's own gradebook.db, graded/, feedback/ or submitted/. Every test cell runs again on NCCL; the
   reference solutions' NCCL notes decide the check.

Exit status: 0 passed; 1 failed (a reference cell failed on NCCL or lost points, or grading failed);
2 stopped: no usable GPU (the reason printed); 3 stopped: one GPU (the 1-rank NCCL all-reduce passed, no NCCL
case of the course can run).
"""

from __future__ import annotations

import ast
import glob
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PREFIX = "GPU node check: "
PASSED, FAILED, NO_GPU, ONE_GPU = 0, 1, 2, 3
# what a scratch copy of the course leaves out: the course's results, build outputs, caches, its .venv (linked)
_OUTPUTS = {".venv", ".git", "gradebook.db", "graded", "feedback", "submitted", "autograded", "backups", "build",
            "dist", "downloaded", "exports", ".grading-work", ".pytest_cache", "__pycache__", ".ipynb_checkpoints"}


def say(line: str) -> None:
    print(PREFIX + line, flush=True)


# ---------------------------------------------------------------------------
# 1. The node
# ---------------------------------------------------------------------------

def probe() -> tuple[int, int, str]:
    """(NO_GPU or PASSED, the CUDA devices torch sees, what this node is) without touching a device."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return NO_GPU, 0, f"torch is not importable ({exc}): make install"
    release = torch.__version__.split("+")[0]
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return NO_GPU, 0, (
            f"this torch ({torch.__version__}) is a CPU-only build: it sees no GPU whatever the node has. "
            f"Install the CUDA build of the same release into the course's .venv, e.g. `.venv/bin/pip install "
            f"--force-reinstall torch=={release} --index-url https://download.pytorch.org/whl/cu128` (the cuXXX "
            f"no newer than the 'CUDA Version' nvidia-smi shows), then run this again")
    n = torch.cuda.device_count()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {torch.version.hip}"
    if n == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return NO_GPU, 0, (
            f"this torch ({torch.__version__}) is a {build} build but sees no CUDA device: check that the driver "
            f"is loaded (`nvidia-smi` lists the GPUs) and CUDA_VISIBLE_DEVICES "
            f"({'not set' if visible is None else repr(visible)}; a Slurm job sees only the GPUs it asked for, "
            f"e.g. --gres=gpu:2)")
    if not dist.is_nccl_available():
        return NO_GPU, n, f"this torch ({torch.__version__}, {build}) has no NCCL backend: install PyTorch's own wheel"
    names = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(n))
    try:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001 - only shown
        nccl = "?"
    return PASSED, n, f"torch {torch.__version__} ({build}, NCCL {nccl}), {n} CUDA device(s): {names}"


_SMOKE = """
import sys, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
t = torch.arange(4.0, device="cuda:0")
dist.all_reduce(t)
torch.cuda.synchronize()
assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
dist.destroy_process_group()
print("ok")
"""


def smoke_test(timeout: float = 120.0) -> tuple[bool, str]:
    """A 1-rank NCCL process group on cuda:0, one all-reduce: the driver, the CUDA build and NCCL work together."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-c", _SMOKE, os.path.join(d, "store")], capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"a 1-rank NCCL all-reduce on cuda:0 did not finish in {timeout:.0f} s"
        if proc.returncode != 0 or proc.stdout.strip() != "ok":
            return False, ("a 1-rank NCCL all-reduce on cuda:0 failed: "
                           + ((proc.stderr.strip().splitlines() or ["(no message)"])[-1])[:400])
        return True, f"a 1-rank NCCL all-reduce on cuda:0 passed ({time.monotonic() - t0:.1f} s)"


# ---------------------------------------------------------------------------
# What this many devices runs: the test cells' checks, as the grader's NCCL run meets them
# ---------------------------------------------------------------------------

def _nccl_checks() -> dict[str, inspect.Signature]:
    """The checks the grader runs again on NCCL (autograder.grading.trusted._on_backend: a function of
    autograder.checks that takes `backend`), by name."""
    import importlib
    import pkgutil

    import autograder.checks as pkg

    out = {}
    for info in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}."):  # a package per dimension, its modules
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if callable(obj) and (getattr(obj, "__module__", "") or "").startswith("autograder.checks"):
                try:
                    sig = inspect.signature(obj)
                except (TypeError, ValueError):
                    continue
                if "backend" in sig.parameters:
                    out.setdefault(name, sig)
    return out


def cell_sizes(code: str, checks: dict[str, inspect.Signature]) -> list[int]:
    """The world size of each NCCL check call in a test cell, in order (the keyword `world_size`, else the
    check's default, else 2: as the grader reads it)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id in checks]
    sizes = []
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
        size = next((k.value for k in call.keywords if k.arg == "world_size"), None)
        if size is None:
            param = checks[call.func.id].parameters.get("world_size")
            size = param.default if param is not None else None
        else:
            size = size.value if isinstance(size, ast.Constant) else None
        sizes.append(size if isinstance(size, int) else 2)
    return sizes


def plan(root: str, devices: int, assignments: list[str] | None = None) -> dict:
    """What the NCCL run does on `devices` GPUs, from the source notebooks' test cells: each cell runs its checks
    in order until the first that needs more ranks than there are devices (then it stops: the rest of the cell
    is skipped)."""
    checks = _nccl_checks()
    out = {"cells": 0, "whole": 0, "cut": 0, "none": 0, "calls": 0, "run": 0, "needs": {}}
    for path in sorted(glob.glob(os.path.join(root, "source", "*", "*.ipynb"))):
        if assignments and os.path.basename(os.path.dirname(path)) not in assignments:
            continue
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        for cell in nb["cells"]:
            meta = (cell.get("metadata") or {}).get("nbgrader") or {}
            if not meta.get("grade") or meta.get("solution"):
                continue
            code = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            sizes = cell_sizes(code, checks)
            out["cells"] += 1
            out["calls"] += len(sizes)
            if not sizes:
                out["none"] += 1
                continue
            ran = next((i for i, s in enumerate(sizes) if s > devices), len(sizes))
            out["run"] += ran
            if ran == len(sizes):
                out["whole"] += 1
            else:
                out["cut"] += 1
                out["needs"][sizes[ran]] = out["needs"].get(sizes[ran], 0) + 1
    return out


def describe_plan(p: dict, devices: int) -> str:
    needs = ", ".join(f"{c} at a case of {k} ranks" for k, c in sorted(p["needs"].items()))
    return (f"on {devices} device(s), {p['run']} of the {p['calls']} NCCL check calls of the test cells run "
            f"(NCCL puts one rank on each device: a case of k ranks needs k devices); of the "
            f"{p['cells'] - p['none']} test cells with a distributed check, {p['whole']} run whole and "
            f"{p['cut']} stop at their first case that needs more devices ({needs or 'none'}; the rest of such a "
            f"cell is skipped, its note says 'skipped after N check(s)'); {p['none']} test cells have no "
            f"distributed check")


# ---------------------------------------------------------------------------
# 3. The class, in a scratch copy of the course
# ---------------------------------------------------------------------------

def scratch_copy(root: str, dest: str) -> str:
    """The course at `dest` without its results or build outputs (gradebook.db, graded/, feedback/,
    submitted/, ...), its .venv a link to the course's: what is graded there never reaches the course."""
    def ignore(folder, names):
        top = os.path.abspath(folder) == os.path.abspath(root)
        return {n for n in names if n in _OUTPUTS or (top and (n.startswith(("slurm-", ".autograde", ".gradebook-"))))}

    shutil.copytree(root, dest, ignore=ignore, symlinks=True, dirs_exist_ok=True)
    venv = os.path.join(root, ".venv")
    if os.path.exists(venv):
        os.symlink(os.path.realpath(venv), os.path.join(dest, ".venv"))
    return dest


def summarize(course: str, assignments: list[str]) -> tuple[int, list[str]]:
    """(PASSED or FAILED, a line per assignment and the verdict's reasons) from the scratch course's records."""
    lines, bad, ran, skipped = [], [], 0, 0
    for a in assignments:
        path = os.path.join(course, "graded", a, "reference.json")
        if not os.path.exists(path):
            bad.append(f"{a}: the reference submission has no record (grading failed: see the table above)")
            continue
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        notes = [c.get("backend_note") or "" for c in rec["cells"]]
        failed = [c["grade_id"] for c in rec["cells"] if "FAILED" in (c.get("backend_note") or "")]
        passed = sum(int(n.split("(")[1].split(" check")[0]) for n in notes if n.startswith("NCCL: passed ("))
        cut = [n for n in notes if n.startswith("NCCL: skipped after ")]
        before = sum(int(n.split("skipped after ")[1].split(" check")[0]) for n in cut)
        ran += passed + before
        skipped += len(cut)
        lines.append(f"{a}: reference {rec['score']:.1f} / {rec['max_score']:.0f} (gloo, graded); NCCL: "
                     f"{passed + before} check(s) passed, {len(cut)} cell(s) cut short for devices, "
                     f"{len(failed)} failed")
        if rec["status"] != "graded" or rec["score"] < rec["max_score"]:
            bad.append(f"{a}: the reference solution scored {rec['score']} of {rec['max_score']} "
                       f"({rec.get('reason') or 'see the table above'})")
        if failed:
            bad.append(f"{a}: on NCCL the reference solution failed {', '.join(failed)}")
    if not bad and ran == 0:
        bad.append("no NCCL check ran")
    verdict = (f"PASSED: {ran} NCCL check(s) ran and passed on the reference solutions of {len(assignments)} "
               f"assignment(s); {skipped} cell(s) stopped early for want of devices" if not bad
               else "FAILED: " + "; ".join(bad))
    return (FAILED if bad else PASSED), lines + [verdict]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = os.getcwd()
    t0 = time.monotonic()
    status, n, what = probe()
    if status != PASSED:
        say(f"stopped: {what}. Nothing was built or graded.")
        return status
    say(what)
    assignments = argv or sorted(os.path.basename(os.path.dirname(p))
                                 for p in glob.glob(os.path.join(root, "release", "*", "*.ipynb")))
    say("what runs here: " + describe_plan(plan(root, n, assignments), n))
    ok, smoke = smoke_test()
    say(smoke)
    if not ok:
        say("FAILED: NCCL does not work on this node; nothing was graded.")
        return FAILED
    if n < 2:
        two, four = plan(root, 2, assignments), plan(root, 4, assignments)
        say(f"stopped: 1 CUDA device: no NCCL case of this course can run on one GPU (each test cell's first "
            f"distributed check runs 2 ranks or more, and NCCL needs a device per rank); 2 GPUs run "
            f"{two['run']} of the {two['calls']} NCCL check calls, 4 GPUs {four['run']}. Grading on this node is "
            f"the CPU grading (gloo), as on any machine. Nothing was graded.")
        return ONE_GPU
    scratch = tempfile.mkdtemp(prefix="gpu-check-")
    try:
        scratch_copy(root, scratch)
        say(f"grading make demo's class with --nccl on in a scratch copy of the course ({scratch}; the course's "
            f"gradebook.db, graded/ and feedback/ are not touched)")
        env = {**os.environ, "PYTHONPATH": scratch, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        proc = subprocess.run([os.path.join(scratch, ".venv", "bin", "python"), "-m", "autograder.grade", "demo",
                               *assignments, "--nccl", "on", "--jobs", "1", "--memory", "32", "--force", "--quiet"],
                              cwd=scratch, env=env)
        status, lines = summarize(scratch, assignments)
        if proc.returncode != 0:
            status = FAILED
            lines[-1] = f"FAILED: the grading command exited with status {proc.returncode}; " + lines[-1]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for line in lines:
        say(line)
    say(f"{time.monotonic() - t0:.0f} s in all; the scratch copy was removed")
    return status


if __name__ == "__main__":
    sys.exit(main())
