"""The runner inside a real Jupyter kernel, as a student (and nbgrader) uses it.

    .venv/bin/python -m pytest -q tests/test_kernel.py
"""

from nbclient import NotebookClient
from nbformat import v4


def _run(cells, timeout=120):
    nb = v4.new_notebook()
    nb.cells = [v4.new_code_cell(src) for src in cells]
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True)
    client.execute()
    return nb


def _stream(cell, name):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == name)


def _errors(cell):
    return [o for o in cell.outputs if o.output_type == "error"]


def test_a_deadlocking_cell_fails_and_the_kernel_survives():
    nb = _run([
        "import torch, torch.distributed as dist\n"
        "from autograder.runtime.dist import run_distributed\n"
        "torch.randn(256, 256) @ torch.randn(256, 256)  # warm the kernel's thread pool (spec 6)",
        # a function defined in a notebook cell (fork needs nothing; spawn sends it by value)
        "def student_deadlock(rank, world_size):\n"
        "    t = torch.zeros(1)\n"
        "    dist.recv(t, src=1 - rank)\n"
        "run_distributed(student_deadlock, 2, timeout=2)",
        "def works(rank, world_size):\n"
        "    t = torch.ones(2) * rank\n"
        "    dist.all_reduce(t)\n"
        "    return t\n"
        "print('next cell ran', run_distributed(works, 4)[3].tolist())",
        "class Scale(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return 3 * x\n"
        "def with_class(rank, world_size, m):\n"
        "    return m(torch.ones(1))\n"
        "print('spawn ran', run_distributed(with_class, 2, args=(Scale(),), start_method='spawn', timeout=60)[1].tolist())",
        # a spawned rank (macOS) names the kernel's cells as the kernel does, never ipykernel's temporary files
        "def spawned_fails(rank, world_size):\n"
        "    raise ValueError(f'bad rank {rank}')\n"
        "try:\n"
        "    run_distributed(spawned_fails, 2, start_method='spawn', timeout=60)\n"
        "except Exception as exc:\n"
        "    print(exc)",
    ])
    setup, deadlock, after, spawned, spawned_error = nb.cells
    assert not _errors(setup)
    errs = _errors(deadlock)
    assert len(errs) == 1 and errs[0].ename == "DistributedError"
    text = "\n".join(errs[0].traceback)
    assert "deadlock" in text and "student_deadlock" in text
    assert _stream(deadlock, "stderr") == ""
    assert "next cell ran [6.0, 6.0]" in _stream(after, "stdout")
    assert _stream(after, "stderr") == ""
    assert "spawn ran [3.0]" in _stream(spawned, "stdout"), spawned.outputs
    text = _stream(spawned_error, "stdout")
    assert "ValueError: bad rank 0" in text and "Cell In[5], line 2, in spawned_fails" in text, text
    assert "raise ValueError(f'bad rank {rank}')" in text  # the cell's line, quoted from the kernel's copy
    assert "ipykernel" not in text and "dynamic-code" not in text and ".py:" not in text, text
