"""benchmarks/gpu_check.sh, dry-run on the CPU: the same steps as on a GPU, tiny budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["device", "rl", "parity", "bench_trainer", "bench_inference_server", "sizes"]


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
    sizes = json.loads((out / "sizes.json").read_text())  # the miniature: every part ran, no MFU on a CPU
    mini = sizes["sizes"]["mini"]
    assert sizes["ok"] and set(mini) >= {"train", "weight_sync", "decode"} and "skipped" not in mini
    assert steps["sizes"]["mfu_target_met"] is None and steps["sizes"]["lines"] == sizes["lines"]
    lines = proc.stdout.strip().splitlines()
    head = max(i for i, ln in enumerate(lines) if ln.startswith("GPU check on"))
    assert lines[head].startswith("GPU check on cpu (quick dry run): all steps ok")
    rows = [ln for ln in lines[head + 1 :] if not ln.startswith("    ")]
    assert [ln.split()[0] for ln in rows] == STEPS and all(ln.split()[1] == "ok" for ln in rows)
    assert [ln.strip() for ln in lines[head + 1 :] if ln.startswith("    ")] == sizes["lines"]  # a line per size


def test_the_summary_gives_each_size_a_line() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    sys.path.pop(0)
    summary = {"device": "cuda", "quick": False, "ok": True, "total_s": 400.0, "steps": {
        "device": {"status": "ok", "seconds": 4.0, "gpu": "NVIDIA H200"},
        "sizes": {"status": "ok", "seconds": 200.0, "mfu_target_met": True, "lines": ["1.5b (...)", "0.5b (...)"]}}}  # fmt: skip
    assert gpu_check.format_summary(summary).splitlines()[1:] == [
        "  device                   ok          4.0 s  gpu=NVIDIA H200",
        "  sizes                    ok        200.0 s  mfu_target_met=True", "    1.5b (...)", "    0.5b (...)"]  # fmt: skip
    assert list(gpu_check.STEP_LIMITS_S) == STEPS and gpu_check.STEP_LIMITS_S["sizes"] <= 300
    assert sum(gpu_check.STEP_LIMITS_S.values()) > gpu_check.BUDGET_S <= 540  # steps share one budget, under 9 minutes
