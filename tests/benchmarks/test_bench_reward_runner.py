"""The reward-runner benchmark runs end to end at a small size and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reward_runner_benchmark_small(tmp_path: Path) -> None:
    out = tmp_path / "reward_runner.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_reward_runner.py"), "--calls", "2",
                           "--seconds", "0.05", "--timeout", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["parallel"]) == {"calls", "reward_s", "wall_s_n_workers", "wall_s_one_worker", "speedup"}
    assert set(report["hang"]) == {"timeout_s", "hung_call_ended_after_s", "other_call_s", "other_reward_s"}
    assert report["parallel"]["calls"] == 2 and report["hang"]["timeout_s"] == 1.0
