"""The site's figures, drawn when the site is built, from the course's own library (the `autograder` package).

    from docs.figures import FIGURES, draw_all
    draw_all("build/site-src/_figures")      # {name: path}; docs/build_site.py places each in its lesson

Every number comes from a function the graded code uses (`autograder.lessons.volume`,
`autograder.lessons.hardware`, the checks' plotting and simulation helpers), so the
site and the grader cannot disagree. Nothing is imported from `solutions/`.
Where a figure needs what an exercise computes (the ZeRO ledger, a schedule's
action lists, which ring step does which work), a few lines here compute it
from the rule the lesson states, and the build checks them against the
library before drawing: the ledger with the exercise's own public check, the
schedules' idle time with `pp_bubble_fraction`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "llm-parallelism-course"   # the same SVG bytes on every build
matplotlib.rcParams["svg.fonttype"] = "path"                   # no font needed to read it


@dataclass(frozen=True)
class Figure:
    name: str           # file name without extension
    lesson: str         # assignments/<a>/<file>.md
    section: str        # the heading (its start) at whose section's end the figure goes
    caption: str
    draw: callable      # () -> matplotlib Figure
    caption_zh: str = ""   # the caption on the Chinese site (the same formulas and code spans)


def _save(fig, path: str) -> None:
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})


# ---------------------------------------------------------------------------
# 01: data parallelism
# ---------------------------------------------------------------------------

def dp_volume():
    from autograder.lessons.plots import new_figure
    from autograder.lessons.volume import dp_step_bytes

    psi, b = 7.5e9, 2
    ds = [2 ** k for k in range(1, 11)]
    fig, ax = new_figure(figsize=(7, 3.4))
    for scheme, label, color in (("ddp", "DDP: all-reduce(G)", "#4C72B0"),
                                 ("zero", "ZeRO-1/2: reduce-scatter(G) + all-gather(W)", "#55A868"),
                                 ("fsdp", "ZeRO-3 / FSDP: 2 all-gathers(W) + reduce-scatter(G)", "#C44E52")):
        ys = [dp_step_bytes(psi, d, bytes_per_element=b, scheme=scheme) / 1e9 for d in ds]
        ax.plot(ds, ys, marker="o", ms=3, label=label, color=color,
                linestyle="--" if scheme == "zero" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ds, [str(d) for d in ds])
    ax.set_ylim(0, None)
    ax.set_xlabel("d (data-parallel ranks)")
    ax.set_ylabel("GB sent per rank per step")
    ax.set_title("One step of a 7.5B-parameter model, bf16 (b = 2): bytes each rank sends", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return fig


def zero_bytes_lesson(stage: int, dp_size: int, *, param_bytes=2, grad_bytes=2, optim_bytes=12) -> float:
    """The ledger of 01 README §3, column "general form" (P + G + O, P + G + O/d, P + (G + O)/d, (P + G + O)/d)."""
    p, g, o, d = param_bytes, grad_bytes, optim_bytes, dp_size
    return (p + g + o, p + g + o / d, p + (g + o) / d, (p + g + o) / d)[stage]


def zero_memory():
    from autograder.checks.data_parallel import check_zero_bytes_per_param, plot_memory_ledger

    check_zero_bytes_per_param(zero_bytes_lesson)      # the lesson's formulas are the grader's
    return plot_memory_ledger(zero_bytes_lesson, num_params=7.5e9, dp_size=64).figure


# ---------------------------------------------------------------------------
# 02: tensor parallelism
# ---------------------------------------------------------------------------

def tp_volume():
    from autograder.lessons.plots import new_figure
    from autograder.lessons.volume import tp_layer_bytes

    s, b, h = 4096, 1, 8192
    ts = [1, 2, 4, 8, 16]
    fig, ax = new_figure(figsize=(7, 3.4))
    for sp, label, color in ((False, "TP: all-reduces (f, g)", "#4C72B0"),
                             (True, "TP + SP: all-gathers and reduce-scatters (input re-gathered in backward)",
                              "#DD8452")):
        ys = [tp_layer_bytes(s, b, h, t, sequence_parallel=sp)["total"] / 1e6 for t in ts]
        ax.plot(ts, ys, marker="o", ms=3, label=label, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.set_xlabel("t (tensor-parallel ranks)")
    ax.set_ylabel("MB sent per rank")
    ax.set_title(f"One transformer layer, forward + backward, [s, b, h] = [{s}, {b}, {h}], bf16", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------------------
# 03: pipeline parallelism
# ---------------------------------------------------------------------------

def gpipe_actions(p: int, s: int, m: int) -> list:
    """GPipe as the lesson draws it: every forward, then every backward, micro-batches in order."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b_actions(p: int, s: int, m: int) -> list:
    """1F1B as the lesson states it: min(p - s - 1, m) warm-up forwards, then one forward / one backward, then
    the remaining backwards."""
    warm = min(p - s - 1, m)
    acts = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        acts += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return acts + [("B", i) for i in range(b, m)]


