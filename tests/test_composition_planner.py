"""The layout planner of assignment 06: its vocabulary against published figures, the reference planner's
rules, and the lesson's worked example recomputed.

    .venv/bin/python -m pytest -q tests/test_composition_planner.py

No ranks: arithmetic only. Published figures are independent of the planner:
parameter counts of Llama 3 (Meta / Hugging Face model cards) and GPT-3 (Brown
et al. 2020), the FLOPs of a GPT layer (Narayanan et al. 2021, eq. 3),
activation memory (Korthikanti et al. 2022, table 2; Megatron-LM's
`compute_activation_memory`), the node boundaries of an actual rank layout.
"""

from __future__ import annotations

import itertools

import pytest

from autograder.lessons.planner import (
    GPT3_175B, LLAMA3_405B, LLAMA3_70B, LLAMA3_8B, Cluster, Layout, ModelConfig, Training, crosses_nodes,
    layers_on_stage,
)
from autograder.lessons.volume import dp_step_bytes, zero_step_bytes
from solutions.composition.layout import rank_layout
from solutions.composition.planner import best_layouts, memory_per_gpu, plan, stage_params, step_time

GB = 1e9


# ---------------------------------------------------------------------------
# The vocabulary against published figures
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("model, published, tolerance", [
    (LLAMA3_8B, 8.03e9, 0.005e9),      # "8.03B" on the model card
    (LLAMA3_70B, 70.6e9, 0.05e9),      # "70.6B"
    (LLAMA3_405B, 405.9e9, 0.1e9),     # "405.9B" (reported as 405B)
    (GPT3_175B, 175.0e9, 0.5e9),       # Brown et al. 2020, table 2.1 (vocabulary 50257; here padded to 51200)
])
def test_parameter_counts_match_the_published_models(model, published, tolerance):
    assert abs(model.num_params() - published) < tolerance, model.num_params()


def test_flops_per_token_is_narayanans_formula_for_a_gpt_layer():
    """Narayanan et al. 2021, eq. 3 without recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per step."""
    for model, s in ((GPT3_175B, 2048), (ModelConfig("g", 24, 2048, 8192, 16, 16, 50304, swiglu=False), 1024)):
        l, h, v = model.n_layers, model.hidden, model.vocab
        narayanan = 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
        # the course counts the norm-free matmuls exactly; Narayanan's 12 h^2 per layer is the same for GeLU, ffn 4h
        assert model.flops_per_token(s) == pytest.approx(narayanan, rel=1e-12)


def test_activation_bytes_are_korthikantis_without_dropout_masks():
    """GPT layer, flash attention: SP 34 sbh/t with two 1-byte dropout masks (Korthikanti table 2); TP-only
    sbh (10 + 24/t) of which 2 are dropout masks; Megatron's estimate sbh (18 + 4 ffn/h), ffn = 4h."""
    h = 4096
    gpt = ModelConfig("gpt", 1, h, 4 * h, 32, 32, 1000, swiglu=False)
    for t in (1, 2, 4, 8):
        dropout_masks = 2 * h / t  # SP shards them too
        assert gpt.activation_bytes_per_token(tp=t) + dropout_masks == pytest.approx(34 * h / t)
        assert gpt.activation_bytes_per_token(tp=t, sequence_parallel=False) + 2 * h == pytest.approx(h * (10 + 24 / t))
        assert gpt.activation_bytes_per_token(tp=t) + dropout_masks == pytest.approx((18 + 4 * gpt.ffn / h) * h / t)


