"""examples/multi_turn_math: compare.py trains with credit=trajectory and credit=turn and compares them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from examples_support import TINY, run_command


@pytest.mark.slow
def test_compare_runs_both_credit_modes(tmp_path: Path) -> None:
    overrides = [o for o in TINY if not o.startswith("trainer.total_steps")] + ["trainer.total_steps=1"]
    proc = run_command([sys.executable, "examples/multi_turn_math/compare.py", *overrides,
                        f"output_dir={tmp_path / 'runs'}"], tmp_path, timeout=300)
    root = tmp_path / "runs" / "multi-turn-math"
    results = json.loads((root / "credit_comparison.json").read_text())
    assert sorted(results) == ["trajectory", "turn"]
    for credit, res in results.items():
        saved = yaml.safe_load((root / f"credit-{credit}" / "config.yaml").read_text())
        assert saved["algorithm"]["credit"] == credit
        assert saved["env"]["name"] == "math-multiturn" and saved["env"]["turn_discount"] == 0.5
        assert res["steps"] == [1] and 1.0 <= res["turns"][0] <= 3.0
        assert 0.0 <= res["reward"][0] <= 1.0 and res["accuracy_before"] is not None
    assert (root / "credit_comparison.png").stat().st_size > 1000
    table = proc.stdout[proc.stdout.index("credit "):]
    assert "trajectory" in table and "turn" in table


def test_compare_rejects_overriding_what_it_compares(tmp_path: Path) -> None:
    import subprocess

    from examples_support import ROOT

    proc = subprocess.run([sys.executable, "examples/multi_turn_math/compare.py", "algorithm.credit=turn"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: compare.py sets algorithm.credit and trial_name itself"
