"""Shared helpers of the course's own tests: where things are, and a scratch copy of the course."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)


def assignments() -> list[str]:
    """Assignments with a builder, in course order."""
    base = os.path.join(ROOT, "assignments")
    return sorted(a for a in os.listdir(base) if os.path.exists(os.path.join(base, a, "_build_nb.py")))


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def copy_course(dest: str) -> str:
    """A copy of the working tree (what git would commit) at `dest`, without build outputs."""
    for rel in tracked_files():
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target)
    return dest


def nbgrader(root: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    exe = os.path.join(VENV_BIN, "nbgrader")
    # nbgrader runs `alembic` from PATH: put the venv's bin first
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONPATH": root,
           "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run([exe, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def region_lines(source: str, begin: str = "### BEGIN HIDDEN TESTS", end: str = "### END HIDDEN TESTS",
                 min_len: int = 12) -> list[str]:
    """The substantive lines (stripped, not comments) between nbgrader markers in a cell's source."""
    lines, inside = [], False
    for line in source.splitlines():
        if begin in line:
            inside = True
        elif end in line:
            inside = False
        elif inside and len(line.strip()) >= min_len and not line.strip().startswith("#"):
            lines.append(line.strip())
    return lines


def secret_lines(notebook) -> tuple[list[str], list[str]]:
    """(solution lines, hidden-test lines) of a source notebook."""
    solution, hidden = [], []
    for cell in notebook.cells:
        solution += region_lines(cell.source, "### BEGIN SOLUTION", "### END SOLUTION")
        hidden += region_lines(cell.source)
    return solution, hidden
