"""What a student sees for each kind of fault, in a real Jupyter kernel (what JupyterLab shows).

    .venv/bin/python -m pytest -q tests/test_student_messages.py

Each case runs the release notebook's set-up, one answer cell (the reference
solution with one plausible mistake) and that exercise's visible test cell in
a kernel, and asserts on the error the notebook displays: IPython's rendering
of it (`_render_traceback_`), which is what JupyterLab draws under the cell.
- a stub: the exercise and the function are named, and nothing else is shown;
- ranks that call different collectives: which rank called what, and the
  student's line that called it;
- a missing backward collective: the missing collective first, then the wrong numbers;
- a deadlock: reported in under 5 s with the line each rank is blocked on; in
  every test cell that deadlocks (03's send to the wrong peer: five cells), the
  sends and receives without a partner, per rank, and the student's line that
  posted the wrong send;
- a course function refusing the student's argument in a picture cell: one line
  that names the argument;
- an answer cell that does not compile: its test names that cell's SyntaxError and line.
No frame of the course's own code or of torch is shown, and a passing test
prints one line.
"""

from __future__ import annotations

import re
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbformat import v4

from course import ROOT

sys.path.insert(0, ROOT)
from solutions import submissions  # noqa: E402
from solutions.submissions import mutant, mutants_of  # noqa: E402


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _cells(assignment: str, answer: str, test: str, edit=None) -> list:
    """The release notebook's locked set-up cells, one answer cell (reference, optionally edited), one test."""
    nb = submissions.reference_submission(assignment)
    out, last = [], None
    for cell in nb.cells:
        meta = _meta(cell)
        if cell.cell_type != "code" or not meta:
            continue
        gid = meta["grade_id"]
        if meta.get("locked") and not meta.get("grade") and gid in ("setup", "helpers", "layer_helpers"):
            out.append(cell.source)
        elif gid == answer:
            out.append(edit.apply(cell.source) if edit else cell.source)
        elif gid == test:
            last = cell.source
    return out + [last]


def _run(sources: list[str]):
    nb = v4.new_notebook()
    nb.cells = [v4.new_code_cell(src) for src in sources]
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True)
    t0 = time.monotonic()
    client.execute()
    return nb, time.monotonic() - t0


