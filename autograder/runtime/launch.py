"""Your notebook's code as a job: one script, one process per rank, under `torchrun` or `srun`.

    python -m autograder.runtime.launch export composition_lab.ipynb --out train_06.py
    torchrun --standalone --nproc-per-node 8 train_06.py --pp 2 --dp 2 --tp 2 --steps 4
    torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train_06.py
    srun --ntasks 8 python train_06.py                      # each Slurm task is one rank
    python train_06.py --help                               # the job's options

`export` writes a standalone script made of the notebook's code: your answer
cells and the given (locked) cells, in order, keeping their definitions only
(imports, functions, classes, constants: assignments whose value calls
nothing); test cells, scratch cells and every other top-level statement (a
visible check, a print, a picture, a computation such as `x = torch.randn(...)`)
are left out, each cell headed by a comment that says which statements were. The course's runtime is
imported by the script, never copied. The notebook's `job` cell names its
job (for example `composition_job`, autograder/checks/composition/job.py):
the training that the script's `main()` runs.

How the notebook's runner maps onto torchrun's environment. In the notebook,
`run_distributed(fn, world_size, args=...)` forks `world_size` processes, each
calling `fn(rank, world_size, *args)` with a fresh process group, and returns
their results. In the job, torchrun (or srun) has already started one process
per rank: `run_job` initialises the default process group from the
environment (`init_method="env://"`: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
`MASTER_PORT`; `LOCAL_RANK` picks the GPU with `--backend nccl`) and installs
an executor (`autograder.runtime.dist.set_executor`) under which every
`run_distributed(fn, world_size, ...)` call runs `fn(RANK, WORLD_SIZE, *args)`
in this process instead, then gathers every rank's result
(`all_gather_object`), so that the code after the call sees the same list as
in the notebook. A `world_size` other than torchrun's `WORLD_SIZE` is an error
that says how to start the job. Under `srun` without torchrun the same
variables are taken from Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`,
`SLURM_LOCALID`; `MASTER_ADDR`, when not set, is the first host of the job's
node list and `MASTER_PORT` is derived from the job id).

Imports nothing from the other layers: the script imports the job named by
the notebook, and this module only calls it.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import inspect
import json
import os
import socket
import subprocess
import sys

__all__ = ["export", "export_source", "run_job", "running_as_job", "job_device", "init_from_environment",
           "JobSizeError"]

# The cell that names a notebook's job (its grade id), and the comment the exported script starts each cell with.
JOB_CELL = "job"
_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


class JobSizeError(RuntimeError):
    """The code asks run_distributed for another number of ranks than the job was started with."""


# -- export -------------------------------------------------------------------------------------------------

def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _kept(node) -> bool:
    """A definition: an import, a function, a class, or an assignment of a value that calls nothing (a constant)."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value is not None and not any(isinstance(n, ast.Call) for n in ast.walk(node.value))
    return isinstance(node, _KEPT)


