"""`areal-agents eval`: greedy accuracy and pass@k on the test split, with a JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from areal_agents.inference.tiny_model import build_tiny_model


def test_eval_command_writes_report(tmp_path: Path) -> None:
    model = build_tiny_model([f"{a}+{b}= {a + b}" for a in range(10, 40) for b in range(10, 40)], tmp_path / "m")
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.cli", "eval", "--env", "math", "--model", str(model), "--output", str(out),
         "eval.n=6", "eval.k=3", "sampling.max_new_tokens=4", f"output_dir={tmp_path / 'runs'}", "logging.progress=false"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["eval/n"] == 6 and report["k"] == 3 and report["model"] == str(model)
    assert 0.0 <= report["eval/accuracy"] <= 1.0 and 0.0 <= report["eval/pass@3"] <= 1.0
    assert report["eval/failed"] == 0
    assert "eval/accuracy" in proc.stdout
