"""A solved notebook as a job (issue 32): exported, run under torchrun (one node, two agents) and srun, resumed.

    .venv/bin/python -m pytest -q -s tests/test_jobs.py

The script is written by the documented command (`python -m autograder.runtime.launch
export NOTEBOOK --out SCRIPT`) from the reference submission of 06 (the release
notebook with every answer cell filled in, as a student's solved notebook is),
and run for real: `torchrun --standalone`, two `torchrun` agents with
`--nnodes 2` and c10d rendezvous on localhost (two "nodes" on one machine),
`srun` on the single-node Slurm cluster of tests/test_slurm.py (skipped with
the reason without Slurm; a failure with COURSE_REQUIRE_SLURM=1), and
`torchrun --max-restarts 1` with one rank killed mid-run. Every run's losses
are compared with the in-notebook runner's: the job's own function called in
this process, its ranks forked by `run_distributed`, from the same seeds. They
are compared exactly (==): the same ranks run the same operations in the same
order on gloo, only the launcher differs. A checkpoint resumed on another
layout (other TP, PP, DP sizes, other world size) is compared with a tolerance
of 1e-10 (float64; another layout sums the same numbers in another order).

Each launched command runs in its own session with a marker in its
environment; afterwards every process that carries the marker (torchrun's
workers start sessions of their own) is killed by pid: nothing is left running.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import nbformat
import pytest

from course import ROOT, VENV_BIN
try:  # the one-node Slurm cluster of tests/test_slurm.py, its fixture reused
    from test_slurm import _SBIN, cluster  # noqa: F401 - the fixture
    from test_slurm import _WHY as _NO_SLURM
except RuntimeError as exc:  # test_slurm refuses to load: COURSE_REQUIRE_SLURM=1 and no Slurm here
    _SBIN, _NO_SLURM, _SLURM_ERROR = "", None, str(exc)

    @pytest.fixture(scope="module")
    def cluster():  # the srun test fails saying why; the other tests of this file run
        pytest.fail(_SLURM_ERROR)

sys.path.insert(0, ROOT)

from solutions.submissions import notebook_path, reference_submission  # noqa: E402

PYTHON = sys.executable
TORCHRUN = os.path.join(VENV_BIN, "torchrun")
TOL = 1e-10  # another layout: the same float64 sums in another order
_STEP = re.compile(r"^step (\d+) loss (\S+)$", re.M)
pytestmark = [pytest.mark.timeout(900)]


# -- helpers ----------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(marker: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(PYTHONPATH=ROOT, TORCH_CPP_LOG_LEVEL="ERROR", COURSE_JOB_TEST=marker, OMP_NUM_THREADS="1")
    return env


def _marked_pids(marker: str) -> list[int]:
    """Every process whose environment carries `marker` (the commands this test started, and theirs)."""
    found = []
    needle = f"COURSE_JOB_TEST={marker}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
    return found


def _launch(commands: list[list[str]], *, cwd: str, timeout: float, env: dict | None = None) -> list[tuple[int, str]]:
    """Run `commands` side by side (each in its own session); (exit status, stdout + stderr) of each.

    Generous `timeout` (seconds of the clock, for a loaded machine): past it the commands are killed and the test
    fails saying so. Afterwards every process with this call's marker is killed, by pid.
    """
    marker = uuid.uuid4().hex
    run_env = {**_env(marker), **(env or {})}
    logs = [open(os.path.join(cwd, f"launch-{marker[:8]}-{i}.log"), "w+") for i in range(len(commands))]
    procs = []
    try:
        for cmd, log in zip(commands, logs):
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=run_env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                outputs = []
                for log in logs:
                    log.seek(0)
                    outputs.append(log.read()[-4000:])
                pytest.fail(f"{' '.join(p.args)} did not finish within {timeout:.0f} s; output so far:\n"
                            + "\n---\n".join(outputs))
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for pid in _marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not _marked_pids(marker) or _wait_gone(marker), "processes of the job were left running"
    out = []
    for p, log in zip(procs, logs):
        log.seek(0)
        out.append((p.returncode, log.read()))
        log.close()
    return out


def _wait_gone(marker: str, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _marked_pids(marker):
            return True
        time.sleep(0.2)
    return False


def _losses(output: str) -> dict[int, float]:
    """step -> loss, as the job printed them (`step N loss X`); a step printed again (after a restart): the last."""
    return {int(n): float(x) for n, x in _STEP.findall(output)}


def _exported(assignment: str, folder: str):
    """The assignment's reference submission saved as a student saves it, its job script exported with the
    documented command, and the script's namespace (its definitions, as the job runs them; not its main)."""
    notebook = os.path.basename(notebook_path("release", assignment))
    nbformat.write(reference_submission(assignment), os.path.join(folder, notebook))
    script = f"train_{assignment[:2]}.py"
    done = subprocess.run([PYTHON, "-m", "autograder.runtime.launch", "export", notebook, "--out", script],
                          cwd=folder, env=_env("export"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"export of {notebook} failed:\n{done.stdout}{done.stderr}"
    script = os.path.join(folder, script)
    namespace = {"__name__": os.path.basename(script)[:-3]}
    with open(script) as f:
        exec(compile(f.read(), script, "exec"), namespace)
    return folder, script, namespace


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """06's job script (see _exported)."""
    return _exported("06_composition", str(tmp_path_factory.mktemp("job06")))


def _notebook_losses(namespace, **kwargs) -> list[tuple[int, float]]:
    """The in-notebook runner: the job's function called here, its ranks forked by run_distributed."""
    return namespace["composition_job"](namespace, **kwargs)["losses"]


def _assert_same(got: dict, expected: list, what: str) -> None:
    want = {step: loss for step, loss in expected}
    assert got == want, (f"{what}: the losses differ from the notebook runner's (compared exactly)\n"
                         + "\n".join(f"  step {s}: got {got.get(s)!r}, expected {want.get(s)!r}"
                                     for s in sorted(set(got) | set(want))))


# -- the export ---------------------------------------------------------------------------------------------

def test_export_keeps_answers_and_given_definitions_and_leaves_out_tests_scratch_and_calls(job):
    from autograder.runtime.launch import export_source

    folder, script, namespace = job
    text = open(script).read()
    for name in ("rank_layout", "local_batch", "apply_tensor_parallel", "apply_fsdp", "pipeline_train_step",
                 "split_model_for_pipeline", "build_schedule", "_mesh_coordinate", "composition_job", "main"):
        assert callable(namespace.get(name)), f"the exported script does not define {name}"
    assert "with checking(" not in text, "a test cell was exported"
    assert "HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text
    assert "composition_job(globals()" not in text, "the scratch cell that runs the job in the notebook was exported"
    assert "course_notebook(" not in text.split("left out")[1].split("\n", 2)[2], "the set-up's call was kept"
    assert re.search(r"left out .*\n#\s+line \d+: course_notebook\(\{", text), "the dropped call is not named"

    # made-up notebooks: a top-level call in an answer cell is left out and named; a scratch helper is not exported
    def cell(source, **meta):
        return {"cell_type": "code", "source": source, "metadata": {"nbgrader": meta} if meta else {},
                "outputs": [], "execution_count": None}
    nb = {"cells": [cell("import torch", grade_id="setup", locked=True),
                    cell("K = (3, 4)\n\ndef f(x):\n    return x + K[0]\n\nprint(f(1))\ny = f(2)", grade_id="ans",
                         solution=True),
                    cell("def scratch_helper():\n    pass"),
                    cell("with checking('E1', 'doc'):\n    assert f(1) == 2", grade_id="test_f", grade=True,
                         locked=True),
                    cell("from autograder.checks.composition import composition_job", grade_id="job",
                         locked=True)]}
    out = export_source(nb, name="made_up.ipynb")
    assert "K = (3, 4)\n\ndef f(x)" in out and "scratch_helper" not in out and "assert f(1)" not in out
    assert re.search(r"# --- cell 'ans' \(your answer\); left out .*\n#\s+line 6: print\(f\(1\)\)\n#\s+line 7: y = f\(2\)",
                     out), out[:2000]
    assert "return run_job(composition_job, globals(), argv)" in out
    with pytest.raises(ValueError, match="has no job cell"):
        export_source({"cells": nb["cells"][:2]}, name="nojob.ipynb")


def _size_error_rank(rank, world_size):
    from autograder.runtime.launch import JobSizeError, _JobExecutor

    try:
        _JobExecutor("torchrun").run(lambda r, w: r, 4, {"args": ()})
    except JobSizeError as exc:
        return str(exc)
    return None


def test_a_job_started_with_another_world_size_says_how_to_start_it():
    from autograder.runtime.dist import run_distributed

    msg = run_distributed(_size_error_rank, 2)[0]
    assert msg is not None, "asking for 4 ranks in a job of 2 raised nothing"
    assert "4 ranks" in msg and "WORLD_SIZE=2" in msg and "--nproc-per-node 4" in msg, msg


def test_the_capstones_job_refuses_nccl_saying_why(job):
    folder, script, namespace = job
    with pytest.raises(ValueError, match=r"backend 'nccl'.*CPU ranks.*build_schedule places each stage on the CPU"):
        namespace["composition_job"](namespace, backend="nccl")


# -- torchrun, two agents, srun -----------------------------------------------------------------------------

# 01, 02, 03: their job under torchrun --standalone (06's runs there in the killed-rank test below)
ONE_NODE = {
    "01_data_parallel": (["--strategy", "zero", "--world-size", "2", "--steps", "3"], 2,
                         dict(strategy="zero", world_size=2, steps=3)),
    "02_tensor_parallel": (["--tp", "2", "--sequence-parallel", "true", "--steps", "3"], 2,
                           dict(tp=2, sequence_parallel=True, steps=3)),
    "03_pipeline_parallel": (["--stages", "2", "--schedule", "1f1b", "--steps", "3"], 2,
                             dict(stages=2, schedule="1f1b", steps=3)),
}


@pytest.mark.parametrize("assignment", sorted(ONE_NODE))
def test_torchrun_one_node_prints_the_notebook_runners_losses(assignment, tmp_path):
    folder, script, namespace = _exported(assignment, str(tmp_path))
    options, nproc, kwargs = ONE_NODE[assignment]
    [(rc, out)] = _launch([[TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), script, *options]],
                          cwd=folder, timeout=400)
    assert rc == 0, f"torchrun exited with {rc}:\n{out[-4000:]}"
    job = next(v for k, v in namespace.items() if k.endswith("_job") and callable(v))
    _assert_same(_losses(out), job(namespace, **kwargs)["losses"], f"{assignment}: torchrun --standalone")


def test_two_torchrun_agents_as_two_nodes_print_the_notebook_runners_losses(job):
    folder, script, namespace = job
    port = _free_port()
    agent = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"job{port}"]
    sizes = ["--pp", "2", "--dp", "2", "--tp", "2", "--steps", "3"]
    outs = _launch([agent + ["--node-rank", str(n), script] + sizes for n in (0, 1)], cwd=folder, timeout=600)
    for n, (rc, out) in enumerate(outs):
        assert rc == 0, f"agent {n} exited with {rc}:\n{out[-4000:]}"
    printed = _losses(outs[0][1] + outs[1][1])
    _assert_same(printed, _notebook_losses(namespace, pp=2, dp=2, tp=2, steps=3),
                 "two torchrun agents (--nnodes 2, c10d), PP 2 x DP 2 x TP 2")