def pp_schedules():
    from autograder.checks.pipeline_parallel import simulate_schedules
    from autograder.lessons.plots import new_figure
    from autograder.lessons.volume import pp_bubble_fraction

    p, m = 4, 8
    fig, axes = new_figure(figsize=(10, 4.6), nrows=2)
    for ax, (name, fn) in zip(axes, (("GPipe", gpipe_actions), ("1F1B", one_f_one_b_actions))):
        sim = simulate_schedules([fn(p, s, m) for s in range(p)])
        if "deadlock" in sim:
            raise RuntimeError(f"{name} deadlocks: {sim['deadlock']}")
        bubble = pp_bubble_fraction(p, m)
        if abs(sim["idle_fraction"] - bubble) > 1e-9:
            raise RuntimeError(f"{name}: idle {sim['idle_fraction']} != (p-1)/(m+p-1) = {bubble}")
        for s, events in enumerate(sim["events"]):
            for kind, mb, _chunk, start, end in events:
                ax.barh(s, end - start, left=start, height=0.8, edgecolor="white",
                        color="#4C72B0" if kind == "F" else "#DD8452")
                ax.text((start + end) / 2, s, f"{kind}{mb}", ha="center", va="center", fontsize=7, color="white")
        ax.set_yticks(range(p), [f"stage {s}" for s in range(p)], fontsize=8)
        ax.set_ylim(p - 0.5, -0.5)
        ax.set_xlim(0, sim["makespan"])
        ax.set_title(f"{name}, p = {p} stages, m = {m} micro-batches (F = 1, B = 2): idle fraction "
                     f"{sim['idle_fraction']:.3f} = (p - 1) / (m + p - 1); most micro-batches alive at once on "
                     f"stage 0: {_peak(fn(p, 0, m))}", fontsize=9)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel("time (one forward = 1)")
    return fig


def _peak(actions) -> int:
    from autograder.checks.pipeline_parallel import in_flight_peak

    return in_flight_peak(actions)


# ---------------------------------------------------------------------------
# 04: context parallelism
# ---------------------------------------------------------------------------

def ring_work(w: int) -> dict:
    """Work per (rank, ring step) of causal ring attention, in full blocks, by the rule of 03_zigzag.md: at
    step i rank r holds the K/V of src = (r - i) mod w. Contiguous: the diagonal block (computed whole, with
    the mask inside), a full block for src < r, nothing for src > r. Zigzag: the diagonal block, then half a
    block at every later step. The shape `plot_ring_steps` draws."""
    block = 1.0
    contiguous, zigzag = [], []
    for r in range(w):
        steps_c, steps_z = [], []
        for i in range(w):
            src = (r - i) % w
            steps_c.append(block if src <= r else 0.0)
            steps_z.append(block if i == 0 else block / 2)
        contiguous.append({"steps": steps_c})
        zigzag.append({"steps": steps_z})
    return {"contiguous": contiguous, "zigzag": zigzag, "block": block, "world_size": w, "shape": (1, 8 * w, 2, 8)}


def ring_steps():
    from autograder.checks.context_parallel import plot_ring_steps

    w = 4
    fig = plot_ring_steps(None, None, measured=ring_work(w)).figure
    fig.suptitle(f"Causal ring attention on {w} ranks: the work of each (rank, step), in full blocks "
                 f"(the rule of this page)", fontsize=10)
    return fig


