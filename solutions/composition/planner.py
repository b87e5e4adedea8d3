"""Reference solution, assignment 06 (part 3): the layout planner.

`memory_per_gpu` (bytes on the worst pipeline stage), `step_time` (seconds per
step: compute, bubble and each dimension's exposed communication), `plan` (the
two, and whether the layout is feasible at all) and `best_layouts` (the
feasible layouts of a cluster, fastest first). Every formula and assumption:
assignments/06_composition/05_planner.md; the vocabulary (ModelConfig,
Training, Layout, Cluster, Plan): autograder/lessons/planner.py; communication volumes:
autograder/lessons/volume.py; hardware figures: autograder/lessons/hardware.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_composition_planner.py
"""

from __future__ import annotations

from autograder.lessons.hardware import ring_collective_seconds, transfer_seconds
from autograder.lessons.planner import Cluster, Layout, ModelConfig, Plan, Training, crosses_nodes, layers_on_stage
from autograder.lessons.volume import pp_boundary_bytes, ring_attention_bytes_per_layer, tp_layer_bytes, zero_step_bytes

__all__ = ["stage_params", "memory_per_gpu", "step_time", "plan", "best_layouts"]


# ---------------------------------------------------------------------------
# Exercise 10: memory per GPU
# ---------------------------------------------------------------------------

def stage_params(model: ModelConfig, layout: Layout, stage: int) -> float:
    """Parameters one GPU of pipeline stage `stage` holds: its layers, the embedding on the first stage, the
    final norm and the head on the last (the head is a copy of the embedding when tied and pp > 1, absent when
    tied and pp == 1), all divided by the TP size."""
    ### BEGIN SOLUTION
    params = layers_on_stage(model.n_layers, layout.pp, stage) * model.layer_params()
    if stage == 0:
        params += model.embedding_params()
    if stage == layout.pp - 1:
        params += model.hidden
        if not model.tied_embeddings or layout.pp > 1:
            params += model.embedding_params()
    return params / layout.tp
    ### END SOLUTION


def memory_per_gpu(model: ModelConfig, layout: Layout, training: Training) -> dict:
    """Bytes on one GPU of the worst pipeline stage: {"params", "grads", "optimizer", "activations", "total", "stage"}.

    For every stage s (the worst is the largest total; the first of equals):
    - parameters P = stage_params(...); weights P * param_bytes, gradients
      P * grad_bytes, optimizer P * optim_bytes, each divided by d = dp * cp
      from its ZeRO stage on (ZeRO-1: the optimizer; 2: + gradients; 3: + weights);
    - m = max(1, layout.microbatches(training)) micro-batches per step; 1F1B keeps
      min(pp - s, m) in flight on stage s; a micro-batch is micro_batch * seq_len / cp
      tokens per rank; a layer keeps model.activation_bytes_per_token(tp=tp,
      bytes_per_element=activation_bytes) per token with recompute "none", and
      only its input (hidden / tp elements per token, sequence-parallel) with
      "full", plus ONE layer's full activations of one micro-batch, recomputed;
    - the last stage also holds one micro-batch's logits: tokens * vocab / tp
      elements, at activation_bytes plus 4 (the loss's fp32 softmax).
    """
    ### BEGIN SOLUTION
    d = layout.dp * layout.cp
    m = max(1, layout.microbatches(training))
    tokens = layout.micro_batch * training.seq_len / layout.cp
    per_layer = model.activation_bytes_per_token(tp=layout.tp, bytes_per_element=training.activation_bytes) * tokens
    layer_input = model.hidden / layout.tp * training.activation_bytes * tokens
    worst = None
    for s in range(layout.pp):
        p = stage_params(model, layout, s)
        weights, grads, optim = p * training.param_bytes, p * training.grad_bytes, p * training.optim_bytes
        if layout.zero >= 1:
            optim /= d
        if layout.zero >= 2:
            grads /= d
        if layout.zero >= 3:
            weights /= d
        in_flight = min(layout.pp - s, m)
        layers = layers_on_stage(model.n_layers, layout.pp, s)
        if layout.recompute == "full":
            acts = in_flight * layers * layer_input + per_layer
        else:
            acts = in_flight * layers * per_layer
        if s == layout.pp - 1:
            acts += tokens * model.vocab / layout.tp * (training.activation_bytes + 4)
        entry = {"params": weights, "grads": grads, "optimizer": optim, "activations": acts,
                 "total": weights + grads + optim + acts, "stage": s}
        if worst is None or entry["total"] > worst["total"]:
            worst = entry
    return worst
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 11: time per step
# ---------------------------------------------------------------------------