def _kept_statements(source: str, where: str) -> tuple[str, list[str]]:
    """The cell's top-level definitions, as written; and a line for each statement left out."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise SyntaxError(f"{where}: the cell does not parse (line {exc.lineno}: {exc.msg}); fix it in the "
                          f"notebook, then export again") from None
    lines = source.splitlines()
    kept, dropped = [], []
    previous_end, previous_kept = 0, True  # a kept statement keeps the comments and blank lines above it
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = "\n".join(lines[start - 1:node.end_lineno])
        if _kept(node):
            between = lines[previous_end:start - 1]
            above = "\n".join(between)
            if kept and previous_kept:
                kept[-1] += "\n" + (above + "\n" if between else "") + text
            else:
                kept.append((above.strip("\n") + "\n" if above.strip() else "") + text)
            previous_end, previous_kept = node.end_lineno, True
        else:
            previous_end, previous_kept = node.end_lineno, False
            first = text.strip().splitlines()[0]
            more = " ..." if len(first) > 70 or len(text.strip().splitlines()) > 1 else ""
            dropped.append(f"line {start}: {first[:70]}{more}")
    return "\n\n".join(kept), dropped


def export_source(notebook: dict, *, name: str = "the notebook") -> str:
    """The standalone job script of a notebook (its JSON as a dict): its code cells' definitions and a `main()`."""
    cells = [c for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
    job_cells = [c for c in cells if _meta(c).get("grade_id") == JOB_CELL]
    if not job_cells:
        raise ValueError(f"{name} has no job cell (a given cell with grade id {JOB_CELL!r} that imports the "
                         f"assignment's job): this assignment has no training to run as a job")
    job_names = [a.asname or a.name for node in ast.parse(_source(job_cells[0])).body
                 if isinstance(node, ast.ImportFrom) for a in node.names]
    if len(job_names) != 1:
        raise ValueError(f"{name}: the job cell must import exactly one job, found {job_names or 'none'}")
    parts = []
    for cell in cells:
        meta = _meta(cell)
        if meta.get("grade"):
            continue  # a test cell: the checks, visible and hidden, stay in the notebook
        if meta.get("solution"):
            kind = "your answer"
        elif meta.get("locked"):
            kind = "given"
        else:
            continue  # a scratch cell: your experiments stay in the notebook
        where = f"{name}, cell {meta.get('grade_id', '?')!r}"
        body, dropped = _kept_statements(_source(cell), where)
        head = f"# --- cell {meta.get('grade_id', '?')!r} ({kind})"
        if dropped:
            head += "; left out (top-level calls run only in the notebook):\n#     " + "\n#     ".join(dropped)
        parts.append(head + ("\n" + body if body else ""))
    job = job_names[0]
    doc = f'''"""{name} as a job: its answer and given cells (definitions only), and main() that runs `{job}`.

Written by `python -m autograder.runtime.launch export` (autograder/runtime/launch.py); edit the notebook and
export again rather than editing this file. Run it with one process per rank:

    torchrun --standalone --nproc-per-node N THIS_FILE [options]      # N: the ranks the job asks for
    srun --ntasks N python THIS_FILE [options]
    python THIS_FILE --help                                           # the options and their defaults
"""'''
    main = f'''

def main(argv=None):
    """Run `{job}` in this process as one rank of the job (torchrun or srun started one per rank)."""
    from autograder.runtime.launch import run_job

    return run_job({job}, globals(), argv)


if __name__ == "__main__":
    main()
'''
    return doc + "\n\n" + "\n\n\n".join(parts) + "\n" + main


def export(notebook_path: str, out: str) -> str:
    """Write the job script of the notebook at `notebook_path` to `out`; return `out`."""
    with open(notebook_path, encoding="utf-8") as f:
        notebook = json.load(f)
    text = export_source(notebook, name=os.path.basename(notebook_path))
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


# -- the rank's side ----------------------------------------------------------------------------------------

class _JobExecutor:
    """run_distributed's executor in a job: `fn` runs here, as this process's rank; every rank's result gathered."""

    def __init__(self, how: str):
        self.how = how  # "torchrun" or "srun": named in the size error

    def run(self, fn, world_size: int, kwargs: dict):
        import torch.distributed as dist

        started = dist.get_world_size()
        if world_size != started:
            hint = (f"torchrun --nproc-per-node {world_size} (or --nnodes K --nproc-per-node {world_size}/K)"
                    if self.how == "torchrun" else f"srun --ntasks {world_size}")
            raise JobSizeError(
                f"the code asks run_distributed for {world_size} ranks, but this job was started with "
                f"WORLD_SIZE={started} ({self.how}). Start it with {world_size} processes in all: {hint}; or "
                f"change the job's sizes (--help lists them) so that they multiply to {started}.")
        result = fn(dist.get_rank(), started, *kwargs.get("args", ()))
        gathered = [None] * started
        dist.all_gather_object(gathered, result)
        return gathered


def running_as_job() -> bool:
    """Whether this process is one rank of a job started by run_job (torchrun or srun), not a notebook."""
    from autograder.runtime import dist as course_dist

    return isinstance(course_dist._EXECUTOR, _JobExecutor)


def job_device():
    """The device of this rank's tensors: `cuda:<its device>` in an NCCL process group, else the CPU.

    Both runners set the rank's device before its program runs (`run_distributed`
    with backend="nccl": cuda:rank % devices; `run_job` with --backend nccl:
    cuda:LOCAL_RANK), so a job's rank program places its model and data with
    this and runs unchanged on gloo and on NCCL.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _first_slurm_host() -> str:
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or ""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=30)
        hosts = out.stdout.split()
        if out.returncode == 0 and hosts:
            return hosts[0]
    except (OSError, subprocess.SubprocessError):
        pass
    if nodes and not any(c in nodes for c in "[,"):
        return nodes
    return socket.gethostname()


def init_from_environment(backend: str = "gloo", *, timeout_s: float = 600.0) -> tuple[int, int, int, str]:
    """Initialise the default process group from torchrun's or Slurm's environment: (rank, world, local rank, how).

    torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and
    TORCHELASTIC_RESTART_COUNT); srun sets SLURM_PROCID, SLURM_NTASKS and
    SLURM_LOCALID, from which the torchrun names are set here. With `nccl` each
    rank uses one GPU, `cuda:LOCAL_RANK`.
    """
    import torch
    import torch.distributed as dist

    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        how = "torchrun"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        how = "srun"
        env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        env.setdefault("MASTER_ADDR", _first_slurm_host())
        env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    else:
        raise SystemExit("this script is one rank of a job: start it with torchrun (torchrun --standalone "
                         "--nproc-per-node N SCRIPT) or srun (srun --ntasks N python SCRIPT), which set RANK and "
                         "WORLD_SIZE (or SLURM_PROCID and SLURM_NTASKS); neither is set here")
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not set: torchrun sets them; under srun export them (the first "
                         f"node's address and a free port) before srun")
    rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
            raise SystemExit(f"--backend nccl: rank {rank} needs cuda:{local} (LOCAL_RANK={local}), but this node "
                             f"has {torch.cuda.device_count()} CUDA device(s): start at most that many processes "
                             f"per node, or use --backend gloo")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local), **_rendezvous(rank, world, timeout_s))
    elif backend == "gloo":
        if sys.platform.startswith("linux") and env.get("MASTER_ADDR") in ("localhost", "127.0.0.1"):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", **_rendezvous(rank, world, timeout_s))
    else:
        raise SystemExit(f"--backend must be gloo or nccl, got {backend!r}")
    return rank, world, local, how


def _rendezvous(rank: int, world: int, timeout_s: float) -> dict:
    """init_process_group's rendezvous arguments: env://, except in a job that torchrun restarted.

    torchrun's workers share the agent's TCPStore (MASTER_ADDR:MASTER_PORT), and
    after a restart the keys of the dead attempt are still there: a new rank
    can read a dead peer's address and fail with "Connection refused" (PyTorch
    issue 135712; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on torchrun's command line
    avoids it too). From the second attempt on, each attempt's keys get a
    prefix of their own.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0:
        return dict(init_method="env://", timeout=timeout)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent hosts it: every rank a client
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=timeout)
    return dict(store=dist.PrefixStore(f"/course-job/attempt_{attempt}/", store), rank=rank, world_size=world,
                timeout=timeout)


