"""The distributed runner under the faults a student submission can cause.

    .venv/bin/python -m pytest -q tests/test_dist.py

Each fault must end within its bound, say which rank failed and how, keep the
ranks' output off the caller's stderr, and leave no process behind.
"""

import contextlib
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from autograder.runtime.dist import DistributedError, run_distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _children() -> list[int]:
    """PIDs of live (non-zombie) processes whose parent is this process (Linux /proc)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            out.append(int(name))
    return out


@pytest.fixture(autouse=True)
def no_orphans():
    before = set(_children())
    yield
    deadline = time.monotonic() + 2
    while set(_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(_children()) - before == set(), "rank processes were left behind"


# --- rank programs (module level, so the spawn path can send them by reference) ---

def _sum_ranks(rank, world_size, base):
    t = torch.full((3,), float(rank)) + base
    dist.all_reduce(t)
    print(f"rank {rank} says hello")
    return {"rank": rank, "sum": t}


def _raise_on_1(rank, world_size):
    if rank == 1:
        raise ValueError("student bug on rank 1")
    dist.barrier()


def _exit_3(rank, world_size):
    if rank == 0:
        os._exit(3)
    dist.barrier()


def _segfault(rank, world_size):
    if rank == 1:
        import ctypes

        ctypes.string_at(0)
    dist.barrier()


def _deadlock(rank, world_size):
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)  # both ranks wait for the other: a classic P2P deadlock


def _noisy(rank, world_size):
    sys.stderr.write("x" * (10 * 2**20))
    sys.stderr.flush()
    os.write(2, b"raw fd 2 output\n")
    return rank


def _matmul(rank, world_size):
    a = torch.randn(256, 256)
    return float((a @ a).sum())


# --- tests ---

@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_returns_results_in_rank_order(world_size):
    out = run_distributed(_sum_ranks, world_size, args=(1.0,))
    expected = sum(range(world_size)) + world_size
    assert [o["rank"] for o in out] == list(range(world_size))
    for o in out:
        assert torch.equal(o["sum"], torch.full((3,), float(expected)))


def test_a_rank_that_raises_is_named_with_its_traceback_fast():
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_raise_on_1, 2, timeout=30)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert elapsed < 3, f"took {elapsed:.1f} s to report a failed rank"
    assert "rank 1 raised an exception" in msg
    assert "ValueError: student bug on rank 1" in msg
    assert "_raise_on_1" in msg  # the traceback points at the student's code
    assert info.value.failures[0].rank == 1  # the root cause is listed first


def test_a_rank_that_calls_os_exit_is_named():
    with pytest.raises(DistributedError) as info:
        run_distributed(_exit_3, 2, timeout=30)
    msg = str(info.value)
    assert "rank 0 died: exited with status 3" in msg


def test_a_rank_that_segfaults_is_named_with_its_stack():
    with pytest.raises(DistributedError) as info:
        run_distributed(_segfault, 2, timeout=30)
    msg = str(info.value)
    assert "rank 1 died: killed by SIGSEGV (segmentation fault)" in msg
    assert "_segfault" in msg  # faulthandler's stack shows where


def test_a_deadlock_is_reported_within_seconds_with_where_each_rank_waits():
    """Every rank blocked and idle: reported after ~2 s of idleness, long before the 20 s timeout."""
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_deadlock, 2, timeout=20)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert elapsed < 10, f"a deadlock took {elapsed:.1f} s to report"
    assert "deadlock" in msg and "none made progress in between" in msg
    assert "ranks 0, 1: each was blocked in recv (torch.distributed)" in msg
    assert "in _deadlock" in msg and "dist.recv(t, src=1 - rank)" in msg  # the student's blocking line


# --- a pipeline's point-to-point mistakes (assignment 03's two classic bugs, in a generic rank program) ---

def _send_next(t):
    r, w = dist.get_rank(), dist.get_world_size()
    return dist.isend(t, (r - 1) % w)  # the bug: the previous rank, not the next


def _recv_prev(shape):
    r, w = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(shape)
    dist.recv(buf, (r - 1) % w)
    return buf


def _wrong_peer_stage(rank, world_size):
    x = torch.ones(2, 3)
    if rank > 0:
        x = _recv_prev((2, 3))
    if rank < world_size - 1:
        _send_next(x).wait()
    return rank


def test_a_send_to_the_wrong_peer_names_the_sends_and_receives_without_a_partner():
    """3 ranks (at 2 the previous rank is the next one: the bug is invisible there)."""
    with pytest.raises(DistributedError) as info:
        run_distributed(_wrong_peer_stage, 3, timeout=20)
    msg = str(info.value)
    first = msg.split("\n\n", 1)[0]  # the summary: the unmatched pairs come before the ranks' stacks
    assert "deadlock" in first
    assert "rank 0: send #1 to rank 2 ([2, 3] float32, tag 0) at test_dist.py:" in first
    assert "in _send_next: rank 2 never receives from rank 0" in first
    assert "rank 1: receive #1 from rank 0 ([2, 3] float32, tag 0)" in first and "rank 0 never sends to rank 1" in first
    assert "rank 2: receive #1 from rank 1" in first and "rank 1 never sends to rank 2" in first
    # the send that reached a rank waiting for another sender, and the line that posted it, quoted
    assert "rank 0 sends to rank 2, which waits to receive from rank 1 instead ([2, 3] float32, tag 0 on both " \
           "sides): the send (at test_dist.py:" in first and "in _send_next) or the receive" in first
    assert "The lines of your code that posted them (sends first):\n  test_dist.py:" in first and \
        "in _send_next (called from test_dist.py:" in first and \
        "    return dist.isend(t, (r - 1) % w)  # the bug: the previous rank, not the next" in first
    # each blocked rank's chain of frames, outermost first: the stage, then the helper and its receive
    chain = msg[msg.index("ranks 1, 2: each was blocked in recv (torch.distributed), called from your code"):]
    assert chain.index("in _wrong_peer_stage") < chain.index("x = _recv_prev((2, 3))") \
        < chain.index("in _recv_prev") < chain.index("dist.recv(buf, (r - 1) % w)"), chain


def test_the_unmatched_section_merges_repeats_per_rank_and_quotes_the_lines_that_posted_them(tmp_path):
    """A ring of 4 whose ranks send to and receive from the same neighbour, twice each (interleaved, as
    batch_isend_irecv posts them): one entry per rank and direction, the send that reached a rank waiting for
    another sender, and the line that posted them, quoted once (from the journals alone: no ranks run)."""
    import json

    from autograder.runtime.dist import _unmatched_p2p

    for r in range(4):
        with open(tmp_path / f"rank{r}.p2p", "w") as f:
            for _ in range(2):
                for op in ("send", "recv"):
                    f.write(json.dumps({"op": op, "peer": (r + 1) % 4, "tag": 0, "shape": [2, 3], "dtype": "float64",
                                        "where": "Cell In[8], line 16, in ring_send_recv",
                                        "line": "return dist.batch_isend_irecv(ops), received",
                                        "caller": "Cell In[8], line 37, in ring_attention_forward"}) + "\n")
    text = _unmatched_p2p(str(tmp_path), 4)
    lines = text.splitlines()
    assert lines[0].startswith("Sends and receives without a partner when the ranks stopped")
    for r in range(4):
        n = (r + 1) % 4
        assert f"  rank {r}: sends #1-#2 to rank {n} ([2, 3] float64, tag 0) at Cell In[8], line 16, in " \
               f"ring_send_recv: rank {n} never receives from rank {r}" in lines, text
        assert f"  rank {r}: receives #1-#2 from rank {n} ([2, 3] float64, tag 0) at Cell In[8], line 16, in " \
               f"ring_send_recv: rank {n} never sends to rank {r}" in lines, text
    assert "  rank 0 sends to rank 1, which waits to receive from rank 2 instead ([2, 3] float64, tag 0 on both " \
           "sides): the send or the receive (both at Cell In[8], line 16, in ring_send_recv) names the wrong peer" \
        in lines, text
    assert lines[-3:] == ["The lines of your code that posted them (sends first):",
                          "  Cell In[8], line 16, in ring_send_recv (called from Cell In[8], line 37, in "
                          "ring_attention_forward)",
                          "    return dist.batch_isend_irecv(ops), received"], text
    assert "" not in lines  # one paragraph: the summary's first part, before the ranks' stacks


def _recv_next(shape):
    r, w = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(shape)
    dist.recv(buf, (r + 1) % w)
    return buf


def _send_prev(t):
    r, w = dist.get_rank(), dist.get_world_size()
    return dist.isend(t, (r - 1) % w)


def _backward_step(rank, world_size, y):
    grad = torch.ones_like(y) if rank == world_size - 1 else _recv_prev(y.shape)  # the bug: _recv_next
    if rank > 0:
        _send_prev(grad).wait()


def _backward_receives_forward(rank, world_size):
    x = torch.ones(4) if rank == 0 else _recv_prev((4,))
    y = 2 * x
    if rank < world_size - 1:
        dist.isend(y, rank + 1).wait()
    _backward_step(rank, world_size, y)
    return rank


def test_a_backward_that_receives_from_the_wrong_side_shows_each_ranks_chain_and_the_unmatched_send():
    """4 stages: the backward receives the gradient the way the forward receives activations."""
    with pytest.raises(DistributedError) as info:
        run_distributed(_backward_receives_forward, 4, timeout=20)
    msg = str(info.value)
    first = msg.split("\n\n", 1)[0]
    assert "rank 3: send #1 to rank 2 ([4] float32, tag 0)" in first and "in _send_prev" in first
    assert "rank 2 posted only 1 receive(s) from rank 3" not in first  # rank 2 never received from rank 3
    assert "rank 2 never receives from rank 3" in first
    assert "rank 2: receive #2 from rank 1 ([4] float32, tag 0)" in first and \
        "rank 1 posted only 1 send(s) to rank 2" in first
    # the chain names the wrong call (the backward step's receive), not only the receive inside the helper
    assert "in _backward_step" in msg and "else _recv_prev(y.shape)  # the bug: _recv_next" in msg
    rank2 = msg[msg.index("ranks 0, 1, 2: each was blocked in recv (torch.distributed), called from your code "
                          "(outermost first):"):]
    assert rank2.index("in _backward_receives_forward") < rank2.index("in _backward_step") \
        < rank2.index("in _recv_prev") < rank2.index("dist.recv(buf, (r - 1) % w)"), rank2


def _spin(rank, world_size):
    end = time.monotonic() + 30
    while time.monotonic() < end:
        pass


def test_a_busy_rank_past_the_timeout_is_stopped_with_its_stack():
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_spin, 2, timeout=2)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert elapsed >= 2  # 2 CPU-seconds each take at least 2 s of the clock (longer on a busy machine)
    assert "computed for 2 CPU-seconds without finishing" in msg  # the first rank to use it, or both
    assert "in _spin" in msg


def _slow_compute(rank, world_size):
    x = torch.randn(300, 300)
    end = time.monotonic() + 3.0  # longer than the idle window: busy, not deadlocked
    while time.monotonic() < end:
        x = torch.tanh(x @ x.T / 300)
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def test_a_slow_but_working_run_is_not_taken_for_a_deadlock():
    assert run_distributed(_slow_compute, 2, timeout=30) == [2.0, 2.0]


def test_rank_output_stays_off_the_callers_stderr(capfd):
    out = run_distributed(_noisy, 2, timeout=30)
    assert out == [0, 1]
    captured = capfd.readouterr()
    assert captured.err == ""
    assert "xxxx" not in captured.out


def test_output_is_shown_on_request(capfd):
    run_distributed(_sum_ranks, 2, args=(0.0,), show_output=True)
    captured = capfd.readouterr()
    assert "rank 0 says hello" in captured.out and "rank 1 says hello" in captured.out
    assert captured.err == ""


def test_failure_message_includes_a_bounded_tail_of_output():
    def noisy_then_fail(rank, world_size):
        print("y" * 100_000)
        raise RuntimeError("after printing")

    with pytest.raises(DistributedError) as info:
        run_distributed(noisy_then_fail, 2)
    msg = str(info.value)
    assert "earlier bytes not shown" in msg and len(msg) < 20_000


def test_forked_ranks_do_not_hang_after_the_parent_used_its_thread_pool():
    torch.randn(512, 512) @ torch.randn(512, 512)  # the parent's OpenMP pool is now warm (spec 6)
    out = run_distributed(_matmul, 2, timeout=30)
    assert len(out) == 2


def test_many_runs_in_one_process_use_fresh_rendezvous():
    for _ in range(10):
        out = run_distributed(_sum_ranks, 2, args=(0.0,))
        assert torch.equal(out[0]["sum"], torch.full((3,), 1.0))


def test_unpicklable_return_value_is_reported():
    def returns_a_lambda(rank, world_size):
        return lambda: 1

    with pytest.raises(DistributedError, match="cannot be sent back"):
        run_distributed(returns_a_lambda, 2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        run_distributed(_sum_ranks, 0)
    with pytest.raises(ValueError, match="start_method"):
        run_distributed(_sum_ranks, 2, args=(0.0,), start_method="forkserver")


def test_spawn_runs_a_function_defined_in_main_of_a_script_without_a_guard(tmp_path):
    """The spawn path (macOS, CUDA) sends __main__-defined code by value; no main guard needed."""
    script = tmp_path / "student_script.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from autograder.runtime.dist import run_distributed

        class Doubler:                      # a class defined in __main__, as in a notebook cell
            def __call__(self, t):
                return 2 * t

        def program(rank, world_size, op):
            t = op(torch.ones(2) * (rank + 1))
            dist.all_reduce(t)
            return t

        out = run_distributed(program, 2, args=(Doubler(),), start_method="spawn", timeout=60)
        print("RESULT", out[0].tolist(), out[1].tolist())
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    assert "RESULT [6.0, 6.0] [6.0, 6.0]" in proc.stdout
    assert proc.stderr == ""


def test_the_timeout_starts_once_every_rank_has_started():
    """Spawned ranks (macOS) each import torch (seconds): that is the start-up's own limit, not the run's."""
    from autograder.runtime.report import checking

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        with checking("Exercise 0", "a spawned run with a timeout shorter than its start-up"):
            out = run_distributed(_sum_ranks, 2, args=(0.0,), start_method="spawn", timeout=1.0)
    assert [o["rank"] for o in out] == [0, 1]
    line = buf.getvalue()
    assert "passed (world size 2, " in line and " s of it starting the ranks)" in line, line


def test_a_start_past_its_limit_is_reported_as_such(monkeypatch):
    import autograder.runtime.dist as runtime_dist

    monkeypatch.setattr(runtime_dist, "STARTUP_TIMEOUT_S", 0.2)
    t0 = time.monotonic()
    with pytest.raises(runtime_dist.InconclusiveRun) as info:  # not a verdict on the code: the machine's
        run_distributed(_sum_ranks, 2, args=(0.0,), start_method="spawn", timeout=30)
    msg = str(info.value)
    assert time.monotonic() - t0 < 5
    assert "inconclusive" in msg and "did not all start within 0.2 s" in msg and "your code had not begun" in msg
    assert "not a verdict on your code" in msg


def test_the_start_method_can_be_forced_to_spawn(monkeypatch):
    from autograder.runtime.dist import default_start_method

    monkeypatch.setenv("AUTOGRADER_START_METHOD", "spawn")
    assert default_start_method() == ("spawn")
    monkeypatch.setenv("AUTOGRADER_START_METHOD", "fork")
    assert default_start_method() == ("fork" if sys.platform.startswith("linux") else "spawn")
    assert default_start_method("nccl") == "spawn"


def test_spawn_reports_a_failing_rank():
    with pytest.raises(DistributedError, match="student bug on rank 1"):
        run_distributed(_raise_on_1, 2, start_method="spawn", timeout=60)


def _mismatched_dtypes(rank, world_size):
    dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))


def test_ranks_calling_a_collective_with_different_dtypes_get_a_clear_error():
    """Without the agreement check gloo aborts a rank (SIGABRT) or returns wrong numbers (spec 6)."""
    with pytest.raises(DistributedError) as info:
        run_distributed(_mismatched_dtypes, 2, timeout=30)
    msg = str(info.value)
    assert "collective #1 on the group of ranks [0, 1] differs between ranks" in msg
    assert "rank 0: all_reduce of [4] float32, called at test_dist.py" in msg
    assert "rank 1: all_reduce of [4] float64, called at test_dist.py" in msg
    assert "SIGABRT" not in msg and "CollectiveFingerPrint" not in msg
    assert "rank 0 raised an exception, and rank(s) 1 the same one" in msg  # one message, not two


def _different_shapes_same_bytes(rank, world_size):
    dist.all_reduce(torch.ones(2, 3) if rank == 0 else torch.ones(3, 2))


def test_same_bytes_different_shapes_are_caught_before_gloo_runs():
    """gloo would run this without an error; the ledger of shapes must agree first."""
    with pytest.raises(DistributedError, match=r"all_reduce of \[2, 3\] float32.*\n.*all_reduce of \[3, 2\]"):
        run_distributed(_different_shapes_same_bytes, 2, timeout=30)


def _skips_a_collective(rank, world_size):
    t = torch.ones(3)
    if rank != 1:
        dist.all_reduce(t)
    return t


def test_a_rank_that_skips_a_collective_is_named():
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_skips_a_collective, 3, timeout=30)
    msg = str(info.value)
    assert time.monotonic() - t0 < 5
    assert "not every rank called it" in msg
    assert "rank 1: returned from its rank program after 0 collective(s) on this group" in msg
    assert "rank 0: all_reduce of [3] float32" in msg and "rank 2: all_reduce of [3] float32" in msg
    assert "BARRIER" not in msg and "barrier" not in msg  # the runner's own synchronisation is never blamed


def _order_mismatch(rank, world_size):
    sub = dist.new_group([0, 1])
    a, b = torch.ones(2), torch.ones(5)
    if rank == 0:
        dist.all_reduce(a, group=sub)
        dist.broadcast(b, src=0, group=sub)
    else:
        dist.broadcast(b, src=0, group=sub)
        dist.all_reduce(a, group=sub)


def test_collectives_in_a_different_order_on_a_subgroup():
    with pytest.raises(DistributedError) as info:
        run_distributed(_order_mismatch, 2, timeout=30)
    msg = str(info.value)
    assert "collective #1 on the group of ranks [0, 1] differs between ranks" in msg
    assert "rank 0: all_reduce of [2] float32" in msg and "rank 1: broadcast of [5] float32" in msg


def _all_stubs(rank, world_size):
    raise NotImplementedError()


def test_ranks_failing_identically_are_reported_once():
    with pytest.raises(DistributedError) as info:
        run_distributed(_all_stubs, 4)
    msg = str(info.value)
    assert "rank 0 raised an exception, and rank(s) 1, 2, 3 the same one (`_all_stubs` is still a stub" in msg
    assert msg.count("raise NotImplementedError()") == 1
    assert [f.rank for f in info.value.failures] == [0, 1, 2, 3]
    assert info.value.stub == "_all_stubs"


def _torch_error_on_1(rank, world_size):
    if rank == 1:
        torch.ones(3) @ torch.ones(4)
    dist.barrier()


def test_only_the_students_frames_unless_internals_are_asked_for():
    from autograder.runtime.report import show_internals

    with pytest.raises(DistributedError) as info:
        run_distributed(_torch_error_on_1, 2, timeout=30)
    msg = str(info.value)
    assert "in your code (innermost last):" in msg and "torch.ones(3) @ torch.ones(4)" in msg
    assert "site-packages" not in msg and "autograder" not in msg.split("\n", 1)[1]
    assert "rank 0 did not finish because another rank failed: it was blocked in barrier" in msg
    show_internals(True)
    try:
        with pytest.raises(DistributedError) as info:
            run_distributed(_torch_error_on_1, 2, timeout=30)
    finally:
        show_internals(False)
    assert "Traceback (most recent call last)" in str(info.value)


def test_failures_are_listed_in_the_same_order_every_run():
    orders = set()
    for _ in range(3):
        with pytest.raises(DistributedError) as info:
            run_distributed(_all_stubs, 3)
        orders.add(tuple(f.rank for f in info.value.failures))
    assert orders == {(0, 1, 2)}


def _non_contiguous(rank, world_size):
    x = torch.ones(4, 6).t()  # a transposed view
    dist.all_reduce(x)


def test_a_non_contiguous_tensor_given_to_a_collective_is_named():
    """gloo would accept it (NCCL would not): the runner says so, with the student's line, on every backend."""
    with pytest.raises(DistributedError) as info:
        run_distributed(_non_contiguous, 2, timeout=30)
    msg = str(info.value)
    assert "rank 0 raised an exception, and rank(s) 1 the same one" in msg
    assert "NonContiguousTensor: all_reduce was given a non-contiguous tensor (shape [6, 4], strides (1, 6))" in msg
    assert "in _non_contiguous" in msg and ".contiguous()" in msg


