"""benchmarks/bench_record.py runs (its reading part, at the smoke size): the synthetic record is
written with the real writer and read back whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_benchmark_reads_what_it_wrote(tmp_path: Path) -> None:
    out = tmp_path / "record.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_record.py"), "--smoke", "--skip-train",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = json.loads(out.read_text())["read"]
    assert read["episodes"] == 2000 and read["step_files"] == -(-2000 // (8 * read["groups_per_step"]))
    assert read["bytes_per_1000_episodes"] > 0 and "train" not in json.loads(out.read_text())
