"""The weight-sync benchmark runs end to end at a small size and reports both paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_weight_sync_benchmark_small(tmp_path: Path) -> None:
    out = tmp_path / "weight_sync.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_weight_sync.py"), "--hidden", "64",
                           "--layers", "2", "--repeats", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["parameters"] > 0 and len(report["raw"]["disk"]) == len(report["raw"]["gloo"]) == 1
    assert report["disk_s"] > 0 and report["gloo_s"] > 0 and report["ratio"] == report["disk_s"] / report["gloo_s"]
