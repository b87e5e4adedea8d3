"""Build source/02_tensor_parallel/tensor_parallel_lab.ipynb (nbgrader source notebook) from code.

    .venv/bin/python assignments/02_tensor_parallel/_build_nb.py
    .venv/bin/nbgrader generate_assignment 02_tensor_parallel --force

Answer cells are cut from solutions/tensor_parallel/ (mappings.py, layers.py
and loss.py: one source of truth); test cells call the public
checks in autograder/checks/tensor_parallel/, with hidden cases.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autograder.authoring.nbbuild import NotebookBuilder, source_of  # noqa: E402
from solutions.tensor_parallel import mappings as tp  # noqa: E402
from solutions.tensor_parallel import layers  # noqa: E402
from solutions.tensor_parallel import loss  # noqa: E402

ASSIGNMENT = "02_tensor_parallel"
LESSON = "../../assignments/02_tensor_parallel"
OUT = os.path.join(ROOT, "source", ASSIGNMENT, "tensor_parallel_lab.ipynb")


def _solution(nb, grade_id: str, module, *names: str) -> None:
    """An answer cell holding `names` from the solution module (markers kept whole)."""
    nb.solution_from(grade_id, module, *names)


def _mapping_tests(nb, grade_id, points, name, doc, tp_kind: bool) -> None:
    """One graded cell per mapping, float64: visible 2 ranks; hidden 1 and 4 ranks, odd shapes, non-contiguous."""
    if tp_kind:  # the last dim (h) is split: odd s and b
        shape1, shape4 = "(3, 2, 5)", "(5, 3, 12)"
    else:  # dim 0 (s) is split: odd b and h
        shape1, shape4 = "(3, 2, 5)", "(8, 3, 7)"
    nb.test(grade_id, points, doc=doc, visible=f"""
    check_mapping({name}, "{name}", world_size=2, shape=(4, 3, 6))
    """, hidden=f"""
    check_mapping({name}, "{name}", world_size=1, shape={shape1}, seed=11)
    check_mapping({name}, "{name}", world_size=4, shape={shape4}, noncontiguous=True, seed=14)
    """)


def build() -> NotebookBuilder:
    nb = NotebookBuilder(ASSIGNMENT)
    nb.markdown(f"""
    # 02 · Tensor parallelism (TP) and sequence parallelism (SP)

    Tensor parallelism splits every weight matrix of a layer across the `t`
    ranks of a TP group; sequence parallelism also splits the activations TP
    leaves whole, along the sequence. You will implement, with real
    `torch.distributed` collectives on several CPU processes (gloo), the core
    of Megatron-LM's `megatron/core/tensor_parallel/`:

    1. the tensor-parallel mappings `f`, `g`, scatter and gather (last dim);
    2. the sequence-parallel mappings: all-gather and reduce-scatter along the sequence (dim 0);
    3. `ColumnParallelLinear` and `RowParallelLinear`, with and without SP;
    4. `ParallelMLP` and `allreduce_sequence_parallel_grads`;
    5. `vocab_parallel_cross_entropy`: the loss without ever gathering the logits;
    6. `LinearWithAsyncAllReduce`: the column layer's backward, its all-reduce overlapped with the weight gradient.

    Read first: the lesson [README.md]({LESSON}/README.md) ([the course overview](../../assignments/README.md)
    puts it beside the other dimensions). Deep dives:
    [01_mappings.md]({LESSON}/01_mappings.md) (exercises 1-2),
    [02_column_row_mlp.md]({LESSON}/02_column_row_mlp.md) (exercises 3-4),
    [03_sequence_parallel.md]({LESSON}/03_sequence_parallel.md) (SP in exercises 2-4),
    [04_vocab_parallel_cross_entropy.md]({LESSON}/04_vocab_parallel_cross_entropy.md) (exercise 5),
    [05_overlap.md]({LESSON}/05_overlap.md) (exercise 6).

    Conventions. Activations are `[s, b, h]` (sequence, batch, hidden), as in
    Megatron-LM: the sequence split is on dim 0, the TP split of features on
    the last dim. A full weight is `[out, in]` (as `nn.Linear`). Every API
    takes its process group as a keyword argument (`group=` for the mappings,
    `tp_group=` for the layers); a group of size 1 communicates nothing.
    Invalid arguments raise `ValueError` on every rank *before* any
    communication, naming the sizes. Use the collectives
    `dist.all_reduce`, `dist.all_gather_single(output, input, group=...)` and
    `dist.reduce_scatter_single(output, input, op=..., group=...)` (the older
    `all_gather_into_tensor` / `reduce_scatter_tensor` print a FutureWarning,
    and any stderr output zeroes a graded cell).

    How the tests work: each test starts N rank processes with
    `run_distributed`, runs your code on every rank on its shard, and compares
    what the ranks send back (outputs, every gradient) with a single-process
    `nn.Linear` / `F.cross_entropy` reference built from the same full
    weights. A `CommLedger` records every collective each rank issued (op,
    shape, dtype, phase: forward, backward or outside); the expected
    communication is part of the grade. A failure names the rank, the tensor,
    the element, expected and got. Stubs read
    `# TODO: implement (see the task description above).`
    """)
    nb.given("setup", """
    import math

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace
    from autograder.checks.tensor_parallel import (
        check_mapping, check_column_parallel_linear, check_row_parallel_linear, check_argument_errors,
        check_tp_pair_communication, check_parallel_mlp, check_sequence_parallel_grads,
        check_vocab_parallel_cross_entropy, check_async_allreduce_gradients, check_async_allreduce_overlap,
        plot_pair_communication,
    )
    """)

    # -- given helpers and the worked example --------------------------------------
    nb.markdown("""
    ## Given: argument checks and the dim-0 primitives

    Read these; you will call them. `_group_size_rank` and `_check_divisible`
    implement the error contract. `_reduce` all-reduces into a new tensor (so
    the caller's tensor is never modified). `_split_along_first_dim` and
    `_gather_along_first_dim` are Megatron-LM's primitives for the sequence
    dimension (`mappings.py`): note `.contiguous()` before a collective (a
    collective needs contiguous memory; your inputs may be views) and the
    early return for a group of one.
    """)
    nb.given("helpers", source_of(tp, "_group_size_rank", "_check_divisible", "_check_min_dims", "_reduce",
                                  "_split_along_first_dim", "_gather_along_first_dim"))
    nb.markdown("""
    ## Worked example: `scatter_to_sequence_parallel_region`

    Megatron-LM's `_ScatterToSequenceParallelRegion`: the input `[s, b, h]` is
    replicated on every rank; each rank keeps its sequence chunk `[s/t, b, h]`.
    Its backward is the conjugate: every rank holds the gradient of its own
    chunk only, so the chunks are all-gathered back into the gradient of the
    whole input. The pattern of every exercise: an autograd `Function` whose
    `forward` and `backward` are conjugate collectives, saving the group on
    `ctx`, and a lowercase wrapper that validates its arguments before
    `.apply`. The check below runs it on 2 ranks; the next cell shows what
    the ledger sees.
    """)
    nb.given("worked_example", source_of(tp, "_ScatterToSequenceParallelRegion",
                                         "scatter_to_sequence_parallel_region"))
    nb.given("worked_example_check", """
    check_mapping(scatter_to_sequence_parallel_region, "scatter_to_sequence_parallel_region", world_size=2)
    print("scatter_to_sequence_parallel_region: passed")
    """)
    nb.code("""
    # Scratch: run your own code on 2 ranks and look at the ledger (edit freely).
    def show_scatter(rank, world_size):
        x = torch.arange(4 * 1 * 2, dtype=torch.float64).reshape(4, 1, 2).requires_grad_()
        with CommLedger() as ledger:
            y = scatter_to_sequence_parallel_region(x, group=dist.group.WORLD)
            y.backward(torch.full_like(y, rank + 1.0))
        return y.detach(), x.grad, ledger.records

    for rank, (y, grad, records) in enumerate(run_distributed(show_scatter, 2)):
        print(f"rank {rank}: output {y.flatten().tolist()}, input grad {grad.flatten().tolist()}")
        print(format_trace(records, rank))
    """)

    # -- exercise 1 ----------------------------------------------------------------
    nb.exercise(1, "the tensor-parallel mappings (last dim)", """
    Implement, as Megatron-LM's `mappings.py` does (its symbol in each docstring):

    | function | forward | backward |
    |---|---|---|
    | `copy_to_tensor_model_parallel_region` (`f`) | identity | all-reduce |
    | `reduce_from_tensor_model_parallel_region` (`g`) | all-reduce | identity |
    | `scatter_to_tensor_model_parallel_region` | keep my chunk of the last dim | all-gather the last dim |
    | `gather_from_tensor_model_parallel_region` | all-gather the last dim | keep my chunk of the last dim |

    First the two primitives. `_split_along_last_dim`: rank r keeps
    `[..., r*h/t:(r+1)*h/t]`. `_gather_along_last_dim`: concatenate the ranks'
    `[s, b, h/t]` along the last dim **in rank order**. `all_gather_single`
    stacks the inputs along dim 0 (`[t*s, b, h/t]`): reorder them, do not just
    reshape. Then each autograd `Function` and its wrapper: the wrapper checks
    the group with `_group_size_rank` (and, where a dim is split, divisibility
    with `_check_divisible`) before `.apply(input_, group)`. Never modify the
    input in place (`_reduce` already returns a new tensor). Inputs may be
    non-contiguous views. Why `f` and `g` are conjugate, and where each sits
    in a transformer layer: [01_mappings.md](../../assignments/02_tensor_parallel/01_mappings.md).
    """)
    _solution(nb, "tp_mappings", tp, "_split_along_last_dim", "_gather_along_last_dim",
                     "_CopyToModelParallelRegion", "copy_to_tensor_model_parallel_region",
                     "_ReduceFromModelParallelRegion", "reduce_from_tensor_model_parallel_region",
                     "_ScatterToModelParallelRegion", "scatter_to_tensor_model_parallel_region",
                     "_GatherFromModelParallelRegion", "gather_from_tensor_model_parallel_region")
    _mapping_tests(nb, "test_copy_to_region", 6, "copy_to_tensor_model_parallel_region",
                   "f: identity forward, one all-reduce of the gradient in backward.", True)
    _mapping_tests(nb, "test_reduce_from_region", 6, "reduce_from_tensor_model_parallel_region",
                   "g: one all-reduce in forward, identity backward.", True)
    _mapping_tests(nb, "test_scatter_to_region", 5, "scatter_to_tensor_model_parallel_region",
                   "Split the last dim in forward, all-gather it (rank order) in backward.", True)
    _mapping_tests(nb, "test_gather_from_region", 6, "gather_from_tensor_model_parallel_region",
                   "All-gather the last dim in rank order in forward, split it in backward.", True)

    # -- exercise 2 ----------------------------------------------------------------
    nb.exercise(2, "the sequence-parallel mappings (dim 0)", """
    | function | forward | backward |
    |---|---|---|
    | `gather_from_sequence_parallel_region` | all-gather dim 0: `[s/t, b, h] -> [s, b, h]` | reduce-scatter dim 0 |
    | `reduce_scatter_to_sequence_parallel_region` | reduce-scatter dim 0: `[s, b, h] -> [s/t, b, h]` | all-gather dim 0 |

    First `_reduce_scatter_along_first_dim` with `dist.reduce_scatter_single`
    (sum, then each rank keeps its chunk of dim 0), then the two Functions and
    their wrappers. The reduce-scatter wrapper checks that dim 0 is divisible
    by the group size. Grading counts the collectives: one reduce-scatter of
    `[s, b, h]` is what the ledger must see, not an all-reduce followed by a
    split (same numbers, twice the traffic). Why the backward of the
    all-gather is a reduce-scatter (and not a split):
    [03_sequence_parallel.md](../../assignments/02_tensor_parallel/03_sequence_parallel.md).
    """)
    _solution(nb, "sp_mappings", tp, "_reduce_scatter_along_first_dim",
                     "_GatherFromSequenceParallelRegion", "gather_from_sequence_parallel_region",
                     "_ReduceScatterToSequenceParallelRegion", "reduce_scatter_to_sequence_parallel_region")
    _mapping_tests(nb, "test_gather_from_sequence_parallel_region", 6, "gather_from_sequence_parallel_region",
                   "All-gather dim 0 in forward, one reduce-scatter of [s, b, h] in backward.", False)
    _mapping_tests(nb, "test_reduce_scatter_to_sequence_parallel_region", 6,
                   "reduce_scatter_to_sequence_parallel_region",
                   "One reduce-scatter of [s, b, h] in forward, all-gather dim 0 in backward.", False)

    # -- exercise 3 ----------------------------------------------------------------
    nb.exercise(3, "`ColumnParallelLinear` and `RowParallelLinear`", """
    Both take the full `master_weight` `[out, in]` (and `master_bias` `[out]`)
    that every rank slices its shard from, as Megatron's CPU initialisation
    does; the given `_master_parameters` validates their shapes (and makes
    them when they are `None`). Shards live in `.weight` and `.bias`
    (`nn.Parameter`s); `forward` returns a tensor.

    - **Column** (Megatron `layers.ColumnParallelLinear`): rank r holds rows
      `[r*out/t, (r+1)*out/t)` of the weight and the same slice of the bias.
      Input `[s, b, in]` through `f` (copy-to), or with `sequence_parallel`
      the shard `[s/t, b, in]` all-gathered along dim 0; output
      `[s, b, out/t]`, or all-gathered to `[s, b, out]` with `gather_output`.
    - **Row** (Megatron `layers.RowParallelLinear`): rank r holds columns
      `[r*in/t, (r+1)*in/t)` of the weight and the **whole** bias. Input
      `[s, b, in/t]` (`input_is_parallel=True`) or `[s, b, in]` scattered on
      the last dim; the partial products are summed by `g` (all-reduce), or
      reduce-scattered to `[s/t, b, out]` with `sequence_parallel`; the bias
      is added once, **after** the reduction. With `sequence_parallel`, mark
      it `self.bias.sequence_parallel = True` (exercise 4 needs it).
    - `ValueError` (before any communication): `out_features` (column) or
      `in_features` (row) not divisible by the group size;
      `gather_output=True` with `sequence_parallel=True`; a row layer with
      `sequence_parallel=True` and `input_is_parallel=False`; a `tp_group`
      that is not a `ProcessGroup`; a master weight of the wrong shape; with
      sequence parallelism, a sequence (dim 0) not divisible by the group size.

    A column -> row pair without SP communicates exactly one all-reduce in
    forward and one in backward; with SP one all-gather and one
    reduce-scatter of `[s, b, h]` in forward, and in backward one
    reduce-scatter plus one all-gather (two if you re-gather the input for the
    weight gradient, as Megatron does). Details:
    [02_column_row_mlp.md](../../assignments/02_tensor_parallel/02_column_row_mlp.md).
    """)
    nb.given("layer_helpers", source_of(layers, "_master_parameters", "_check_last_dim"))
    _solution(nb, "column_row", layers, "ColumnParallelLinear", "RowParallelLinear")
    nb.test("test_column_parallel_linear", 9,
            doc="ColumnParallelLinear equals nn.Linear (output, input/weight/bias grads) for every valid flag combination.",
            visible="""
    check_column_parallel_linear(ColumnParallelLinear, world_size=2, in_features=6, out_features=4, seq=4, batch=3)
    """, hidden="""
    check_column_parallel_linear(ColumnParallelLinear, world_size=4, in_features=5, out_features=8, seq=4, batch=3, seed=1)
    check_column_parallel_linear(ColumnParallelLinear, world_size=1, in_features=3, out_features=5, seq=3, batch=2, seed=2)
    check_column_parallel_linear(ColumnParallelLinear, world_size=2, in_features=7, out_features=6, seq=6, batch=1,
                                 dtype=torch.float32, seed=3)
    """)
    nb.test("test_row_parallel_linear", 9,
            doc="RowParallelLinear equals nn.Linear (output, input/weight/bias grads) for every valid flag combination.",
            visible="""
    check_row_parallel_linear(RowParallelLinear, world_size=2, in_features=6, out_features=4, seq=4, batch=3)
    """, hidden="""
    check_row_parallel_linear(RowParallelLinear, world_size=4, in_features=8, out_features=5, seq=4, batch=3, seed=1)
    check_row_parallel_linear(RowParallelLinear, world_size=1, in_features=5, out_features=3, seq=3, batch=2, seed=2)
    check_row_parallel_linear(RowParallelLinear, world_size=2, in_features=6, out_features=7, seq=2, batch=5,
                              dtype=torch.float32, seed=3)
    """)
    nb.test("test_argument_errors", 5,
            doc="Invalid arguments raise ValueError on every rank before any communication, naming the sizes.",
            visible="""
    impls = {name: globals()[name] for name in (
        "ColumnParallelLinear", "RowParallelLinear", "copy_to_tensor_model_parallel_region",
        "reduce_from_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region",
        "gather_from_tensor_model_parallel_region", "gather_from_sequence_parallel_region",
        "reduce_scatter_to_sequence_parallel_region")}
    check_argument_errors(impls, world_size=2)
    """)
    nb.test("test_tp_pair_communication", 6,
            doc="Column -> Row without SP: one all-reduce of [s, b, h] in forward, one in backward, nothing else.",
            visible="""
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=2, sequence_parallel=False)
    """, hidden="""
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=4, sequence_parallel=False,
                                hidden=5, ffn=12, seq=3, batch=2, seed=1)
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=1, sequence_parallel=False,
                                hidden=5, ffn=7, seq=3, batch=2, seed=2)
    """)
    nb.test("test_sp_pair_communication", 7,
            doc="Column -> Row with SP: all-gather + reduce-scatter of [s, b, h] in forward, reduce-scatter + 1 or 2 all-gathers in backward.",
            visible="""
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=2, sequence_parallel=True)
    """, hidden="""
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=4, sequence_parallel=True,
                                hidden=5, ffn=12, seq=8, batch=3, seed=1)
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=1, sequence_parallel=True,
                                hidden=5, ffn=7, seq=3, batch=2, seed=2)
    check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=2, sequence_parallel=True,
                                hidden=7, ffn=4, seq=2, batch=1, dtype=torch.float32, seed=3)
    """)
    nb.markdown("""
    ### Picture: what a column -> row pair sends, with and without SP

    Drawn from the ledgers of a real run of *your* layers (rank 0 of 2). Each
    box is one collective, with the size of its full tensor and what one rank
    sends in a ring. Same bytes in both rows: a ring all-reduce *is* a
    reduce-scatter followed by an all-gather. What SP buys is memory
    (README section 3). Run it once exercise 3 passes.
    """)
    nb.code("""
    plot_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=2)
    """)

    # -- exercise 4 ----------------------------------------------------------------
    nb.exercise(4, "`ParallelMLP` and `allreduce_sequence_parallel_grads`", """
    `ParallelMLP`: `linear_fc1 = ColumnParallelLinear(h -> ffn, gather_output=False)`,
    exact GeLU (`F.gelu`, not the tanh approximation) on the shard,
    `linear_fc2 = RowParallelLinear(ffn -> h, input_is_parallel=True)`, both
    with the given `sequence_parallel` and master weights (a layer has a bias
    iff its master bias is not `None`). Keep the names `linear_fc1` and
    `linear_fc2` (Megatron-LM `transformer/mlp.py`). With SP its input and
    output are sequence shards `[s/t, b, h]`.

    With SP, parameters that are replicated across the group but see only the
    rank's sequence shard get **partial** gradients: the row bias, and a
    LayerNorm placed before the MLP (the check marks its parameters
    `.sequence_parallel = True`, as Megatron does).
    `allreduce_sequence_parallel_grads(module, *, tp_group)` sums, after
    backward, the gradients of every parameter of `module` marked
    `.sequence_parallel = True` (Megatron-LM
    `finalize_model_grads._allreduce_non_tensor_model_parallel_grads`; one
    coalesced all-reduce is enough). A marked parameter whose `.grad` is
    `None` (unused in this step, or frozen) is skipped, as Megatron's
    `if param.requires_grad and getattr(param, "sequence_parallel", False)`
    and its `grad is not None` filter do. Tensor-parallel shards must not be
    touched. The check calls it in the ledger's "outside" phase.
    """)
    _solution(nb, "parallel_mlp", layers, "ParallelMLP", "allreduce_sequence_parallel_grads")
    nb.test("test_parallel_mlp", 5,
            doc="LayerNorm -> ParallelMLP: output, input grad and TP-shard grads equal single-process, with and without SP.",
            visible="""
    check_parallel_mlp(ParallelMLP, world_size=2, sequence_parallel=False)
    check_parallel_mlp(ParallelMLP, world_size=2, sequence_parallel=True)
    """, hidden="""
    check_parallel_mlp(ParallelMLP, world_size=4, sequence_parallel=True, hidden=5, ffn=12, seq=8, batch=3, seed=1)
    # master biases None: no bias parameters at all (not zero biases)
    check_parallel_mlp(ParallelMLP, world_size=4, sequence_parallel=False, hidden=7, ffn=8, seq=3, batch=2, bias=False,
                       seed=2)
    check_parallel_mlp(ParallelMLP, world_size=1, sequence_parallel=True, hidden=5, ffn=3, seq=3, batch=2, seed=3)
    """)
    nb.test("test_sequence_parallel_grads", 5,
            doc="After allreduce_sequence_parallel_grads the LayerNorm and row-bias grads equal single-process.",
            visible="""
    check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, world_size=2, sequence_parallel=True)
    """, hidden="""
    # with a marked parameter that no forward uses: its grad is None, skip it
    check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, world_size=4, sequence_parallel=True,
                                  hidden=5, ffn=12, seq=8, batch=3, unused=True, seed=1)
    check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, world_size=2, sequence_parallel=False,
                                  hidden=5, ffn=6, seq=3, batch=2, seed=2)
    check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, world_size=1, sequence_parallel=True,
                                  seed=3)
    """)

    # -- exercise 5 ----------------------------------------------------------------
    nb.exercise(5, "`vocab_parallel_cross_entropy`", """
    The output layer is column-parallel over the vocabulary: rank r holds the
    logits `[s, b, v/t]` of tokens `[r*v/t, (r+1)*v/t)`. Compute the per-token
    loss `[s, b]` (float32, whatever the input dtype) without gathering the
    logits, as Megatron-LM `cross_entropy._VocabParallelCrossEntropy`:

    1. cast to float32; the local max over the vocab, all-reduced with `MAX`;
       subtract it (so `exp` cannot overflow: logits near `1e4` are tested);
    2. the target's logit: only the rank that owns the target id contributes
       it, the others contribute 0; all-reduce `SUM`;
    3. the sum of `exp`, all-reduced `SUM`; loss = `log(sum_exp) - target_logit`.

    Exactly three all-reduces of `[s, b]` in forward; none in backward, where
    the gradient of the local logits is `(softmax - one_hot(target)) * grad`,
    computed from what forward saved. Do not modify the input (Megatron
    subtracts in place; you may not). A group of one communicates nothing.
    Details: [04_vocab_parallel_cross_entropy.md](../../assignments/02_tensor_parallel/04_vocab_parallel_cross_entropy.md).
    """)
    _solution(nb, "cross_entropy", loss, "_VocabParallelCrossEntropy", "vocab_parallel_cross_entropy")
    nb.test("test_vocab_parallel_cross_entropy", 6,
            doc="Loss and logit gradients equal F.cross_entropy; three all-reduces of [s, b] forward, none backward.",
            visible="""
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=2, seq=4, batch=3, vocab=8)
    """, hidden="""
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=4, seq=5, batch=3, vocab=12, seed=1)
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=1, seq=3, batch=2, vocab=7, seed=2)
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=2, seq=3, batch=1, vocab=10,
                                       dtype=torch.float64, seed=3)
    """)
    nb.test("test_cross_entropy_extreme_logits", 4,
            doc="Logits near +-1e4 (targets in every partition): no overflow, loss and gradients still exact.",
            visible="""
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=2, extreme=True)
    """, hidden="""
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=4, seq=6, batch=2, vocab=16,
                                       extreme=True, seed=1)
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=1, seq=3, batch=3, vocab=5,
                                       extreme=True, seed=2)
    """)

    # -- exercise 6 ----------------------------------------------------------------
    nb.exercise(6, "overlap the input-gradient all-reduce with the weight gradient", """
    In the column layer without SP, the backward all-reduce of `f` sits on
    the critical path. Megatron-LM fuses the column layer's matmul and its
    communication into one autograd Function
    (`layers.LinearWithGradAccumulationAndAsyncCommunication`): in backward it
    computes the input gradient `grad_output @ W`, **launches** its
    all-reduce with `async_op=True`, computes the weight gradient
    `grad_output^T @ input` (and the bias gradient) while the all-reduce is in
    flight, and only then calls `wait()` on the returned work handle.

    Implement `LinearWithAsyncAllReduce.apply(input, weight, bias, tp_group)`:
    input `[s, b, in]` (replicated), weight shard `[out/t, in]`, bias shard
    `[out/t]` or `None`; output `[s, b, out/t]`; no communication in forward.
    Graded from the op trace (`CommLedger(trace_compute=True)`), because CPU
    timing proves nothing: in backward, the async all-reduce must come before
    the first op whose output has the weight's shape, and its `wait()` after
    that op, before backward returns. Details:
    [05_overlap.md](../../assignments/02_tensor_parallel/05_overlap.md).
    """)
    _solution(nb, "overlap", layers, "LinearWithAsyncAllReduce")
    nb.test("test_async_allreduce_gradients", 3,
            doc="LinearWithAsyncAllReduce: output and gradients equal the plain column layer's.",
            visible="""
    check_async_allreduce_gradients(LinearWithAsyncAllReduce, world_size=2)
    """, hidden="""
    check_async_allreduce_gradients(LinearWithAsyncAllReduce, world_size=4, in_features=5, out_features=8,
                                    seq=3, batch=3, seed=1)
    check_async_allreduce_gradients(LinearWithAsyncAllReduce, world_size=2, bias=False, seed=2)
    check_async_allreduce_gradients(LinearWithAsyncAllReduce, world_size=1, in_features=5, out_features=3,
                                    seq=2, batch=3, seed=3)
    """)
    nb.test("test_async_allreduce_overlap", 6,
            doc="Backward launches the all-reduce async before the weight-gradient op and waits after it.",
            visible="""
    check_async_allreduce_overlap(LinearWithAsyncAllReduce, world_size=2)
    """, hidden="""
    check_async_allreduce_overlap(LinearWithAsyncAllReduce, world_size=4, in_features=5, out_features=8,
                                  seq=3, batch=3, seed=1)
    check_async_allreduce_overlap(LinearWithAsyncAllReduce, world_size=2, bias=False, seed=2)
    check_async_allreduce_overlap(LinearWithAsyncAllReduce, world_size=1, in_features=5, out_features=3,
                                  seq=2, batch=3, seed=3)
    """)
    # -- your code as a job (not graded) -----------------------------------------------------
    nb.markdown("""
    ## Your code as a job: `torchrun` (not graded)

    Every test above ran in ranks this notebook forked (`run_distributed`). On
    a cluster a launcher starts one process per rank instead, and your code is
    the same. `tensor_parallel_job` (the cell below imports it) trains `LayerNorm -> ParallelMLP -> ColumnParallelLinear` over the vocabulary with your layers and your `vocab_parallel_cross_entropy` (with sequence parallelism: your `allreduce_sequence_parallel_grads`). Export your
    notebook's code (answer and given cells, definitions only) as a script and
    start it with torchrun:

    ```bash
    python -m autograder.runtime.launch export tensor_parallel_lab.ipynb --out train_02.py   # save the notebook first
    torchrun --standalone --nproc-per-node 2 train_02.py --tp 2 --sequence-parallel true
    python train_02.py --help                                               # the job's options
    ```

    It prints `step N loss X`: the same numbers as the cell below, bit for bit.
    How the runner maps onto torchrun's environment (`RANK`, `WORLD_SIZE`,
    `LOCAL_RANK`, `env://`), two nodes, Slurm, `--backend nccl` and sharded
    checkpoints: the last section of assignment 06's notebook, and
    [06_to_a_cluster.md](../../assignments/06_composition/06_to_a_cluster.md).
    """)
    nb.given("job", """
    from autograder.checks.tensor_parallel import tensor_parallel_job
    """)
    nb.code("""
    # Your TP + SP layers as a job, in this notebook (2 forked ranks, 4 steps); torchrun prints the same losses.
    result = tensor_parallel_job(globals(), tp=2, sequence_parallel=True, steps=4)
    """)
    nb.nccl_checks("""
    [
        ("f (copy_to)", check_mapping,
         (copy_to_tensor_model_parallel_region, "copy_to_tensor_model_parallel_region"), {"world_size": 2}),
        ("SP reduce-scatter", check_mapping,
         (reduce_scatter_to_sequence_parallel_region, "reduce_scatter_to_sequence_parallel_region"), {"world_size": 2}),
        ("column -> row with SP", check_tp_pair_communication, (ColumnParallelLinear, RowParallelLinear),
         {"world_size": 2, "sequence_parallel": True}),
        ("vocab-parallel cross-entropy", check_vocab_parallel_cross_entropy, (vocab_parallel_cross_entropy,),
         {"world_size": 2, "extreme": True}),
        ("async all-reduce overlap", check_async_allreduce_overlap, (LinearWithAsyncAllReduce,), {"world_size": 2}),
    ]
    """)
    return nb


if __name__ == "__main__":
    build().write(OUT)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
