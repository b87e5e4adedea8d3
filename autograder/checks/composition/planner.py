"""Public checks of assignment 06, exercises 10-12: the planner (no ranks: arithmetic against
hand-computed numbers and published layouts).

    from autograder.checks.composition import check_memory_per_gpu
    check_memory_per_gpu(memory_per_gpu, model, layout, training, expected={...})
"""

from __future__ import annotations

import math

from autograder.runtime.compare import CheckFailure

from .common import _call_program, _one_rank

__all__ = ["check_memory_per_gpu", "check_step_time", "check_plan", "check_best_layouts"]


# ---------------------------------------------------------------------------
# Exercises 10-12: the planner (no ranks: arithmetic against hand-computed numbers and published layouts)
# ---------------------------------------------------------------------------

def _describe_case(model, layout, training, cluster=None) -> str:
    where = f" on {cluster.num_gpus} GPUs" if cluster is not None else ""
    return (f"{model.name}, {layout.name}{where}, micro-batch {layout.micro_batch}, seq {training.seq_len}, "
            f"global batch {training.global_batch}")


def _expect_numbers(got, expected: dict, *, what: str, unit: str, scale: float) -> None:
    if not isinstance(got, dict):
        raise CheckFailure(f"{what}: returned {type(got).__name__}, expected a dict with keys {sorted(expected)}")
    missing = [k for k in expected if k not in got]
    if missing:
        raise CheckFailure(f"{what}: no key(s) {missing}; returned keys {sorted(got)}")
    wrong = []
    for key, want in expected.items():
        value = got[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise CheckFailure(f"{what}: [{key!r}] is a {type(value).__name__}, expected a number")
        if not math.isclose(float(value), float(want), rel_tol=1e-9, abs_tol=1e-12 * max(1.0, abs(want))):
            ratio = f", ratio {value / want:.6g}" if want else ""
            wrong.append(f"[{key!r}]: expected {want / scale:.6g} {unit}, got {value / scale:.6g} {unit}{ratio}")
    if wrong:
        raise CheckFailure(f"{what}: " + "; ".join(wrong))


def check_memory_per_gpu(memory_per_gpu, model, layout, training, *, expected: dict | None = None,
                         total_between: tuple | None = None) -> None:
    """`memory_per_gpu(model, layout, training)` equals the hand-computed bytes (relative 1e-9) and names the
    worst stage; or, for a published model, its total lies within `total_between` = (low, high) bytes."""
    got = _one_rank(_call_program, memory_per_gpu, (model, layout, training), {})
    what = f"memory_per_gpu({_describe_case(model, layout, training)})"
    expected = dict(expected or {})
    stage = expected.pop("stage", None)
    _expect_numbers(got, expected, what=what, unit="GB", scale=1e9)
    if stage is not None and got.get("stage") != stage:
        raise CheckFailure(f"{what}: the worst stage is {stage}, got {got.get('stage')!r}")
    if total_between is not None:
        _expect_numbers(got, {}, what=what, unit="GB", scale=1e9)
        total = got.get("total")
        if not isinstance(total, (int, float)) or not total_between[0] <= total <= total_between[1]:
            parts = ", ".join(f"{k} {got[k] / 1e9:.2f}" for k in ("params", "grads", "optimizer", "activations")
                              if isinstance(got.get(k), (int, float)))
            raise CheckFailure(f"{what}: expected between {total_between[0] / 1e9:g} and {total_between[1] / 1e9:g} "
                               f"GB on the worst GPU, got {total if not isinstance(total, float) else total / 1e9:.4g}"
                               f"{' GB' if isinstance(total, float) else ''} ({parts})")


def check_step_time(step_time, model, cluster, layout, training, *, expected: dict) -> None:
    """`step_time(model, cluster, layout, training)` equals the hand-computed seconds (relative 1e-9)."""
    got = _one_rank(_call_program, step_time, (model, cluster, layout, training), {})
    _expect_numbers(got, expected, what=f"step_time({_describe_case(model, layout, training, cluster)})",
                    unit="s", scale=1.0)


def check_plan(plan, model, cluster, layout, training, *, feasible: bool, reason: str | None = None,
               memory_gb: tuple | None = None, check_mfu: bool = False) -> None:
    """`plan(...)` judges a layout as given: feasible or not, a reason containing `reason`, the worst GPU's
    memory within `memory_gb` = (low, high); with `check_mfu`, its `mfu` is the model's FLOPs of the step
    (global batch x seq x flops_per_token(seq), no recomputation) over the plan's own total time x GPUs x peak
    (relative 1e-9: a wrong step time is exercise 11's to grade, not this)."""
    from autograder.lessons.planner import Plan

    what = f"plan({_describe_case(model, layout, training, cluster)})"
    p = _one_rank(_call_program, plan, (model, cluster, layout, training), {})
    if not isinstance(p, Plan):
        raise CheckFailure(f"{what}: returned {type(p).__name__}, expected an autograder.lessons.planner.Plan")
    if memory_gb is not None:
        gb = p.memory["total"] / 1e9
        if not memory_gb[0] <= gb <= memory_gb[1]:
            raise CheckFailure(f"{what}: {gb:.1f} GB on the worst GPU, expected between {memory_gb[0]} and "
                               f"{memory_gb[1]} GB (breakdown: " + ", ".join(
                                   f"{k} {p.memory[k] / 1e9:.2f}" for k in ("params", "grads", "optimizer",
                                                                           "activations")) + ")")
    if bool(p.feasible) != feasible:
        raise CheckFailure(f"{what}: judged {'feasible' if p.feasible else 'infeasible'} ({p.reasons}), expected "
                           f"{'feasible' if feasible else 'infeasible'}")
    if feasible and p.reasons:
        raise CheckFailure(f"{what}: feasible, yet with reasons {p.reasons}")
    if reason is not None and not any(reason in r for r in p.reasons):
        raise CheckFailure(f"{what}: expected a reason mentioning {reason!r}, got {p.reasons}")
    if check_mfu:
        got, total = p.mfu, p.time.get("total") if isinstance(p.time, dict) else None
        if not isinstance(total, (int, float)) or total <= 0:
            raise CheckFailure(f"{what}: time['total'] is {total!r}, expected a positive number of seconds")
        step_flops = training.global_batch * training.seq_len * model.flops_per_token(training.seq_len)
        want = step_flops / (total * cluster.num_gpus * cluster.node.peak_flops)
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isclose(got, want, rel_tol=1e-9):
            shown = f"{got:.6g}" if isinstance(got, (int, float)) else repr(got)
            raise CheckFailure(f"{what}: mfu {shown}, expected {want:.6g}: the model's FLOPs of the step, "
                               f"{step_flops:.6g} (global batch x seq x flops_per_token, no recomputation), over "
                               f"total seconds x GPUs x peak FLOP/s = {total:.6g} x {cluster.num_gpus} x "
                               f"{cluster.node.peak_flops:g}")


def check_best_layouts(best_layouts, model, cluster, training, *, expected: list, top: int = 3, zero_stages=(1,),
                       recompute=("none", "full"), micro_batch: int = 1) -> None:
    """`best_layouts` returns, fastest first, exactly the `expected` layouts: the `top` fastest feasible ones
    of the whole candidate space as the course's reference planner judges them (the builder computes
    `expected` with it), so a search that ranks with wrong memory or time numbers does not pass; every plan
    it returns is feasible. `micro_batch` is passed on (the default is not: a search that has no such
    argument fails); every returned layout has that micro-batch."""
    from autograder.lessons.planner import Plan

    what = (f"best_layouts({model.name}, {cluster.num_gpus} GPUs, seq {training.seq_len}, global batch "
            f"{training.global_batch}, top={top}" + (f", micro_batch={micro_batch}" if micro_batch != 1 else "") + ")")
    kwargs = dict(zero_stages=tuple(zero_stages), recompute=tuple(recompute), top=top)
    if micro_batch != 1:
        kwargs["micro_batch"] = micro_batch
    got = _one_rank(_call_program, best_layouts, (model, cluster, training), kwargs)
    if not isinstance(got, list) or not all(isinstance(p, Plan) for p in got):
        raise CheckFailure(f"{what}: expected a list of Plan, got {type(got).__name__}")
    have = [p.layout for p in got]
    other = sorted({p.layout.micro_batch for p in got} - {micro_batch})
    if other:
        raise CheckFailure(f"{what}: returned layouts with micro-batch {other}, expected {micro_batch} for every "
                           f"candidate: build each Layout with the micro_batch you were given (it changes the "
                           f"micro-batch count, the memory in flight, the bubble and every volume)")
    if have != list(expected):
        def names(layouts):
            return [lay.name + (f", micro-batch {lay.micro_batch}" if lay.micro_batch != 1 else "")
                    for lay in layouts]
        raise CheckFailure(f"{what}: expected the {top} fastest feasible layouts, fastest first, as the course's "
                           f"reference planner ranks them: {names(expected)}; got {names(have)}. A search that is "
                           f"right ranks wrong when memory_per_gpu, step_time or plan are off: check those first.")
    for p in got:
        if not p.feasible:
            raise CheckFailure(f"{what}: returned an infeasible plan: {p.layout.name} ({p.reasons})")