def _options(job) -> list[tuple[str, object]]:
    """The job's keyword-only options with their defaults (its signature: `job(namespace, *, steps=4, ...)`)."""
    return [(p.name, p.default) for p in inspect.signature(job).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "backend"]


def _parser(job) -> argparse.ArgumentParser:
    doc = inspect.getdoc(job) or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None,
                                     epilog="Start one process per rank: torchrun --nproc-per-node N, or srun.")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="gloo: CPU ranks; nccl: one GPU per rank, cuda:LOCAL_RANK (default: gloo)")
    for name, default in _options(job):
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default,
                                help=f"(default: {default})")
        else:
            kind = type(default) if isinstance(default, (int, float)) else str
            parser.add_argument(flag, type=kind, default=default, help=f"(default: {default!r})")
    return parser


def run_job(job, namespace: dict, argv=None):
    """The exported script's main: parse the job's options, join the process group, run `job(namespace, ...)`.

    Every `run_distributed` call the job makes runs its function here, as this
    process's rank (see the module docstring). Returns the job's result.
    """
    from autograder.runtime import dist as course_dist

    args = _parser(job).parse_args(argv)
    options = {name: getattr(args, name) for name, _ in _options(job)}
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # as the notebook's ranks (autograder.runtime.dist): the same kernels, the same sums
    rank, world, local, how = init_from_environment(args.backend)
    course_dist.set_executor(_JobExecutor(how))
    try:
        return job(namespace, backend=args.backend, **options) if "backend" in inspect.signature(job).parameters \
            else job(namespace, **options)
    finally:
        course_dist.set_executor(None)
        dist.destroy_process_group()


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.runtime.launch",
                                     description="Your notebook's code as a job (torchrun, srun).")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write the notebook's job script: its code cells and a main()")
    exp.add_argument("notebook", help="your notebook, e.g. composition_lab.ipynb")
    exp.add_argument("--out", required=True, help="the script to write, e.g. train_06.py")
    args = parser.parse_args(argv)
    try:
        out = export(args.notebook, args.out)
    except (OSError, ValueError, SyntaxError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}: run it with  torchrun --standalone --nproc-per-node N {out}  (python {out} --help: "
          f"its options)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
