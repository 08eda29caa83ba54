"""examples/multi_turn_math: compare.py trains with credit=trajectory and credit=turn and compares them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from examples_support import TINY, metrics_rows, run_command, train_steps


@pytest.mark.slow
def test_compare_runs_both_credit_modes(tmp_path: Path) -> None:
    overrides = [o for o in TINY if not o.startswith("trainer.total_steps")] + ["trainer.total_steps=1"]
    proc = run_command([sys.executable, "examples/multi_turn_math/compare.py", *overrides,
                        f"output_dir={tmp_path / 'runs'}"], tmp_path, timeout=300)
    root = tmp_path / "runs" / "multi-turn-math"
    results = json.loads((root / "credit_comparison.json").read_text())
    assert sorted(results) == ["trajectory", "turn"]
    table = proc.stdout[proc.stdout.index("credit "):].splitlines()

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    for credit, res in results.items():
        run_dir = root / f"credit-{credit}"
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["algorithm"]["credit"] == credit
        assert saved["env"]["name"] == "math-multiturn" and saved["env"]["turn_discount"] == 0.5
        # the comparison reports each run's own training and eval records, step by step
        steps = train_steps(run_dir)
        evals = [r for r in metrics_rows(run_dir) if "eval/accuracy" in r]
        assert res["steps"] == [r["step"] for r in steps] == [1]
        assert res["reward"] == [r["rollout/reward"] for r in steps] and res["turns"] == [r["rollout/turns"] for r in steps]
        assert res["accuracy_before"] == evals[0]["eval/accuracy"] and 1.0 <= res["turns"][0] <= 3.0
        row = next(line for line in table if line.split()[0] == credit)
        assert row.split()[1:] == [fmt(res["accuracy_before"]), fmt(res["accuracy_after"]), fmt(res["reward"][0]),
                                   fmt(res["reward"][-1]), fmt(res["turns"][-1])], row
    assert (root / "credit_comparison.png").stat().st_size > 1000


def test_compare_rejects_overriding_what_it_compares(tmp_path: Path) -> None:
    import subprocess

    from examples_support import ROOT

    proc = subprocess.run([sys.executable, "examples/multi_turn_math/compare.py", "algorithm.credit=turn"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: compare.py sets algorithm.credit and trial_name itself"
