"""The weight-sync benchmark runs end to end at a small size: both paths carry the same work
(fresh weights each sync) and deliver exactly the trainer's weights to the server."""

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
    assert len(report["raw"]["disk"]) == len(report["raw"]["gloo"]) == 1  # one timed sync each (after warm-up)
    checks, tol = report["checks"], report["checks"]["tolerance"]
    # syncs alternate disk, gloo, disk, gloo with a new version (and new weights) each time
    assert [c["version"] for c in checks["disk"]] == [1, 3] and [c["version"] for c in checks["gloo"]] == [2, 4]
    for kind in ("disk", "gloo"):
        for check in checks[kind]:
            # before the sync the server's logprobs are not the trainer's (the probe can tell), after it they are
            assert check["stale_logprob_diff"] > 100 * tol > 100 * check["max_abs_logprob_diff"], (kind, check)
            assert len(check["output_ids"]) == 8