def cp_volume():
    from autograder.lessons.plots import new_figure
    from autograder.lessons.volume import cp_allgather_bytes, cp_ring_bytes, cp_ulysses_bytes

    s, b, hidden, kv = 131072, 1, 8192, 1024
    ws = [2, 4, 8, 16, 32]
    fig, ax = new_figure(figsize=(7, 3.4))
    series = (("ring (P2P of K/V blocks, dK/dV home)", lambda w: cp_ring_bytes(s, b, kv, w)["total"], "#4C72B0"),
              ("all-gathered K/V", lambda w: cp_allgather_bytes(s, b, kv, w)["total"], "#55A868"),
              ("Ulysses (all-to-all of q, k, v, out)", lambda w: cp_ulysses_bytes(s, b, hidden, kv, w)["total"],
               "#C44E52"))
    for label, fn, color in series:
        ax.plot(ws, [fn(w) / 1e6 for w in ws], marker="o", ms=3, label=label, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ws, [str(w) for w in ws])
    ax.set_xlabel("w (context-parallel ranks)")
    ax.set_ylabel("MB sent per rank")
    ax.set_title(f"One attention layer, forward + backward, s = {s}, hidden {hidden}, K/V hidden {kv}, bf16",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


FIGURES = [
    Figure("dp_volume", "assignments/01_data_parallel/README.md", "## 2. Communication per step",
           "Bytes each rank sends per step against the number of data-parallel ranks, from "
           "`autograder.lessons.volume.dp_step_bytes` (the function the volume tests check against the ledger): "
           "DDP and ZeRO-1/2 tend to $2\\Psi b$, ZeRO-3 to $3\\Psi b$.", dp_volume,
           "每个 rank 每个 step 发送的字节数与数据并行 rank 数的关系，由 `autograder.lessons.volume.dp_step_bytes` "
           "算出（volume 测试拿来与账本对照的正是这个函数）：DDP 和 ZeRO-1/2 趋于 $2\\Psi b$，ZeRO-3 趋于 $3\\Psi b$。"),
    Figure("zero_memory", "assignments/01_data_parallel/README.md", "## 3. The memory ledger",
           "The ledger above for $\\Psi = 7.5 \\cdot 10^9$ and $d = 64$, drawn by the notebook's "
           "`plot_memory_ledger`; the formulas are checked at build time by the exercise's public check "
           "`check_zero_bytes_per_param`.", zero_memory,
           "上面的账本在 $\\Psi = 7.5 \\cdot 10^9$、$d = 64$ 时的样子，由 notebook 的 `plot_memory_ledger` 画出；"
           "构建时用练习的公开检查 `check_zero_bytes_per_param` 核对这些公式。"),
    Figure("tp_volume", "assignments/02_tensor_parallel/README.md", "## 3. Communication volume per transformer layer",
           "Bytes a rank sends for one layer, from `autograder.lessons.volume.tp_layer_bytes`: sequence parallelism "
           "keeps the forward volume of plain TP and adds one all-gather in backward (Megatron re-gathers the "
           "input for the weight gradient).", tp_volume,
           "一个 rank 为一层发送的字节数，由 `autograder.lessons.volume.tp_layer_bytes` 算出：序列并行保持普通 TP "
           "的前向通信量，反向多一次 all-gather（Megatron 为权重梯度重新 gather 输入）。"),
    Figure("pp_schedules", "assignments/03_pipeline_parallel/README.md", "## 3. The schedules side by side",
           "GPipe and 1F1B on an ideal timeline (`simulate_schedules`, the checks' simulator): the same idle "
           "time, checked at build time against `pp_bubble_fraction`; 1F1B keeps at most $p$ micro-batches "
           "alive instead of $m$.", pp_schedules,
           "理想时间线上的 GPipe 与 1F1B（`simulate_schedules`，检查用的模拟器）：空闲时间相同，构建时与 "
           "`pp_bubble_fraction` 核对；1F1B 最多同时保留 $p$ 个 micro-batch，而不是 $m$ 个。"),
    Figure("cp_volume", "assignments/04_context_parallel/README.md", "## 3. Three ways to give every query every key",
           "Bytes a rank sends for one attention layer, from `autograder.lessons.volume` (`cp_ring_bytes`, "
           "`cp_allgather_bytes`, `cp_ulysses_bytes`), for a GQA model with 8 times fewer K/V heads "
           "than query heads.", cp_volume,
           "一个 rank 为一个 attention 层发送的字节数，由 `autograder.lessons.volume`（`cp_ring_bytes`、"
           "`cp_allgather_bytes`、`cp_ulysses_bytes`）算出；模型用 GQA，K/V head 比 query head 少 8 倍。"),
    Figure("ring_steps", "assignments/04_context_parallel/03_zigzag.md", "## The zigzag layout",
           "Contiguous against zigzag, drawn by the notebook's `plot_ring_steps` from the rule above: with "
           "zigzag every rank does the same work at every step after the first.", ring_steps,
           "连续布局与 zigzag 布局的对比，由 notebook 的 `plot_ring_steps` 按上面的规则画出：用 zigzag 时，"
           "第一步之后的每一步里每个 rank 的工作量都一样。"),
]


def draw_all(out_dir: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for f in FIGURES:
        path = os.path.join(out_dir, f.name + ".svg")
        _save(f.draw(), path)
        paths[f.name] = path
    return paths
