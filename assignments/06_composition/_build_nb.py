"""Build source/06_composition/composition_lab.ipynb (nbgrader source notebook) from code.

    .venv/bin/python assignments/06_composition/_build_nb.py
    .venv/bin/nbgrader generate_assignment 06_composition --force

Answer cells are cut from solutions/composition/ (layout.py, train.py and
planner.py: one source of truth); test cells call the public checks
in autograder/checks/composition/, with hidden cases. The hidden rank-layout
cases compare with an independent construction of Megatron-LM's groups (a
reshape and permute of the rank grid, `_INDEPENDENT_LAYOUT` below), checked in
tests/test_composition_solutions.py against Megatron's own published examples.
"""

import os
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autograder.lessons import tinygpt  # noqa: E402
from autograder.authoring.nbbuild import NotebookBuilder, source_of  # noqa: E402
from solutions.composition import checkpoint as checkpoint_mod  # noqa: E402
from solutions.composition import layout as layout_mod  # noqa: E402
from solutions.composition import planner as planner_mod  # noqa: E402
from solutions.composition import train as train_mod  # noqa: E402

ASSIGNMENT = "06_composition"
LESSON = "../../assignments/06_composition"
OUT = os.path.join(ROOT, "source", ASSIGNMENT, "composition_lab.ipynb")

# Hidden-test helper: Megatron's groups built another way than the reference solution (which sums strides):
# the ranks as an n-d grid (outermost dimension first), the unselected axes moved to the front, reshaped.
# Indented as the checks it is joined with (`hidden=_INDEPENDENT_LAYOUT + """\n    check...`), so that they stay
# outside its functions (the builder refuses a test cell with statements that never run).
_INDEPENDENT_LAYOUT = """
def _grid_groups(world, sizes, tokens, selected):
    grid = torch.arange(world).reshape([sizes[t] for t in reversed(tokens)])  # outermost first
    axis = {t: len(tokens) - 1 - i for i, t in enumerate(tokens)}
    outer = [axis[t] for t in reversed(tokens) if t not in selected]
    inner = [axis[t] for t in reversed(tokens) if t in selected]
    return grid.permute(outer + inner).reshape(-1, math.prod(sizes[t] for t in selected)).tolist()

def _expected_layout(world, tp=1, cp=1, pp=1, ep=1, etp=None, dp=None, order="tp-cp-ep-dp-pp"):
    etp = etp or tp
    tokens = order.split("-") + [t for t in ("tp", "cp", "ep", "dp", "pp") if t not in order.split("-")]
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp or world // (tp * cp * pp), "pp": pp}
    expert = {"tp": etp, "cp": 1, "ep": ep, "dp": world // (etp * ep * pp), "pp": pp}
    d = lambda sel: _grid_groups(world, dense, tokens, set(sel.split("-")))
    e = lambda sel: _grid_groups(world, expert, tokens, set(sel.split("-")))
    return {"tp": d("tp"), "cp": d("cp"), "pp": d("pp"), "dp": d("dp"), "dp_cp": d("dp-cp"), "tp_pp": d("tp-pp"),
            "ep": e("ep"), "etp": e("tp"), "edp": e("dp"),
            "embedding": [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in d("pp")]}
"""
_INDEPENDENT_LAYOUT = textwrap.indent(_INDEPENDENT_LAYOUT, "    ")

# Megatron-LM's own example (megatron/core/parallel_state.py, initialize_model_parallel's docstring):
# 16 GPUs, TP 2, PP 4 (so DP 2), the default order tp-cp-ep-dp-pp.
_MEGATRON_EXAMPLE = """{
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "dp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "pp": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
        "embedding": [[0, 12], [1, 13], [2, 14], [3, 15]],
    }"""


def _layout_source(layout) -> str:
    """`Layout(tp=8, pp=16, dp=128, recompute="full")`: a layout as code, its non-default fields only."""
    from autograder.lessons.planner import Layout

    default = Layout()
    fields = [f"{k}={getattr(layout, k)!r}".replace("'", '"') for k in ("tp", "cp", "pp", "dp", "zero", "recompute",
                                                                       "micro_batch")
              if getattr(layout, k) != getattr(default, k) or k == "dp"]
    return f"Layout({', '.join(fields)})"


def _best(model: str, gpus: int, training: dict, **kwargs) -> str:
    """The reference planner's `best_layouts` as code: what test_best_layouts expects (computed at build time)."""
    from autograder.lessons import planner as lessons

    plans = planner_mod.best_layouts(getattr(lessons, model), lessons.Cluster(gpus), lessons.Training(**training),
                                     **kwargs)
    return "[\n" + "".join(f"            {_layout_source(p.layout)},\n" for p in plans) + "        ]"


