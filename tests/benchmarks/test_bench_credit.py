"""The credit benchmark: its analysis (time to a level, verdict; its curves are ``curves.read_training``'s,
tested in test_bench_curves.py) and a tiny end-to-end run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_credit as bc  # noqa: E402

sys.path.pop(0)
ROOT = Path(__file__).resolve().parents[2]


def test_time_to_a_level_gives_the_time_and_the_step() -> None:
    curve = [[0.0, 0, 0.2], [15.0, 2, 0.5], [40.0, 4, 0.9]]  # curves.read_training's points
    assert bc.time_to(curve, 0.5) == (15.0, 2) and bc.time_to(curve, 0.85) == (40.0, 4)
    assert bc.time_to(curve, 0.95) is None


def test_summary_and_verdict_over_seeds() -> None:
    def run(curve: list[list[float]]) -> dict:
        return {"curve": curve, "steps": int(curve[-1][1]), "train_s": curve[-1][0]}

    runs = {"grpo": [run([[0, 0, 0.5], [60, 10, 0.6], [120, 20, 0.7]]), run([[0, 0, 0.5], [120, 20, 0.72]])],
            "gigpo": [run([[0, 0, 0.5], [60, 10, 0.8], [120, 20, 0.9]]), run([[0, 0, 0.5], [120, 20, 0.8]])]}
    summary = {arm: bc.summarise(rs, [0.7, 0.8]) for arm, rs in runs.items()}
    assert summary["gigpo"]["final_success"] == {"mean": pytest.approx(0.85), "min": 0.8, "max": 0.9, "n": 2, "of": 2}
    assert summary["gigpo"]["time_to_s"]["0.80"] == {"mean": 90.0, "min": 60, "max": 120, "n": 2, "of": 2}
    assert summary["gigpo"]["steps_to"]["0.80"]["mean"] == 15.0
    assert summary["grpo"]["time_to_s"]["0.80"]["n"] == 0 and summary["grpo"]["time_to_s"]["0.70"]["mean"] == 120.0
    v = bc.verdict(summary, [0.7, 0.8])
    assert v == {"best_final_success": "gigpo", "separated": True, "fastest_to": {"0.70": "gigpo", "0.80": "gigpo"}}
    runs["gigpo"][1]["curve"][-1][2] = 0.71  # its worst seed now ends below grpo's best
    runs["gigpo"][1]["curve"][-1][0] = 30
    v = bc.verdict({arm: bc.summarise(rs, [0.7, 0.8]) for arm, rs in runs.items()}, [0.7, 0.8])
    assert v["best_final_success"] == "gigpo" and v["separated"] is False
    assert v["fastest_to"] == {"0.70": "gigpo", "0.80": None}  # no arm reached 0.80 with every seed


@pytest.mark.slow
def test_credit_benchmark_runs_end_to_end_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "credit.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_credit.py"), "--seeds", "1", "--budget",
                           "30", "--steps", "2", "--eval-every", "1", "--levels", "0.5", "--out", str(out),
                           "--override", "sft.warm_start_steps=10", "sft.warm_start_target=0", "eval.n=8",
                           "data.test_size=8", "rollout.batch_size=2", "rollout.group_size=2"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"grpo", "turn", "gigpo"} and result["env"] == "math-multiturn"
    for runs in result["runs"].values():
        assert len(runs) == 1 and runs[0]["steps"] == 2 and [c[1] for c in runs[0]["curve"]] == [0, 1, 2]
    assert out.with_suffix(".png").stat().st_size > 0 and "best final success" in proc.stdout
