"""Optional NCCL runs: skipped with a reason on a machine without enough GPUs, never raising.

    .venv/bin/python -m pytest -q tests/test_gpu.py
"""

import json
import os

import pytest
import torch

from autograder.runtime.gpu import nccl_status, run_nccl_checks


def test_nccl_checks_say_why_they_were_skipped(capsys):
    calls = []

    def check(*args, backend, world_size):
        calls.append(backend)

    verdicts = run_nccl_checks([("demo check", check, (), {"world_size": 2})])
    ok, reason = nccl_status(2)
    if torch.cuda.device_count() >= 2:
        assert ok and verdicts["demo check"].startswith("passed on NCCL") and calls == ["nccl"]
    else:
        assert not ok and calls == []
        assert verdicts["demo check"] == f"skipped: {reason}"
        assert "demo check: skipped:" in capsys.readouterr().out


def test_a_failing_nccl_check_is_reported_not_raised(monkeypatch):
    import autograder.runtime.gpu as gpu

    monkeypatch.setattr(gpu, "nccl_status", lambda ws: (True, "pretend"))

    def check(*, backend, world_size):
        raise AssertionError("rank 1: out differs")

    verdicts = gpu.run_nccl_checks([("c", check, (), {"world_size": 2})], verbose=False)
    assert verdicts["c"] == "FAILED on NCCL: rank 1: out differs"


# ---------------------------------------------------------------------------
# cluster/gpu-check.sh's logic (autograder/grading/gpunode.py), on this machine with a pretend torch
# ---------------------------------------------------------------------------

def _pretend_gpus(monkeypatch, n: int, cuda: str | None = "12.8") -> None:
    import torch.distributed as dist

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)


def test_the_gpu_check_tells_a_cpu_only_build_from_a_node_without_devices(monkeypatch):
    from autograder.grading import gpunode

    _pretend_gpus(monkeypatch, 0, cuda=None)
    status, n, why = gpunode.probe()
    assert status == gpunode.NO_GPU and "is a CPU-only build" in why
    assert f"pip install --force-reinstall torch=={torch.__version__.split('+')[0]} --index-url " \
           "https://download.pytorch.org/whl/cu" in why
    _pretend_gpus(monkeypatch, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status, n, why = gpunode.probe()
    assert status == gpunode.NO_GPU and "is a CUDA 12.8 build but sees no CUDA device" in why
    assert "nvidia-smi" in why and "CUDA_VISIBLE_DEVICES (''; " in why and "CPU-only" not in why
    _pretend_gpus(monkeypatch, 1)
    assert gpunode.probe() == (gpunode.PASSED, 1, f"torch {torch.__version__} (CUDA 12.8, NCCL 2.27.3), 1 CUDA "
                                                  f"device(s): cuda:0 NVIDIA H200")


def test_on_one_gpu_the_check_says_no_nccl_case_runs_and_grades_nothing(monkeypatch, capsys, tmp_path):
    from autograder.grading import gpunode
    from course import ROOT

    _pretend_gpus(monkeypatch, 1)
    monkeypatch.setattr(gpunode, "smoke_test", lambda: (True, "a 1-rank NCCL all-reduce on cuda:0 passed (0.1 s)"))
    monkeypatch.setattr(gpunode.tempfile, "mkdtemp", lambda **kw: pytest.fail("no scratch course on one GPU"))
    monkeypatch.chdir(ROOT)
    assert gpunode.main([]) == gpunode.ONE_GPU
    out = capsys.readouterr().out
    assert "GPU node check: what runs here: on 1 device(s), 0 of the 218 NCCL check calls" in out
    assert "GPU node check: stopped: 1 CUDA device: no NCCL case of this course can run on one GPU" in out


def test_the_readme_table_of_what_each_number_of_gpus_runs_is_the_notebooks():
    import re

    from autograder.grading.gpunode import plan
    from course import ROOT

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    rows = dict(re.findall(r"^ *\| (\d)(?: or more)? \| (\d+)", text, re.M))
    assert set(rows) == {"1", "2", "3", "4"}, rows
    for n, run in rows.items():
        p = plan(ROOT, int(n))
        assert int(run) == p["run"], (n, p)
        row = rf"^ *\| {n}(?: or more)? \| {p['run']}\D[^|]*\| {p['whole']} \| {p['cut']}\b"
        assert re.search(row, text, re.M), (n, p)
    p = plan(ROOT, 1)
    assert p["run"] == 0 and p["whole"] == 0
    assert f"notebooks' {p['cells']} test cells ({p['calls']} NCCL check calls in the {p['cells'] - p['none']} cells" \
           in " ".join(text.split())


def _record(course, assignment: str, notes: list[str], score: float = 12.0) -> None:
    folder = os.path.join(course, "graded", assignment)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"student": "reference", "status": "graded", "score": score, "max_score": 12.0, "reason": None,
                   "cells": [{"grade_id": f"c{i}", "backend_note": n} for i, n in enumerate(notes)]}, f)