def step_time(model: ModelConfig, cluster: Cluster, layout: Layout, training: Training) -> dict:
    """Seconds per step: {"compute", "bubble", "tp", "cp", "pp", "dp", "total", "cp_overlapped", "dp_overlapped"}.

    N = cluster.num_gpus, peak = cluster.node.peak_flops, m = max(1, microbatches),
    L = layers of stage 0 (the fullest), f = 4/3 with full recompute (one more forward), else 1.
    - compute: global_batch * seq_len * model.flops_per_token(seq_len) * f / (N * peak * mfu);
    - bubble (1F1B): compute * (pp - 1) / m;
    - tp (never hidden): per layer and micro-batch, the collectives of tp_layer_bytes(seq_len / cp,
      micro_batch, hidden, tp, bytes_per_element=activation_bytes, sequence_parallel=True,
      regather=True): 4 in forward (2 all-gathers, 2 reduce-scatters), 6 in backward, 4 more in a
      recomputed forward; each takes ring_collective_seconds(its bytes, tp, link); times m * L;
    - cp: per layer and micro-batch ring_attention_bytes_per_layer(seq_len, micro_batch,
      kv_dim / tp, cp, bytes_per_element=activation_bytes): 2(cp-1) sends forward, 4(cp-1) backward,
      2(cp-1) more recomputed, each transfer_seconds(block, link) with block the bytes of one send;
      times m * L; with overlap only what exceeds the attention compute (compute * attention FLOPs /
      flops_per_token) is exposed, the rest is "cp_overlapped";
    - pp (never hidden): 2m sends (an activation forward and its gradient backward per micro-batch) of
      pp_boundary_bytes(seq_len / cp, micro_batch, hidden, bytes_per_element=activation_bytes, tp=tp,
      sequence_parallel=True) bytes, each transfer_seconds(one send, link);
    - dp over d = dp * cp ranks: zero_step_bytes(stage_params(..., 0), d, stage=zero, param_bytes,
      grad_bytes, microbatches=m); "reduce" and "gather" each ring_collective_seconds(bytes, d, link)
      per collective (ZeRO-0: one all-reduce, 0 gathers; 1-2: one each; 3: m reduce-scatters and 2m
      all-gathers); with overlap, ZeRO 0-2 hide the reduce behind one micro-batch's backward
      (compute / m * (1 - share)) and the gather behind one forward (compute / m * share), share =
      1/4 with full recompute else 1/3; ZeRO-3 hides both behind all of compute; the hidden part is
      "dp_overlapped";
    - a link is the node's NVLink when the group of that dimension stays in a node
      (crosses_nodes(layout, dims, node.gpus) with dims ("tp",), ("cp",), ("pp",), ("cp", "dp")),
      InfiniBand otherwise; total = compute + bubble + tp + cp + pp + dp (exposed parts).
    """
    ### BEGIN SOLUTION
    node = cluster.node
    n = cluster.num_gpus
    m = max(1, layout.microbatches(training))
    layers = layers_on_stage(model.n_layers, layout.pp, 0)
    full = layout.recompute == "full"
    f = 4 / 3 if full else 1.0
    s, b, act = training.seq_len, layout.micro_batch, training.activation_bytes
    flops = model.flops_per_token(s)
    compute = training.global_batch * s * flops * f / (n * node.peak_flops * training.mfu)
    bubble = compute * (layout.pp - 1) / m

    def link(*dims):
        return node.link(crosses_nodes=crosses_nodes(layout, dims, node.gpus))

    tp = 0.0
    if layout.tp > 1:
        vol = tp_layer_bytes(s // layout.cp, b, model.hidden, layout.tp, bytes_per_element=act, regather=True,
                             sequence_parallel=True)  # SP whenever tp > 1
        one = vol["forward"] / 4  # every all-gather and reduce-scatter moves the same bytes
        count = 4 + 6 + (4 if full else 0)
        tp = m * layers * count * ring_collective_seconds(one, layout.tp, link("tp"))

    cp_total = 0.0
    if layout.cp > 1:
        vol = ring_attention_bytes_per_layer(s, b, model.kv_dim // layout.tp, layout.cp, bytes_per_element=act)
        sends = 2 * (layout.cp - 1) + 4 * (layout.cp - 1) + (2 * (layout.cp - 1) if full else 0)
        block = vol["forward"] / (2 * (layout.cp - 1))
        cp_total = m * layers * sends * transfer_seconds(block, link("cp"))
    attention = compute * model.attention_flops_per_token(s) / flops
    cp = max(0.0, cp_total - attention) if training.overlap else cp_total

    pp = 0.0
    if layout.pp > 1:
        one = pp_boundary_bytes(s // layout.cp, b, model.hidden, bytes_per_element=act, tp=layout.tp,
                                sequence_parallel=True)
        pp = 2 * m * transfer_seconds(one, link("pp"))

    d = layout.dp * layout.cp
    dp_total = dp = 0.0
    if d > 1:
        vol = zero_step_bytes(stage_params(model, layout, 0), d, stage=layout.zero, param_bytes=training.param_bytes,
                              grad_bytes=training.grad_bytes, microbatches=m)
        dp_link = link("cp", "dp")
        reduces, gathers = {0: (1, 0), 1: (1, 1), 2: (1, 1), 3: (m, 2 * m)}[layout.zero]
        t_reduce = reduces * ring_collective_seconds(vol["reduce"] / reduces, d, dp_link)
        t_gather = gathers * ring_collective_seconds(vol["gather"] / gathers, d, dp_link) if gathers else 0.0
        dp_total = t_reduce + t_gather
        if not training.overlap:
            dp = dp_total
        elif layout.zero == 3:
            dp = max(0.0, dp_total - compute)
        else:
            share = 1 / 4 if full else 1 / 3
            per_mb = compute / m
            dp = max(0.0, t_reduce - per_mb * (1 - share)) + max(0.0, t_gather - per_mb * share)
    total = compute + bubble + tp + cp + pp + dp
    return {"compute": compute, "bubble": bubble, "tp": tp, "cp": cp, "pp": pp, "dp": dp, "total": total,
            "cp_overlapped": cp_total - cp, "dp_overlapped": dp_total - dp}
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 12: the verdict, and the search
# ---------------------------------------------------------------------------

def plan(model: ModelConfig, cluster: Cluster, layout: Layout, training: Training) -> Plan:
    """Memory, time and the verdict for one layout; `reasons` lists every rule it breaks:

    the sizes do not multiply to the cluster; tp does not divide the heads or the
    KV heads; with cp > 1 the sequence is not divisible by 2 cp; pp > layers; the
    global batch is not a positive multiple of dp * micro_batch; the worst stage
    needs more than the GPU's memory. `mfu` of the plan: the model FLOPs of a step
    (no recomputation) / (total time * N * peak).
    """
    ### BEGIN SOLUTION
    reasons = []
    if layout.world != cluster.num_gpus:
        reasons.append(f"tp*cp*pp*dp = {layout.world} is not the cluster's {cluster.num_gpus} GPUs")
    if model.n_heads % layout.tp or model.n_kv_heads % layout.tp:
        reasons.append(f"TP {layout.tp} does not divide {model.n_heads} heads and {model.n_kv_heads} KV heads")
    if layout.cp > 1 and training.seq_len % (2 * layout.cp):
        reasons.append(f"the sequence ({training.seq_len}) is not divisible by 2 * CP = {2 * layout.cp}")
    if layout.pp > model.n_layers:
        reasons.append(f"PP {layout.pp} > {model.n_layers} layers")
    if layout.microbatches(training) < 1 or training.global_batch % (layout.dp * layout.micro_batch):
        reasons.append(f"the global batch ({training.global_batch} sequences) is not a multiple of "
                       f"DP x micro-batch = {layout.dp * layout.micro_batch}")
    memory = memory_per_gpu(model, layout, training)
    if memory["total"] > cluster.node.hbm_bytes:
        reasons.append(f"needs {memory['total'] / 1e9:.1f} GB per GPU (stage {memory['stage']}), more than "
                       f"{cluster.node.hbm_bytes / 1e9:g} GB")
    time = step_time(model, cluster, layout, training)
    model_flops = training.global_batch * training.seq_len * model.flops_per_token(training.seq_len)
    mfu = model_flops / (time["total"] * cluster.num_gpus * cluster.node.peak_flops)
    return Plan(layout=layout, memory=memory, time=time, feasible=not reasons, reasons=reasons, mfu=mfu)
    ### END SOLUTION


def best_layouts(model: ModelConfig, cluster: Cluster, training: Training, *, zero_stages=(1,),
                 recompute=("none", "full"), micro_batch: int = 1, top: int = 5) -> list:
    """The `top` feasible plans, fastest step first (then least memory), over every candidate:

    tp a power of two up to the node's GPUs, cp a power of two up to 32, pp any
    divisor of num_gpus / (tp * cp) up to the number of layers, dp what is left,
    each ZeRO stage of `zero_stages` and each recompute of `recompute`.
    """
    ### BEGIN SOLUTION
    n = cluster.num_gpus
    powers = [1 << i for i in range(12)]
    found = []
    for tp in (x for x in powers if x <= cluster.node.gpus):
        for cp in (x for x in powers if x <= 32):
            if n % (tp * cp):
                continue
            rest = n // (tp * cp)
            for pp in range(1, min(rest, model.n_layers) + 1):
                if rest % pp:
                    continue
                for zero in zero_stages:
                    for rc in recompute:
                        layout = Layout(tp=tp, cp=cp, pp=pp, dp=rest // pp, zero=zero, recompute=rc,
                                        micro_batch=micro_batch)
                        candidate = plan(model, cluster, layout, training)
                        if candidate.feasible:
                            found.append(candidate)
    found.sort(key=lambda p: (p.time["total"], p.memory["total"]))
    return found[:top]
    ### END SOLUTION
