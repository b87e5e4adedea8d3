"""Optional NCCL runs: skipped with a reason on a machine without enough GPUs, never raising.

    .venv/bin/python -m pytest -q tests/test_gpu.py
"""

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
