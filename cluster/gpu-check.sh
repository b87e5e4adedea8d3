#!/usr/bin/env bash
# On a GPU grading node: every assignment's NCCL cases and the reference class, in one go.
#
#   cluster/gpu-check.sh            # from the course root (or anywhere: it goes there)
#
# It needs at least 2 CUDA devices (4 for the cases that run on 4 ranks; those say they were skipped on 2).
# It stops at once, saying why, where there are none. Then: the course is built, and `make demo`'s class (the
# reference solution, the untouched release and one wrong edit of each assignment) is graded with `--nccl on`:
# every test cell, visible and hidden, runs again with backend="nccl" (ranks spawned, tensors on cuda:<rank>),
# and the table, the feedback and the records carry one note per cell. No points depend on the NCCL run.
set -euo pipefail
cd "$(dirname "$0")/.."
test -x .venv/bin/python || make install >/dev/null
.venv/bin/python - <<'PY'
from autograder.runtime.gpu import nccl_status

ok, why = nccl_status(2)
print(f"GPU node check: {why}")
raise SystemExit(0 if ok else 1)
PY
nvidia-smi --query-gpu=index,name,memory.total --format=csv || true
make build >/dev/null
.venv/bin/python -m autograder.grade demo --nccl on --jobs 1 --memory 32 --force
