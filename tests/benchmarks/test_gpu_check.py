"""benchmarks/gpu_check.sh, dry-run on the CPU: the same steps as on a GPU, tiny budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["device", "rl", "parity", "bench_trainer", "bench_inference_server"]


def test_the_wheelhouse_holds_every_requirement_but_torch() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "requirements"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)  # fmt: skip
    reqs = proc.stdout.split()
    assert proc.returncode == 0 and "transformers>=4.45" in reqs and "math-verify>=0.7" in reqs
    assert not any(r.startswith("torch") for r in reqs)
    deps = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "deps"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)  # fmt: skip
    assert deps.returncode == 0 and deps.stdout == ""  # the test environment has them all: nothing to install


@pytest.mark.slow
def test_cpu_dry_run_runs_every_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "GPU_CHECK_OUT": str(out), "AREAL_AGENTS_CACHE": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1", "WHEELHOUSE": str(tmp_path / "no-wheelhouse")}  # fmt: skip
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(summary["steps"]) == STEPS and summary["ok"] and summary["quick"]
    assert "installing" not in proc.stdout  # everything was there: no wheelhouse needed
    steps = summary["steps"]
    assert steps["device"]["device"] == "cpu" and steps["device"]["torch"]
    assert steps["rl"]["steps"] == 2 and steps["rl"]["accuracy_before"] is not None
    run = out / "runs" / "math" / "gpu-check"
    config = (run / "config.yaml").read_text()
    assert "dtype: bfloat16" in config and "grad_reduce_dtype: float32" in config and "device: cpu" in config
    assert (run / "final" / "model.safetensors").is_file()
    parity = steps["parity"]
    assert parity["tokens"] == 4 * 16 and 0 < parity["mean_abs_diff"] < parity["threshold_mean"]
    for name in ("bench_trainer", "bench_inference_server"):
        data = json.loads((out / f"{name}.json").read_text())
        assert data["device"] == "cpu"
    assert steps["bench_trainer"]["engine_tokens_per_s"] > 0 and steps["bench_inference_server"]["ratio"] > 0
    lines = proc.stdout.strip().splitlines()
    assert lines[-6].startswith("GPU check on cpu (quick dry run): all steps ok")
    assert [ln.split()[0] for ln in lines[-5:]] == STEPS and all(ln.split()[1] == "ok" for ln in lines[-5:])
