"""The layout planner's vocabulary (assignment 06): models, training set-ups, layouts, and the picture.

    from autograder.lessons.planner import LLAMA3_405B, Training, Layout, Cluster, plot_plans
    training = Training(seq_len=8192, global_batch=2048)
    layout = Layout(tp=8, pp=16, dp=128, zero=1, recompute="full")
    # the student's plan(LLAMA3_405B, Cluster(16384), layout, training) -> Plan

What is given here: the sizes that follow from a model's shape (parameters per
layer, FLOPs per token, activation bytes per token), the stated assumptions
(`Training`), a candidate layout (`Layout`), the hardware (`Cluster`, with the
figures of autograder/lessons/hardware.py), which groups leave a node, and the picture
of several plans. What the planner does with them (which stage is the worst,
how many micro-batches are in flight, what ZeRO divides, what overlaps) is the
exercise. The formulas and their sources: assignments/06_composition/05_planner.md.

Layouts use the course's rank order tp-cp-pp-dp (TP innermost): a group of a
dimension has stride = the product of the sizes inside it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from autograder.lessons.hardware import H100_NODE, Node

__all__ = ["ModelConfig", "Training", "Layout", "Cluster", "Plan", "LLAMA3_8B", "LLAMA3_70B", "LLAMA3_405B",
           "GPT3_175B", "MEMORY_PARTS", "TIME_PARTS", "layers_on_stage", "crosses_nodes", "plot_plans", "GB"]

GB = 1e9
MEMORY_PARTS = ("params", "grads", "optimizer", "activations")
TIME_PARTS = ("compute", "bubble", "tp", "cp", "pp", "dp")


@dataclass(frozen=True)
class ModelConfig:
    """A dense decoder (Llama or GPT shaped): sizes only.

    `ffn` is the MLP's intermediate size; `swiglu` (Llama) has three MLP matrices
    (gate, up, down), otherwise two (GPT's GeLU MLP). No biases. `n_kv_heads` <
    `n_heads` is grouped-query attention: k and v have `n_kv_heads * head_dim`
    features. `tied_embeddings`: the head reuses the embedding matrix.
    """

    name: str
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    swiglu: bool = True
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """One transformer layer: q and o (h x h each), k and v (h x kv_dim each), the MLP, two norm scales."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim + (3 if self.swiglu else 2) * h * self.ffn + 2 * h

    def embedding_params(self) -> int:
        """The embedding matrix (and the head, the same size): vocab x hidden."""
        return self.vocab * self.hidden

    def num_params(self) -> int:
        """Every parameter: the layers, the embedding, the head (unless tied), the final norm."""
        heads = 1 if self.tied_embeddings else 2
        return self.n_layers * self.layer_params() + heads * self.embedding_params() + self.hidden

    def matmul_params(self) -> int:
        """Parameters a token is multiplied with: every layer's weight matrices and the head (not the lookup)."""
        return self.n_layers * (self.layer_params() - 2 * self.hidden) + self.embedding_params()

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per token for forward + backward: 6 x matmul params + 12 L s h (attention scores and
        their use, counted without the causal half, as PaLM's MFU does: Chowdhery et al. 2022, app. B)."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layers * seq_len * self.hidden

    def attention_flops_per_token(self, seq_len: int) -> float:
        """The 12 L s h part of `flops_per_token`: what ring attention's communication can hide behind."""
        return 12.0 * self.n_layers * seq_len * self.hidden

    def activation_bytes_per_token(self, *, tp: int = 1, sequence_parallel: bool = True,
                                   bytes_per_element: int = 2) -> float:
        """Bytes one layer keeps for backward per token, on one TP rank, nothing recomputed, flash attention.

        Kept tensors (elements per token): the inputs and outputs of the two
        norms, 4h (split over TP only under sequence parallelism); q, k, v
        (h + 2 kv_dim) and the attention output (h); the MLP's intermediate
        tensors, 3 ffn with SwiGLU (gate, up, their product) or 2 ffn with
        GeLU (fc1's output, the GeLU's): all split over TP. Flash attention keeps
        no s x s scores. For GPT (ffn = 4h, GeLU) it is 32 s b h bytes at 2 bytes
        per element: Korthikanti et al. 2022's 34 s b h without the two dropout masks.
        """
        h = self.hidden
        replicated = 4 * h
        split = 2 * h + 2 * self.kv_dim + (3 if self.swiglu else 2) * self.ffn
        return bytes_per_element * (replicated / (tp if sequence_parallel else 1) + split / tp)


@dataclass(frozen=True)
class Training:
    """What is trained and the assumptions every estimate states.

    `seq_len` tokens per sequence, `global_batch` sequences per optimizer step.
    Bytes per parameter: `param_bytes` for the bf16 weights forward and backward
    use, `grad_bytes` for the gradients (4: Megatron accumulates them in fp32,
    `main_grad`), `optim_bytes` for AdamW's fp32 master copy and two moments.
    `activation_bytes` per activation element (bf16). `mfu`: the fraction of
    the GPU's peak reached on the FLOPs executed (recomputation included).
    `overlap`: DP and CP traffic hide behind compute as stated in 05_planner.md;
    TP and PP traffic never do.
    """

    seq_len: int
    global_batch: int
    param_bytes: int = 2
    grad_bytes: int = 4
    optim_bytes: int = 12
    activation_bytes: int = 2
    mfu: float = 0.4
    overlap: bool = True


@dataclass(frozen=True)
class Layout:
    """A candidate: the four sizes (rank order tp-cp-pp-dp), the ZeRO stage over the dp x cp ranks,
    recomputation ("none" or "full"), and the micro-batch size in sequences. 1F1B; SP whenever tp > 1."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 1
    recompute: str = "none"
    micro_batch: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def name(self) -> str:
        parts = [f"{d.upper()}{getattr(self, d)}" for d in ("tp", "cp", "pp", "dp") if getattr(self, d) > 1]
        rc = ", recompute" if self.recompute == "full" else ""
        return (" x ".join(parts) or "1 GPU") + f" (ZeRO-{self.zero}{rc})"

    def microbatches(self, training: Training) -> int:
        """Micro-batches per step on one DP rank: global batch / (dp x micro_batch), rounded down (0: too few)."""
        return training.global_batch // (self.dp * self.micro_batch)

    def strides(self) -> dict[str, int]:
        """Rank distance between neighbours of each dimension's group, in the order tp-cp-pp-dp."""
        return {"tp": 1, "cp": self.tp, "pp": self.tp * self.cp, "dp": self.tp * self.cp * self.pp}


@dataclass(frozen=True)
class Cluster:
    """`num_gpus` GPUs in nodes of `node.gpus`, with `node`'s peak FLOP/s, memory and links."""

    num_gpus: int
    node: Node = H100_NODE


@dataclass
class Plan:
    """One layout judged: bytes per GPU on the worst pipeline stage, seconds per step, and the verdict.

    `memory`: params, grads, optimizer, activations, total (bytes), stage (the worst one).
    `time`: compute, bubble, tp, cp, pp, dp (what is exposed), total (seconds), and
    cp_overlapped, dp_overlapped (what hid behind compute). `reasons`: why it is not feasible.
    """

    layout: Layout
    memory: dict
    time: dict
    feasible: bool
    reasons: list = field(default_factory=list)
    mfu: float = 0.0

    def describe(self) -> str:
        verdict = "feasible" if self.feasible else "NOT feasible: " + "; ".join(self.reasons)
        return (f"{self.layout.name}: {self.memory['total'] / GB:.1f} GB per GPU (stage {self.memory['stage']}), "
                f"{self.time['total']:.2f} s per step, MFU {100 * self.mfu:.0f} %: {verdict}")


# Published shapes. Llama 3: Dubey et al. 2024 ("The Llama 3 Herd of Models", arXiv:2407.21783), table 3.
LLAMA3_8B = ModelConfig("Llama 3 8B", n_layers=32, hidden=4096, ffn=14336, n_heads=32, n_kv_heads=8, vocab=128256)
LLAMA3_70B = ModelConfig("Llama 3 70B", n_layers=80, hidden=8192, ffn=28672, n_heads=64, n_kv_heads=8, vocab=128256)
LLAMA3_405B = ModelConfig("Llama 3 405B", n_layers=126, hidden=16384, ffn=53248, n_heads=128, n_kv_heads=8,
                          vocab=128256)
# GPT-3: Brown et al. 2020, table 2.1 (GeLU MLP of 4h, tied embeddings, vocabulary 50257 padded to 51200 by Megatron).
GPT3_175B = ModelConfig("GPT-3 175B", n_layers=96, hidden=12288, ffn=4 * 12288, n_heads=96, n_kv_heads=96,
                        vocab=51200, swiglu=False, tied_embeddings=True)


def layers_on_stage(n_layers: int, pp: int, stage: int) -> int:
    """Layers of pipeline stage `stage` when `n_layers` do not divide evenly: the first `n_layers % pp` stages
    take one more (so stage 0, which also holds the embedding, is the fullest)."""
    if not 0 <= stage < pp:
        raise ValueError(f"layers_on_stage: stage ({stage}) must be in [0, {pp})")
    return n_layers // pp + (1 if stage < n_layers % pp else 0)


def crosses_nodes(layout: Layout, dims, gpus_per_node: int) -> bool:
    """Whether the group spanning `dims` (e.g. ("tp",) or ("cp", "dp")) leaves a node of `gpus_per_node` GPUs.

    Judged on the group of rank 0 in the order tp-cp-pp-dp, which is exact when
    the sizes and the node are powers of two (every group then sits alike).
    """
    strides = layout.strides()
    ranks = [0]
    for d in dims:
        ranks = [r + i * strides[d] for i in range(getattr(layout, d)) for r in ranks]
    return len({r // gpus_per_node for r in ranks}) > 1


# ---------------------------------------------------------------------------
# The picture
# ---------------------------------------------------------------------------

_MEMORY_COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2"}
_TIME_COLORS = {"compute": "#4C72B0", "bubble": "#CCCCCC", "tp": "#DD8452", "cp": "#8172B2", "pp": "#937860",
                "dp": "#55A868"}


def plot_plans(plans, *, hbm_bytes: float = H100_NODE.hbm_bytes, title: str = ""):
    """Stacked memory bars (worst stage, GB per GPU) and step-time bars per layout, side by side.

    The memory panel draws the GPU's memory as a line; the time panel stacks
    compute, the pipeline bubble and the exposed communication of each
    dimension, with the communication that hid behind compute drawn hatched on
    top. An infeasible layout's label says why.
    """
    from autograder.lessons.plots import matplotlib_missing, new_figure, picture

    missing = matplotlib_missing()
    if missing:
        print(missing)
        return None
    plans = list(plans)
    if not plans:
        raise ValueError(f"plot_plans: plans is empty ({plans!r}): nothing to draw")
    fig, (ax_m, ax_t) = new_figure(figsize=(12, 0.9 + 0.55 * len(plans)), ncols=2, sharey=True)
    labels = []
    drawn_hidden = False
    for i, p in enumerate(plans):
        left = 0.0
        for part in MEMORY_PARTS:
            width = p.memory[part] / GB
            ax_m.barh(i, width, left=left, color=_MEMORY_COLORS[part], label=part if i == 0 else None)
            left += width
        left = 0.0
        for part in TIME_PARTS:
            width = p.time[part]
            ax_t.barh(i, width, left=left, color=_TIME_COLORS[part], label=part if i == 0 else None)
            left += width
        hidden = p.time.get("cp_overlapped", 0.0) + p.time.get("dp_overlapped", 0.0)
        if hidden > 0:
            ax_t.barh(i, hidden, left=left, color="white", edgecolor="#55A868", hatch="//",
                      label="overlapped (hidden)" if not drawn_hidden else None)
            drawn_hidden = True
        why = "" if p.feasible else "\n" + textwrap.shorten("not feasible: " + p.reasons[0], width=58, placeholder=" ...")
        labels.append(p.layout.name + why)
    ax_m.axvline(hbm_bytes / GB, color="black", linestyle="--", label=f"GPU memory ({hbm_bytes / GB:g} GB)")
    ax_m.set_yticks(range(len(plans)), labels, fontsize=8)
    ax_m.invert_yaxis()
    ax_m.set_xlabel("GB per GPU (worst pipeline stage)")
    ax_t.set_xlabel("seconds per step")
    ax_m.legend(fontsize=7, loc="lower right")
    ax_t.legend(fontsize=7, loc="lower right")
    ax_m.set_title("memory", fontsize=10)
    ax_t.set_title("step time (exposed)", fontsize=10)
    fig.suptitle(title or "candidate layouts", fontsize=11)
    return picture(fig)