@pytest.mark.skipif(_NO_SLURM is not None, reason=str(_NO_SLURM))
def test_srun_tasks_as_ranks_print_the_notebook_runners_losses(job, cluster):  # noqa: F811 - the fixture
    folder, script, namespace = job
    os.chmod(folder, 0o755)
    env = {**cluster.env_vars(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    [(rc, out)] = _launch([[shutil.which("srun", path=_SBIN), "--ntasks", "4", "--overcommit", "--kill-on-bad-exit=1",
                            "--chdir", folder, PYTHON, script, "--pp", "1", "--dp", "2", "--tp", "2", "--steps", "3"]],
                          cwd=folder, timeout=600, env=env)
    assert rc == 0, f"srun exited with {rc}:\n{out[-4000:]}"
    _assert_same(_losses(out), _notebook_losses(namespace, pp=1, dp=2, tp=2, steps=3), "srun --ntasks 4, DP 2 x TP 2")


# -- checkpoints --------------------------------------------------------------------------------------------

def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=TOL, abs_tol=TOL)


def test_a_checkpoint_saved_at_dp2_tp2_resumes_at_pp2_tp2_and_at_pp2_and_continues_the_losses(job, tmp_path):
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    folder, script, namespace = job
    ckpt = str(tmp_path / "ckpt")
    whole = namespace["composition_job"](namespace, pp=1, dp=2, tp=2, steps=4, checkpoint_dir=ckpt,
                                         checkpoint_every=2)
    assert [os.path.basename(p) for p in whole["saved"]] == ["step_2", "step_4"]
    keys = set(FileSystemReader(os.path.join(ckpt, "step_2")).read_metadata().state_dict_metadata)
    assert "model.tok_embeddings.weight" in keys and "model.output.weight" not in keys, sorted(keys)
    assert "optim.layers.3.feed_forward.w2.weight.exp_avg_sq" in keys, sorted(keys)
    shutil.rmtree(os.path.join(ckpt, "step_4"))  # resume from step 2
    expected = dict(whole["losses"])
    for layout in (dict(pp=2, dp=1, tp=2), dict(pp=2, dp=1, tp=1)):
        resumed = namespace["composition_job"](namespace, steps=4, checkpoint_dir=ckpt, **layout)
        assert resumed["resumed"] == os.path.join(ckpt, "step_2"), resumed["resumed"]
        got = dict(resumed["losses"])
        assert sorted(got) == [3, 4], f"resumed at {layout}: steps {sorted(got)}, expected 3 and 4"
        for step in (3, 4):
            assert _close(got[step], expected[step]), (f"resumed at {layout}: step {step} loss {got[step]!r}, "
                                                      f"the uninterrupted run's {expected[step]!r} (tol {TOL})")
        copies = {"output.weight": "tok_embeddings.weight"}  # pp > 1: the last stage's copy of the tied head
        assert {copies.get(n, n) for n in resumed["state"]} == set(whole["state"]), (
            f"resumed at {layout}: parameters {sorted(resumed['state'])}, expected the whole model's")
        for name, have in resumed["state"].items():
            want = whole["state"][copies.get(name, name) if name not in whole["state"] else name]
            assert torch.allclose(have, want, rtol=TOL, atol=TOL), (
                f"resumed at {layout}: {name} after step 4 differs from the uninterrupted run's by "
                f"{(have - want).abs().max().item():.3g} (tol {TOL})")
        shutil.rmtree(os.path.join(ckpt, "step_4"), ignore_errors=True)


def test_a_killed_rank_is_restarted_by_torchrun_and_the_job_resumes_from_its_last_checkpoint(job, tmp_path):
    folder, script, namespace = job
    ckpt = str(tmp_path / "ckpt")
    [(rc, out)] = _launch([[TORCHRUN, "--standalone", "--nproc-per-node", "4", "--max-restarts", "1", script,
                            "--pp", "1", "--dp", "2", "--tp", "2", "--steps", "6", "--checkpoint-dir", ckpt,
                            "--checkpoint-every", "2", "--simulate-failure", "1:3"]], cwd=folder, timeout=600)
    assert rc == 0, f"torchrun exited with {rc} (the restart did not finish the job):\n{out[-4000:]}"
    assert "rank 1: killing myself after step 3" in out, out[-4000:]
    assert f"resumed from {os.path.join(ckpt, 'step_2')}" in out, f"no resume from step 2:\n{out[-4000:]}"
    first, _, second = out.partition("resumed from")
    before, after = _losses(first), _losses(second)
    # steps 1 and 2 are printed before the checkpoint of step 2, which every rank joins: always there; step 3's
    # line may or may not beat torchrun stopping the others once rank 1 is gone
    assert {1, 2} <= set(before) <= {1, 2, 3} and sorted(after) == [3, 4, 5, 6], out[-4000:]
    expected = _notebook_losses(namespace, pp=1, dp=2, tp=2, steps=6)
    # the first attempt: 06's job under torchrun --standalone prints the notebook runner's losses
    _assert_same(before, expected[:len(before)], "torchrun --standalone, DP 2 x TP 2 (before the kill)")
    # after the restart: the same layout and the same state restored exactly, so the same numbers as one
    # uninterrupted run
    _assert_same(after, expected[2:], "torchrun --max-restarts 1 with rank 1 killed after step 3 (resumed)")


def _written_bytes(path: str) -> dict[str, int]:
    """Tensor bytes each file of a DCP checkpoint holds (`__RANK_0.distcp`: what that rank wrote), read from its
    metadata: every chunk's elements x its dtype's size. AdamW's step counters (0-d) are left out, as the formula
    leaves them out."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(path).read_metadata()
    per_file: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        item = meta.state_dict_metadata[index.fqn]
        assert isinstance(item, TensorStorageMetadata), f"{index.fqn}: not a tensor"
        if not item.size:  # a 0-d tensor: an optimizer step counter
            continue
        chunk = next(c for c in item.chunks if list(c.offsets) == list(index.offset))
        per_file[info.relative_path] = (per_file.get(info.relative_path, 0)
                                        + math.prod(chunk.sizes) * item.properties.dtype.itemsize)
    return per_file


def _unique_stage_params(model, layout) -> list[int]:
    """What each pipeline stage writes to a checkpoint: exercise 10's reference count (per GPU, so x tp), the last
    stage's copy of a tied head left out (DCP writes the embedding's piece once). From solutions/: instructor only."""
    from solutions.composition.planner import stage_params

    per = [round(stage_params(model, layout, s) * layout.tp) for s in range(layout.pp)]
    if model.tied_embeddings and layout.pp > 1:
        per[-1] -= model.embedding_params()
    return per


@pytest.mark.parametrize("layout", [dict(pp=1, dp=2, tp=2), dict(pp=2, dp=1, tp=2)], ids=["dp2-tp2", "pp2-tp2"])
def test_the_lessons_checkpoint_bytes_are_what_dcp_writes_for_the_capstone(job, tmp_path, layout):
    """autograder/lessons/checkpoint.py against the capstone's real checkpoint: float64 weights (8 B) and AdamW's two
    float64 moments (16 B). The total exactly; each rank's share within 10% of the formula's even split (DCP spreads
    the replicated pieces greedily, not evenly: measured here: 7% at most, the same every run)."""
    from autograder.lessons.checkpoint import CAPSTONE, checkpoint_bytes
    from autograder.lessons.planner import Layout

    folder, script, namespace = job
    ckpt = str(tmp_path / "ckpt")
    namespace["composition_job"](namespace, steps=1, checkpoint_dir=ckpt, checkpoint_every=1, **layout)
    written = _written_bytes(os.path.join(ckpt, "step_1"))
    want = checkpoint_bytes(CAPSTONE, Layout(**layout), _unique_stage_params(CAPSTONE, Layout(**layout)),
                            param_bytes=8, optim_bytes=16)
    assert sum(written.values()) == want["total"], (f"{layout}: the checkpoint holds {sum(written.values())} tensor "
                                                    f"bytes, the lesson's formula says {want['total']}")
    assert len(written) == 4, f"{layout}: {len(written)} ranks wrote, expected 4: {written}"
    for name, size in sorted(written.items()):
        assert abs(size - want["per_rank"]) <= 0.10 * want["per_rank"], (
            f"{layout}: {name} holds {size} bytes, the formula's share is {want['per_rank']:.0f}")


def test_the_lessons_checkpoint_numbers_are_the_codes():
    """06_to_a_cluster.md §5 (and its Chinese twin) print what autograder/lessons/checkpoint.py computes: the
    capstone's bytes and Llama 3 70B's at TP 8 x PP 4 x DP 32, in the lesson's rounding."""
    from autograder.lessons.checkpoint import CAPSTONE, checkpoint_bytes
    from autograder.lessons.planner import LLAMA3_70B, Layout

    capstone = checkpoint_bytes(CAPSTONE, Layout(tp=2, dp=2), _unique_stage_params(CAPSTONE, Layout(tp=2, dp=2)),
                                param_bytes=8, optim_bytes=16)
    llama_layout = Layout(tp=8, pp=4, dp=32)
    llama = checkpoint_bytes(LLAMA3_70B, llama_layout, _unique_stage_params(LLAMA3_70B, llama_layout))
    assert llama["stage"] == 3, "the lesson says the fullest stage is the last"
    expected = [f"{CAPSTONE.num_params():,}",
                f"{capstone['total']:,}", f"{capstone['per_rank']:,.0f}", f"{LLAMA3_70B.num_params() / 1e9:.2f}",
                f"{llama['total'] / 1e9:.1f} GB", f"{llama['per_rank'] / 1e9:.2f} GB",
                f"{LLAMA3_70B.n_layers // 4} "]
    for lang in ("", "zh"):
        path = os.path.join(ROOT, lang, "assignments", "06_composition", "06_to_a_cluster.md")
        text = open(path, encoding="utf-8").read().split("## 5.", 1)[1].split("## 6.", 1)[0]
        missing = [e for e in expected if e not in text]
        assert not missing, f"{os.path.relpath(path, ROOT)} §5 does not show {missing} (autograder/lessons/checkpoint.py)"
