"""Element-wise comparison with failure messages that say where and by how much.

    from autograder.runtime.compare import assert_close
    assert_close(got, expected, name="grad of weight shard", rank=1)

Tolerances per dtype are defined once, here (`TOLERANCES`), and printed in
every failure message.
"""

from __future__ import annotations

import contextlib
import re

import torch

__all__ = ["CheckFailure", "TOLERANCES", "tolerance", "assert_close", "fmt_shape", "dtype_name", "Findings"]


class CheckFailure(AssertionError):
    """A graded check failed; the message says what, where, expected vs got. `subject`: the tensor it is about
    (`rank 1: lse`), where an element-wise comparison raised it."""

    subject: str = ""
    kinds: tuple = ()  # what a `Findings` found: "communication", "values" (a hidden case's verdict names them)


class Findings:
    """Collect a check's failures, then raise them together: communication first (the usual root cause).

        findings = Findings()
        for rank, out in enumerate(outs):
            with findings.numbers():
                assert_close(out["grad"], expected, name="grad of input", rank=rank)
            with findings.communication():          # graded here
                expect_comm(out["comm"], rank=rank, op="all_reduce", phase="backward", count=1)
            with findings.communication(hint=True):  # graded in another cell: only explains wrong numbers
                expect_comm(...)
        findings.raise_if_any()

    A forgotten backward all-reduce shows up both as wrong numbers and as a
    missing collective; the message says both, the missing collective first.
    A hint is reported only when something graded failed too. Only
    `CheckFailure` is collected; anything else propagates at once.
    """

    def __init__(self):
        self.comm: list[str] = []
        self.hints: list[str] = []
        self.numeric: list[str] = []
        self.subjects: list[str] = []  # the tensor of each numeric finding (`rank 1: lse`)

    @contextlib.contextmanager
    def _collect(self, bucket: list):
        try:
            yield
        except CheckFailure as exc:
            bucket.append(str(exc))
            if bucket is self.numeric:
                self.subjects.append(exc.subject or _subject_of(str(exc)))

    def numbers(self):
        """A block of element-wise comparisons."""
        return self._collect(self.numeric)

    def communication(self, *, hint: bool = False):
        """A block of ledger checks (counts, shapes, phases, order); `hint`: reported only with another failure."""
        return self._collect(self.hints if hint else self.comm)

    def raise_if_any(self) -> None:
        if not self.comm and not self.numeric:
            return
        parts = []
        comm = self.comm or self.hints
        if comm:
            parts.append(comm[0])
            if len(comm) > 1:
                parts.append(f"({len(comm) - 1} more communication finding(s) on other ranks or ops)")
        if self.numeric:
            lead = "The numbers are wrong too: " if comm else ""
            if len(self.numeric) > 1:
                parts.append(f"{lead or 'Wrong: '}{_wrong_tensors(self.subjects)}; the first in detail:")
                lead = ""
            parts.append(lead + self.numeric[0])
        failure = CheckFailure("\n".join(parts))
        failure.kinds = ("communication",) * bool(self.comm) + ("values",) * bool(self.numeric)
        raise failure


def _subject_of(message: str) -> str:
    """`rank 1: lse` of a finding written as `rank 1: lse: ...` (the first 60 characters otherwise)."""
    m = re.match(r"(rank \d+: )?([^:;\n]{1,60})", message)
    return m.group(0).strip() if m else message[:60]


def _wrong_tensors(subjects: list[str]) -> str:
    """`lse on ranks 0, 1, 2; out on rank 1`: every wrong tensor, briefly, from `rank R: name` subjects."""
    by_name: dict[str, list[str]] = {}
    for subject in subjects:
        rank, sep, name = subject.partition(": ") if subject.startswith("rank ") else ("", "", subject)
        name = name.rsplit(": ", 1)[-1]  # a long context (`ring_attention(...) on ...: lse`): its tensor
        ranks = by_name.setdefault(name, [])
        if sep and rank[5:] not in ranks:
            ranks.append(rank[5:])
    items = []
    for name, ranks in by_name.items():
        where = "" if not ranks else f" on rank {ranks[0]}" if len(ranks) == 1 else f" on ranks {', '.join(ranks)}"
        items.append(name + where)
    shown = "; ".join(items[:8])
    return shown + (f"; and {len(items) - 8} more" if len(items) > 8 else "")


# (rtol, atol) per dtype: torch.testing.assert_close's defaults, which allow for
# a different summation order (a sharded matmul) and nothing more.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for `dtype`; integer and bool tensors compare exactly."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def dtype_name(dtype) -> str:
    """`torch.float64` -> "float64", as every message and ledger record spells it."""
    return str(dtype).replace("torch.", "")


def _where(name: str, rank) -> str:
    return f"rank {rank}: {name}" if rank is not None else name


def assert_close(actual, expected: torch.Tensor, *, name: str, rank: int | None = None,
                 rtol: float | None = None, atol: float | None = None,
                 check_dtype: bool = True) -> None:
    """Raise CheckFailure unless `actual` equals `expected` element-wise within tolerance.

    The message names the rank and tensor, the worst element's index, the
    expected and actual values there, how many elements differ, and the tolerance.
    """
    where = _where(name, rank)
    try:
        _compare(actual, expected, where, rtol, atol, check_dtype)
    except CheckFailure as exc:
        exc.subject = where
        raise


def _compare(actual, expected: torch.Tensor, where: str, rtol, atol, check_dtype: bool) -> None:
    if actual is None:
        raise CheckFailure(f"{where} is None; expected a tensor of shape {fmt_shape(expected.shape)} "
                           f"({dtype_name(expected.dtype)}).")
    if not isinstance(actual, torch.Tensor):
        raise CheckFailure(f"{where}: expected a torch.Tensor, got {type(actual).__name__}.")
    if tuple(actual.shape) != tuple(expected.shape):
        raise CheckFailure(f"{where}: shape {fmt_shape(actual.shape)}, expected {fmt_shape(expected.shape)}.")
    if check_dtype and actual.dtype != expected.dtype:
        raise CheckFailure(f"{where}: dtype {dtype_name(actual.dtype)}, "
                           f"expected {dtype_name(expected.dtype)}.")
    d_rtol, d_atol = tolerance(expected.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    if not e.is_floating_point() and not e.is_complex():
        bad = a != e.to(a.dtype)
        if not bool(bad.any()):
            return
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise CheckFailure(f"{where}: {int(bad.sum())} of {e.numel()} elements differ (compared exactly); "
                           f"first at index {idx}: expected {e[idx].item()}, got {a[idx].item()}.")
    a64 = a.to(torch.float64)
    e64 = e.to(torch.float64)
    close = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return
    diff = (a64 - e64).abs()
    excess = diff - (atol + rtol * e64.abs())
    excess = torch.where(close, torch.full_like(excess, -float("inf")), excess)
    excess = torch.nan_to_num(excess, nan=float("inf"), posinf=float("inf"))
    flat = int(torch.argmax(excess.reshape(-1)))
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape)) if e.dim() else ()
    n_bad = int((~close).sum())
    exp_v, got_v = e64[idx].item(), a64[idx].item()
    raise CheckFailure(
        f"{where}: {n_bad} of {e.numel()} elements differ; worst at index {idx}: "
        f"expected {exp_v:.6g}, got {got_v:.6g} (|diff| {abs(got_v - exp_v):.3g}); "
        f"tolerance for {dtype_name(expected.dtype)}: rtol={rtol:g}, atol={atol:g}."
    )