def _shown(cell) -> str:
    """What the notebook displays for a cell: streams and each error's traceback lines (as rendered)."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
    return "\n".join(parts)


def _seconds(cell) -> float:
    """How long the kernel took to run a cell (nbclient's timing in the cell's metadata)."""
    from datetime import datetime

    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return float("nan")
    return (datetime.fromisoformat(end.replace("Z", "+00:00"))
            - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def _assert_no_internals(text: str) -> None:
    for internal in ("site-packages", "/autograder/", "distributed_c10d", "Traceback (most recent call last)",
                     "CollectiveFingerPrint", "\x1b["):
        assert internal not in text, f"the student sees {internal!r}:\n{text}"


def test_a_stub_names_its_exercise_and_function():
    sources = _cells("02_tensor_parallel", "column_row", "test_column_parallel_linear")
    release = nbformat.read(submissions.notebook_path("release", "02_tensor_parallel"), as_version=4)
    stub = next(c.source for c in release.cells if _meta(c).get("grade_id") == "column_row")
    sources[-2] = stub
    nb, _ = _run(sources)
    text = _shown(nb.cells[-1])
    assert text.startswith("NotImplementedError: Exercise 3 is not done yet: ColumnParallelLinear.__init__ is "
                           "still the stub"), text
    _assert_no_internals(text)


MISMATCH = mutant(
    "reversed_on_rank_1", "all_reduce_gradients",
    [("    for param in model.parameters():\n",
      "    params = list(model.parameters())\n"
      "    for param in (params if dist.get_rank(group) == 0 else params[::-1]):\n")],
    must_fail={"test_all_reduce_gradients"}, why="rank 1 walks the parameters in reverse order")


def test_ranks_calling_different_collectives_are_told_who_called_what_where():
    nb, _ = _run(_cells("01_data_parallel", "all_reduce_gradients", "test_all_reduce_gradients", MISMATCH))
    text = _shown(nb.cells[-1])
    first = text.splitlines()[0]
    assert first.startswith("DistributedError: Exercise 1") and "FAILED" in first, text
    assert "collective #1 on the group of ranks [0, 1] differs between ranks:" in text
    assert "rank 0: all_reduce of [7, 5] float64, called at Cell In[" in text
    assert "rank 1: all_reduce of [3] float64, called at Cell In[" in text
    assert "in all_reduce_gradients" in text
    _assert_no_internals(text)


MISSING_BACKWARD = mutant(
    "copy_to_identity_backward", "tp_mappings",
    [("return _reduce(grad_output, ctx.group), None", "return grad_output, None")],
    must_fail={"test_copy_to_region"}, why="f's backward left as identity")


def test_a_missing_backward_collective_is_named_before_the_wrong_numbers():
    nb, _ = _run(_cells("02_tensor_parallel", "tp_mappings", "test_copy_to_region", MISSING_BACKWARD))
    text = _shown(nb.cells[-1])
    missing = text.find("expected 1 all_reduce of [4, 3, 6] float64 in backward, saw 0")
    numbers = text.find("The numbers are wrong too: ")
    assert 0 < missing < numbers, text
    assert "input gradient (backward)" in text
    _assert_no_internals(text)


DEADLOCK = mutant(
    "recv_instead_of_all_reduce", "all_reduce_gradients",
    [("dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)",
      "dist.recv(param.grad, src=(dist.get_rank(group) + 1) % world_size, group=group)")],
    must_fail={"test_all_reduce_gradients"}, why="every rank waits to receive")


def test_a_deadlock_is_reported_within_seconds_with_the_blocked_line():
    sources = _cells("01_data_parallel", "all_reduce_gradients", "test_all_reduce_gradients", DEADLOCK)
    sources[-1] = "import time\n_t0 = time.monotonic()\ntry:\n" + "\n".join(
        "    " + line for line in sources[-1].splitlines()) + "\nfinally:\n    print(f'took {time.monotonic() - _t0:.1f} s')"
    nb, _ = _run(sources)
    text = _shown(nb.cells[-1])
    took = float(text.split("took ", 1)[1].split(" s", 1)[0])
    # the idle detection needs 2 s of quiet after the ranks block (dist.DEADLOCK_IDLE_S); the run's own
    # timeout is 20 s: well under it, whatever the machine's load
    assert took < 10, f"the deadlock took {took} s to report:\n{text}"
    assert "deadlock" in text
    assert "each was blocked in recv (torch.distributed), called at Cell In[" in text
    assert "dist.recv(param.grad" in text
    _assert_no_internals(text)


WRONG_PEER = next(m for m in mutants_of("03_pipeline_parallel") if m.name == "activation_to_previous_rank")
SEND_LINE = "return dist.isend(tensor.contiguous(), group=pp_group, group_dst=next_rank)"


def test_every_deadlocking_cell_lists_the_sends_and_receives_without_a_partner_and_the_wrong_send():
    """send_forward sends to the previous rank: every visible test cell it fails deadlocks (the P2P helpers, GPipe,
    1F1B, the memory test, interleaved). Each message lists, per rank, the sends and receives that had no
    partner, names the send that reached a rank waiting for another sender, and quotes the student's line that
    posted it (not only the receive that waited). (The pictures that run run_pipeline show the same section:
    they raise the same DistributedError, rendered as in test_picture_and_scratch_cells_....)"""
    nb = submissions.mutant_submission("03_pipeline_parallel", WRONG_PEER)
    given = {"setup", "helpers", "p2p", "schedules", "bubble", "run_pipeline", "interleaved"}
    sources, shown_as = [], []
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if cell.cell_type != "code":
            continue
        if gid in given:
            sources.append(cell.source)
            shown_as.append(None)
        elif gid in WRONG_PEER.must_fail:
            sources.append(cell.source)
            shown_as.append(gid)
    assert sorted(g for g in shown_as if g) == sorted(WRONG_PEER.must_fail)
    out, took = _run(sources)
    print(f"\n{len(WRONG_PEER.must_fail)} deadlocking cells (and the set-up) in a kernel: {took:.1f} s; "
          f"each cell: {', '.join(f'{gid} {_seconds(cell):.1f} s' for cell, gid in zip(out.cells, shown_as) if gid)}")
    for cell, gid in zip(out.cells, shown_as):
        if gid is None:
            assert not [o for o in cell.outputs if o.output_type == "error"], (cell.source[:80], _shown(cell))
            continue
        text = _shown(cell)
        first = text.splitlines()[0] if text else ""
        assert first.startswith("DistributedError: Exercise ") and "FAILED" in first, (gid, text)
        section = text[text.index("Sends and receives without a partner when the ranks stopped"):]
        # per rank: the sends that reached nobody, from send_forward's line; the receives that waited
        assert re.search(r"^  rank \d: sends? #1(-#\d+)? to rank \d \(\[\d+, \d+\] float64, tag 0\) at Cell In\[\d+\], "
                         r"line \d+, in send_forward: rank \d never receives from rank \d$", section, re.M), (gid, text)
        assert re.search(r"^  rank \d: receive #1 from rank \d \(\[\d+, \d+\] float64, tag 0\) at Cell In\[\d+\], "
                         r"line \d+, in recv_forward: rank \d never sends to rank \d$", section, re.M), (gid, text)
        assert re.search(r"^  rank \d sends to rank \d, which waits to receive from rank \d instead .*: the send "
                         r"\(at Cell In\[\d+\], line \d+, in send_forward\) or the receive \(at Cell In\[\d+\], line \d+, "
                         r"in recv_forward\) names the wrong peer$", section, re.M), (gid, text)
        quoted = section[section.index("The lines of your code that posted them (sends first):"):]
        assert SEND_LINE in quoted.split("\n", 3)[2], (gid, text)  # the send's line, quoted first
        _assert_no_internals(text)


def test_a_passing_test_prints_one_line():
    nb, _ = _run(_cells("01_data_parallel", "all_reduce_gradients", "test_all_reduce_gradients"))
    text = _shown(nb.cells[-1])
    assert [line for line in text.splitlines() if line.strip()] == [text.strip()], text
    assert text.startswith("\u2713 Exercise 1 \u00b7 ") and "passed (world size 2," in text, text


RAISES_IN_A_RANK = mutant(
    "a_rank_raises", "all_reduce_gradients",
    [("    world_size = dist.get_world_size(group)\n",
      "    world_size = dist.get_world_size(group)\n    _check_sizes(model)\n")],
    must_fail={"test_all_reduce_gradients"}, why="the student's own helper raises")


def test_the_graders_verdict_names_the_exercises_answer_cell_never_a_file():
    """What the feedback shows: the trusted run's message locates the student's code by the exercise's answer
    cell, as the notebook does by `Cell In[n]` (never a temporary file of ipykernel or of the grader)."""
    import copy
    import json

    from autograder.grading.trusted import grade_notebook

    nb = submissions.mutant_submission("01_data_parallel", RAISES_IN_A_RANK)
    cell = next(c for c in nb.cells if _meta(c).get("grade_id") == "all_reduce_gradients")
    cell.source += "\n\n\ndef _check_sizes(model):\n    raise ValueError('my own size check failed')\n"
    source = json.loads(open(submissions.notebook_path("source", "01_data_parallel"), encoding="utf-8").read())
    source["cells"] = [c for c in source["cells"] if not _meta(c).get("grade") or _meta(c).get("solution")
                       or _meta(c)["grade_id"] == "test_all_reduce_gradients"]  # one test cell: seconds
    verdicts, _ = grade_notebook(json.loads(nbformat.writes(copy.deepcopy(nb))), source)
    msg = verdicts["test_all_reduce_gradients"].message
    assert "ValueError: my own size check failed" in msg, msg
    assert "answer cell of Exercise 1 (all_reduce_gradients), line " in msg and ", in _check_sizes" in msg, msg
    for bad in ("<answer", "ipykernel", ".py:", "/tmp/", "dynamic-code"):
        assert bad not in msg, (bad, msg)


UNCLOSED = mutant(
    "unclosed_parenthesis", "all_reduce_gradients",
    [("    world_size = dist.get_world_size(group)\n", "    world_size = dist.get_world_size(group\n")],
    must_fail={"test_all_reduce_gradients"}, why="the answer cell does not compile")


def test_a_syntax_error_in_an_answer_cell_is_named_by_the_test_that_needs_it():
    """An unclosed parenthesis in Exercise 1's answer cell: that cell shows Python's SyntaxError, and its test
    says which cell failed, where, and why (not only `name 'all_reduce_gradients' is not defined`)."""
    cells = _cells("01_data_parallel", "all_reduce_gradients", "test_all_reduce_gradients", UNCLOSED)
    line = next(i for i, text in enumerate(cells[-2].splitlines(), 1) if "get_world_size(group" in text)
    nb, _ = _run(cells)
    assert "SyntaxError" in _shown(nb.cells[-2])
    shown = _shown(nb.cells[-1])
    assert shown.startswith("NameError: Exercise 1 \u00b7 "), shown
    assert (f"name 'all_reduce_gradients' is not defined\nThe cell that defines it failed: SyntaxError: '(' was "
            f"never closed (Cell In[{len(cells) - 1}], line {line}).") in shown, shown
    _assert_no_internals(shown)


def test_picture_and_scratch_cells_show_the_one_line_verdict_of_a_stub():
    """Outside a test cell (a picture, a scratch run) a stub reached through the course's code is named with its
    exercise in one line, as a test cell names it: no frame of the course's runner, checks or lessons. A course
    function that refuses the student's argument in a picture cell says so in one line that names the argument
    (a ValueError the student's own code raises is shown as Python shows it)."""
    release = submissions.untouched_submission("01_data_parallel")
    keep, pictures = [], []
    for cell in release.cells:
        meta = _meta(cell)
        if cell.cell_type != "code" or meta.get("grade") and not meta.get("solution"):
            continue
        if meta:  # given cells and the answer cells (stubs)
            keep.append(cell.source)
        elif "ddp_timeline(" in cell.source or "plot_memory_ledger(" in cell.source or "show_fsdp" in cell.source:
            pictures.append(cell.source)
    assert len(pictures) == 3, pictures
    own_error = "def my_helper():\n    raise RuntimeError('my own error')\nmy_helper()"
    timeline = next(p for p in pictures if "ddp_timeline(BucketedDDP, world_size=2)" in p)
    bad_argument = timeline.replace("world_size=2", "world_size=0")  # the student's edit of a picture cell
    own_value_error = "def my_check(n):\n    raise ValueError(f'my own check: {n}')\nmy_check(0)"
    nb, _ = _run(keep + pictures + [own_error, bad_argument, own_value_error])
    shown = [_shown(cell) for cell in nb.cells[-6:-3]]
    mine = _shown(nb.cells[-3])  # the student's own error: shown as IPython always shows it, frames and all
    assert "RuntimeError" in mine and "my own error" in mine and "my_helper()" in mine, mine
    refused = _shown(nb.cells[-2])
    assert refused.strip() == "ValueError: ddp_timeline: world_size must be a positive int, got 0", refused
    mine = re.sub(r"\x1b\[[0-9;]*m", "", _shown(nb.cells[-1]))  # IPython's colours
    assert "ValueError" in mine and "my own check: 0" in mine and "my_check(0)" in mine, mine
    expected = {"show_fsdp": "Exercise 5 is not done yet: fully_shard is still the stub",
                "ddp_timeline": "Exercise 2 is not done yet: BucketedDDP.__init__ is still the stub",
                "plot_memory_ledger": "Exercise 3 is not done yet: zero_bytes_per_param is still the stub"}
    for source, text in zip(pictures, shown):
        want = next(v for k, v in expected.items() if k in source)
        assert text.startswith(f"NotImplementedError: {want}") and "This cell uses it: implement Exercise" in text, text
        assert len(text.strip().splitlines()) == 1, text
        _assert_no_internals(text)