def build() -> NotebookBuilder:
    nb = NotebookBuilder(ASSIGNMENT)
    nb.markdown(f"""
    # 06 · The capstone: one small GPT on a DP × CP × TP × PP mesh, and a layout planner

    Assignments 01-05 built each parallelism by hand. Production training stacks
    them (`world = DP × CP × TP × PP`, with EP reusing the DP × TP ranks of MoE
    layers), and most real bugs live in the glue between them: which ranks form
    which group, which rank sees which data, what is averaged where, which
    gradient is counted how often. This time you compose PyTorch's own parallel
    APIs (`init_device_mesh`, `parallelize_module` with `ColwiseParallel` /
    `RowwiseParallel` / `SequenceParallel`, FSDP2 `fully_shard`,
    `torch.distributed.pipelining`), as torchtitan does, and write the glue
    yourself. Then you estimate what a layout costs on a real cluster.

    1. `rank_layout`: every group of every dimension, exactly as Megatron-LM's `RankGenerator`;
    2. `build_process_groups` and `build_device_mesh`: the groups, and the same layout as a `DeviceMesh`;
    3. `local_batch`: which rank sees which data (DP rows, CP zigzag chunks, TP and PP the same);
    4. `apply_tensor_parallel`: the TP + SP plan of the small GPT (and the tie it breaks);
    5. `apply_fsdp`: FSDP2 over the DP dimension, on top of TP; DP 2 × TP 2 trained;
    6. `pipeline_loss_fn`, `reduce_loss_for_logging`: the loss averaged exactly once;
    7. `allreduce_tied_embedding_grads`: the tied embedding kept in sync across pipeline stages;
    8. `clip_grad_norm_`: the norm of the whole model from shards on a PP × DP × TP mesh;
    9. the pipeline: `split_model_for_pipeline`, `build_schedule`, `pipeline_train_step`; PP 2 × DP 2 × TP 2 trained;
    10-12. the planner: `memory_per_gpu`, `step_time`, `plan`, `best_layouts`;
    13. `checkpoint_state`: a checkpoint that resumes on another layout (the last section: your code as a job).

    Read first: this lesson's [README.md]({LESSON}/README.md), and [the course overview](../../assignments/README.md)
    (the five dimensions side by side, and how they compose). Deep dives:
    [01_rank_layout.md]({LESSON}/01_rank_layout.md) (exercises 1-3),
    [02_tp_and_fsdp.md]({LESSON}/02_tp_and_fsdp.md) (exercises 4-5),
    [03_glue.md]({LESSON}/03_glue.md) (exercises 6-8),
    [04_pipeline.md]({LESSON}/04_pipeline.md) (exercise 9),
    [05_planner.md]({LESSON}/05_planner.md) (exercises 10-12).

    Conventions. Activations are `[b, s, h]` here (PyTorch's and torchtitan's
    layout: the sequence is dim 1, `Shard(1)` under sequence parallelism;
    Megatron and assignment 02 use `[s, b, h]`). Everything trains in float64
    and is compared with single-process training of the same model from the
    same weights at a tolerance of 1e-10. Groups and meshes are keyword
    arguments. Invalid sizes raise `ValueError` naming them.

    How the tests work: as in 01-05, each test forks N CPU ranks (gloo) with
    `run_distributed`, runs your functions there, and judges in this process
    what they send back. An 8-rank test takes a few seconds. Ranks that build
    groups in different orders hang in `new_group`: the runner stops them and
    says so, with the line each rank waits on. Stubs read
    `# TODO: implement (see the task description above).`
    """)
    nb.given("setup", """
    import math

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module,
    )

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace
    from autograder.lessons.hardware import H100_NODE, ring_collective_seconds, transfer_seconds
    from autograder.lessons.tinygpt import ModelArgs, TinyGPT, master_state
    from autograder.lessons.volume import (
        pp_boundary_bytes, ring_attention_bytes_per_layer, tp_layer_bytes, zero_step_bytes,
    )
    from autograder.lessons.planner import (
        GB, GPT3_175B, LLAMA3_405B, LLAMA3_70B, LLAMA3_8B, Cluster, Layout, ModelConfig, Plan, Training,
        crosses_nodes, layers_on_stage, plot_plans,
    )
    from autograder.checks.composition import (
        PIPELINE_FUNCTIONS, check_best_layouts, check_clip_grad_norm, check_device_mesh, check_dp_tp_training,
        check_local_batch, check_loss_averaging, check_memory_per_gpu, check_pipeline_training, check_plan,
        check_process_groups, check_rank_layout, check_rank_layout_errors, check_step_time,
        check_tensor_parallel_plan, check_tied_embedding_grads, plot_rank_layout, check_checkpoint_state,
    )
    """)

    # -- the model -----------------------------------------------------------------
    # the prose dedented on its own: the source below starts at column 0, so a dedent of the whole cell would
    # remove nothing and leave the prose indented (a code block)
    nb.markdown(textwrap.dedent("""
    ## The model: `TinyGPT` (given, in `autograder/lessons/tinygpt.py`)

    A Llama-shaped decoder small enough for 8 CPU ranks: embedding, two blocks
    (RMSNorm, causal attention with separate `wq`, `wk`, `wv`, `wo`, RMSNorm,
    SwiGLU MLP `w1`, `w2`, `w3`), a final norm and an output head **tied** to
    the embedding. The names are torchtitan's, so a torchtitan-style plan
    applies. A pipeline stage is the same class with parts set to `None`. Its
    code, which the checks use as is:

    ```python
    """) + source_of(tinygpt, "ModelArgs", "Attention", "FeedForward", "TransformerBlock", "TinyGPT") + "\n```")
    nb.code("""
    # Scratch: the model, its parameters, one forward (edit freely).
    model = TinyGPT(ModelArgs()).double()
    model.load_state_dict(master_state(ModelArgs(), seed=0))
    for name, p in model.named_parameters():
        print(f"{name:38s} {list(p.shape)}")
    print("tied:", model.output.weight is model.tok_embeddings.weight)
    print("logits:", list(model(torch.randint(0, 16, (2, 8))).shape))
    """)

    # -- exercise 1 ----------------------------------------------------------------
    nb.markdown("""
    ## Given: Megatron's order string

    An order such as `"tp-cp-ep-dp-pp"` lists the dimensions **innermost
    first**: TP's ranks are adjacent (stride 1), CP's stride is `tp`, and so on.
    `_parse_order` checks it as Megatron's `RankGenerator.__init__` does and
    appends the dimensions it leaves out (allowed only for a size of 1).
    """)
    nb.given("order_helper", source_of(layout_mod, "DIMENSIONS", "_parse_order"))
    nb.exercise(1, "`rank_layout`: every group, as Megatron-LM builds it", """
    `rank_layout(world_size, *, tp=1, cp=1, pp=1, dp=None, ep=1, etp=None, order="tp-cp-ep-dp-pp")`
    returns a dict of rank lists, **identical** (order of groups, order of ranks
    in a group) to what Megatron-LM's `RankGenerator.get_ranks` returns
    (`megatron/core/parallel_state.py`):

    - with the attention generator (sizes tp, cp, dp, pp; ep = 1):
      `"tp"`, `"cp"`, `"pp"`, `"dp"`, `"dp_cp"` (token `dp-cp`), `"tp_pp"` (Megatron's model-parallel group, token `tp-pp`);
    - with the expert generator on the **same ranks** (sizes etp, ep, edp, pp; cp = 1;
      `edp = world / (etp * ep * pp)`; `etp` defaults to `tp`): `"ep"`, `"etp"` (token `tp`), `"edp"` (token `dp`);
    - `"embedding"`: for every pipeline group, its first and last rank (one rank if pp = 1),
      Megatron's `default_embedding_ranks`.

    The rule (Megatron's `generate_masked_orthogonal_rank_groups`): with the
    sizes in order, innermost first, a rank is `sum(coordinate[d] * stride[d])`
    with strides the prefix products (innermost stride 1). The groups of a
    selection (say `dp-cp`) vary the selected coordinates and fix the others:
    groups are listed with the first **unselected** dimension varying fastest,
    and inside a group the first **selected** dimension varies fastest.
    `_orthogonal_groups(world_size, tokens, sizes, selected)` is the suggested
    helper. `dp` defaults to `world / (tp * cp * pp)`.

    `ValueError` naming the sizes: a size that is not a positive int; tp·cp·pp
    not dividing the world (or tp·cp·pp·dp not equal to it); etp·ep·pp not
    dividing it; a bad order (`_parse_order`); with pp > 1, an order not ending
    in `pp` while dp ≠ edp (Megatron's assert "When not using pp-last rank
    ordering, the data parallel size of the attention and moe layers must be
    the same"); pipeline groups that differ between the two generators.
    Lesson: [01_rank_layout.md](../../assignments/06_composition/01_rank_layout.md).
    """)
    nb.solution_from("rank_layout", layout_mod, "_orthogonal_groups", "rank_layout")
    nb.test("test_rank_layout", 7, doc="tp, cp, pp, dp, dp_cp, tp_pp and embedding groups equal Megatron's RankGenerator.",
            visible=f"""
    # Megatron's own example (initialize_model_parallel's docstring): 16 GPUs, TP 2, PP 4, order tp-cp-ep-dp-pp
    check_rank_layout(rank_layout, 16, tp=2, pp=4, expected={_MEGATRON_EXAMPLE})
    # the course's order, TP innermost, DP outermost: 8 GPUs, TP 2, PP 2, DP 2
    check_rank_layout(rank_layout, 8, tp=2, pp=2, order="tp-cp-pp-dp", expected={{
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "tp_pp": [[0, 1, 2, 3], [4, 5, 6, 7]],
    }})
    # CP without PP: dp = 8 / (tp * cp) = 2; a one-stage pipeline's embedding group is its one rank
    check_rank_layout(rank_layout, 8, tp=2, cp=2, expected={{
        "cp": [[0, 2], [1, 3], [4, 6], [5, 7]], "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "dp_cp": [[0, 2, 4, 6], [1, 3, 5, 7]], "embedding": [[0], [1], [2], [3], [4], [5], [6], [7]],
    }})
    # the course's order with CP and PP (a dense model: no expert group to agree with)
    check_rank_layout(rank_layout, 8, cp=2, pp=2, order="tp-cp-pp-dp", expected={{
        "cp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "embedding": [[0, 2], [1, 3], [4, 6], [5, 7]],
    }})
    """, hidden=_INDEPENDENT_LAYOUT + """
    for world, sizes in [(16, dict(tp=2, cp=2, pp=2)), (24, dict(tp=2, cp=3, pp=2)), (32, dict(tp=4, cp=2, pp=2)),
                         (16, dict(tp=2, cp=2, pp=2, order="tp-cp-pp-dp")), (24, dict(tp=3, pp=4, order="tp-pp-dp")),
                         (12, dict(cp=2, pp=3, order="tp-cp-dp-pp")), (8, dict()), (6, dict(pp=6)),
                         (32, dict(tp=2, cp=4, pp=2, order="tp-dp-cp-pp")),
                         # CP > 1 without PP: dp = world / (tp * cp), one-rank embedding groups
                         (8, dict(tp=2, cp=2)), (12, dict(cp=3, order="tp-cp-dp-pp")),
                         (16, dict(tp=2, cp=4, order="tp-cp-pp-dp")), (8, dict(cp=2, dp=4))]:
        want = _expected_layout(world, **sizes)
        check_rank_layout(rank_layout, world, expected={k: want[k] for k in ("tp", "cp", "pp", "dp", "dp_cp", "tp_pp",
                                                                              "embedding")}, **sizes)
    """)
    nb.test("test_rank_layout_expert", 5, doc="ep, etp and edp groups from Megatron's expert generator on the same ranks.",
            visible="""
    # 8 GPUs, attention TP 2 x DP 4; experts EP 4 with expert-TP 1 (so expert-DP 2): EP reuses the DP x TP ranks
    check_rank_layout(rank_layout, 8, tp=2, ep=4, etp=1, expected={
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "ep": [[0, 1, 2, 3], [4, 5, 6, 7]], "etp": [[0], [1], [2], [3], [4], [5], [6], [7]],
        "edp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    })
    """, hidden=_INDEPENDENT_LAYOUT + """
    for world, sizes in [(16, dict(tp=2, pp=2, ep=4, etp=1)), (16, dict(tp=4, ep=2)), (32, dict(tp=2, cp=2, pp=2, ep=4)),
                         (16, dict(tp=2, pp=2, ep=2, etp=2)), (24, dict(tp=2, pp=3, ep=2, etp=1)),
                         (16, dict(tp=2, cp=2, pp=2, ep=4, etp=1, order="tp-cp-ep-pp-dp")),
                         (8, dict(tp=2, cp=2, ep=2, etp=1)), (8, dict(tp=2, cp=2, ep=4, etp=1, order="tp-cp-ep-dp-pp"))]:
        want = _expected_layout(world, **sizes)
        check_rank_layout(rank_layout, world, expected={k: want[k] for k in ("ep", "etp", "edp", "pp")}, **sizes)
    """)
    nb.test("test_rank_layout_errors", 4, doc="Impossible sizes and orders raise ValueError naming them.",
            visible="""
    check_rank_layout_errors(rank_layout, [
        ((8,), dict(tp=3), ("8", "3")),                                   # 3 does not divide 8
        ((8,), dict(tp=2, dp=3), ("3",)),                                 # 2 * 3 != 8
        ((8,), dict(tp=2, cp=2, order="tp-dp-pp"), ("cp",)),              # the order leaves out cp (size 2)
        ((16,), dict(tp=2, pp=2, ep=4, etp=1, order="tp-cp-ep-pp-dp"), ("pp",)),  # not pp-last, dp 4 != edp 2
        ((8,), dict(pp=2, ep=4, etp=1, order="tp-pp-cp-ep-dp"), ("pp",)),  # same pipeline groups, dp 4 != edp 1
    ])
    """, hidden="""
    check_rank_layout_errors(rank_layout, cases=[
        ((12,), dict(pp=5), ("12", "5")), ((8,), dict(tp=2, ep=3), ("3",)), ((8,), dict(tp=2, order="tp-xp-dp"), ("xp",)),
        ((8,), dict(tp=2, order="tp-tp-dp"), ("tp",)), ((0,), dict(), ("0",)), ((8,), dict(tp=0), ("0",)),
        ((8,), dict(tp=2, etp=3), ("3",)), ((8,), dict(tp=2, pp=2, ep=2, order="tp-ep-pp-dp"), ()),
        ((8,), dict(pp=2, ep=2, etp=1, order="pp-cp-ep-dp-tp"), ("pp",)),  # same pipeline groups, dp 4 != edp 2
    ])
    """)
    nb.markdown("""
    ### Picture: a layout on nodes of 8 GPUs

    Each row is a dimension, each cell a rank, coloured by its group. With TP
    innermost, every TP group sits inside a node (NVLink); DP, outermost,
    crosses nodes (InfiniBand). Try other orders: `order="dp-tp-pp"`. Run it
    once exercise 1 passes.
    """)
    nb.code("""
    plot_rank_layout(rank_layout(32, tp=4, cp=2, pp=2, order="tp-cp-pp-dp"), gpus_per_node=8,
                     title="32 GPUs, order tp-cp-pp-dp: TP 4, CP 2, PP 2, DP 2")
    """)

    # -- exercise 2 ----------------------------------------------------------------
    nb.exercise(2, "the groups, and the same layout as a `DeviceMesh`", """
    `build_process_groups(layout)`: every rank creates **every** group of every
    name of `layout` with `dist.new_group(ranks)`, in the same order on every
    rank (`new_group` is a collective of the whole world, even for ranks not in
    the group: Megatron's `initialize_model_parallel` loops over all
    `get_ranks(...)` on every rank), and returns `{name: the group containing
    this rank}` (a name whose groups leave this rank out, like `"embedding"` on
    a middle pipeline stage, is left out). Ranks that create groups in
    different orders hang; try it on purpose in the scratch cell below and read
    what the runner says.

    `build_device_mesh(*, tp=1, cp=1, pp=1, dp=1, order="tp-cp-pp-dp")`: the
    same layout as `init_device_mesh("cpu", shape, mesh_dim_names=names)`. A
    `DeviceMesh` lays ranks out row-major, so its **last** dimension is the
    innermost: the names are the order's tokens reversed (`("dp", "pp", "cp",
    "tp")` for the course's order), every size a dimension (1 included).
    `ValueError` for an order that is not a permutation of tp, cp, pp, dp or
    sizes whose product is not the world size.
    Lesson: [01_rank_layout.md](../../assignments/06_composition/01_rank_layout.md) §4.
    """)
    nb.solution_from("process_groups", layout_mod, "build_process_groups", "build_device_mesh")
    nb.test("test_process_groups", 5, doc="Every rank gets its group of every dimension, and an all-reduce over it sums its members.",
            visible="""
    # rank_layout(8, tp=2, pp=2) (Megatron's default order): DP 2, PP 2
    check_process_groups(build_process_groups, {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]], "embedding": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }, world_size=8)
    """, hidden=_INDEPENDENT_LAYOUT + """
    check_process_groups(build_process_groups, _expected_layout(8, tp=2, cp=2, pp=2, ep=2, etp=1), world_size=8)
    check_process_groups(build_process_groups, {"pp": [[0, 1, 2]], "embedding": [[0, 2]]}, world_size=3)
    want = _expected_layout(4, cp=2)  # CP without PP: one-rank embedding groups
    check_process_groups(build_process_groups, {k: want[k] for k in ("cp", "dp", "dp_cp", "embedding")}, world_size=4)
    """)
    nb.test("test_device_mesh", 4, doc="The mesh's dimensions are the order reversed and each one is rank_layout's group.",
            visible="""
    check_device_mesh(build_device_mesh, world_size=8, order="tp-cp-pp-dp", tp=2, pp=2, dp=2, expected={
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "cp": [[0], [1], [2], [3], [4], [5], [6], [7]],
    })
    """, hidden=_INDEPENDENT_LAYOUT + """
    want = _expected_layout(8, tp=2, cp=2, pp=2, order="tp-cp-dp-pp")
    check_device_mesh(build_device_mesh, world_size=8, order="tp-cp-dp-pp", tp=2, cp=2, pp=2, dp=1,
                      expected={k: want[k] for k in ("tp", "cp", "pp", "dp")})
    want = _expected_layout(8, tp=2, cp=2, order="tp-cp-pp-dp")  # CP without PP
    check_device_mesh(build_device_mesh, world_size=8, order="tp-cp-pp-dp", tp=2, cp=2, dp=2,
                      expected={k: want[k] for k in ("tp", "cp", "pp", "dp")})
    """)
    nb.code("""
    # Scratch: groups created in a rank-dependent order hang in new_group. Set SHOW_THE_HANG = True and run
    # this cell to read what the runner reports (it stops the ranks after `timeout` seconds).
    SHOW_THE_HANG = False

    def build_in_my_order(rank, world_size):
        layout = {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]}
        names = ["tp", "dp"] if rank % 2 == 0 else ["dp", "tp"]   # the bug
        for name in names:
            for ranks in layout[name]:
                dist.new_group(ranks)

    if SHOW_THE_HANG:
        try:
            run_distributed(build_in_my_order, 4, timeout=10)
        except Exception as exc:
            print(exc)
    """)

    # -- exercise 3 ----------------------------------------------------------------
    nb.exercise(3, "`local_batch`: which rank sees which data", """
    `local_batch(tokens, labels, *, mesh)` takes the global batch `[B, S]` and a
    mesh whose dimensions are among `dp`, `cp`, `tp`, `pp` (read your
    coordinates with `mesh[name].get_local_rank()` and sizes with
    `mesh[name].size()`; a missing dimension has size 1). It returns
    `{"tokens": [B/D, S/C], "labels": [B/D, S/C], "positions": [S/C]}`:

    - **DP** rank d of D: rows `[d*B/D, (d+1)*B/D)`. DP ranks see different sequences.
    - **CP** rank c of C: the sequence cut into `2C` equal chunks, chunks `c` and
      `2C-1-c` concatenated (Megatron's `get_batch_on_this_cp_rank`: the causal
      work is then equal on every CP rank, assignment 04's zigzag); `positions`
      are the global positions of the kept tokens (`arange(S)` when C = 1).
    - **TP** and **PP**: every rank of a TP group, and every pipeline stage, gets
      the same data (Megatron broadcasts it: `get_batch_on_this_tp_rank`).

    `ValueError` (naming the sizes) if B is not divisible by D or, with C > 1,
    S is not divisible by 2C. A classic bug: slicing by the global rank instead
    of the DP coordinate; then the ranks of a TP group compute on different data.
    Lesson: [01_rank_layout.md](../../assignments/06_composition/01_rank_layout.md) §5.
    """)
    nb.given("mesh_coordinate", source_of(layout_mod, "_mesh_coordinate"))
    nb.solution_from("local_batch", layout_mod, "local_batch")
    nb.test("test_local_batch", 6, doc="DP ranks see different rows, CP ranks zigzag chunks, TP ranks and stages the same data.",
            visible="""
    check_local_batch(local_batch, mesh_shape=(2, 2, 2), mesh_dim_names=("dp", "cp", "tp"), batch=4, seq=8)
    """, hidden="""
    check_local_batch(local_batch, mesh_shape=(2, 2, 2), mesh_dim_names=("pp", "dp", "tp"), batch=6, seq=4, seed=1)
    check_local_batch(local_batch, mesh_shape=(4, 2), mesh_dim_names=("dp", "cp"), batch=8, seq=12, seed=2)
    """)

    # -- exercise 4 ----------------------------------------------------------------
    nb.exercise(4, "`apply_tensor_parallel`: the TP + SP plan", """
    `apply_tensor_parallel(model, tp_mesh)` shards a `TinyGPT` (or a pipeline
    stage of it: skip the parts that are `None`) with `parallelize_module`,
    Megatron's layout in PyTorch's styles (torchtitan's `apply_tp`), and returns it:

    | module | style | weight placement |
    |---|---|---|
    | `attention.wq`, `wk`, `wv`; `feed_forward.w1`, `w3` | `ColwiseParallel()` | `Shard(0)` of `[out, in]` |
    | `attention.wo`, `feed_forward.w2` | `RowwiseParallel(output_layouts=Shard(1))`: reduce-scatter along the sequence | `Shard(1)` |
    | `attention_norm`, `ffn_norm`, `norm` | `SequenceParallel()` | `Replicate()` |
    | `attention`, `feed_forward` | `PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))`: all-gather the sequence | - |
    | `tok_embeddings` | `RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))`: vocabulary-parallel | `Shard(0)` |
    | `output` | `ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)` | `Shard(0)` |

    The logits stay a `Shard(-1)` DTensor so that `F.cross_entropy` inside
    `loss_parallel()` never gathers the vocabulary (02's
    `vocab_parallel_cross_entropy`). **The trap:** `parallelize_module` replaces
    every parameter by a new DTensor `Parameter`, so after it the head and the
    embedding are two parameters with equal values: tie them again
    (`model.output.weight = model.tok_embeddings.weight`), both are `Shard(0)`
    on the same mesh. Checked: placements, the tie, the logits, the loss, every
    gradient, and no all-reduce of a `[b, s, h]` activation in forward.
    Lesson: [02_tp_and_fsdp.md](../../assignments/06_composition/02_tp_and_fsdp.md).
    """)
    nb.solution_from("tensor_parallel", train_mod, "apply_tensor_parallel")
    nb.test("test_tensor_parallel_plan", 8, doc="TP+SP plan: placements, the re-tied head, logits, loss and every gradient equal single-process.",
            visible="""
    check_tensor_parallel_plan(apply_tensor_parallel, world_size=2)
    """, hidden="""
    check_tensor_parallel_plan(apply_tensor_parallel, world_size=4,
                               args=ModelArgs(vocab_size=20, dim=16, n_heads=4, ffn_dim=24, n_layers=1), seq=4, seed=3)
    """)

    # -- exercise 5 ----------------------------------------------------------------
    nb.exercise(5, "`apply_fsdp`, and DP 2 × TP 2 trained", """
    `apply_fsdp(model, dp_mesh, *, reshard_after_forward=True)`: `fully_shard`
    each transformer block, then the root, over `dp_mesh`; return the model.
    One FSDP unit per block means one all-gather per block just before its
    forward (and again for its backward) and one reduce-scatter right after
    its backward, so only a block or two is ever unsharded; the root unit holds
    the embedding, the final norm and the head (one parameter: tied). On a
    tensor-parallel model FSDP2 shards the DTensor parameters again over
    `dp_mesh`: each becomes a 2-D DTensor on `(dp, tp)`.

    The test trains the small GPT on 4 ranks, a `(dp=2, tp=2)` mesh: your
    `apply_tensor_parallel`, then your `apply_fsdp`, your `local_batch`, and
    three AdamW steps. Loss curve and every full parameter must equal
    single-process training on the global batch; forward must all-gather once
    per FSDP unit on the DP group.
    Lesson: [02_tp_and_fsdp.md](../../assignments/06_composition/02_tp_and_fsdp.md) §4.
    """)
    nb.solution_from("fsdp", train_mod, "apply_fsdp")
    nb.test("test_dp_tp_training", 9, doc="DP 2 x TP 2 with SP: loss curve and parameters after 3 AdamW steps equal single-process.",
            visible="""
    check_dp_tp_training(apply_tensor_parallel, apply_fsdp, local_batch, dp=2, tp=2)
    """, hidden="""
    check_dp_tp_training(apply_tensor_parallel, apply_fsdp, local_batch, dp=2, tp=1, batch=6, seq=4, steps=2, seed=5,
                         args=ModelArgs(vocab_size=12, dim=8, n_heads=2, ffn_dim=8, n_layers=3))
    """)

    # -- exercise 6 ----------------------------------------------------------------
    nb.exercise(6, "the loss, averaged exactly once", """
    Three things average: the loss of a micro-batch over its tokens, the
    pipeline schedule over micro-batches (PyTorch's schedules divide the
    gradients by the number of micro-batches: `scale_grads=True`, in
    `_PipelineStageBase.scale_grads`), and FSDP over the DP ranks (its
    reduce-scatter averages). Each must happen once.

    - `pipeline_loss_fn(logits, labels)`: what the schedule calls per micro-batch:
      the mean cross-entropy over this micro-batch's tokens (`logits` `[b, s, V]`,
      a `Shard(-1)` DTensor under `loss_parallel()`; `labels` `[b, s]`). Nothing else.
    - `reduce_loss_for_logging(losses, *, dp_group)`: on the last stage, the list
      the schedule filled (one loss per micro-batch; DTensors under
      `loss_parallel()`: `.full_tensor()`): the mean over the micro-batches, then
      the mean over the DP group (`dist.all_reduce(..., op=dist.ReduceOp.AVG)`),
      as a Python float: the loss of the global batch, on every DP rank.

    Checked on a `(dp, tp)` mesh: each micro-batch loss; the gradient of the
    logits, which after the schedule's `1/m` and FSDP's `1/d` must be the
    gradient of the global mean; the logged value.
    Lesson: [03_glue.md](../../assignments/06_composition/03_glue.md) §1.
    """)
    nb.solution_from("losses", train_mod, "pipeline_loss_fn", "reduce_loss_for_logging")
    nb.test("test_loss_averaging", 5, doc="Micro-batch loss, its gradient and the logged loss: the global mean, averaged once.",
            visible="""
    check_loss_averaging(pipeline_loss_fn, reduce_loss_for_logging, dp=2, tp=2, microbatches=2)
    """, hidden="""
    check_loss_averaging(pipeline_loss_fn, reduce_loss_for_logging, dp=2, tp=1, microbatches=4, batch=8, seq=2,
                         vocab=6, seed=1)
    """)

    # -- exercise 7 ----------------------------------------------------------------
    nb.exercise(7, "the tied embedding across pipeline stages", """
    With pipeline parallelism the embedding (first stage) and the head (last
    stage) live on different ranks, so a tied weight becomes two **copies**.
    Megatron keeps them identical: both start from the same values, and after
    every pipeline step, before clipping, their gradients are all-reduced over
    the **embedding group** (the first and last rank of each pipeline group;
    `finalize_model_grads._allreduce_word_embedding_grads`), so both copies
    take the same update.

    `allreduce_tied_embedding_grads(stage_module, *, embedding_group)`: the
    weight is `stage_module.tok_embeddings.weight` on the first stage and
    `stage_module.output.weight` on the last; all-reduce (sum) its gradient's
    local shard (`grad.to_local()`: under TP and FSDP it is a DTensor, and a
    collective on a DTensor fails). `embedding_group` is None on a middle stage
    (do nothing); a group of one (no pipeline: the weight is tied inside one
    module) needs no communication.
    Lesson: [03_glue.md](../../assignments/06_composition/03_glue.md) §2.
    """)
    nb.solution_from("tied_embedding", train_mod, "allreduce_tied_embedding_grads")
    nb.test("test_tied_embedding_grads", 5, doc="First and last stage hold the sum of both gradients; one all-reduce over the embedding group.",
            visible="""
    check_tied_embedding_grads(allreduce_tied_embedding_grads, pp=2, dp=1, tp=2)
    """, hidden="""
    check_tied_embedding_grads(allreduce_tied_embedding_grads, pp=3, dp=1, tp=1, seed=1)
    check_tied_embedding_grads(allreduce_tied_embedding_grads, pp=1, dp=2, tp=1, seed=2)
    """)

    # -- exercise 8 ----------------------------------------------------------------
    nb.exercise(8, "`clip_grad_norm_` by the norm of the whole model", """
    `clip_grad_norm_(parameters, max_norm, *, pp_group)` gets this stage's
    parameters, whose gradients are DTensors on one `(dp, tp)` mesh, and must
    clip by the 2-norm of **all** the model's gradients (Megatron's
    `get_grad_norm_fp32`): every distinct element counted once.

    - A **sharded** piece (FSDP's `Shard(0)` over dp, TP's `Shard(0)` / `Shard(1)`)
      counts once: sum the squares of the local shards over the mesh.
    - A piece **replicated** over a mesh dimension (the norm scales: `Replicate()`
      over TP) counts once, not once per replica: only the rank at coordinate 0 of
      that dimension adds it (Megatron's `param_is_not_tensor_parallel_duplicate`).
    - **Pipeline stages**: sum the squared norms over `pp_group`
      (`torch.nn.utils.clip_grad_norm_` on a stage returns only that stage's norm).
    - The tied head's copy on the last stage is marked `.shared = True`: clip it,
      do not count it (Megatron's `param_is_not_shared`).

    Then multiply every gradient by `max_norm / (total_norm + 1e-6)` when that
    is below 1 (`torch.nn.utils.clip_grads_with_norm_`), and return the total
    norm (a 0-d tensor, the same on every rank).
    Lesson: [03_glue.md](../../assignments/06_composition/03_glue.md) §3.
    """)
    nb.solution_from("clip_grad_norm", train_mod, "clip_grad_norm_")
    nb.test("test_clip_grad_norm", 7, doc="The whole model's gradient norm from shards (replicas and the tied copy once); gradients clipped.",
            visible="""
    check_clip_grad_norm(clip_grad_norm_, pp=2, dp=2, tp=2, max_norm=1.0)
    """, hidden="""
    check_clip_grad_norm(clip_grad_norm_, pp=2, dp=1, tp=2, max_norm=100.0, seed=1)
    check_clip_grad_norm(clip_grad_norm_, pp=3, dp=1, tp=2, max_norm=0.5, seed=2)
    """)

    # -- exercise 9 ----------------------------------------------------------------
    nb.exercise(9, "the pipeline: PP 2 × DP 2 × TP 2 trained", """
    - `split_model_for_pipeline(model, *, pp_rank, pp_size)`: keep stage
      `pp_rank`'s part in place: layers `[r*L/p, (r+1)*L/p)` (delete the others from
      `model.layers`, so the kept ones keep their global names), `tok_embeddings`
      on the first stage only, `norm` and `output` on the last only (set the
      others to `None`). With p > 1 the last stage's `output.weight` is then
      its own copy of the embedding. `ValueError` if L is not divisible by p or
      `pp_rank` is out of range.
    - `build_schedule(stage_module, *, pp_group, n_microbatches, loss_fn)`: a
      `PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"), group=pp_group)`
      (index and count from `pp_group`) inside a `Schedule1F1B(stage, n_microbatches, loss_fn=loss_fn)`.
    - `pipeline_train_step(schedule, batch, *, stage_module, optimizer, pp_group, dp_group, embedding_group, max_norm)`:
      run `schedule.step(...)` inside **one** `loss_parallel()` (it cannot be
      nested, and each micro-batch's backward runs inside `step`; the first stage
      passes `batch["tokens"]`, the last `target=batch["labels"], losses=[...]`,
      a middle one nothing); then `allreduce_tied_embedding_grads`; then mark the
      last stage's head copy `.shared = True` (here, after TP and FSDP replaced
      the parameter objects: an attribute set earlier is gone); then your
      `clip_grad_norm_`; then `optimizer.step()` and `optimizer.zero_grad()`.
      Return `reduce_loss_for_logging(...)` on the last stage, `None` elsewhere.

    The test builds a `(pp=2, dp=2, tp=2)` mesh on 8 ranks and, with your
    functions, a 4-layer model: split, TP, FSDP (`reshard_after_forward=False`,
    torchtitan's choice under PP), the schedule, `local_batch`, two steps
    clipped at `max_norm=1.0` (every step clips). Loss curve and every parameter of every
    stage must equal single-process training with `clip_grad_norm_` and AdamW.
    Lesson: [04_pipeline.md](../../assignments/06_composition/04_pipeline.md).
    """)
    nb.solution_from("pipeline", train_mod, "split_model_for_pipeline", "build_schedule", "pipeline_train_step")
    nb.test("test_pipeline_training", 10, doc="PP 2 x DP 2 x TP 2: loss curve and every stage's parameters after clipped steps equal single-process.",
            visible="""
    pipeline_functions = {name: globals()[name] for name in PIPELINE_FUNCTIONS}
    # 4 layers: 2 per stage (with 1 a stage cannot hold its layers out of order); 2 steps, both clipped
    check_pipeline_training(pipeline_functions, pp=2, dp=2, tp=2, args=ModelArgs(n_layers=4), steps=2)
    """, hidden="""
    check_pipeline_training(pipeline_functions, pp=2, dp=1, tp=1, microbatches=4, batch=4, seq=4, steps=2,
                            max_norm=0.5, seed=7, args=ModelArgs(vocab_size=12, dim=8, n_heads=2, ffn_dim=8, n_layers=4))
    """)

    # -- exercises 10-12: the planner ------------------------------------------------
    nb.markdown("""
    ## The planner

    Exercises 10-12 estimate, with stated assumptions, what a layout costs on
    a real cluster: bytes per GPU and seconds per step. The vocabulary is given
    in `autograder/lessons/planner.py`: `ModelConfig` (a model's shape, with
    `layer_params()`, `embedding_params()`, `flops_per_token(seq_len)`,
    `attention_flops_per_token(seq_len)`, `activation_bytes_per_token(tp=...,
    bytes_per_element=...)`), `Training` (sequence length, global batch, bytes
    per parameter, gradient, optimizer state and activation, MFU, overlap),
    `Layout` (`tp`, `cp`, `pp`, `dp`, ZeRO stage, recompute, micro-batch;
    `layout.microbatches(training)`), `Cluster` (GPUs and the node's figures
    from `autograder/lessons/hardware.py`: `H100_NODE`), `Plan`, `layers_on_stage`,
    `crosses_nodes`, and the published shapes `LLAMA3_8B`, `LLAMA3_70B`,
    `LLAMA3_405B`, `GPT3_175B`. The communication volumes are
    `autograder/lessons/volume.py`'s (`tp_layer_bytes`, `ring_attention_bytes_per_layer`,
    `pp_boundary_bytes` from assignment 03, `zero_step_bytes`), the times `hardware.py`'s
    (`ring_collective_seconds`, `transfer_seconds`). Every formula, its source
    and a worked example: [05_planner.md](../../assignments/06_composition/05_planner.md).
    """)
    nb.exercise(10, "`memory_per_gpu`", """
    `stage_params(model, layout, stage)`: the parameters one GPU of a stage
    holds: its `layers_on_stage(...)` layers, the embedding on stage 0, the
    final norm (`hidden`) and the head on the last stage (a copy of the
    embedding when tied and pp > 1; nothing extra when tied and pp = 1), all
    divided by `tp`.

    `memory_per_gpu(model, layout, training)` returns the bytes on one GPU of
    the **worst** stage (largest total; the first of equals):
    `{"params", "grads", "optimizer", "activations", "total", "stage"}`.
    For each stage s, with P = `stage_params(...)` and d = dp · cp (CP ranks
    hold the same weights, so ZeRO shards over dp × cp):

    - `params` = P · param_bytes, `grads` = P · grad_bytes, `optimizer` = P · optim_bytes,
      divided by d from their ZeRO stage on (1: optimizer; 2: + grads; 3: + params);
    - m = max(1, `layout.microbatches(training)`); 1F1B keeps min(pp − s, m)
      micro-batches in flight on stage s; one micro-batch is
      micro_batch · seq_len / cp tokens per rank;
    - recompute `"none"`: each layer keeps `model.activation_bytes_per_token(tp=tp, bytes_per_element=activation_bytes)`
      per token; `"full"`: each layer keeps only its input, hidden / tp elements
      per token (sequence-parallel), and the GPU also holds ONE layer's full
      activations of one micro-batch while it is recomputed;
    - the last stage also holds one micro-batch's logits: tokens · vocab / tp
      elements at activation_bytes + 4 bytes (the loss's fp32 softmax).
    """)
    nb.solution_from("planner_memory", planner_mod, "stage_params", "memory_per_gpu")
    nb.test("test_memory_per_gpu", 6, doc="Bytes per GPU of the worst stage equal hand-computed cases and ~88 / ~26 GB for Llama 3 405B.",
            visible="""
    # A GPT-shaped toy: 4 layers, h 1024, ffn 4096 (GeLU), 16 heads, vocab 32768, tied. Layer params:
    # 2*1024^2 (q, o) + 2*1024*1024 (k, v) + 2*1024*4096 (MLP) + 2*1024 (norms) = 12,584,960; embedding 33,554,432.
    toy = ModelConfig("toy", n_layers=4, hidden=1024, ffn=4096, n_heads=16, n_kv_heads=16, vocab=32768,
                      swiglu=False, tied_embeddings=True)
    # TP 2, PP 2, DP 2, ZeRO-1; seq 2048, global batch 16 -> 8 micro-batches of 1 per DP rank.
    # Stage 1 (last): P = (2 * 12,584,960 + 1024 + 33,554,432) / 2 = 29,362,688 per GPU;
    #   params 2P, grads 4P, optimizer 12P / 2;
    #   activations: per token per layer 2 * (4*1024/2 + (2*1024 + 2*1024 + 2*4096)/2) = 16,384 bytes,
    #   x 2048 tokens x 2 layers x min(2 - 1, 8) = 1 in flight = 67,108,864; logits 2048 * 32768/2 * (2 + 4) = 201,326,592.
    # Stage 0 has the same layers and the embedding but no logits: 486,563,840 bytes < stage 1's.
    check_memory_per_gpu(memory_per_gpu, toy, Layout(tp=2, pp=2, dp=2, zero=1), Training(seq_len=2048, global_batch=16),
                         expected={"params": 58_725_376, "grads": 117_450_752, "optimizer": 176_176_128,
                                   "activations": 268_435_456, "total": 620_787_712, "stage": 1})
    # Fewer micro-batches than stages: Llama 3 405B, TP 8 x PP 16 x DP 128, 1024 sequences per step -> m = 8 < 16.
    # Stage 0 (8 of the 126 layers) can only ever hold 8 micro-batches, not 16: 8 x 8 layers x 8192 tokens x
    # 65,024 B per token per layer (activation_bytes_per_token(tp=8)) = 34.1 GB of activations, 55.1 GB in all.
    check_memory_per_gpu(memory_per_gpu, LLAMA3_405B, Layout(tp=8, pp=16, dp=128, zero=1),
                         Training(seq_len=8192, global_batch=1024),
                         expected={"activations": 8 * 8 * 8192 * 65_024, "stage": 0}, total_between=(54e9, 56e9))
    """, hidden="""
    tr = Training(seq_len=2048, global_batch=16)
    # full recompute, ZeRO-3, 4 micro-batches of 2: stage 1 keeps inputs 2048*2 tokens * 1024/2 * 2 B * 2 layers * 1,
    # one layer recomputed 16,384 * 4096 = 67,108,864; logits 4096 * 16384 * 6 = 402,653,184
    check_memory_per_gpu(memory_per_gpu, toy, Layout(tp=2, pp=2, dp=2, zero=3, recompute="full", micro_batch=2), tr,
                         expected={"params": 58_725_376 / 2, "grads": 117_450_752 / 2, "optimizer": 176_176_128,
                                   "activations": 2 * 4096 * 512 * 2 + 67_108_864 + 402_653_184,
                                   "total": 29_362_688 + 58_725_376 + 176_176_128 + 8_388_608 + 67_108_864 + 402_653_184,
                                   "stage": 1})
    # ZeRO-2, no PP, CP 2 (d = dp * cp = 4), TP 1: P = 4 * 12,584,960 + 33,554,432 + 1024 (tied, pp 1) = 83,895,296
    # tokens 1024 per micro-batch; per layer per token 2*(4*1024 + 2*1024 + 2*1024 + 2*4096) = 32,768 B; m = 8, in flight 1
    check_memory_per_gpu(memory_per_gpu, toy, Layout(cp=2, dp=2, zero=2), tr,
                         expected={"params": 2 * 83_895_296, "grads": 4 * 83_895_296 / 4, "optimizer": 12 * 83_895_296 / 4,
                                   "activations": 4 * 1024 * 32_768 + 1024 * 32768 * 6, "stage": 0})
    # untied, 3 stages over 4 layers (2, 1, 1): stage 0 has 2 layers, the embedding, 3 micro-batches in flight
    untied = ModelConfig("toy-untied", n_layers=4, hidden=1024, ffn=4096, n_heads=16, n_kv_heads=16, vocab=32768,
                         swiglu=False)
    check_memory_per_gpu(memory_per_gpu, untied, Layout(pp=3, dp=1, zero=0), Training(seq_len=2048, global_batch=4),
                         expected={"params": 2 * (2 * 12_584_960 + 33_554_432), "optimizer": 12 * (2 * 12_584_960 + 33_554_432),
                                   "activations": 3 * 2 * 2048 * 32_768, "stage": 0})
    # Llama 3 405B, TP 8 x PP 16 x DP 128 on 16,384 GPUs, ZeRO-1, seq 8192, 2048 sequences (16 micro-batches):
    # about 88 GB on stage 0 without recomputation, about 24 GB with full recomputation (COURSE_SPEC 4.6)
    llama = Training(seq_len=8192, global_batch=2048)
    check_memory_per_gpu(memory_per_gpu, LLAMA3_405B, Layout(tp=8, pp=16, dp=128, zero=1), llama,
                         expected={"stage": 0}, total_between=(85e9, 93e9))
    check_memory_per_gpu(memory_per_gpu, LLAMA3_405B, Layout(tp=8, pp=16, dp=128, zero=1, recompute="full"), llama,
                         expected={"stage": 0}, total_between=(22e9, 28e9))
    # 512 sequences: m = 4 micro-batches for 16 stages, with full recomputation: stage 0 keeps 4 micro-batches' layer
    # inputs (8192 tokens x 16384 / 8 x 2 B per layer, 8 layers) and one layer's full activations (8192 x 65,024 B)
    few = Training(seq_len=8192, global_batch=512)
    check_memory_per_gpu(memory_per_gpu, LLAMA3_405B, Layout(tp=8, pp=16, dp=128, zero=1, recompute="full"), few,
                         expected={"activations": 4 * 8 * 8192 * 2048 * 2 + 8192 * 65_024, "stage": 0})
    """)
    nb.exercise(11, "`step_time`", """
    `step_time(model, cluster, layout, training)` returns seconds per step:
    `{"compute", "bubble", "tp", "cp", "pp", "dp", "total", "cp_overlapped", "dp_overlapped"}`
    (`cp` and `dp` are the **exposed** parts; `*_overlapped` what hid behind
    compute). N GPUs of peak P FLOP/s, m = max(1, microbatches), L = the layers of
    stage 0, f = 4/3 with full recompute (one more forward), else 1.

    - `compute` = global_batch · seq_len · flops_per_token(seq_len) · f / (N · P · mfu);
      `bubble` = compute · (pp − 1) / m (1F1B);
    - `tp` (never hidden): `tp_layer_bytes(seq_len / cp, micro_batch, hidden, tp,
      bytes_per_element=activation_bytes, sequence_parallel=True, regather=True)`:
      4 collectives in forward (2 all-gathers, 2 reduce-scatters, each a quarter of
      its `"forward"`), 6 in backward, 4 more in a recomputed forward; each takes
      `ring_collective_seconds(its bytes, tp, link)`; times m · L;
    - `cp`: `ring_attention_bytes_per_layer(seq_len, micro_batch, kv_dim / tp, cp,
      bytes_per_element=activation_bytes)`: 2(cp−1) sends forward, 4(cp−1) backward,
      2(cp−1) more recomputed, each `transfer_seconds(one block, link)`; times m · L;
      with `overlap`, only what exceeds the attention compute
      (compute · attention_flops_per_token / flops_per_token) is exposed;
    - `pp` (never hidden): 2m sends (per micro-batch an activation forward, its gradient backward) of
      `pp_boundary_bytes(seq_len / cp, micro_batch, hidden, bytes_per_element=activation_bytes, tp=tp,
      sequence_parallel=True)` bytes, each `transfer_seconds(..., link)`;
    - `dp` over d = dp · cp ranks: `zero_step_bytes(stage_params(model, layout, 0), d,
      stage=zero, param_bytes=..., grad_bytes=..., microbatches=m)`; its `"reduce"`
      in 1 collective (ZeRO 0-2) or m (ZeRO-3), its `"gather"` in 0 (ZeRO-0), 1 (1-2)
      or 2m (3), each `ring_collective_seconds(bytes per collective, d, link)`. With
      `overlap`, ZeRO 0-2 hide the reduce behind one micro-batch's backward
      (compute / m · (1 − share)) and the gather behind one forward
      (compute / m · share), share = 1/4 with full recompute else 1/3; ZeRO-3
      hides everything behind compute;
    - link: the node's `nvlink` when the group stays in a node, `network` otherwise:
      `cluster.node.link(crosses_nodes=crosses_nodes(layout, dims, cluster.node.gpus))`
      with dims `("tp",)`, `("cp",)`, `("pp",)`, `("cp", "dp")`;
    - `total` = compute + bubble + tp + cp + pp + dp.
    """)
    nb.solution_from("planner_time", planner_mod, "step_time")
    nb.test("test_step_time", 6, doc="Seconds per step (compute, bubble, each dimension's exposed traffic) equal hand-computed cases.",
            visible="""
    # The toy of exercise 10 on one node of 8 H100 (989e12 FLOP/s, NVLink 450e9 B/s, 3e-6 s per message), MFU 0.4.
    toy = ModelConfig("toy", n_layers=4, hidden=1024, ffn=4096, n_heads=16, n_kv_heads=16, vocab=32768, swiglu=False,
                      tied_embeddings=True)
    # FLOPs per token: 6 * (4 * 12,582,912 + 33,554,432) + 12 * 4 * 2048 * 1024 = 603,979,776; 16 * 2048 tokens.
    # TP 2 in a node: one all-gather or reduce-scatter moves 1/2 * 2048*1024*2 B = 2,097,152 B; 10 per layer and
    #   micro-batch, 2 layers, 8 micro-batches. PP 2 (stride 2, in the node): 16 sends of 2048/2*1024*2 B.
    # DP 2 (stride 4, in the node) hides behind one micro-batch: 0 exposed.
    compute = 16 * 2048 * 603_979_776 / (8 * 989e12 * 0.4)
    hop = 2_097_152 / 450e9 + 3e-6
    check_step_time(step_time, toy, Cluster(8), Layout(tp=2, pp=2, dp=2, zero=1), Training(seq_len=2048, global_batch=16),
                    expected={"compute": compute, "bubble": compute / 8, "tp": 160 * hop, "cp": 0.0, "pp": 16 * hop,
                              "dp": 0.0, "total": compute * 9 / 8 + 176 * hop})
    """, hidden="""
    tr = Training(seq_len=2048, global_batch=16)
    # no overlap, 16 GPUs: DP 2 has stride 8 and crosses nodes (InfiniBand 50e9 B/s, 5e-6 s); ZeRO-1 over d = 2:
    # P0 = (2 * 12,584,960 + 33,554,432) / 4 = 14,681,088 (TP 4); reduce-scatter 1/2 * P0 * 4 B, all-gather 1/2 * P0 * 2 B
    c16 = 16 * 2048 * 603_979_776 / (16 * 989e12 * 0.4)
    dp_time = (0.5 * 14_681_088 * 4 / 50e9 + 5e-6) + (0.5 * 14_681_088 * 2 / 50e9 + 5e-6)
    check_step_time(step_time, toy, Cluster(16), Layout(tp=4, pp=2, dp=2, zero=1),
                    Training(seq_len=2048, global_batch=16, overlap=False),
                    expected={"compute": c16, "bubble": c16 / 8,
                              "tp": 8 * 2 * 10 * (0.75 * 2048 * 1024 * 2 / 450e9 + 3 * 3e-6),
                              "pp": 16 * (2048 / 4 * 1024 * 2 / 450e9 + 3e-6), "dp": dp_time})
    # CP 2 (stride 1, NVLink), full recompute, ZeRO-3 over d = 2 * 2 = 4 hidden behind compute; one node of 8 GPUs
    c8 = 16 * 2048 * 603_979_776 * 4 / 3 / (8 * 989e12 * 0.4)
    block = 1 * 1024 * 1024 * 2
    cp_total = 4 * 4 * (2 + 4 + 2) * (block / 450e9 + 3e-6)
    attention = c8 * 12 * 4 * 2048 * 1024 / 603_979_776
    check_step_time(step_time, toy, Cluster(8), Layout(cp=2, dp=4, zero=3, recompute="full"), tr,
                    expected={"compute": c8, "bubble": 0.0, "tp": 0.0, "pp": 0.0, "dp": 0.0,
                              "cp": max(0.0, cp_total - attention), "cp_overlapped": min(cp_total, attention)})
    # TP 2 with full recompute, micro-batches of 2 (m = 16 / (2 * 2) = 4): per layer and micro-batch 14 TP
    # collectives (4 forward, 6 backward, 4 recomputed) of 1/2 * 2048*2*1024*2 B = 4,194,304 B; 2 layers; 8 PP sends
    # of 2048*2*1024*2/2 B. DP 2 (ZeRO-1, P0 = 29,362,176) hides behind one micro-batch: all of it overlapped.
    c_rc = 16 * 2048 * 603_979_776 * 4 / 3 / (8 * 989e12 * 0.4)
    hop2 = 4_194_304 / 450e9 + 3e-6
    check_step_time(step_time, toy, Cluster(8), Layout(tp=2, pp=2, dp=2, zero=1, recompute="full", micro_batch=2), tr,
                    expected={"compute": c_rc, "bubble": c_rc / 4, "tp": 4 * 2 * 14 * hop2, "cp": 0.0, "pp": 8 * hop2,
                              "dp": 0.0, "dp_overlapped": (0.5 * 29_362_176 * 4 / 450e9 + 3e-6)
                              + (0.5 * 29_362_176 * 2 / 450e9 + 3e-6), "total": c_rc * 5 / 4 + 120 * hop2})
    # TP 8 x CP 2 on 16 GPUs, DP 1: the CP group (stride 8) leaves the node, and so does DP's traffic over
    # d = dp * cp = 2 (InfiniBand 50e9 B/s, 5e-6 s). m = 16, 4 layers. TP: 10 collectives of 7/8 * 1024*1024*2 B
    # (the CP shard: 2048 / 2 tokens; 7 steps). CP: 6 sends of a K or V block, 1024 * (1024 / 8) * 2 B, partly hidden behind the attention compute.
    # DP (ZeRO-1, P0 = 83,895,296 / 8 = 10,486,912): each collective hidden behind part of one micro-batch.
    cp_ib = 16 * 4 * 6 * (1024 * 128 * 2 / 50e9 + 5e-6)
    att16 = c16 * 12 * 4 * 2048 * 1024 / 603_979_776
    per_mb = c16 / 16
    dp_ib = (max(0.0, 0.5 * 10_486_912 * 4 / 50e9 + 5e-6 - per_mb * 2 / 3)
             + max(0.0, 0.5 * 10_486_912 * 2 / 50e9 + 5e-6 - per_mb / 3))
    check_step_time(step_time, toy, Cluster(16), Layout(tp=8, cp=2, zero=1), tr,
                    expected={"compute": c16, "bubble": 0.0, "tp": 16 * 4 * 10 * (7 / 8 * 1024 * 1024 * 2 / 450e9
                                                                                   + 7 * 3e-6),
                              "cp": cp_ib - att16, "cp_overlapped": att16, "pp": 0.0, "dp": dp_ib})
    # The same with full recompute and micro-batches of 3 (global batch 48: m = 16): 14 TP collectives of
    # 7/8 * 1024*3*1024*2 B, 8 CP sends of 1024*3*128*2 B, compute x 4/3; DP's reduce-scatter hides behind 3/4 of
    # a micro-batch (the backward's share with a recomputed forward: fully) and its all-gather behind 1/4 (partly).
    c_rc16 = 48 * 2048 * 603_979_776 * 4 / 3 / (16 * 989e12 * 0.4)
    att_rc = c_rc16 * 12 * 4 * 2048 * 1024 / 603_979_776
    cp_rc = 16 * 4 * 8 * (1024 * 3 * 128 * 2 / 50e9 + 5e-6)
    dp_rc = (max(0.0, 0.5 * 10_486_912 * 4 / 50e9 + 5e-6 - c_rc16 / 16 * 3 / 4)
             + max(0.0, 0.5 * 10_486_912 * 2 / 50e9 + 5e-6 - c_rc16 / 16 / 4))
    check_step_time(step_time, toy, Cluster(16), Layout(tp=8, cp=2, zero=1, recompute="full", micro_batch=3),
                    Training(seq_len=2048, global_batch=48),
                    expected={"compute": c_rc16, "tp": 16 * 4 * 14 * (7 / 8 * 1024 * 3 * 1024 * 2 / 450e9 + 7 * 3e-6),
                              "cp": cp_rc - att_rc, "cp_overlapped": att_rc, "dp": dp_rc})
    # TP 8 x PP 2 on 16 GPUs: the pipeline group (stride 8) leaves the node: 2m = 32 sends of 2048*1024*2/8 B on
    # InfiniBand; m = 16, 2 layers per stage; bubble 1/16 of compute.
    check_step_time(step_time, toy, Cluster(16), Layout(tp=8, pp=2, zero=1), tr,
                    expected={"compute": c16, "bubble": c16 / 16, "pp": 32 * (524_288 / 50e9 + 5e-6), "cp": 0.0,
                              "tp": 16 * 2 * 10 * (7 / 8 * 2048 * 1024 * 2 / 450e9 + 7 * 3e-6), "dp": 0.0})
    # ZeRO-0 (DDP) over 2 GPUs, no overlap: one all-reduce of the gradients, 2 (d - 1) / d x P x 4 B, no gather
    check_step_time(step_time, toy, Cluster(2), Layout(dp=2, zero=0), Training(seq_len=2048, global_batch=16, overlap=False),
                    expected={"compute": 16 * 2048 * 603_979_776 / (2 * 989e12 * 0.4), "dp": 83_895_296 * 4 / 450e9 + 3e-6,
                              "dp_overlapped": 0.0})
    # ZeRO-3 over 16 GPUs (two nodes: InfiniBand), one micro-batch: a reduce-scatter of the gradients and two
    # all-gathers of the parameters, 15/16 of P = 83,895,296 each, 15 steps each: more than the whole compute,
    # so only compute's worth of it hides.
    half = 15 / 16 * 83_895_296
    dp3 = (half * 4 / 50e9 + 15 * 5e-6) + 2 * (half * 2 / 50e9 + 15 * 5e-6)
    check_step_time(step_time, toy, Cluster(16), Layout(dp=16, zero=3), tr,
                    expected={"compute": c16, "dp": dp3 - c16, "dp_overlapped": c16, "tp": 0.0, "cp": 0.0, "pp": 0.0,
                              "total": dp3})
    """)
    nb.exercise(12, "`plan` and `best_layouts`", """
    `plan(model, cluster, layout, training)` returns a `Plan(layout, memory,
    time, feasible, reasons, mfu)`: your two estimates, and every rule the
    layout breaks, one sentence each in `reasons` (feasible when there is none):
    tp · cp · pp · dp is not the number of GPUs; tp does not divide the heads
    and the KV heads; with cp > 1 the sequence is not divisible by 2cp; pp >
    layers; the global batch is not a positive multiple of dp · micro_batch
    (mention "global batch"); the worst stage needs more than the GPU's
    memory (mention "GB"). `mfu` = the model FLOPs of a step (no
    recomputation) / (total · N · peak).

    `best_layouts(model, cluster, training, *, zero_stages=(1,), recompute=("none", "full"), micro_batch=1, top=5)`:
    plan every candidate, tp a power of two up to the node's GPUs, cp a power of
    two up to 32, pp every divisor of N / (tp · cp) up to the number of layers,
    dp what is left, each ZeRO stage and recompute; return the `top` feasible
    plans, fastest first (then least memory).
    """)
    nb.solution_from("planner_search", planner_mod, "plan", "best_layouts")
    nb.test("test_plan_published", 5, doc="Published layouts are feasible; DP-only fails on memory (ZeRO-1) and on the batch (ZeRO-3).",
            visible="""
    # Llama 3 405B as Meta trained it (Dubey et al. 2024, table 4): 16,384 H100, TP 8 x PP 16 x DP 128, seq 8192,
    # 16M tokens per step (2048 sequences). ZeRO-1 needs full recomputation to fit; DP alone cannot.
    llama, big = Training(seq_len=8192, global_batch=2048), Cluster(16384)
    check_plan(plan, LLAMA3_405B, big, Layout(tp=8, pp=16, dp=128, recompute="full"), llama, feasible=True,
               memory_gb=(20, 30))
    check_plan(plan, LLAMA3_405B, big, Layout(tp=8, pp=16, dp=128), llama, feasible=False, reason="GB",
               memory_gb=(80, 100))
    check_plan(plan, LLAMA3_405B, big, Layout(dp=16384, zero=1), llama, feasible=False, reason="GB")
    check_plan(plan, LLAMA3_405B, big, Layout(dp=16384, zero=3, recompute="full"), llama, feasible=False,
               reason="global batch")
    # MFU: the model's FLOPs of the step (no recomputation) over the plan's total seconds x GPUs x peak
    toy = ModelConfig("toy", n_layers=4, hidden=1024, ffn=4096, n_heads=16, n_kv_heads=16, vocab=32768, swiglu=False,
                      tied_embeddings=True)
    check_plan(plan, toy, Cluster(8), Layout(tp=2, pp=2, dp=2, zero=1), Training(seq_len=2048, global_batch=16),
               feasible=True, check_mfu=True)
    # The batch rule counts the micro-batch: 16 sequences over DP 2 in micro-batches of 3 do not divide (16 % 6)
    check_plan(plan, toy, Cluster(8), Layout(tp=2, pp=2, dp=2, zero=1, micro_batch=3),
               Training(seq_len=2048, global_batch=16), feasible=False, reason="global batch")
    """, hidden="""
    # MFU with full recompute: the recomputed forward is work done, not model FLOPs
    check_plan(plan, toy, Cluster(8), Layout(tp=2, pp=2, dp=2, zero=1, recompute="full", micro_batch=2),
               Training(seq_len=2048, global_batch=16), feasible=True, check_mfu=True)
    check_plan(plan, LLAMA3_405B, big, Layout(tp=8, cp=2, pp=16, dp=64, recompute="full"), llama,
               check_mfu=True, feasible=True)
    # Megatron-LM's parallelism guide (docs/user-guide/parallelism-guide.md): Llama 3 70B on 64 GPUs TP 4 x PP 4 x CP 2,
    # its example command's global batch 512 and seq 8192; GPT-3 175B TP 4 x PP 8 on 512 GPUs (seq 2048, 1536 sequences).
    check_plan(plan, LLAMA3_70B, Cluster(64), Layout(tp=4, pp=4, cp=2, dp=2), Training(seq_len=8192, global_batch=512),
               feasible=True)
    check_plan(plan, GPT3_175B, Cluster(512), Layout(tp=4, pp=8, dp=16), Training(seq_len=2048, global_batch=1536),
               feasible=True)
    check_plan(plan, LLAMA3_70B, Cluster(64), Layout(tp=16, pp=4), Training(seq_len=8192, global_batch=512),
               feasible=False, reason="heads")
    check_plan(plan, LLAMA3_70B, Cluster(64), Layout(tp=4, pp=4, cp=2, dp=4), Training(seq_len=8192, global_batch=512),
               feasible=False)
    check_plan(plan, LLAMA3_8B, Cluster(8), Layout(cp=8), Training(seq_len=8200, global_batch=8), feasible=False,
               reason="sequence")
    check_plan(plan, LLAMA3_8B, Cluster(64), Layout(pp=64), Training(seq_len=8192, global_batch=64), feasible=False,
               reason="layers")
    # a micro-batch larger than a DP rank's share of the batch: not even one micro-batch per step
    check_plan(plan, LLAMA3_8B, Cluster(64), Layout(tp=8, dp=8, micro_batch=4), Training(seq_len=8192, global_batch=16),
               reason="global batch", feasible=False)
    check_plan(plan, LLAMA3_8B, Cluster(64), Layout(tp=8, dp=8, micro_batch=2), Training(seq_len=8192, global_batch=16),
               feasible=True)
    """)
    nb.test("test_best_layouts", 4, doc="best_layouts returns the fastest feasible candidates as the course's planner ranks them, fastest first.",
            visible=f"""
    # expected: the course's reference planner's ranking (solutions/composition/planner.py, at build time)
    check_best_layouts(best_layouts, LLAMA3_70B, Cluster(64), Training(seq_len=8192, global_batch=512), top=3,
                       expected={_best('LLAMA3_70B', 64, dict(seq_len=8192, global_batch=512), top=3)})
    # Long context (64K tokens per sequence), micro-batches of 2: context parallelism across nodes ranks first
    check_best_layouts(best_layouts, LLAMA3_8B, Cluster(64), Training(seq_len=65536, global_batch=8), top=3,
                       micro_batch=2,
                       expected={_best('LLAMA3_8B', 64, dict(seq_len=65536, global_batch=8), top=3, micro_batch=2)})
    """, hidden=f"""
    check_best_layouts(best_layouts, LLAMA3_405B, Cluster(16384), Training(seq_len=8192, global_batch=2048), top=5,
                       expected={_best('LLAMA3_405B', 16384, dict(seq_len=8192, global_batch=2048), top=5)})
    check_best_layouts(best_layouts, GPT3_175B, Cluster(512), Training(seq_len=2048, global_batch=1536), top=2,
                       zero_stages=(1, 3), recompute=("full",), expected={_best('GPT3_175B', 512, dict(seq_len=2048, global_batch=1536), top=2, zero_stages=(1, 3), recompute=('full',))})
    check_best_layouts(best_layouts, LLAMA3_8B, Cluster(64), Training(seq_len=8192, global_batch=256), top=4,
                       zero_stages=(1, 2, 3), expected={_best('LLAMA3_8B', 64, dict(seq_len=8192, global_batch=256), top=4, zero_stages=(1, 2, 3))})
    check_best_layouts(best_layouts, LLAMA3_8B, Cluster(128), Training(seq_len=131072, global_batch=4), top=3,
                       micro_batch=2,
                       expected={_best('LLAMA3_8B', 128, dict(seq_len=131072, global_batch=4), top=3, micro_batch=2)})
    check_best_layouts(best_layouts, LLAMA3_8B, Cluster(32), Training(seq_len=131072, global_batch=16), top=3,
                       expected={_best('LLAMA3_8B', 32, dict(seq_len=131072, global_batch=16), top=3)})
    """)
    nb.markdown("""
    ### Picture: candidate layouts of Llama 3 405B on 16,384 GPUs

    Memory of the worst GPU (stacked: weights, gradients, optimizer state,
    activations; the dashed line is the GPU's 80 GB) and the step time
    (compute, the pipeline bubble, each dimension's exposed communication; the
    hatched part is communication hidden behind compute). Change the layouts,
    the global batch, ZeRO stages, recomputation: which term dominates, and why
    did Meta use an interleaved schedule (the bubble) and not DP alone (the
    memory, then the batch)? Run it once exercises 10-12 pass.
    """)
    nb.code("""
    llama, big = Training(seq_len=8192, global_batch=2048), Cluster(16384)
    candidates = [Layout(dp=16384, zero=3, recompute="full"), Layout(tp=8, pp=16, dp=128),
                  Layout(tp=8, pp=16, dp=128, recompute="full"), Layout(tp=8, pp=16, dp=128, zero=3, recompute="full"),
                  Layout(tp=8, cp=2, pp=16, dp=64, recompute="full")]
    plans = [plan(LLAMA3_405B, big, layout, llama) for layout in candidates] + best_layouts(LLAMA3_405B, big, llama, top=2)
    for p in plans:
        print(p.describe())
    plot_plans(plans, hbm_bytes=big.node.hbm_bytes, title="Llama 3 405B, 16,384 H100, seq 8192, 2048 sequences per step")
    """)

    # -- to a cluster (not graded) -------------------------------------------------------
    nb.markdown(f"""
    ## Your code as a job: `torchrun`, two nodes, Slurm, a checkpoint (not graded)

    On a cluster nobody forks ranks from a notebook: a launcher starts one
    process per rank (`torchrun` on each node, or `srun`), and the job saves a
    sharded checkpoint it can resume from, on another layout if need be. Your
    exercises 1-9 are already that job, and exercise 13 below gives its
    checkpoint keys that every layout shares. `composition_job` (the last cell
    imports it) trains the small GPT with your functions on a PP × DP × TP
    mesh, each step on its own batch, and can save and resume a checkpoint.

    **In this notebook** `run_distributed(fn, world_size, ...)` forks
    `world_size` processes and calls `fn(rank, world_size, ...)` in each.
    **Under torchrun** the processes exist before your code runs: each one
    reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT`
    from its environment and joins the process group with
    `init_process_group(init_method="env://")`; the same `run_distributed` call
    then runs `fn(RANK, WORLD_SIZE, ...)` in the process itself and gathers every
    rank's result (`autograder/runtime/launch.py`). So the script is your cells:

    ```bash
    python -m autograder.runtime.launch export composition_lab.ipynb --out train_06.py   # save the notebook first
    torchrun --standalone --nproc-per-node 8 train_06.py --pp 2 --dp 2 --tp 2 --steps 4
    # two "nodes" on one machine: run each line in its own terminal (node 0 hosts the rendezvous)
    torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint localhost:29500 train_06.py
    torchrun --nnodes 2 --nproc-per-node 4 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint localhost:29500 train_06.py
    # Slurm: each task is one rank (SLURM_PROCID -> RANK); or one torchrun per node under srun
    MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1) MASTER_PORT=29500 srun --ntasks 8 python train_06.py
    # a checkpoint every 2 steps; one rank killed after step 3; torchrun restarts the job, which resumes from step 2
    torchrun --standalone --nproc-per-node 4 --max-restarts 1 train_06.py --pp 1 --dp 2 --tp 2 --steps 6 \\
        --checkpoint-dir ckpt --checkpoint-every 2 --simulate-failure 1:3
    # resume the same checkpoint on another layout: PP 2 x TP 2 reads what DP 2 x TP 2 wrote
    torchrun --standalone --nproc-per-node 4 train_06.py --pp 2 --dp 1 --tp 2 --steps 6 --checkpoint-dir ckpt
    ```

    Each prints `step N loss X`: the same numbers as the cell below, bit for
    bit (the same ranks run the same operations in the same order; only the
    launcher changed). What changes on a real cluster, what
    `torch.distributed.checkpoint` does (the planner, the metadata, resharding on
    load), `--backend nccl` (one GPU per rank, `cuda:LOCAL_RANK`), and what a
    checkpoint costs per rank: [06_to_a_cluster.md]({LESSON}/06_to_a_cluster.md).
    """)
    nb.exercise(13, "`checkpoint_state`: your stage under keys every layout shares", """
    `torch.distributed.checkpoint` (DCP) saves a dict `{flat key: tensor}`
    from every rank: each rank writes the pieces of its DTensors (its shard),
    and a piece offered by several ranks once; `dcp.load` fills the tensors of
    such a dict **in place**, each rank reading the saved pieces that overlap
    what it holds now, whatever layout wrote them. The one thing DCP cannot do
    for you is name the tensors: a key must mean the same tensor on every layout.

    `checkpoint_state(stage_module, optimizer)` returns this rank's dict:

    - `model.<name>` → the parameter itself, for every parameter of the stage,
      `<name>` its name in the whole model (`layers.2.attention.wq.weight`:
      `split_model_for_pipeline` kept the global names);
    - `optim.<name>.<key>` → the tensor itself, for every entry of that
      parameter's optimizer state (AdamW: `step`, `exp_avg`, `exp_avg_sq`;
      `optimizer.state[param]`);
    - the last stage's copy of the tied head (`output.weight` on a stage
      without `tok_embeddings`) under the embedding's name:
      `model.tok_embeddings.weight` and `optim.tok_embeddings.weight.<key>`.
      With one stage there is no other key for it (the head *is* the embedding).

    Return the tensors themselves (never `.to_local()`, `.detach()` or a
    copy): `dcp.load` writes into them. The test builds the stages of two
    layouts (every parameter a DTensor, `Shard(0)` over DP and the TP plan's
    placement), takes one AdamW step on the first, saves with your dict, loads
    with your dict on the second (parameters and state zeroed first), and
    compares every parameter and AdamW state with the first run's, both ways
    between PP 2 × TP 2 and DP 2 × TP 2. Lesson: [06_to_a_cluster.md](../../assignments/06_composition/06_to_a_cluster.md) §4.
    """)
    nb.solution_from("checkpoint_state", checkpoint_mod, "checkpoint_state")
    nb.test("test_checkpoint_state", 4, doc="Saved on one layout with your keys, loaded on another: every parameter and AdamW state restored.",
            visible="""
    check_checkpoint_state(checkpoint_state, save=dict(pp=2, dp=1, tp=2), load=dict(pp=1, dp=2, tp=2))
    check_checkpoint_state(checkpoint_state, save=dict(pp=1, dp=2, tp=2), load=dict(pp=2, dp=1, tp=2))
    """, hidden="""
    check_checkpoint_state(checkpoint_state, save=dict(pp=4, dp=1, tp=1), load=dict(pp=1, dp=1, tp=2), seed=3)
    check_checkpoint_state(checkpoint_state, save=dict(pp=1, dp=1, tp=1), load=dict(pp=2, dp=2, tp=1), seed=4)
    """)
    nb.markdown("""
    ### The job

    `composition_job` runs your exercises 1-9 (and 13 for a checkpoint) as
    the job the commands above start; in this notebook its ranks are forked,
    as every test's were.
    """)
    nb.given("job", """
    from autograder.checks.composition import composition_job
    """)
    nb.code("""
    # The job in this notebook (PP 2 x TP 2 on 4 forked ranks, 3 steps); torchrun prints the same losses.
    result = composition_job(globals(), pp=2, dp=1, tp=2, steps=3)
    """)
    return nb


if __name__ == "__main__":
    build().write(OUT)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
