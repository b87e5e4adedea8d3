#!/usr/bin/env bash
# On a GPU grading node: can it run the course's NCCL cases, and do they pass? (README: "A GPU grading node")
#
#   cluster/gpu-check.sh [ASSIGNMENT ...]     # from the course root (or anywhere: it goes there); default: all
#
# 1. The node, in seconds: torch's build and the devices it sees. It stops at once, saying why and what to do,
#    where NCCL cannot run (exit 2): a CPU-only torch build (which wheel to install), a CUDA build that sees no
#    device (the driver, CUDA_VISIBLE_DEVICES), no NCCL. It says which NCCL cases this many devices run (NCCL
#    puts one rank on each device), then runs a 1-rank NCCL all-reduce on cuda:0.
# 2. One GPU: it stops there (exit 3): no NCCL case of the course can run on one device.
# 3. Two or more: make demo's class is graded with --nccl on in a scratch copy of the course (in $TMPDIR,
#    removed afterwards; never this course's gradebook.db, graded/, feedback/ or submitted/), and the reference
#    solutions' NCCL notes decide: exit 0 passed, 1 failed. No points depend on the NCCL run.
# The logic: autograder/grading/gpunode.py.
set -euo pipefail
cd "$(dirname "$0")/.."
test -x .venv/bin/python || make install >/dev/null
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
export TORCH_CPP_LOG_LEVEL=ERROR PYTHONPATH="$PWD"
exec .venv/bin/python -m autograder.grading.gpunode "$@"
