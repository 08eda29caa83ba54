#!/usr/bin/env bash
# The GPU check: the embedded server and the FSDP2 trainer on CUDA in bfloat16 (gradients
# reduced in float32), a few RL steps of the default recipe, server-vs-trainer logprob parity
# and the trainer/server benchmarks, then real sizes (Qwen2.5-1.5B/0.5B shapes, random weights: MFU,
# memory, weight sync, decode), in under 9 minutes, with one summary at the end
# (benchmarks/gpu_check.py does the steps; results in benchmarks/results/gpu_check_cuda/).
#
# For a single-GPU machine with PyTorch but nothing else of this project and no network:
#   1. on a machine with network, from this checkout, with the GPU machine's Python minor version:
#        bash benchmarks/gpu_check.sh wheelhouse       # -> benchmarks/wheelhouse/ (gitignored)
#      (WHEEL_PYTHON=3.10 also fetches binary wheels for another Python; the wheels of the
#      pure-Python packages fit any version)
#   2. copy the checkout with benchmarks/wheelhouse/ to the GPU machine, then there:
#        bash benchmarks/gpu_check.sh                  # installs what is missing, offline, then runs
#   DEVICE=cpu bash benchmarks/gpu_check.sh runs the same steps on a CPU with tiny budgets.
# Environment: DEVICE (cuda | cpu), WHEELHOUSE (default benchmarks/wheelhouse),
# GPU_CHECK_OUT (default benchmarks/results/gpu_check_$DEVICE), GPU_CHECK_BUDGET (seconds; default 540 on
# cuda, 1200 on cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
WHEELHOUSE=${WHEELHOUSE:-benchmarks/wheelhouse}
OUT=${GPU_CHECK_OUT:-benchmarks/results/gpu_check_$DEVICE}

if [ "${1:-}" = "wheelhouse" ]; then
    mapfile -t reqs < <("$PY" benchmarks/gpu_check.py requirements)
    mkdir -p "$WHEELHOUSE"
    # torch stays out: the GPU machine has its own CUDA build. setuptools builds the project there.
    "$PY" -m pip wheel --wheel-dir "$WHEELHOUSE" "setuptools>=68" wheel "${reqs[@]}"
    if [ -n "${WHEEL_PYTHON:-}" ]; then
        "$PY" -m pip download --dest "$WHEELHOUSE" --only-binary=:all: --python-version "$WHEEL_PYTHON" \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            "setuptools>=68" wheel "${reqs[@]}"
    fi
    echo "wheelhouse ready: $WHEELHOUSE ($(ls "$WHEELHOUSE" | wc -l) wheels)"
    exit 0
fi

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "error: no PyTorch for $PY (the check uses the machine's own torch build)" >&2
    exit 2
fi
if ! missing=$("$PY" benchmarks/gpu_check.py deps); then
    if [ ! -d "$WHEELHOUSE" ]; then
        echo "error: $missing; and no wheelhouse at $WHEELHOUSE (build it with: bash benchmarks/gpu_check.sh wheelhouse)" >&2
        exit 2
    fi
    echo "installing from $WHEELHOUSE ($missing)"
    "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" -e .
fi
exec "$PY" benchmarks/gpu_check.py --device "$DEVICE" --out "$OUT" ${GPU_CHECK_BUDGET:+--budget "$GPU_CHECK_BUDGET"}