def _leaves_children(rank, world_size, seconds):
    import subprocess

    subprocess.Popen(["sleep", seconds])  # outlives the rank program unless the runner kills it
    return rank


def test_processes_a_rank_started_do_not_outlive_the_call():
    # a duration no other process on the machine sleeps for (a `sleep 60` of someone else's is not a leak)
    seconds = f"60.{os.getpid():07d}{time.monotonic_ns() % 10**6:06d}"
    out = run_distributed(_leaves_children, 2, args=(seconds,), timeout=30)
    assert out == [0, 1]
    # killed when the call returns; the kernel may take a moment to end them on a loaded machine (a leak is a
    # `sleep` still there seconds later)
    deadline = time.monotonic() + 5
    while True:
        mine = _running(f"sleep {seconds}")
        if not mine or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not mine, f"processes started by the ranks are still running 5 s after the call: {mine}"


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _running(cmd: str) -> list[int]:
    """Live processes on this machine whose command line is exactly `cmd`, wherever they are in the tree."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if _cmd(int(name)).strip() == cmd:
                    out.append(int(name))
            except OSError:
                continue
    return out


def _idle_outside_communication(rank, world_size):
    time.sleep(60)  # neither computing nor waiting on a peer: no evidence before the stall rule's 20 s


def _one_rank_sleeps(rank, world_size):
    import torch
    import torch.distributed as dist

    if rank == 1:
        time.sleep(1000)  # the others wait for it in the all-reduce
    dist.all_reduce(torch.ones(2))


def _naps_then_finishes(rank, world_size):
    import torch
    import torch.distributed as dist

    time.sleep(3)  # asleep, but shorter than the stall rule's 10 s: not a stall
    dist.all_reduce(torch.ones(2))
    return rank


def test_ranks_that_sleep_are_stopped_on_the_scheduler_s_record_naming_the_sleep():
    """A rank asleep in the student's code (not waiting on its peers, so no deadlock on the stacks) while the
    others wait for it: once, for 10 s, no rank ran, made progress or waited for a CPU, the run is stopped
    with each rank's stack. A short nap is not a stall."""
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_one_rank_sleeps, 4, timeout=5)
    seconds = time.monotonic() - t0
    msg = str(info.value)
    assert 10 <= seconds < 40, seconds
    assert "stopped: for 10 s none of them ran, made progress or waited for a CPU" in msg, msg
    assert "time.sleep(1000)  # the others wait for it" in msg and "ranks 0, 2, 3: each was blocked in all_reduce" in msg, msg
    assert "deadlock" not in msg and "inconclusive" not in msg
    assert run_distributed(_naps_then_finishes, 2, timeout=5) == [0, 1]


