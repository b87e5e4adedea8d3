"""Build source/01_data_parallel/data_parallel_lab.ipynb (nbgrader source notebook) from code.

    .venv/bin/python assignments/01_data_parallel/_build_nb.py
    .venv/bin/nbgrader generate_assignment 01_data_parallel --force

Answer cells are cut from solutions/data_parallel/ (ddp.py, zero.py and
fsdp.py: one source of truth); test cells call the public checks in
autograder/checks/data_parallel/ (ddp_zero.py and fsdp.py), with hidden cases.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autograder.authoring.nbbuild import NotebookBuilder, source_of  # noqa: E402
from solutions.data_parallel import ddp as dp  # noqa: E402
from solutions.data_parallel import fsdp  # noqa: E402
from solutions.data_parallel import zero  # noqa: E402

def solution_cell(nb, grade_id, module, *names):
    nb.solution_from(grade_id, module, *names)


ASSIGNMENT = "01_data_parallel"
LESSON = "../../assignments/01_data_parallel"
OUT = os.path.join(ROOT, "source", ASSIGNMENT, "data_parallel_lab.ipynb")


def build() -> NotebookBuilder:
    nb = NotebookBuilder(ASSIGNMENT)
    nb.markdown(f"""
    # 01 · Data parallelism: DP, ZeRO and FSDP

    Every rank holds the model (or a shard of it) and a different slice of the
    batch. You will implement, with real `torch.distributed` collectives running
    on several CPU processes (gloo):

    1. `all_reduce_gradients`: the DDP contract, averaged gradients;
    2. `BucketedDDP`: gradient buckets all-reduced asynchronously *during* backward, `no_sync()`;
    3. `zero_bytes_per_param`: the ZeRO memory ledger;
    4. `ZeroShardedOptimizer`: the ZeRO step for any torch optimizer (reduce-scatter, step your shard, all-gather);
    5. `fully_shard` / `gather_full_params`: FSDP (ZeRO-3) for any module, parameters gathered just in time,
       with mixed precision as FSDP2's `MixedPrecisionPolicy`.

    Read first: the lesson [README.md]({LESSON}/README.md) ([the course overview](../../assignments/README.md)
    puts it beside the other dimensions). Deep dives:
    [01_gradient_bucketing.md]({LESSON}/01_gradient_bucketing.md) (exercise 2),
    [02_zero.md]({LESSON}/02_zero.md) (exercise 4),
    [03_fsdp.md]({LESSON}/03_fsdp.md) (exercise 5).

    How the tests work: each test starts N rank processes with
    `run_distributed`, runs your code on every rank on its slice of the batch,
    and compares what the ranks send back with a single-process reference
    built from the same weights and the whole batch. A `CommLedger` records
    every collective each rank issued (op, shape, dtype, phase: forward,
    backward or outside). A failure names the rank, the tensor, the element,
    expected and got. Every API takes its process group as `group=`; a group
    of one communicates nothing. Stubs read
    `# TODO: implement (see the task description above).`
    """)
    nb.given("setup", """
    import contextlib

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace
    from autograder.checks.data_parallel import (
        ToyNet, check_broadcast_module_states, check_all_reduce_gradients, check_ddp_broadcast,
        check_ddp_gradients, check_ddp_buckets, check_ddp_no_sync, check_zero_bytes_per_param,
        check_zero_matches_optimizer, check_zero_rounding, check_zero_state_sharded, check_zero_comm,
        expected_buckets, plot_memory_ledger, ddp_timeline, plot_ddp_timeline,
        MixedPrecisionPolicy, TinyTransformer, check_fsdp_numerics, check_fsdp_comm, check_fsdp_memory,
        check_fsdp_mixed_precision, check_gather_full_params,
    )
    """)

    # -- worked example ---------------------------------------------------------
    nb.markdown("""
    ## Worked example: start every replica from rank 0's weights

    Before training, DDP copies rank 0's parameters and buffers to every rank
    (`torch.distributed.utils._sync_module_states`). Below: the function, its
    check, and a look at its ledger from a rank program of your own. Your
    `BucketedDDP` will call `broadcast_module_states` in its constructor.
    """)
    nb.given("worked_example", source_of(dp, "broadcast_module_states"))
    nb.given("worked_example_check", """
    check_broadcast_module_states(broadcast_module_states, world_size=2)
    print("broadcast_module_states: passed")
    """)
    nb.code("""
    def show_broadcast(rank, world_size):
        torch.manual_seed(rank)  # different weights on each rank
        model = ToyNet((5, 7, 3)).double()
        with CommLedger() as ledger:
            broadcast_module_states(model, group=dist.group.WORLD)
        return ledger.records

    print(format_trace(run_distributed(show_broadcast, 2)[1], rank=1))
    """)

    # -- 1. all_reduce_gradients -------------------------------------------------
    nb.exercise(1, "`all_reduce_gradients(model, *, group)` (6 points)", """
    After `loss.backward()` each rank holds the gradient of its *local* mean
    loss. Replace every parameter's `.grad`, in place, by the average over the
    ranks of `group` (DDP semantics: the mean of the local-mean gradients,
    which equals the gradient of the global-batch mean when local batches have
    equal sizes). Use `dist.all_reduce`; skip parameters whose `.grad` is
    None (frozen or unused on every rank). A group of one communicates nothing.
    Lesson: README §1-2.
    """)
    solution_cell(nb, "all_reduce_gradients", dp, "all_reduce_gradients")
    nb.test("test_all_reduce_gradients", 6, doc="Gradients averaged over the group (global-batch gradients).",
            visible="""
            check_all_reduce_gradients(all_reduce_gradients, world_size=2)
            """,
            hidden="""
            check_all_reduce_gradients(all_reduce_gradients, world_size=4, dims=(5, 6, 6, 6, 2), unused=True,
                                       frozen=True, tied=True, seed=1)
            check_all_reduce_gradients(all_reduce_gradients, world_size=1, seed=2)
            check_all_reduce_gradients(all_reduce_gradients, world_size=2, dims=(4, 9, 1), dtype=torch.float32,
                                       seed=3)
            """)

    # -- 2. BucketedDDP ------------------------------------------------------------
    nb.exercise(2, "`BucketedDDP(module, *, group, bucket_cap_mb)` (28 points)", f"""
    Overlap the gradient all-reduce with backward, as PyTorch DDP's `Reducer`
    does. Deep dive: [01_gradient_bucketing.md]({LESSON}/01_gradient_bucketing.md).

    - **Constructor**: call `broadcast_module_states(module, group=group)`; walk
      the trainable parameters (`requires_grad=True`, each tied parameter once,
      as `module.parameters()` yields them) in **reverse** order; a bucket
      closes once it holds **at least** (`>=`) `bucket_cap_mb * 2**20` bytes
      (MiB, not MB: `bucket_cap_mb` may be a fraction; a parameter larger than
      the cap gets a bucket of its own). A parameter whose dtype differs from
      the open bucket's closes it and starts a new one (one flat buffer has one
      dtype). Bucket 0 thus holds the last parameters. Register one
      `param.register_post_accumulate_grad_hook(...)` per trainable parameter.
      Frozen parameters are broadcast but never bucketed.
    - **During backward**: the hook counts the gradients of its bucket; when a
      bucket is full, launch every full bucket **in bucket order** from the next
      one not yet launched: flatten its gradients into one buffer `[sum of numels]`,
      divide by the group size, `dist.all_reduce(..., async_op=True)`. Keep the `Work`.
    - **End of backward**: buckets that never filled (a parameter with no
      gradient) are launched from a callback queued once per backward with
      `torch.autograd.Variable._execution_engine.queue_callback(fn)`, zeros in
      place of the missing gradients.
    - `finish_gradient_synchronization()` (called after `loss.backward()`):
      `wait()` for each bucket, **then** copy the averaged values back into
      `.grad` (creating it where it is None), and reset for the next iteration.
    - `no_sync()`: a context manager; inside it backward communicates nothing and
      gradients accumulate in `.grad`; the first backward after it syncs the sum.

    The helper methods (`_reset`, `_grad_ready`, `_launch_remaining`, `_launch`,
    `_copy_back`) are a suggested structure; only the public API is graded.
    A group of one issues no communication (but still fills `.grad` as above).
    """)
    solution_cell(nb, "bucketed_ddp", dp, "BucketedDDP")
    nb.test("test_ddp_broadcast", 4, doc="The constructor copies rank 0's parameters (frozen too) to every rank.",
            visible="""
            check_ddp_broadcast(BucketedDDP, world_size=2)
            """,
            hidden="""
            check_ddp_broadcast(BucketedDDP, world_size=4, dims=(4, 9, 2, 3), seed=5)
            check_ddp_broadcast(BucketedDDP, world_size=2, dims=(3, 1), frozen=False, seed=6)
            """)
    nb.test("test_ddp_gradients", 9,
            doc="After finish_gradient_synchronization() every rank holds the global-batch gradients.",
            visible="""
            check_ddp_gradients(BucketedDDP, world_size=2, bucket_cap_mb=150 / 2**20)
            # rank 1 starts its backward only once rank 0 waits: rank 0's buckets are in flight until then, so
            # a gradient copied back before its wait() is wrong on every run
            check_ddp_gradients(BucketedDDP, world_size=2, bucket_cap_mb=100 / 2**20, late_rank=True, seed=2)
            """,
            hidden="""
            # one parameter per bucket; an unused layer, a frozen scale and a tied weight
            check_ddp_gradients(BucketedDDP, world_size=4, dims=(5, 6, 6, 6, 2), bucket_cap_mb=1e-9, unused=True,
                                frozen=True, tied=True, seed=1)
            check_ddp_gradients(BucketedDDP, world_size=4, dims=(4, 9, 5), bucket_cap_mb=1e-9, late_rank=True, seed=6)
            check_ddp_gradients(BucketedDDP, world_size=1, unused=True, seed=3)
            check_ddp_gradients(BucketedDDP, world_size=2, dims=(4, 9, 1), dtype=torch.float32, seed=4)
            # layer 1 in float32, the rest in float64
            check_ddp_gradients(BucketedDDP, world_size=2, dims=(5, 7, 6, 3), mixed=True, seed=5)
            """)
    nb.test("test_ddp_buckets", 9,
            doc="One async all-reduce per bucket, bucket order, sizes and dtypes, issued during backward.",
            visible="""
            # float64 sizes in reverse order: 24, 144, 48, 336, 56, 280 bytes; the cap is exactly 24 + 144 + 48
            check_ddp_buckets(BucketedDDP, world_size=2, dims=(5, 7, 6, 3), bucket_cap_mb=216 / 2**20)
            """,
            hidden="""
            check_ddp_buckets(BucketedDDP, world_size=4, dims=(5, 6, 6, 6, 2), bucket_cap_mb=1e-9, unused=True,
                              frozen=True, tied=True, seed=1)
            # 170 bytes in MiB units: 168 < 170 bytes, but 168 >= 170 / 2**20 * 10**6 (a cap read as MB)
            check_ddp_buckets(BucketedDDP, world_size=2, dims=(5, 7, 6, 3), bucket_cap_mb=170 / 2**20, seed=2)
            check_ddp_buckets(BucketedDDP, world_size=2, dims=(8, 16, 16, 4), bucket_cap_mb=900 / 2**20, seed=3)
            # a dtype change starts a new bucket, even under a large cap
            check_ddp_buckets(BucketedDDP, world_size=2, dims=(5, 7, 6, 3), mixed=True, bucket_cap_mb=25, seed=4)
            check_ddp_buckets(BucketedDDP, world_size=1, seed=5)
            """)
    nb.test("test_ddp_no_sync", 6,
            doc="no_sync() communicates nothing; the last micro-step syncs the accumulated gradients.",
            visible="""
            check_ddp_no_sync(BucketedDDP, world_size=2, micro_steps=3, bucket_cap_mb=100 / 2**20)
            """,
            hidden="""
            check_ddp_no_sync(BucketedDDP, world_size=4, micro_steps=2, dims=(4, 9, 2, 3), bucket_cap_mb=1e-9,
                              unused=True, seed=1)
            check_ddp_no_sync(BucketedDDP, world_size=1, micro_steps=2, seed=2)
            """)
    nb.markdown("""
    ### Picture (not graded): bucket launches against backward

    One step of your `BucketedDDP` on 2 ranks, with a ledger that also records
    computation (`CommLedger(trace_compute=True)`). Each red line is a bucket's
    all-reduce being launched: the first ones should appear *among* the orange
    backward ops, not after them.
    """)
    nb.code("""
    records, ops = ddp_timeline(BucketedDDP, world_size=2)
    plot_ddp_timeline(records, ops)
    """)

    # -- 3. zero_bytes_per_param ---------------------------------------------------
    nb.exercise(3, "`zero_bytes_per_param(stage, dp_size, *, param_bytes=2, grad_bytes=2, optim_bytes=12)` (4 points)", f"""
    Bytes of model state per parameter on each rank under ZeRO stage 0 (DDP),
    1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters) with `d =
    dp_size` ranks: with the defaults 16, 4 + 12/d, 2 + 14/d, 16/d. Lesson:
    [README.md §3]({LESSON}/README.md). Input validation is given.
    """)
    solution_cell(nb, "zero_bytes_per_param", dp, "zero_bytes_per_param")
    nb.test("test_zero_bytes_per_param", 4, doc="The ZeRO memory ledger for stages 0-3.",
            visible="""
            check_zero_bytes_per_param(zero_bytes_per_param)
            """,
            hidden="""
            check_zero_bytes_per_param(zero_bytes_per_param, cases=[
                (0, 4, dict(param_bytes=4, grad_bytes=4, optim_bytes=8)), (1, 3, dict(optim_bytes=16)),
                (2, 64, dict(grad_bytes=4)), (3, 5, dict(param_bytes=1, grad_bytes=3, optim_bytes=7)),
                (1, 1, {}), (2, 2, {}), (3, 1024, {})])
            """)
    nb.code("""
    plot_memory_ledger(zero_bytes_per_param, num_params=7e9, dp_size=8)
    """)

    # -- 4. ZeRO -------------------------------------------------------------------
    nb.exercise(4, "`ZeroShardedOptimizer(params, optimizer_class=torch.optim.AdamW, *, group, **defaults)` "
                   "(28 points)", f"""
    Any torch optimizer, with ZeRO-sharded state. Deep dive: [02_zero.md]({LESSON}/02_zero.md).
    The constructor takes what `torch.optim` optimizers take (a list of
    parameters, or parameter groups with their own `lr`, `weight_decay`, ...)
    plus the class of the optimizer to run and its keyword arguments, as
    `torch.distributed.optim.ZeroRedundancyOptimizer` does. `self.param_groups`
    is set up for you (the base class), and a learning-rate schedule may change
    `param_groups[i]["lr"]` between steps: read the current values at each step.

    - **Layout**: the trainable parameters (`self._params`: group by group, in
      order) are flattened into one buffer padded with zeros to `padded`, a
      multiple of the group size `d` (the smallest one, `ceil(n / d) * d`, or
      any larger multiple with less than `128 * d` elements of padding, as
      Megatron's `lcm(d, 128)`: the grader reads your size from your
      collectives); rank r owns the contiguous range `[r * padded/d, (r + 1) * padded/d)`,
      ignoring parameter boundaries (a parameter may span ranks; a rank may own
      only padding).
    - **The inner optimizer**: for each piece of a parameter inside your range,
      a 1-D tensor the optimizer updates (a view of the parameter,
      `param.detach().view(-1)[first:last]`, or a float32 copy for bfloat16
      parameters), grouped as the outer parameter groups (same hyperparameters);
      `optimizer_class(those groups, **defaults)`. Keep it as an attribute
      (`self.optimizer`): the grader measures the tensors in its `state`.
    - **`step()`**: copy the gradients into a flat `[padded]` buffer (zeros
      where `.grad` is None); `dist.reduce_scatter_single(shard, flat, ...)`
      and average, `[padded] -> [padded/d]`; give each piece its slice as
      `.grad`, **None where the parameter's `.grad` is None** (torch then skips
      it: no update, no state, no step); step the inner optimizer; put your
      updated range into a `[padded/d]` buffer and
      `dist.all_gather_single(flat, shard, ...)`, `[padded/d] -> [padded]`;
      copy it back into the parameters. Exactly one reduce-scatter and one
      all-gather of `[padded]` per step.
    - State for the pieces in your range only, float32 (float64 for float64
      parameters). `requires_grad=False` parameters may be passed in: not in
      the buffer, never changed.

    Graded with `torch.optim.AdamW`, `Adam` and `SGD` (momentum), parameter
    groups with their own learning rates and weight decay, an lr schedule, and
    float32 to the last bit (rtol 1e-7).
    """)
    solution_cell(nb, "zero_sharded_optimizer", zero, "ZeroShardedOptimizer")
    nb.test("test_zero_matches_optimizer", 10,
            doc="After several steps the parameters equal the torch optimizer run on the global batch.",
            visible="""
            check_zero_matches_optimizer(ZeroShardedOptimizer, world_size=2, lrs=(1e-2, 1e-2, 1e-2))
            """,
            hidden="""
            # a 1-element parameter on 4 ranks, an unused layer, a frozen scale, a tied weight, an lr schedule
            check_zero_matches_optimizer(ZeroShardedOptimizer, world_size=4, dims=(5, 6, 6, 6, 1), unused=True,
                                         frozen=True, tied=True, lrs=(1e-2, 5e-3, 2e-2), seed=1)
            # SGD with momentum: the gradient's scale shows (AdamW hides a missing average)
            check_zero_matches_optimizer(ZeroShardedOptimizer, world_size=2, dims=(3, 4, 1),
                                         optimizer_class=torch.optim.SGD, lrs=(1e-1, 5e-2), seed=2)
            # parameter groups: weights decayed, the rest at 3x the lr without decay
            check_zero_matches_optimizer(ZeroShardedOptimizer, world_size=4, dims=(5, 6, 6, 2), unused=True,
                                         optimizer_class=torch.optim.Adam, lrs=(1e-2, 2e-2),
                                         param_groups=((".weight", 1.0, 0.1), ("", 3.0, 0.0)), seed=3)
            check_zero_matches_optimizer(ZeroShardedOptimizer, world_size=1, lrs=(1e-2, 3e-2), seed=4)
            """)
    nb.test("test_zero_rounding", 5, doc="float32: agreement with the torch optimizer to rtol 1e-7.",
            visible="""
            check_zero_rounding(ZeroShardedOptimizer, world_size=2)
            """,
            hidden="""
            check_zero_rounding(ZeroShardedOptimizer, world_size=4, shapes=((5,), (2, 3), (1,), (3, 3)),
                                flags=("", "late", "", "unused"), lrs=(1e-3, 2e-2, 5e-3, 1e-2), seed=1)
            check_zero_rounding(ZeroShardedOptimizer, world_size=2, optimizer_class=torch.optim.SGD, seed=2)
            """)
    nb.test("test_zero_state_sharded", 7, doc="Each rank's optimizer state covers its shard only.",
            visible="""
            check_zero_state_sharded(ZeroShardedOptimizer, world_size=2)
            """,
            hidden="""
            check_zero_state_sharded(ZeroShardedOptimizer, world_size=4, dims=(5, 6, 6, 6, 1), unused=True,
                                     frozen=True, tied=True, seed=1)
            check_zero_state_sharded(ZeroShardedOptimizer, world_size=2, dims=(3, 4, 1), dtype=torch.float32,
                                     optimizer_class=torch.optim.SGD, param_groups=((".bias", 2.0, 0.0), ("", 1.0, 0.01)),
                                     seed=2)
            """)
    nb.test("test_zero_comm", 6, doc="One reduce-scatter and one all-gather of the padded size per step.",
            visible="""
            check_zero_comm(ZeroShardedOptimizer, world_size=2, steps=2)
            """,
            hidden="""
            check_zero_comm(ZeroShardedOptimizer, world_size=4, dims=(5, 6, 6, 6, 1), unused=True, frozen=True,
                            steps=2, seed=1)
            check_zero_comm(ZeroShardedOptimizer, world_size=2, dims=(3, 4, 1), steps=3, seed=2)
            check_zero_comm(ZeroShardedOptimizer, world_size=1, steps=1, seed=3)
            """)

    # -- 5. FSDP ---------------------------------------------------------------------
    nb.exercise(5, "`fully_shard(module, *, group, reshard_after_forward=True, mp_policy=None)` and "
                   "`gather_full_params(module)` (34 points)", f"""
    FSDP (ZeRO-3) for any module, applied as FSDP2 is: `fully_shard(block, ...)`
    on each block, then `fully_shard(model, ...)` on the root, which takes what
    is left (embedding, final norm, head). Deep dive: [03_fsdp.md]({LESSON}/03_fsdp.md).
    Given below: `param_slots(module)` (the parameters a call takes: those of
    `module` and of sub-modules not already sharded, a tied parameter at each
    of its places) and `FlatLayout` (the flat buffer of one unit: the distinct
    parameters in that order, row-major, zero padded to a multiple of d;
    `views(flat)` gives each parameter back as a view).

    - **`fully_shard`** makes one *unit* (`FSDPUnit`): the flat buffer of the
      parameters `param_slots` lists, chunk r of it kept on rank r as the
      module's only new parameter, **`module.flat_param`** `[padded/d]` (float32
      master weights for float32 parameters, whatever the policy computes in).
      The original parameters leave the module and memory: keep only their
      layout. Register a forward pre-hook and a forward hook (`with_kwargs=True`).
    - **Forward** (pre-hook): with `mp_policy.param_dtype`, cast the floating
      inputs to it; all-gather the flat parameter through an autograd Function,
      `_AllGatherParams`: forward `[padded/d] -> [padded]` in `param_dtype`,
      backward: reduce-scatter the gradient `[padded] -> [padded/d]` in
      `mp_policy.reduce_dtype` (None: the gradient's dtype), **averaged**, as
      the master's dtype. Put `FlatLayout.views(full)` where the parameters were
      (`setattr(owner, attr, view)`: a plain tensor attribute while forward runs).
    - **After forward** (hook): remove those attributes and drop the gathered
      buffer. With `reshard_after_forward=True` nothing may keep it alive, not
      even autograd: what ops save of it for backward must not hold it (wrap
      the forward in `torch.autograd.graph.saved_tensors_hooks`: pack a view of
      the buffer as its place in it, `_ParamRef`; unpack gathers the buffer
      again, once, for backward), or free its storage (`untyped_storage().resize_(0)`,
      FSDP2's way) and gather into it again before backward. Free the buffer
      gathered for backward after the reduce-scatter. With `False` keep it for
      backward: no second all-gather.
    - Per unit: forward 1 all-gather; backward 1 all-gather (0 without
      resharding) + 1 reduce-scatter of the same size. A group of one
      communicates nothing.
    - **`gather_full_params(module)`**: on every rank, the full state dict
      `{{name: tensor}}`, as the unsharded `module.state_dict()` would be
      (a tied parameter under each of its names; buffers too; master dtype):
      one all-gather per unit, shards untouched.

    The methods of `_AllGatherParams` and `FSDPUnit` are a suggested
    structure (the saved-tensor-hook route); only `fully_shard`,
    `module.flat_param` (its layout) and `gather_full_params` are graded.
    The tests use a small transformer (`TinyTransformer`: embedding plus a
    position parameter of the root, blocks with RMSNorm and causal attention,
    a head tied to the embedding) and a stack of linear layers, float64 and
    mixed precision; a scratch cell below shows what your code communicates.
    """)
    nb.given("fsdp_layout", source_of(fsdp, "param_slots", "FlatLayout", "_ParamRef"))
    solution_cell(nb, "fully_shard", fsdp, "_AllGatherParams", "FSDPUnit", "fully_shard", "gather_full_params")
    nb.code("""
    # Scratch: shard a TinyTransformer per block, then the root, on 2 ranks; rank 0's parameters and ledger.
    def show_fsdp(rank, world_size):
        torch.manual_seed(0)
        model = TinyTransformer()  # embedding, 2 blocks, RMSNorm, head tied to the embedding
        for block in model.blocks:
            fully_shard(block, group=dist.group.WORLD)
        fully_shard(model, group=dist.group.WORLD)
        ids = torch.randint(0, 11, (2, 5))
        with CommLedger() as ledger:
            model(ids).logsumexp(-1).mean().backward()
        return [(n, tuple(p.shape)) for n, p in model.named_parameters()], ledger.records

    params, records = run_distributed(show_fsdp, 2)[0]
    print("rank 0's parameters after fully_shard:", params)
    print(format_trace(records, rank=0))
    """)
    nb.test("test_fsdp_numerics", 9,
            doc="Outputs, averaged shard gradients and trained shards match one process training the whole model.",
            visible="""
            check_fsdp_numerics(fully_shard, world_size=2)
            """,
            hidden="""
            check_fsdp_numerics(fully_shard, world_size=4, model={"vocab": 13, "hidden": 6, "ffn": 8, "seq": 4,
                                                                 "layers": 1}, seed=1)
            check_fsdp_numerics(fully_shard, world_size=2, kind="stack", model={"dims": (4, 3, 5), "bias": False},
                                steps=3, dtype=torch.float32, reshard=False, seed=2)
            check_fsdp_numerics(fully_shard, world_size=1, steps=1, seed=4)
            """)
    nb.test("test_fsdp_comm", 7,
            doc="Per unit: forward 1 all-gather; backward 1 all-gather (0 if not resharding) + 1 reduce-scatter.",
            visible="""
            check_fsdp_comm(fully_shard, world_size=2)
            check_fsdp_comm(fully_shard, world_size=2, reshard=False)
            """,
            hidden="""
            check_fsdp_comm(fully_shard, world_size=4, kind="stack", model={"dims": (3, 5, 2, 4)}, reshard=False, seed=1)
            check_fsdp_comm(fully_shard, world_size=1, seed=3)
            """)
    nb.test("test_fsdp_memory", 7,
            doc="At rest only the shards; no gathered parameter survives forward (resharding) or backward.",
            visible="""
            check_fsdp_memory(fully_shard, world_size=2)
            """,
            hidden="""
            check_fsdp_memory(fully_shard, world_size=4, model={"vocab": 7, "hidden": 4, "ffn": 6, "seq": 3,
                                                               "layers": 2}, seed=1)
            check_fsdp_memory(fully_shard, world_size=2, kind="stack", model={"dims": (6, 4, 3)}, reshard=False,
                              seed=2)
            """)
    nb.test("test_fsdp_mixed_precision", 6,
            doc="MixedPrecisionPolicy: float32 masters, all-gather and compute in param_dtype, reduce in reduce_dtype.",
            visible="""
            check_fsdp_mixed_precision(fully_shard, world_size=2)
            """,
            hidden="""
            check_fsdp_mixed_precision(fully_shard, world_size=4, kind="stack", model={"dims": (5, 7, 3)}, steps=1,
                                       seed=1)
            check_fsdp_mixed_precision(fully_shard, world_size=2, param_dtype=torch.float16, steps=1, seed=2)
            """)
    nb.test("test_gather_full_params", 5,
            doc="gather_full_params: the unsharded state dict on every rank, tied names and buffers included.",
            visible="""
            check_gather_full_params(fully_shard, gather_full_params, world_size=2)
            """,
            hidden="""
            check_gather_full_params(fully_shard, gather_full_params, world_size=4, seed=1)
            check_gather_full_params(fully_shard, gather_full_params, world_size=1, seed=3)
            """)
    # -- your code as a job (not graded) -----------------------------------------------------
    nb.markdown("""
    ## Your code as a job: `torchrun` (not graded)

    Every test above ran in ranks this notebook forked (`run_distributed`). On
    a cluster a launcher starts one process per rank instead, and your code is
    the same. `data_parallel_job` (the cell below imports it) trains a small transformer with your `BucketedDDP` (`strategy="ddp"`), your `ZeroShardedOptimizer` (`"zero"`) or your `fully_shard` (`"fsdp"`). Export your
    notebook's code (answer and given cells, definitions only) as a script and
    start it with torchrun:

    ```bash
    python -m autograder.runtime.launch export data_parallel_lab.ipynb --out train_01.py   # save the notebook first
    torchrun --standalone --nproc-per-node 2 train_01.py --strategy zero --world-size 2
    python train_01.py --help                                               # the job's options
    ```

    It prints `step N loss X`: the same numbers as the cell below, bit for bit.
    How the runner maps onto torchrun's environment (`RANK`, `WORLD_SIZE`,
    `LOCAL_RANK`, `env://`), two nodes, Slurm, `--backend nccl` and sharded
    checkpoints: the last section of assignment 06's notebook, and
    [06_to_a_cluster.md](../../assignments/06_composition/06_to_a_cluster.md).
    """)
    nb.given("job", """
    from autograder.checks.data_parallel import data_parallel_job
    """)
    nb.code("""
    # Your DDP as a job, in this notebook (2 forked ranks, 4 steps); torchrun prints the same losses.
    result = data_parallel_job(globals(), strategy="ddp", world_size=2, steps=4)
    """)
    nb.nccl_checks("""
    [
        ("all_reduce_gradients", check_all_reduce_gradients, (all_reduce_gradients,), {"world_size": 2}),
        ("BucketedDDP gradients", check_ddp_gradients, (BucketedDDP,), {"world_size": 2}),
        ("ZeRO step vs AdamW", check_zero_matches_optimizer, (ZeroShardedOptimizer,), {"world_size": 2}),
        ("FSDP numerics", check_fsdp_numerics, (fully_shard,), {"world_size": 2}),
    ]
    """)
    nb.markdown("""
    ## Done

    Run every cell from the top (Kernel → Restart & Run All) before you submit.
    The hidden tests run the same checks with other world sizes (1, 2, 4),
    shapes, seeds and dtypes, unused, frozen and tied parameters.
    """)
    return nb


if __name__ == "__main__":
    build().write(OUT)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