def test_crosses_nodes_agrees_with_the_groups_of_an_actual_layout():
    """For every power-of-two layout of 32 ranks on 8-GPU nodes: the rank-0 rule equals looking at every group."""
    sizes = [1, 2, 4, 8, 16, 32]
    for tp, cp, pp in itertools.product(sizes, sizes, sizes):
        if 32 % (tp * cp * pp):
            continue
        layout = Layout(tp=tp, cp=cp, pp=pp, dp=32 // (tp * cp * pp))
        groups = rank_layout(32, tp=tp, cp=cp, pp=pp, order="tp-cp-pp-dp")
        for dims, key in ((("tp",), "tp"), (("cp",), "cp"), (("pp",), "pp"), (("cp", "dp"), "dp_cp")):
            spans = any(len({r // 8 for r in g}) > 1 for g in groups[key])
            assert crosses_nodes(layout, dims, 8) == spans, (layout, dims)


def test_layers_on_stage_sum_to_the_layers_and_the_first_stages_take_the_rest():
    for n, p in ((126, 16), (80, 4), (4, 3), (7, 7)):
        counts = [layers_on_stage(n, p, s) for s in range(p)]
        assert sum(counts) == n and counts == sorted(counts, reverse=True) and max(counts) - min(counts) <= 1
    with pytest.raises(ValueError):
        layers_on_stage(4, 2, 2)


def test_zero_step_bytes_is_dp_step_bytes_when_both_dtypes_agree():
    for d in (2, 4, 8):
        assert zero_step_bytes(1000, d, stage=0, param_bytes=4, grad_bytes=4)["total"] == dp_step_bytes(1000, d, bytes_per_element=4, scheme="ddp")
        assert zero_step_bytes(1000, d, stage=1, param_bytes=4, grad_bytes=4)["total"] == dp_step_bytes(1000, d, bytes_per_element=4, scheme="zero")
        assert zero_step_bytes(1000, d, stage=3, param_bytes=4, grad_bytes=4)["total"] == dp_step_bytes(1000, d, bytes_per_element=4, scheme="fsdp")


# ---------------------------------------------------------------------------
# The lesson's worked example (05_planner.md), recomputed
# ---------------------------------------------------------------------------

LLAMA = Training(seq_len=8192, global_batch=2048)
BIG = Cluster(16384)


def test_lesson_worked_example_memory():
    assert LLAMA3_405B.layer_params() == 3_187_703_808
    assert LLAMA3_405B.embedding_params() == 2_101_346_304
    assert LLAMA3_405B.num_params() == 405_853_388_800
    layout = Layout(tp=8, pp=16, dp=128)
    assert stage_params(LLAMA3_405B, layout, 0) == 3_450_372_096
    assert LLAMA3_405B.activation_bytes_per_token(tp=8) == 65_024
    m = memory_per_gpu(LLAMA3_405B, layout, LLAMA)
    assert [round(m[k] / GB, 2) for k in ("params", "grads", "optimizer", "activations")] == [6.90, 13.80, 0.32, 68.18]
    assert round(m["total"] / GB, 1) == 89.2 and m["stage"] == 0
    m = memory_per_gpu(LLAMA3_405B, Layout(tp=8, pp=16, dp=128, recompute="full"), LLAMA)
    assert round(m["activations"] / GB, 2) == 4.83 and round(m["total"] / GB, 1) == 25.9


def test_lesson_recomputation_table():
    """05_planner.md §2, "Recomputation between none and full": each row from the planner's per-token terms on
    stage 0 (8 layers, 16 micro-batches of 8192 tokens in flight), the model state of the worked example, and,
    for the two ends, the reference planner itself."""
    import os

    lesson = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assignments",
                               "06_composition", "05_planner.md"), encoding="utf-8").read()
    m, t, tokens, layers, in_flight = LLAMA3_405B, 8, 8192, 8, 16
    layout = Layout(tp=t, pp=16, dp=128)
    state = memory_per_gpu(m, layout, LLAMA)
    state = state["params"] + state["grads"] + state["optimizer"]
    assert round(state / GB, 2) == 21.03
    full = m.activation_bytes_per_token(tp=t)                  # 65,024 B per token and layer
    layer_input = 2 * m.hidden / t                              # what full recomputation keeps (2 bytes x h/t)
    norm_outputs = 2 * 2 * m.hidden / t                         # the two norms' outputs, 2h/t elements
    mlp_inner = 2 * 3 * m.ffn / t                               # SwiGLU's gate, up and product
    kept = tokens * layers * in_flight

    def row(activations):
        return round(activations / GB, 2), round((activations + state) / GB, 1)

    rows = {
        "none": row(full * kept),
        "layernorm": row((full - norm_outputs) * kept),
        "mlp": row((full - mlp_inner) * kept + mlp_inner * tokens),             # + one MLP recomputed at a time
        "block 2": row((layers - 2) * full * tokens * in_flight + 2 * layer_input * tokens * in_flight
                       + full * tokens),                                           # + one layer recomputed at a time
        "full": row(layer_input * kept + full * tokens),
    }
    assert rows == {"none": (68.18, 89.2), "layernorm": (59.59, 80.6), "mlp": (26.63, 47.7),
                    "block 2": (52.74, 73.8), "full": (4.83, 25.9)}
    # the two ends are the reference planner's own numbers
    for recompute, key in (("none", "none"), ("full", "full")):
        p = memory_per_gpu(m, Layout(tp=t, pp=16, dp=128, recompute=recompute), LLAMA)
        assert (round(p["activations"] / GB, 2), round(p["total"] / GB, 1)) == rows[key]
    assert round(norm_outputs / full, 3) == 0.126 and round(mlp_inner / full, 2) == 0.61
    # the compute factor f: one more forward of what is recomputed; a forward is a third of forward + backward
    layer_forward = 2 * (m.layer_params() - 2 * m.hidden) + 4 * LLAMA.seq_len * m.hidden
    mlp_share = 2 * 3 * m.hidden * m.ffn / layer_forward
    assert round(mlp_share, 2) == 0.76 and round(1 + mlp_share / 3, 2) == 1.25
    assert round(1 + 2 / (3 * layers), 3) == 1.083
    for activations, total in rows.values():
        assert f"| {activations:.2f} | {total:.1f} |" in lesson, (activations, total)
    for phrase in ("12.6 % of the layer", "$3 \\, \\mathit{ffn}/t$: 61 %", "76 % of a layer's forward",
                   "$1 + 2/(3 \\cdot 8) = 1.083$", "model state 21.03 GB"):
        assert phrase in lesson, phrase


def test_lesson_worked_example_time():
    t = step_time(LLAMA3_405B, BIG, Layout(tp=8, pp=16, dp=128, recompute="full"), LLAMA)
    assert [round(t[k], 2) for k in ("compute", "bubble", "tp", "pp", "dp", "total")] == [9.06, 8.49, 0.97, 0.02, 0.0,
                                                                                          18.55]
    assert t["dp_overlapped"] == pytest.approx(0.41, abs=0.01)
    assert round(plan(LLAMA3_405B, BIG, Layout(tp=8, pp=16, dp=128, recompute="full"), LLAMA).mfu, 2) == 0.15


def test_dp_alone_fails_on_memory_then_on_the_batch():
    p = plan(LLAMA3_405B, BIG, Layout(dp=16384, zero=1), LLAMA)
    assert not p.feasible and p.memory["total"] > 2000 * GB and any("GB" in r for r in p.reasons)
    p = plan(LLAMA3_405B, BIG, Layout(dp=16384, zero=3, recompute="full"), LLAMA)
    assert any("global batch" in r for r in p.reasons)


# ---------------------------------------------------------------------------
# Rules of the reference planner
# ---------------------------------------------------------------------------

def test_each_infeasibility_reason():
    tr = Training(seq_len=8192, global_batch=512)
    reasons = plan(LLAMA3_70B, Cluster(64), Layout(tp=16, pp=2, dp=2), tr).reasons
    assert any("heads" in r for r in reasons)
    assert any("64 GPUs" in r for r in plan(LLAMA3_70B, Cluster(64), Layout(tp=4, pp=4, dp=2), tr).reasons)
    assert any("sequence" in r for r in plan(LLAMA3_8B, Cluster(8), Layout(cp=8), Training(8200, 8)).reasons)
    assert any("layers" in r for r in plan(LLAMA3_8B, Cluster(64), Layout(pp=64), Training(8192, 64)).reasons)
    assert plan(LLAMA3_70B, Cluster(64), Layout(tp=4, pp=4, cp=2, dp=2), tr).feasible


def test_overlap_only_hides_dp_and_cp():
    lay = Layout(tp=8, cp=2, pp=8, dp=8, recompute="full")
    on = step_time(LLAMA3_405B, Cluster(1024), lay, Training(8192, 512))
    off = step_time(LLAMA3_405B, Cluster(1024), lay, Training(8192, 512, overlap=False))
    assert off["dp"] == pytest.approx(on["dp"] + on["dp_overlapped"])
    assert off["cp"] == pytest.approx(on["cp"] + on["cp_overlapped"])
    assert off["tp"] == on["tp"] and off["pp"] == on["pp"] and off["total"] > on["total"]


def test_best_layouts_are_feasible_sorted_and_include_what_meta_ran_among_feasible():
    best = best_layouts(LLAMA3_70B, Cluster(64), Training(8192, 512), top=4)
    assert len(best) == 4 and all(p.feasible for p in best)
    times = [p.time["total"] for p in best]
    assert times == sorted(times)
    assert plan(LLAMA3_405B, BIG, Layout(tp=8, pp=16, dp=128, recompute="full"), LLAMA).feasible


def test_fewer_micro_batches_than_stages_caps_what_a_stage_holds():
    """1F1B keeps min(pp - stage, m) micro-batches on a stage: with m = 8 < 16 stages, stage 0 of Llama 3 405B
    holds 8, half of what 16 micro-batches cost (the notebook's case for a planner that ignores m)."""
    lay = Layout(tp=8, pp=16, dp=128, zero=1)
    full, half = (memory_per_gpu(LLAMA3_405B, lay, Training(8192, gb)) for gb in (2048, 1024))
    assert lay.microbatches(Training(8192, 1024)) == 8 and full["stage"] == half["stage"] == 0
    assert half["activations"] == pytest.approx(full["activations"] / 2, rel=1e-12)
    assert half["activations"] == 8 * 8 * 8192 * LLAMA3_405B.activation_bytes_per_token(tp=8, bytes_per_element=2)


def test_the_batch_rule_counts_the_micro_batch():
    tr = Training(seq_len=8192, global_batch=16)
    assert plan(LLAMA3_8B, Cluster(64), Layout(tp=8, dp=8, micro_batch=2), tr).feasible
    for mb in (3, 4):  # 16 % 24, and 16 % 32 (not even one micro-batch per DP rank)
        assert any("global batch" in r for r in plan(LLAMA3_8B, Cluster(64), Layout(tp=8, dp=8, micro_batch=mb),
                                                     tr).reasons)


def test_long_context_ranks_a_cp_32_layout_first_with_the_given_micro_batch():
    """The notebook's best_layouts cases where context parallelism across nodes wins (64K and 128K tokens): CP 32
    first, every candidate with the micro-batch asked for (a search that drops it, or stops CP at 16, differs)."""
    for gpus, seq, batch, mb in [(64, 65536, 8, 2), (128, 131072, 4, 2), (32, 131072, 16, 1)]:
        best = best_layouts(LLAMA3_8B, Cluster(gpus), Training(seq, batch), top=3, micro_batch=mb)
        assert best[0].layout.cp == 32 and all(p.layout.micro_batch == mb for p in best), [p.layout for p in best]
        without = best_layouts(LLAMA3_8B, Cluster(gpus), Training(seq, batch), top=3)
        assert mb == 1 or [p.layout for p in without] != [p.layout for p in best]


def test_check_best_layouts_passes_the_micro_batch_and_names_one_that_was_dropped():
    from autograder.checks.composition import check_best_layouts
    from autograder.runtime.compare import CheckFailure

    tr = Training(seq_len=65536, global_batch=8)
    want = [p.layout for p in best_layouts(LLAMA3_8B, Cluster(64), tr, top=3, micro_batch=2)]
    check_best_layouts(best_layouts, LLAMA3_8B, Cluster(64), tr, top=3, micro_batch=2, expected=want)

    def dropped(model, cluster, training, *, zero_stages=(1,), recompute=("none", "full"), micro_batch=1, top=5):
        return best_layouts(model, cluster, training, zero_stages=zero_stages, recompute=recompute, top=top)

    with pytest.raises(CheckFailure, match=r"micro_batch=2\): returned layouts with micro-batch \[1\], expected 2"):
        check_best_layouts(dropped, LLAMA3_8B, Cluster(64), tr, top=3, micro_batch=2, expected=want)