def test_a_run_neither_finished_nor_judged_is_inconclusive_never_a_failure(monkeypatch):
    """Past the wall-clock backstop without evidence (no exception, no CPU budget used, no rank waiting on its
    peers) the run is not decided: InconclusiveRun, shown in a test cell as NOT DECIDED, never FAILED."""
    from autograder.runtime.dist import InconclusiveRun
    from autograder.runtime.report import checking

    monkeypatch.setenv("AUTOGRADER_BACKSTOP_S", "3")
    t0 = time.monotonic()
    with pytest.raises(InconclusiveRun) as info:
        with checking("Exercise 0", "a run that only sleeps"):
            run_distributed(_idle_outside_communication, 2, timeout=20)
    msg = str(info.value)
    assert 3 <= time.monotonic() - t0 < 30
    assert msg.startswith("Exercise 0 \u00b7 a run that only sleeps: NOT DECIDED (not a verdict on your code)"), msg
    assert "inconclusive" in msg and "FAILED" not in msg and "deadlock:" not in msg
    assert "in _idle_outside_communication" in msg  # where each rank was, for the curious


def test_the_submodule_index_finds_what_cloudpickle_s_own_scan_finds():
    """dist._find_imported_submodules (cloudpickle's scan of sys.modules, indexed: issue 31) gives cloudpickle's
    own answer, in its order, for every function of the course's checks and runtime against its module's globals,
    and again after a module is imported between two calls."""
    import importlib
    import pkgutil
    import types

    import cloudpickle

    import autograder.checks
    from autograder.runtime import dist

    original = cloudpickle.cloudpickle._find_imported_submodules
    names = [m.name for m in pkgutil.walk_packages(autograder.checks.__path__, "autograder.checks.")]
    modules = [importlib.import_module(n) for n in names] + [dist, importlib.import_module("autograder.runtime.ledger")]
    compared = found = 0
    for module in modules:
        deps = list(vars(module).values())
        for fn in [v for v in deps if isinstance(v, types.FunctionType)]:
            ours, theirs = dist._find_imported_submodules(fn.__code__, deps), original(fn.__code__, deps)
            assert ours == theirs, f"{module.__name__}.{fn.__name__}: {ours} != {theirs}"
            compared += 1
            found += len(theirs)
    assert compared > 100 and found > 0, (compared, found)

    def uses_a_submodule():
        return json.decoder.JSONDecodeError  # noqa: F821 - only its code is looked at

    import json  # noqa: F401 - json.decoder is a submodule cloudpickle must find
    before = dist._find_imported_submodules(uses_a_submodule.__code__, [sys.modules["json"]])
    importlib.import_module("json.tool")  # sys.modules changes: the index is made again
    after = dist._find_imported_submodules(uses_a_submodule.__code__, [sys.modules["json"]])
    assert [m.__name__ for m in before] == [m.__name__ for m in after] == ["json.decoder"]
