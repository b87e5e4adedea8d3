"""CPU burners beside a test: the grading machine as busy as a shared node gets (issue 28).

    with burners(6 * os.cpu_count()):
        ...   # grade: the verdicts must be the idle ones

Each burner is a process of its own session (setsid): Linux's autogroup shares the CPU between sessions, so
burners started in one session would take one session's share and barely slow the ranks. The burners are
started and ended by PID: nothing else on the machine is touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

BURN = "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(0))\nwhile True:\n    pass\n"


def _load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


@contextlib.contextmanager
def burners(count: int, settle: float = 3.0):
    """`count` busy processes, each in its own session, for the duration of the block; yields their PIDs."""
    procs = [subprocess.Popen([sys.executable, "-S", "-c", BURN], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for _ in range(count)]
    try:
        for p in procs:  # each really is a session leader of its own (autogroup per session)
            assert os.getsid(p.pid) == p.pid, f"burner {p.pid} is not in a session of its own"
        time.sleep(settle)  # every burner running before the work starts
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(10)


def busy_share() -> float:
    """The load average per core (1 minute): how busy the machine was."""
    return _load() / (os.cpu_count() or 1)


def grade_in_sandbox(assignment: str, kind: str) -> dict:
    """The trusted run of one sample submission in a real sandbox (where bubblewrap is), as the class command
    grades it: {grade_id: [passed, points, max_points, inconclusive, message]}. `kind`: "reference" or a
    mutant's name (solutions/<dim>/mutants.py)."""
    import json
    import tempfile

    import nbformat

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from autograder.grading.classrun import source_notebook
    from autograder.grading.sandbox import Sandbox, sandbox_status
    from autograder.grading.trusted import grade_notebook
    from solutions import submissions

    if kind == "reference":
        nb = submissions.reference_submission(assignment)
    else:
        nb = submissions.mutant_submission(assignment, next(m for m in submissions.mutants_of(assignment)
                                                            if m.name == kind))
    with open(source_notebook(root, assignment), encoding="utf-8") as f:
        source = json.load(f)
    inputs = tempfile.mkdtemp(prefix="autograder-load-")
    if sandbox_status()[0]:
        with Sandbox(root, inputs) as box:
            verdicts, _ = grade_notebook(json.loads(nbformat.writes(nb)), source, inputs=inputs, sandbox=box)
    else:
        verdicts, _ = grade_notebook(json.loads(nbformat.writes(nb)), source, inputs=inputs)
    return {g: [v.passed, v.points, v.max_points, v.inconclusive, v.message[:2000]] for g, v in verdicts.items()}


if __name__ == "__main__":  # python tests/load.py ASSIGNMENT KIND OUT.json
    import json

    with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(grade_in_sandbox(sys.argv[1], sys.argv[2]), f)
