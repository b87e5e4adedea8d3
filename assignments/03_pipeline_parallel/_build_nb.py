"""Build source/03_pipeline_parallel/pipeline_parallel_lab.ipynb (nbgrader source notebook) from code.

    .venv/bin/python assignments/03_pipeline_parallel/_build_nb.py
    .venv/bin/nbgrader generate_assignment 03_pipeline_parallel --force

Answer cells are cut from solutions/pipeline_parallel/ (p2p.py, schedules.py,
executor.py, split_backward.py and executor_zb.py: one source of truth); test
cells call the public checks in autograder/checks/pipeline_parallel/
(schedules.py, executor.py, split_backward.py, zero_bubble.py), with hidden
cases. Every visible test runs at a size where a message sent to the wrong
neighbour, a wrong peer or a wrong order shows (3 or 4 stages, a pipeline group
inside a larger world): tests/test_pipeline_parallel_notebook.py proves it with
the mutants.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autograder.authoring.nbbuild import NotebookBuilder, source_of  # noqa: E402
from solutions.pipeline_parallel import p2p as pp  # noqa: E402
from solutions.pipeline_parallel import executor  # noqa: E402
from solutions.pipeline_parallel import executor_zb  # noqa: E402
from solutions.pipeline_parallel import schedules as sched  # noqa: E402
from solutions.pipeline_parallel import split_backward  # noqa: E402

ASSIGNMENT = "03_pipeline_parallel"
LESSON = "../../assignments/03_pipeline_parallel"
OUT = os.path.join(ROOT, "source", ASSIGNMENT, "pipeline_parallel_lab.ipynb")


def build() -> NotebookBuilder:
    nb = NotebookBuilder(ASSIGNMENT)
    nb.markdown(f"""
    # 03 · Pipeline parallelism (PP)

    Pipeline parallelism splits a model **by layers**: rank `s` of a pipeline
    group of `p` ranks holds stage `s`, a consecutive block of layers. A batch
    is cut into `m` micro-batches; each stage sends its output activation to
    the next stage and, in backward, the gradient of its input to the previous
    one. Nothing else travels. You will implement, with real point-to-point
    communication between CPU processes (gloo), the core of Megatron-LM's
    `megatron/core/pipeline_parallel/`:

    1. the P2P helpers `send_forward`, `recv_forward`, `send_backward`, `recv_backward`;
    2. the GPipe and 1F1B schedules, as pure functions that return each stage's list of actions;
    3. `bubble_fraction`: how much of a step each rank idles;
    4. `run_pipeline`: the executor that runs a schedule with real sends and receives, without deadlock,
       and keeps only the activations its schedule needs;
    5. the interleaved 1F1B schedule (virtual pipeline stages), run by the same executor;
    6. the backward split in two: the input gradient (B) now, the weight gradient (W) later;
    7. ZB-H1, the zero-bubble schedule with 1F1B's memory, as data;
    8. DualPipeV, DeepSeek's V-shaped schedule with overlapped forward-and-backward pairs, as data;
    9. `run_pipeline_zb`: an executor of F, B, W and F&B actions that runs them all.

    Read first: the lesson [README.md]({LESSON}/README.md) ([the course overview](../../assignments/README.md)
    puts it beside the other dimensions). Deep dives:
    [01_schedules_as_data.md]({LESSON}/01_schedules_as_data.md) (exercises 2-3),
    [02_p2p_without_deadlock.md]({LESSON}/02_p2p_without_deadlock.md) (exercises 1 and 4),
    [03_memory.md]({LESSON}/03_memory.md) (exercise 4's memory test),
    [04_interleaving_and_zero_bubble.md]({LESSON}/04_interleaving_and_zero_bubble.md) (exercises 5-9).

    Conventions. A micro-batch is a tensor `[b, h]`, and every stage maps
    `[b, h]` to `[b, h]`, so a receiver knows the shape and dtype of what
    arrives without asking. Every function takes its pipeline group as the
    keyword `pp_group`; **peers are ranks of that group** (`pp_group.rank()`),
    never global ranks: the tests run a pipeline group inside a larger world.
    Invalid arguments raise `ValueError` on every rank *before* any
    communication, naming the sizes.

    How the tests work. Schedules are read without running anything: the
    tests check the properties that define each schedule and run all stages'
    lists together on an ideal timeline to prove they cannot deadlock.
    `run_pipeline` runs in real ranks on a model built by the test, whose
    stages are wrapped in a probe: it records, while your pipeline runs, which
    micro-batch each stage runs forward and backward and when, and (with weak
    references) how many stage outputs are still alive. Each rank returns its
    loss, its gradients, what the probe saw and its communication ledger; the
    verdict compares them with single-process training. A deadlock is a
    plausible mistake here: every run is stopped after **5 seconds** with each
    rank's Python stack, and your kernel keeps running. Stubs read
    `# TODO: implement (see the task description above).`
    """)
    nb.given("setup", """
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    from autograder.runtime import run_distributed, checking, CommLedger, format_trace
    from autograder.checks.pipeline_parallel import (
        TaggedStage, show_schedules, check_p2p_helpers, check_gpipe_schedule, check_one_f_one_b_schedule,
        check_bubble_fraction, check_run_pipeline, check_pipeline_memory, check_run_pipeline_errors,
        check_interleaved_schedule, plot_pipeline_timelines,
        check_split_backward, check_split_backward_memory, check_zb_h1_schedule, check_dualpipev_schedule,
        check_run_pipeline_zb, check_pipeline_zb_memory, plot_zb_timelines, torch_schedule_fn,
    )
    """)

    # -- given helpers and the worked example --------------------------------------
    nb.markdown("""
    ## Given: argument checks

    Read these; you will call them at the top of your functions, before any
    communication (the error contract). `_check_pipeline_args` also turns a
    schedule into `(kind, microbatch, chunk)` triples (chunk 0 when there is
    one module), so your executor has one format to read.
    """)
    nb.given("helpers", "\n\n\n".join([
        source_of(pp, "_group_size_rank", "_check_recv_args"),
        source_of(sched, "_check_schedule_args", "_check_positive_ints"),
        source_of(executor, "_check_pipeline_args"),
    ]))
    nb.markdown("""
    ## Worked example: what every schedule must compute

    Megatron-LM's `forward_backward_no_pipelining` (in `schedules.py`) runs the
    micro-batches one after another on one rank, forward then backward, and
    divides each loss by `m`: the gradients accumulated in `.grad` are those of
    the **mean** loss over the micro-batches, exactly as one backward of the
    whole batch. A pipeline computes the same numbers; it only moves the
    stages to different ranks and reorders the work. The cell after it checks
    the claim on a 3-stage model of the kind the tests use (`TaggedStage`:
    `y = x + mask * tanh(x W^T + b)`; column 0 of a micro-batch carries its
    number, and passes every stage unchanged).
    """)
    nb.given("worked_example", source_of(pp, "forward_backward_no_pipelining"))
    nb.given("worked_example_check", """
    def _tiny_model(seed=0, h=4, stages=3):
        g = torch.Generator().manual_seed(seed)
        return nn.Sequential(*[TaggedStage(torch.randn(h, h, generator=g, dtype=torch.float64) / 2,
                                           torch.randn(h, generator=g, dtype=torch.float64)) for _ in range(stages)])

    g = torch.Generator().manual_seed(1)
    batch = torch.randn(6, 4, generator=g, dtype=torch.float64)
    target = torch.randn(6, 4, generator=g, dtype=torch.float64)
    one, two = _tiny_model(), _tiny_model()
    F.mse_loss(one(batch), target).backward()  # the whole batch at once
    loss = forward_backward_no_pipelining(two, list(batch.chunk(3)), list(target.chunk(3)), F.mse_loss)
    same = all(torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-14) for a, b in zip(one.parameters(), two.parameters()))
    print(f"3 micro-batches of 2: mean loss {loss:.6f}; gradients equal to one backward of the batch: {same}")
    """)

    # -- exercise 1 ----------------------------------------------------------------
    nb.exercise(1, "the P2P helpers", """
    As Megatron-LM's `P2PCommunicator` (`p2p_communication.py`):

    | function | peer (a rank of `pp_group`) | blocks? | returns |
    |---|---|---|---|
    | `send_forward(tensor, *, pp_group)` | next: `(rank + 1) % p` | no: `dist.isend` | the send's handle |
    | `recv_forward(shape, dtype, *, pp_group, device=None)` | previous: `(rank - 1) % p` | yes: `dist.recv` | the received tensor |
    | `send_backward(tensor, *, pp_group)` | previous | no | the send's handle |
    | `recv_backward(shape, dtype, *, pp_group, device=None)` | next | yes | the received tensor |

    - Peers wrap around: rank `p - 1`'s next is rank 0 (the interleaved
      schedule of exercise 5 needs it). The executor decides when *not* to
      call them (the first stage receives no activation).
    - Peers are **group ranks**: pass them as `group_dst=` / `group_src=`
      (with `group=pp_group`); `dst=` / `src=` would be global ranks.
    - A send must not block. With gloo, a send completes only once the peer
      has posted the matching receive; if every rank first sends and then
      receives, blocking sends wait for each other forever. `dist.isend`
      posts the send and returns a handle; the caller waits it later.
    - A receive allocates `torch.empty(shape, dtype=dtype, device=device)` and
      fills it. The receiver must know the shape and dtype: a buffer of the
      wrong byte size aborts the process, one of the right size but the wrong
      shape silently receives garbage.
    - The tensor to send may be a non-contiguous view: send a contiguous copy.
    - Start each function with the given checks, before any communication:
      `_group_size_rank(pp_group, "send_forward")`, and in a receive also
      `dims = _check_recv_args(shape, dtype, "recv_forward")`.

    Why sends are posted and receives block, and what Megatron does instead on
    NCCL: [02_p2p_without_deadlock.md](../../assignments/03_pipeline_parallel/02_p2p_without_deadlock.md).
    """)
    nb.solution_from("p2p", pp, "_next_and_prev", "send_forward", "recv_forward", "send_backward", "recv_backward")
    nb.test("test_p2p_helpers", 7,
            doc="Around the ring: send_forward to the next group rank, recv_forward from the previous, and back; non-blocking sends.",
            visible="""
    check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, pp_ranks=[[1, 2, 3]], world_size=4)
    """, hidden="""
    check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, world_size=4, pp_ranks=[[0, 1, 3]],
                      shape=(2, 5), dtype=torch.float32, noncontiguous=True, seed=1)
    check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, world_size=4, seed=3)
    check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, world_size=4,
                      pp_ranks=[[0, 2], [1, 3]], shape=(4, 3), seed=2)
    """)
    nb.code("""
    # Scratch: pass a tensor around a ring of 3 ranks and look at the ledger (edit freely).
    def ring(rank, world_size):
        group = dist.group.WORLD
        with CommLedger() as ledger:
            handle = send_forward(torch.full((2, 3), float(rank)), pp_group=group)
            got = recv_forward((2, 3), torch.float32, pp_group=group)
            handle.wait()
        return got[0, 0].item(), ledger.records

    for rank, (value, records) in enumerate(run_distributed(ring, 3, timeout=5)):
        print(f"rank {rank} received {value} from rank {int(value)}")
        print(format_trace(records, rank))
    """)

    # -- exercise 2 ----------------------------------------------------------------
    nb.exercise(2, "GPipe and 1F1B as data", """
    A schedule is a pure function `(num_stages, stage, num_microbatches)` →
    the list of actions stage `stage` runs, in order: `("F", mb)` is the
    forward of micro-batch `mb`, `("B", mb)` its backward. No communication,
    no model: the executor of exercise 4 runs any such list.

    - `gpipe_schedule`: every forward, then every backward, both in
      micro-batch order (FIFO: the oldest micro-batch first).
    - `one_f_one_b_schedule` (Megatron-LM's
      `forward_backward_pipelining_without_interleaving`): a **warm-up** of
      `min(p - stage - 1, m)` forwards; then the **steady state**, one forward
      followed by one backward, while forwards remain; then the **cool-down**,
      the remaining backwards. Forwards and backwards both in micro-batch
      order. For p = 4, m = 8, stage 1 runs
      `F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7`.
    - First line: `_check_schedule_args(...)` (the given check).

    Why the last stage has no warm-up and stage s holds at most `p - s`
    micro-batches: [01_schedules_as_data.md](../../assignments/03_pipeline_parallel/01_schedules_as_data.md).
    """)
    nb.solution_from("schedules", sched, "gpipe_schedule", "one_f_one_b_schedule")
    nb.test("test_gpipe_schedule", 3,
            doc="GPipe: all forwards then all backwards, FIFO, on every stage; the stages run together without deadlock.",
            visible="""
    check_gpipe_schedule(gpipe_schedule)
    """, hidden="""
    check_gpipe_schedule(gpipe_schedule, cases=[(5, 7), (3, 1), (2, 2)])
    """)
    nb.test("test_1f1b_schedule", 7,
            doc="1F1B: warm-up min(p - s - 1, m), one forward / one backward, FIFO cool-down; no deadlock across stages.",
            visible="""
    check_one_f_one_b_schedule(one_f_one_b_schedule)
    """, hidden="""
    check_one_f_one_b_schedule(one_f_one_b_schedule, cases=[(5, 3), (4, 9), (2, 1), (6, 6), (3, 4)])
    """)
    nb.code("""
    # Scratch: every stage's list, and the idle fraction of an ideal timeline (forward 1, backward 2).
    show_schedules(one_f_one_b_schedule, num_stages=4, num_microbatches=8)
    """)

    # -- exercise 3 ----------------------------------------------------------------
    nb.exercise(3, "the bubble", """
    Run all stages' schedules together with every stage equally fast: stage
    s cannot start before s stages ahead of it have passed it a micro-batch,
    and it finishes `p - 1 - s` stages before the last backward is done. The
    fraction of the step that a rank idles is the same for GPipe and 1F1B:

    `bubble_fraction(num_stages, num_microbatches, num_chunks=1)` =
    `(p - 1) / (v·m + p - 1)`,

    where `v = num_chunks` is the number of model chunks per rank (exercise 5;
    1 here). This is idle time over the *whole step* (busy + idle); Narayanan et
    al.'s "bubble time fraction" `(p - 1) / (v·m)` divides by the busy time
    instead. First line: `_check_positive_ints(...)` on the three arguments.
    Derivation: [01_schedules_as_data.md](../../assignments/03_pipeline_parallel/01_schedules_as_data.md).
    """)
    nb.solution_from("bubble", sched, "bubble_fraction")
    nb.test("test_bubble_fraction", 3,
            doc="bubble_fraction(p, m, num_chunks=v) = (p - 1) / (v m + p - 1); ValueError below 1.",
            visible="""
    check_bubble_fraction(bubble_fraction)
    """, hidden="""
    check_bubble_fraction(bubble_fraction, cases=[(16, 64, 1), (8, 8, 4), (3, 1, 2), (2, 1000, 1)])
    """)

    # -- exercise 4 ----------------------------------------------------------------
    nb.exercise(4, "`run_pipeline`: execute a schedule", """
    `run_pipeline(stage_module, schedule, microbatches, targets, loss_fn, *, pp_group)`
    runs this rank's `schedule` with your P2P helpers. Every rank gets the same
    `microbatches` and `targets` lists; `stage_module` is this rank's stage (a
    module), or a list of its model chunks (exercise 5). It returns the mean
    loss over the micro-batches **as a Python float** on the last stage
    (group rank p - 1), `None` elsewhere; afterwards every parameter's `.grad`
    equals single-process training on the same micro-batches (the worked
    example). Start with the given checks:
    `size, rank = _group_size_rank(pp_group, "run_pipeline")` and
    `chunks, actions = _check_pipeline_args(stage_module, schedule, microbatches, targets)`.

    For each action, with `vstage = chunk * p + rank` (chunk 0 when there is one module):

    - `("F", mb, chunk)`: the input is `microbatches[mb]` on virtual stage 0,
      otherwise `recv_forward(...)` with the micro-batch's shape, dtype and
      device, made a leaf that requires grad (its `.grad` is what you send
      back). Run the chunk. On the last virtual stage compute
      `loss_fn(output, targets[mb]) / m` and keep it for backward; elsewhere keep the
      output and `send_forward` it. Keep the input too.
    - `("B", mb, chunk)`: on the last virtual stage, backward from the kept
      loss; elsewhere `recv_backward(...)` the output's gradient and
      `torch.autograd.backward(output, grad)`. Then, except on virtual stage 0,
      `send_backward` the input's `.grad`.
    - With `p == 1` and several chunks, chunk c's output is chunk c + 1's
      input on the same rank: pass it directly, as a new leaf
      (`.detach().requires_grad_()`), as a send would have cut the graph
      (a send to yourself crashes gloo).

    Deadlock-free on a blocking transport: **sends are posted, only receives
    block**. Keep every send handle and wait it before returning; a forward
    send's handle can be waited as soon as its gradient has arrived (by then
    the next stage received it long ago), which also lets it go early. Never
    `.wait()` a send right after posting it: two neighbours that both do that
    wait for each other.

    Memory is graded: the test counts (with weak references, after
    `gc.collect()`) the stage outputs your executor keeps alive each time a
    stage makes a new one. It must be exactly what the schedule needs (the
    micro-batches forwarded but not yet backwarded: `min(p - s, m)` at most
    under 1F1B), and zero after `run_pipeline` returns. So drop an output as
    soon as its backward has run: remove it from your dict, drop its send
    handle (a handle keeps its tensor, and with it the graph, alive), and do
    not leave it in a variable. Running each action in its own function, as
    Megatron's `forward_step` / `backward_step` do (the stubs below), lets
    Python drop the locals when the function returns. How executors go wrong
    and what Megatron does about memory:
    [02_p2p_without_deadlock.md](../../assignments/03_pipeline_parallel/02_p2p_without_deadlock.md),
    [03_memory.md](../../assignments/03_pipeline_parallel/03_memory.md).
    """)
    nb.solution_from("run_pipeline", executor, "_forward_step", "_backward_step", "run_pipeline")
    nb.test("test_run_pipeline_gpipe", 8,
            doc="GPipe through run_pipeline: loss and every gradient equal single-process; executed order and P2P as scheduled.",
            visible="""
    check_run_pipeline(run_pipeline, gpipe_schedule, num_stages=3, num_microbatches=3, world_size=4,
                       pp_ranks=[[0, 2, 3]])
    """, hidden="""
    check_run_pipeline(run_pipeline, gpipe_schedule, num_stages=3, num_microbatches=1, world_size=4,
                       pp_ranks=[[1, 2, 3]], seed=1)
    check_run_pipeline(run_pipeline, gpipe_schedule, num_stages=4, num_microbatches=2, dtype=torch.float32, seed=2)
    check_run_pipeline(run_pipeline, gpipe_schedule, num_stages=1, num_microbatches=2, seed=3)
    """)
    nb.test("test_run_pipeline_1f1b", 10,
            doc="1F1B through run_pipeline: loss and every gradient equal single-process; executed order and P2P as scheduled.",
            visible="""
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=3, num_microbatches=4, world_size=4,
                       pp_ranks=[[1, 2, 3]])
    """, hidden="""
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=3, num_microbatches=5, world_size=4,
                       pp_ranks=[[0, 1, 3]], seed=1)
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=4, num_microbatches=2, seed=2)
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=3, num_microbatches=1, seed=3)
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=2, num_microbatches=4, world_size=4,
                       pp_ranks=[[0, 2], [1, 3]], dtype=torch.float32, seed=4)
    check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=1, num_microbatches=3, seed=5)
    """)
    nb.test("test_pipeline_memory", 8,
            doc="Stage outputs kept alive: exactly what the schedule needs after every forward (1F1B: min(p - s, m)), none after.",
            visible="""
    check_pipeline_memory(run_pipeline, one_f_one_b_schedule, num_stages=3, num_microbatches=5, world_size=4,
                          pp_ranks=[[1, 2, 3]])
    """, hidden="""
    check_pipeline_memory(run_pipeline, one_f_one_b_schedule, num_stages=4, num_microbatches=7, seed=1)
    check_pipeline_memory(run_pipeline, gpipe_schedule, num_stages=3, num_microbatches=4, world_size=4,
                          pp_ranks=[[0, 2, 3]], seed=2)
    """)
    nb.test("test_run_pipeline_errors", 3,
            doc="Invalid arguments to run_pipeline raise ValueError on every rank before any communication.",
            visible="""
    check_run_pipeline_errors(run_pipeline, world_size=2)
    """)
    nb.markdown("""
    ### Picture: the schedules as they ran

    Each row is a rank; each box a forward (blue) or backward (orange) of the
    micro-batch it names, drawn from the times the probe recorded while *your*
    `run_pipeline` ran (stages that sleep 20 ms per forward and 40 ms per
    backward, so that a shared CPU shows the schedule rather than its load).
    Hatched: idle. The title gives the measured idle fraction beside
    `(p - 1) / (v m + p - 1)` from your `bubble_fraction`; the measured one is
    a little higher (each message takes a millisecond or so, which the
    formula ignores). The row labels give the most stage outputs each rank
    held at once: the same bubble, very different memory. Run it once
    exercise 4 passes.
    """)
    nb.code("""
    plot_pipeline_timelines(run_pipeline, [("GPipe", gpipe_schedule, 4, 8, 1), ("1F1B", one_f_one_b_schedule, 4, 8, 1)],
                            bubble_fraction=bubble_fraction)
    """)

    # -- exercise 5 ----------------------------------------------------------------
    nb.exercise(5, "interleaved 1F1B (virtual pipeline stages)", """
    Give each rank `v = num_chunks` non-consecutive model chunks: chunk c of
    rank r is **virtual stage `c·p + r`** of a pipeline of `p·v` stages, so a
    micro-batch visits every rank v times (after rank p - 1's chunk c comes
    rank 0's chunk c + 1: the wrap-around of your P2P helpers). Each chunk
    does 1/v of a stage's work, so the fill and drain shrink v times:
    `(p - 1) / (v·m + p - 1)`.

    `interleaved_1f1b_schedule(num_stages, stage, num_microbatches, num_chunks)`
    returns actions `("F", mb, chunk)` / `("B", mb, chunk)` in Megatron-LM's
    order (`forward_backward_pipelining_with_interleaving`, `get_schedule_table`
    and `get_pp_rank_microbatches` in `schedules.py`):

    - **forward order**: micro-batches in groups of `p`; each group goes
      through chunk 0, then chunk 1, ..., chunk v - 1, then the next group.
      For p = 2, m = 4, v = 2: `F0c0 F1c0 F0c1 F1c1 F2c0 F3c0 F2c1 F3c1`.
    - **backward order**: the same groups, each through the chunks **in
      reverse** (v - 1 first: the last virtual stage's backward comes first),
      micro-batches FIFO within a group: `B0c1 B1c1 B0c0 B1c0 B2c1 ...`.
    - **warm-up**: `min((p - stage - 1) * 2 + (v - 1) * p, m·v)` forwards of
      the forward order; then one forward, one backward alternately; then the
      remaining backwards (cool-down).
    - `ValueError` (before anything else): `num_microbatches` not a multiple
      of `num_stages` (Megatron's default configuration), `num_chunks < 2`
      (one chunk is plain 1F1B), and whatever `_check_schedule_args` rejects.

    Your `run_pipeline` must run these schedules with a list of chunks per
    rank (its text above says how, `p == 1` included). Why these orders, and
    what zero-bubble schedules do next:
    [04_interleaving_and_zero_bubble.md](../../assignments/03_pipeline_parallel/04_interleaving_and_zero_bubble.md).
    """)
    nb.solution_from("interleaved", sched, "interleaved_1f1b_schedule")
    nb.test("test_interleaved_schedule", 10,
            doc="Interleaved 1F1B: Megatron's forward/backward chunk orders and warm-up on every stage; no deadlock; ValueErrors.",
            visible="""
    check_interleaved_schedule(interleaved_1f1b_schedule)
    """, hidden="""
    check_interleaved_schedule(interleaved_1f1b_schedule, cases=[(4, 12, 3), (2, 2, 2), (1, 3, 2), (3, 6, 2), (2, 6, 4)])
    """)
    nb.test("test_run_pipeline_interleaved", 11,
            doc="run_pipeline with model chunks: loss and gradients equal single-process; executed order and P2P as scheduled.",
            visible="""
    check_run_pipeline(run_pipeline, interleaved_1f1b_schedule, num_stages=3, num_microbatches=6, num_chunks=2,
                       world_size=4, pp_ranks=[[1, 2, 3]])
    """, hidden="""
    check_run_pipeline(run_pipeline, interleaved_1f1b_schedule, num_stages=3, num_microbatches=3, num_chunks=3,
                       world_size=4, pp_ranks=[[1, 2, 3]], seed=1)
    check_run_pipeline(run_pipeline, interleaved_1f1b_schedule, num_stages=1, num_microbatches=2, num_chunks=3, seed=2)
    check_run_pipeline(run_pipeline, interleaved_1f1b_schedule, num_stages=4, num_microbatches=8, num_chunks=2, seed=3)
    check_run_pipeline(run_pipeline, interleaved_1f1b_schedule, num_stages=2, num_microbatches=2, num_chunks=3,
                       dtype=torch.float32, seed=4)
    """)
    nb.markdown("""
    ### Picture: interleaving shrinks the bubble, and costs memory and messages

    The same 4 ranks and 8 micro-batches as the 1F1B picture above, each
    rank now holding 2 chunks of half a stage's work (darker and lighter
    shades: chunk 0 and chunk 1). Compare the idle fraction with 1F1B's, the
    number of boxes (each a message sent and received) with 1F1B's 16 per
    rank, and the row labels: they count chunk outputs, each half a stage's
    activations, against 1F1B's 4, 3, 2, 1 whole-stage outputs. Run it once
    exercise 5 passes.
    """)
    nb.code("""
    plot_pipeline_timelines(run_pipeline, [("interleaved 1F1B", interleaved_1f1b_schedule, 4, 8, 2)],
                            bubble_fraction=bubble_fraction)
    """)
    # -- exercise 6 ----------------------------------------------------------------
    nb.exercise(6, "split the backward: B now, W later", """
    A stage's backward computes two things: the gradient of its **input**
    (B), which the previous stage is waiting for, and the gradients of its
    **weights** (W), which nothing needs until the optimizer step. A
    zero-bubble schedule runs them as two actions, W in what would otherwise
    be a bubble. Implement the split as PyTorch does
    (`stage_backward_input` / `stage_backward_weight` in
    `torch/distributed/pipelining/_backward.py`):

    - `backward_input(output, grad_output, inputs, params)` returns
      `(input_grads, w_state)`: the gradient of each tensor of `inputs` (a
      list; empty on the first stage, whose input is data), and whatever
      `backward_weight` will need. `output` is the stage's output and
      `grad_output` its gradient from the next stage; on the last stage
      `output` is the loss and `grad_output` is `None`. It changes **no**
      `.grad`: neither the parameters' nor the inputs'.
    - `backward_weight(w_state)` then **adds** each parameter's gradient to
      its `.grad` (as a full backward accumulates: the `.grad` may already
      hold an earlier micro-batch's), once.

    How, with the given `_weight_split_points(output, params)`: it returns,
    for every parameter, the autograd node where its gradient branches off
    (a linear layer's `AddmmBackward0`; the parameters that branch off there
    with it). The gradient flowing into that node, `dz`, is all its weights
    need (`dW = dz^T x`, `db = dz.sum(0)`; `x` is saved in the node).

    1. B: **one** `torch.autograd.grad(output, inputs + edges, grad_outputs=grad_output,
       retain_graph=True)`, where `edges = [GradientEdge(node, 0) for node, _ in points]`
       (`torch.autograd.graph.GradientEdge`: "the gradient of that node's
       output"): it returns the input gradients and every `dz`, and computes no
       weight gradient (autograd only runs what leads to what you ask for).
       `retain_graph=True`: W will run those nodes again.
    2. W: for each point, `torch.autograd.grad([GradientEdge(node, 0)], its_params,
       grad_outputs=[dz])` (from that node to its own parameters only: the
       layers above it are not run again), and accumulate into `.grad`.

    Memory is part of the test: once B has returned and the caller dropped the
    output, the output must be freed (your `w_state` keeps the nodes and the
    `dz`s, not the output), and after W nothing of the step may stay alive;
    the test also counts the FLOPs: B must compute no weight-gradient GEMM, W
    nothing else. Why the split, and how Megatron (`--delay-wgrad-compute`)
    and DeepSeek (`WeightGradStore`) do it inside their layers instead:
    [04_interleaving_and_zero_bubble.md](../../assignments/03_pipeline_parallel/04_interleaving_and_zero_bubble.md) §4-5.
    """)
    nb.given("weight_split_points", "from torch.autograd.graph import GradientEdge, get_gradient_edge\n\n\n"
             + source_of(split_backward, "_weight_split_points"))
    nb.solution_from("split_backward", split_backward, "backward_input", "backward_weight")
    nb.test("test_split_backward", 5,
            doc="B returns the input gradients and touches no .grad; W then accumulates exactly the full backward's weight gradients.",
            visible="""
    check_split_backward(backward_input, backward_weight)
    """, hidden="""
    check_split_backward(backward_input, backward_weight, cases=["linear layers without bias, a middle stage",
                         "three layers and a layer norm, a middle stage"], batch=5, seed=1)
    """)
    nb.test("test_split_backward_memory", 4,
            doc="B computes no weight-gradient GEMM and W nothing else (FLOPs); B frees the output's side, W frees the rest.",
            visible="""
    check_split_backward_memory(backward_input, backward_weight)
    """, hidden="""
    check_split_backward_memory(backward_input, backward_weight, cases=["three layers and a layer norm, a middle stage",
                                "linear layers without bias, a middle stage"], batch=5, seed=1)
    """)

    # -- exercise 7 ----------------------------------------------------------------
    nb.exercise(7, "ZB-H1 as data", """
    With B and W apart, a schedule has three kinds of actions: `("F", mb)`,
    `("B", mb)` (the input gradient, and the whole backward if the list has no
    W for it) and `("W", mb)`. ZB-H1 (Qi et al. 2024, their handcrafted
    schedule; the "ZB1P" of their README is what their automatic scheduler
    builds, the same list when `F = B - W = W`) is 1F1B with every backward
    split, and stage `s` running the W
    of backward `k` right after its backward `k + s`, the last `s` Ws at the
    end: stage 0 runs each W at once, the last stage defers `p - 1` of them
    into what was 1F1B's cool-down bubble. For p = 4, m = 8, stage 1 runs

    `F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7`.

    `zb_h1_schedule(num_stages, stage, num_microbatches)` returns that list
    (first line: `_check_schedule_args(...)`). The test checks, in this order:
    a valid list, no deadlock, memory (no stage keeps more micro-batches'
    activations, forwarded and not yet through their W, than 1F1B's busiest
    stage: `min(p, m)`), the bubble (on the ideal timeline, with a forward
    costing F, a whole backward B and its weight part W, every rank idles
    exactly `(p - 1)(F + B - 2W)`, against 1F1B's `(p - 1)(F + B)`), and the
    exact order PyTorch's `ScheduleInterleavedZeroBubble` runs with one stage
    per rank. Where the formula comes from:
    [04_interleaving_and_zero_bubble.md](../../assignments/03_pipeline_parallel/04_interleaving_and_zero_bubble.md) §6.
    """)
    nb.solution_from("zb_h1", sched, "zb_h1_schedule")
    nb.test("test_zb_h1_schedule", 4,
            doc="ZB-H1: every stage's F/B/W list is the order PyTorch's ScheduleInterleavedZeroBubble runs, its bubble (p - 1)(F + B - 2W), its memory 1F1B's.",
            visible="""
    check_zb_h1_schedule(zb_h1_schedule)
    """, hidden="""
    check_zb_h1_schedule(zb_h1_schedule, cases=[(2, 2), (5, 9), (6, 6), (3, 1), (1, 3)],
                         costs=[(1.0, 2.0, 0.5), (3.0, 4.0, 2.0)])
    """)
    nb.code("""
    # Scratch: ZB-H1's lists and its idle fraction on the ideal timeline (F = 1, B = 2 of which W = 1).
    show_schedules(zb_h1_schedule, num_stages=4, num_microbatches=8)
    """)

    # -- exercise 8 ----------------------------------------------------------------
    nb.exercise(8, "DualPipeV as data", """
    DeepSeek-V3's DualPipe feeds the pipeline from both ends; DualPipeV (its
    V-shaped cut, in DeepSeek's `DualPipe` repository and in PyTorch as
    `ScheduleDualPipeV`) keeps one direction and folds the model in a V: with
    `2p` stages on `p` ranks, rank `r` holds **chunk 0 = stage r** and
    **chunk 1 = stage 2p - 1 - r**. A micro-batch goes down the ranks through
    chunk 0, turns at the bottom (stages `p - 1` and `p` are both on rank
    `p - 1`), and comes back up through chunk 1: rank 0 holds both the first
    stage and the last (the loss).

    Actions: `("F", mb, c)`, `("B", mb, c)` (input gradient only if the list
    has `("W", mb, c)` later, else the whole backward), `("W", mb, c)`, and the
    **overlapped pair** `("F&B", ("F", mb, c), ("B", mb2, c2))`: a forward of one
    chunk and the whole backward of the other, which DualPipe runs together
    so that each one's communication hides behind the other's compute.

    `dualpipev_schedule(num_stages, stage, num_microbatches)` (`num_stages` =
    p ranks) returns rank `stage`'s list in the order `ScheduleDualPipeV`
    runs, in eight steps (counts per rank r; "F0" is a forward of chunk 0,
    micro-batches in order per kind and chunk):

    | step | repeat | actions |
    |---|---|---|
    | 1 | `2(p - r - 1)` | F0 |
    | 2 | `r + 1` | F0, F1 |
    | 3 | `p - r - 1` | B1 split (its W queued), the oldest queued W, F1 |
    | 4 | `m - 2p + r + 1` | pair (F0, B1), pair (F1, B0); on the last rank the very first pair is F0 then B1, not paired |
    | 5 | `p - r - 1` | B1, pair (F1, B0) |
    | 6 | `r + 1` | B1, B0: from iteration `(r + 1) // 2` on, split (W queued), from the B1 (odd r) or the B0 (even r) |
    | 7 | `p - r - 1` | the oldest queued W, B0 (split) |
    | 8 | `r + 1` | the oldest queued W (if any) |

    `ValueError` (first line `_check_schedule_args(...)`, then) below `2p`
    micro-batches. For p = 2, m = 4, rank 0 runs
    `F0c0 F1c0 F2c0 F0c1 B0c1 W0c1 F1c1 F3c0&B1c1 F2c1&B0c0 B2c1 F3c1&B1c0 B3c1 B2c0 W2c0 B3c0 W3c0`.
    The test compares every rank's list with PyTorch's, pair for pair. The
    schedule, its bubble and what F&B overlaps on a GPU:
    [04_interleaving_and_zero_bubble.md](../../assignments/03_pipeline_parallel/04_interleaving_and_zero_bubble.md) §7.
    """)
    nb.solution_from("dualpipev", sched, "dualpipev_schedule")
    nb.test("test_dualpipev_schedule", 4,
            doc="DualPipeV: every rank's F/B/W and F&B list is the order torch's ScheduleDualPipeV runs; no deadlock; ValueErrors.",
            visible="""
    check_dualpipev_schedule(dualpipev_schedule)
    """, hidden="""
    check_dualpipev_schedule(dualpipev_schedule, cases=[(2, 5), (4, 11), (5, 10), (3, 6), (6, 13)])
    """)
    nb.code("""
    # Scratch: DualPipeV's lists (F&B: an overlapped pair) and the ideal timeline's idle fraction.
    show_schedules(dualpipev_schedule, num_stages=4, num_microbatches=8, num_chunks=2, style="v")
    """)

    # -- exercise 9 ----------------------------------------------------------------
    nb.exercise(9, "`run_pipeline_zb`: execute F, B, W and F&B", """
    `run_pipeline_zb(stage_module, schedule, microbatches, targets, loss_fn, *, pp_group, style="loop")`
    is `run_pipeline` grown to these lists; it must run any of them: ZB-H1,
    DualPipeV, PyTorch's ZBV and interleaved zero-bubble lists, and the plain
    1F1B and interleaved lists (no W: every B whole). Start with
    `size, rank = _group_size_rank(pp_group, "run_pipeline_zb")` and the given
    `chunks, actions, deferred = _check_zb_args(stage_module, schedule, microbatches, targets, style, size)`:
    `actions` are `(kind, mb, chunk)` with every F&B pair replaced by its two
    halves (on a GPU they would overlap; here they run one after the other),
    `deferred` the `(mb, chunk)` whose B has a W later.

    - **Placement** (`_stage_of`, `_owner`): `style="loop"` puts chunk c of
      rank r on stage `c·p + r` (as before); `style="v"` (two chunks) on stage
      `r` and stage `2p - 1 - r`. The last stage (`v·p - 1`) computes the loss;
      the rank that holds it returns the mean loss as a float (rank p - 1 in
      the loop, **rank 0** in the V), the others `None`.
    - **F** as before, with the neighbours given by placement: stage 0 reads
      `microbatches[mb]`; otherwise the input comes from the rank that holds
      stage `k - 1`, by a receive, or, if that is this rank (the V's bottom,
      or p = 1), handed over locally as `output.detach().requires_grad_()`.
    - **B**: the output's gradient from the rank of stage `k + 1` (or locally;
      none on the last stage); if `(mb, chunk)` is in `deferred`,
      `backward_input(...)` (exercise 6) and keep its state for the W;
      otherwise the whole backward as before. Then the input's gradient to
      the rank of stage `k - 1` (or locally; not on stage 0).
    - **W**: `backward_weight` on the state its B kept, and drop it.
    - **Two streams, two tags.** In the V, activations and gradients travel
      between the same two ranks in the same direction (rank r sends chunk 0's
      activations and chunk 1's gradients to rank r + 1), and the two ranks do
      not post them in the same order. gloo hands a rank's messages to the
      receives from that rank in posting order *per tag*, so a gradient would
      land in a receive waiting for an activation (same shape: no error, wrong
      numbers). Send and receive with `dist.isend(..., group_dst=peer,
      tag=...)` / `dist.recv(..., group_src=peer, tag=...)`: `ACTIVATION_TAG` for
      activations, `GRADIENT_TAG` for gradients. Sends are posted, only
      receives block, every handle is waited before returning, as before.

    Graded: loss and gradients against single-process float64 (ZB-H1 and
    DualPipeV, p = 2, 3 and 4, several micro-batch counts, pipeline groups inside
    a larger world); the order in which each stage ran its F, B and W
    (recorded while it ran: a B that computes a weight gradient the list
    deferred fails); the P2P messages; and memory: after every forward,
    exactly the stage outputs still waiting for their B and the stage inputs
    still waiting for their W are alive (the inputs you received, and what
    the layers saved of them), no W state outlives its W (the gradients
    `backward_input` left for it), none of these after the step.
    """)
    nb.given("zb_helpers", source_of(executor_zb, "_check_zb_args"))
    nb.solution_from("run_pipeline_zb", executor_zb, "ACTIVATION_TAG", "GRADIENT_TAG", "_stage_of", "_owner",
                     "_zb_forward", "_zb_backward", "_zb_weight", "run_pipeline_zb")
    nb.test("test_run_pipeline_zb_h1", 5,
            doc="ZB-H1 and torch's interleaved zero-bubble lists through run_pipeline_zb: loss, gradients, executed F/B/W order, P2P.",
            visible="""
    check_run_pipeline_zb(run_pipeline_zb, zb_h1_schedule, num_stages=4, num_microbatches=6)
    check_run_pipeline_zb(run_pipeline_zb, torch_schedule_fn("zb_interleaved"), num_stages=2, num_microbatches=4,
                          num_chunks=2, world_size=3, pp_ranks=[[0, 2]])
    """, hidden="""
    check_run_pipeline_zb(run_pipeline_zb, zb_h1_schedule, num_stages=2, num_microbatches=3, seed=1)
    check_run_pipeline_zb(run_pipeline_zb, zb_h1_schedule, num_stages=4, num_microbatches=2, dtype=torch.float32, seed=2)
    check_run_pipeline_zb(run_pipeline_zb, zb_h1_schedule, num_stages=3, num_microbatches=5, world_size=4,
                          pp_ranks=[[0, 1, 3]], seed=3)
    check_run_pipeline_zb(run_pipeline_zb, zb_h1_schedule, num_stages=1, num_microbatches=3, seed=4)
    check_run_pipeline_zb(run_pipeline_zb, torch_schedule_fn("zb_interleaved"), num_stages=3, num_microbatches=6,
                          num_chunks=2, world_size=4, pp_ranks=[[1, 2, 3]], seed=5)
    """)
    nb.test("test_run_pipeline_dualpipev", 5,
            doc="DualPipeV (and ZBV) through run_pipeline_zb: V placement, loss, gradients, executed F/B/W and F&B order, P2P.",
            visible="""
    check_run_pipeline_zb(run_pipeline_zb, dualpipev_schedule, num_stages=3, num_microbatches=6, style="v", world_size=4,
                          pp_ranks=[[1, 2, 3]])
    """, hidden="""
    check_run_pipeline_zb(run_pipeline_zb, dualpipev_schedule, num_stages=4, num_microbatches=8, style="v", seed=6)
    check_run_pipeline_zb(run_pipeline_zb, dualpipev_schedule, num_stages=2, num_microbatches=4, style="v", seed=1)
    check_run_pipeline_zb(run_pipeline_zb, dualpipev_schedule, num_stages=2, num_microbatches=5, style="v",
                          world_size=4, pp_ranks=[[1, 3]], dtype=torch.float32, seed=2)
    check_run_pipeline_zb(run_pipeline_zb, dualpipev_schedule, num_stages=4, num_microbatches=10, style="v", seed=3)
    check_run_pipeline_zb(run_pipeline_zb, torch_schedule_fn("zbv"), num_stages=3, num_microbatches=6, style="v",
                          seed=4)
    """)
    nb.test("test_pipeline_zb_memory", 3,
            doc="run_pipeline_zb keeps each output until its B and each W's inputs until that W, nothing after the step.",
            visible="""
    check_pipeline_zb_memory(run_pipeline_zb, zb_h1_schedule, num_stages=3, num_microbatches=5)
    check_pipeline_zb_memory(run_pipeline_zb, dualpipev_schedule, num_stages=2, num_microbatches=5, style="v",
                             world_size=3, pp_ranks=[[1, 2]])
    """, hidden="""
    check_pipeline_zb_memory(run_pipeline_zb, dualpipev_schedule, num_stages=4, num_microbatches=8, style="v", seed=1)
    check_pipeline_zb_memory(run_pipeline_zb, zb_h1_schedule, num_stages=4, num_microbatches=7, world_size=4,
                             pp_ranks=[[0, 1, 2, 3]], seed=2)
    """)
    nb.markdown("""
    ### Picture: the zero-bubble schedules as they ran

    ZB-H1 and DualPipeV on 4 ranks, as *your* `run_pipeline_zb` ran them, on
    stages that sleep F = 20 ms per forward, 20 ms for the input gradient B
    and 20 ms for the weights W (a whole backward 40 ms): blue forwards,
    orange Bs, green Ws, lighter for chunk 1 (a whole backward shows as its B
    then its W). Compare the hatched idle time with the 1F1B picture above
    (same costs, 27 % idle on the ideal timeline): ZB-H1 fills the cool-down
    with the deferred Ws (11 % ideal), DualPipeV also shrinks the fill by
    starting the way back (chunk 1) early (6 % ideal). The measured idle is
    higher than the ideal one, DualPipeV's most: its chunks are half a stage
    (10 ms) and it sends twice the messages, so what a message costs on a
    shared CPU (and the first message between two ranks, which opens their
    connection) shows more. The row labels give the most
    micro-batches each rank kept activations for: ZB-H1 holds p on every
    rank (1F1B's stage 0), DualPipeV 2p + 1 chunks of half a stage each (its
    price). Run it once exercise 9 passes.
    """)
    nb.code("""
    plot_zb_timelines(run_pipeline_zb, [("ZB-H1", zb_h1_schedule, 4, 8, "loop"),
                                        ("DualPipeV", dualpipev_schedule, 4, 8, "v")])
    """)
    # -- your code as a job (not graded) -----------------------------------------------------
    nb.markdown("""
    ## Your code as a job: `torchrun` (not graded)

    Every test above ran in ranks this notebook forked (`run_distributed`). On
    a cluster a launcher starts one process per rank instead, and your code is
    the same. `pipeline_job` (the cell below imports it) trains one stage per rank with your `one_f_one_b_schedule` (or `gpipe_schedule`) and your `run_pipeline`. Export your
    notebook's code (answer and given cells, definitions only) as a script and
    start it with torchrun:

    ```bash
    python -m autograder.runtime.launch export pipeline_parallel_lab.ipynb --out train_03.py   # save the notebook first
    torchrun --standalone --nproc-per-node 4 train_03.py --stages 4 --schedule 1f1b
    python train_03.py --help                                               # the job's options
    ```

    It prints `step N loss X`: the same numbers as the cell below, bit for bit.
    How the runner maps onto torchrun's environment (`RANK`, `WORLD_SIZE`,
    `LOCAL_RANK`, `env://`), two nodes, Slurm, `--backend nccl` and sharded
    checkpoints: the last section of assignment 06's notebook, and
    [06_to_a_cluster.md](../../assignments/06_composition/06_to_a_cluster.md).
    """)
    nb.given("job", """
    from autograder.checks.pipeline_parallel import pipeline_job
    """)
    nb.code("""
    # Your pipeline as a job, in this notebook (2 forked ranks, 4 steps); torchrun prints the same losses.
    result = pipeline_job(globals(), stages=2, microbatches=4, schedule="1f1b", steps=4)
    """)
    nb.nccl_checks("""
    [
        ("P2P helpers", check_p2p_helpers, (send_forward, recv_forward, send_backward, recv_backward),
         {"world_size": 2}),
        ("1F1B run_pipeline", check_run_pipeline, (run_pipeline, one_f_one_b_schedule),
         {"world_size": 2, "num_stages": 2, "num_microbatches": 3}),
        ("interleaved run_pipeline", check_run_pipeline, (run_pipeline, interleaved_1f1b_schedule),
         {"world_size": 2, "num_stages": 2, "num_microbatches": 4, "num_chunks": 2}),
    ]
    """)
    nb.markdown("""
    ## Done

    Run every cell from the top (Kernel → Restart & Run All) before you submit.
    The hidden tests run the same checks on other cases: pipeline groups
    inside a larger world (group ranks differ from global ranks), 1 to 6
    stages, one micro-batch, fewer micro-batches than stages, float32,
    interleaving with one rank or three chunks, a layer norm in the split
    backward, and PyTorch's ZBV and interleaved zero-bubble lists through
    `run_pipeline_zb`.
    """)
    return nb


if __name__ == "__main__":
    build().write(OUT)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
