"""The long-episode benchmark runs end to end at a small size: one step per length and setting,
each in its own process, and checkpointing keeps fewer activations for the backward pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_long_episode_benchmark_small(tmp_path: Path) -> None:
    out = tmp_path / "long_episode.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_long_episode.py"), "--lengths", "1024",
                           "--hidden", "64", "--layers", "2", "--output", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(r["length"], r["checkpointing"]): r for r in report["rows"]}
    assert sorted(rows) == [(1024, False), (1024, True)]  # one fresh process each
    assert all(r["seconds"] > 0 for r in rows.values())
    assert 0 < rows[1024, True]["peak_growth_mb"] < rows[1024, False]["peak_growth_mb"]
    assert "1024 tokens, checkpointing on" in proc.stdout
