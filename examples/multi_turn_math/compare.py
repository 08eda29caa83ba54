"""Train math-multiturn twice, with turn-level and with trajectory-level credit, and compare.

    python examples/multi_turn_math/compare.py [key=value ...]

Both runs use ``config.yaml`` plus the given overrides and differ only in
``algorithm.credit``; they run one after the other through ``areal-agents run`` (the warm
start is built once and shared). Prints a table and writes ``credit_comparison.png`` and
``credit_comparison.json`` into ``runs/<experiment_name>/``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CREDITS = ("trajectory", "turn")

__all__ = ["main", "summarise"]


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarise(run_dir: Path) -> dict[str, Any]:
    """Per-step training reward/turns and eval accuracy before/after, from ``metrics.jsonl``."""
    records = _records(run_dir)
    steps = [r for r in records if "train/loss" in r]
    evals = [r for r in records if "eval/accuracy" in r]
    return {
        "steps": [r["step"] for r in steps],
        "reward": [r.get("rollout/reward", 0.0) for r in steps],
        "turns": [r.get("rollout/turns", 0.0) for r in steps],
        "elapsed_s": [r.get("time/elapsed_s", 0.0) for r in steps],
        "accuracy_before": evals[0]["eval/accuracy"] if evals else None,
        "accuracy_after": evals[-1]["eval/accuracy"] if len(evals) > 1 else None,
        "eval_reward_after": evals[-1].get("eval/reward") if len(evals) > 1 else None,
    }


def _plot(results: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for credit, res in results.items():
        axes[0].plot(res["steps"], res["reward"], marker="o", label=f"credit={credit}")
        axes[1].plot(res["steps"], res["turns"], marker="o", label=f"credit={credit}")
    axes[0].set(xlabel="step", ylabel="mean discounted return", title="training reward")
    axes[1].set(xlabel="step", ylabel="turns per episode", title="turns used")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    if any(o.startswith(("algorithm.credit=", "trial_name=")) for o in overrides):
        print("error: compare.py sets algorithm.credit and trial_name itself", file=sys.stderr)
        return 2
    from areal_agents.config.loader import load_config

    cfg = load_config(str(HERE / "config.yaml"), overrides)  # one clear line on a bad key, before any run
    root = Path(cfg.output_dir) / cfg.experiment_name
    results: dict[str, dict[str, Any]] = {}
    for credit in CREDITS:
        trial = f"credit-{credit}"
        cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--config", str(HERE / "config.yaml"), *overrides,
               f"algorithm.credit={credit}", f"trial_name={trial}"]
        print(f"== algorithm.credit={credit}", flush=True)
        if subprocess.call(cmd) != 0:
            print(f"error: the credit={credit} run failed", file=sys.stderr)
            return 1
        results[credit] = summarise(root / trial)
    print(f"\n{'credit':<11} {'acc before':>10} {'acc after':>10} {'reward first':>13} {'reward last':>12} {'turns last':>11}")
    for credit, res in results.items():
        def fmt(x: Any) -> str:
            return "-" if x is None else f"{x:.3f}"
        print(f"{credit:<11} {fmt(res['accuracy_before']):>10} {fmt(res['accuracy_after']):>10} "
              f"{fmt(res['reward'][0] if res['reward'] else None):>13} "
              f"{fmt(res['reward'][-1] if res['reward'] else None):>12} "
              f"{fmt(res['turns'][-1] if res['turns'] else None):>11}")
    (root / "credit_comparison.json").write_text(json.dumps(results, indent=1) + "\n")
    _plot(results, root / "credit_comparison.png")
    print(f"\nwrote {root / 'credit_comparison.png'} and {root / 'credit_comparison.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