def test_the_gpu_check_verdict_is_the_reference_solutions_nccl_notes(tmp_path):
    from autograder.grading.gpunode import FAILED, PASSED, summarize

    course = str(tmp_path)
    _record(course, "01_x", ["NCCL: passed (3 check(s), 4.1 s; not graded)",
                             "NCCL: skipped after 1 check(s): this machine has 2 CUDA device(s); these NCCL checks "
                             "need 4", "NCCL: no distributed check in this cell"])
    status, lines = summarize(course, ["01_x"])
    assert status == PASSED, lines
    assert lines == ["01_x: reference 12.0 / 12 (gloo, graded); NCCL: 4 check(s) passed, 1 cell(s) cut short for "
                     "devices, 0 failed",
                     "PASSED: 4 NCCL check(s) ran and passed on the reference solutions of 1 assignment(s); 1 cell(s) "
                     "stopped early for want of devices"]
    _record(course, "02_y", ["NCCL: FAILED (not graded): rank 1: out differs"])
    status, lines = summarize(course, ["01_x", "02_y"])
    assert status == FAILED and lines[-1] == "FAILED: 02_y: on NCCL the reference solution failed c0"
    _record(course, "02_y", ["NCCL: passed (1 check(s), 1.0 s; not graded)"], score=6.0)
    status, lines = summarize(course, ["02_y", "03_z"])
    assert status == FAILED and "02_y: the reference solution scored 6.0 of 12.0" in lines[-1]
    assert "03_z: the reference submission has no record" in lines[-1]


def test_the_gpu_check_grades_in_a_scratch_copy_without_the_course_results(tmp_path):
    from autograder.grading.gpunode import scratch_copy

    root = tmp_path / "course"
    for rel in ("nbgrader_config.py", "source/a/n.ipynb", "release/a/n.ipynb", "autograder/x.py", "gradebook.db",
                "graded/a/bob.json", "feedback/bob/a/n.html", "submitted/bob/a/n.ipynb", "backups/g.db",
                "slurm-autograde-1_1.out", "exports/a.csv"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / "venv-real").mkdir()
    os.symlink(root / "venv-real", root / ".venv")
    dest = scratch_copy(str(root), str(tmp_path / "scratch"))
    got = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    assert got == ["autograder/x.py", "nbgrader_config.py", "release/a/n.ipynb", "source/a/n.ipynb"]
    assert os.path.realpath(os.path.join(dest, ".venv")) == str(root / "venv-real")


def test_without_an_nvidia_driver_the_status_is_torch_s_own_without_importing_it(monkeypatch):
    """nccl_status answers from the driver's files on Linux (a grading command's start need not import torch);
    where torch is asked instead (a driver's file present), it says the same on this machine."""
    import autograder.runtime.gpu as gpu

    quick = gpu.nccl_status(2)
    monkeypatch.setattr(gpu, "_DRIVER_PATHS", ("/",))  # as if a driver were there: torch decides
    assert gpu.nccl_status(2) == quick or torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert not quick[0] and quick[1].startswith("no CUDA device on this machine")
