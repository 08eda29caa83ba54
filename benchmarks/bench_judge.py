"""What a judge costs: ``areal-agents run --env math`` with its Python reward against the same run
with the tiny judge's reward (``math-judge``, one judge call an episode), side by side; with
``--group-judge DIR``, also with that group judge's (``rollout.group_reward=math-group-judge``,
one call a group).

All runs start from the same math warm start and train the same steps with the same settings;
the judged runs serve their judge model beside the policy (``judge.model_path``) on the same
cores. Reported per reward, over ``--repeats`` interleaved repeats: seconds per step (steps 3
onward, from ``time/elapsed_s``), the reward calls' seconds per step (``time/reward_s``), judge
calls per second (``perf/judge_calls_per_s``), the reward the run trained on (``rollout/reward``)
and the exact-match greedy accuracy before and after (``eval.env_kwargs.reward=math``); the
ratio of each judged run's step time to the Python reward's.

    python benchmarks/bench_judge.py [--judge DIR] [--group-judge DIR] [--steps 40] [--repeats 2]

Without ``--judge`` the judge is made first (``areal-agents sft --env math-grading``), into the
cache. Writes ``benchmarks/results/judge.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
QUIET = ["logging.progress=false", "logging.plots=false", "logging.tensorboard=false", "logging.episodes=0"]


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args, *QUIET], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def made_model(out: Path, *args: str) -> Path:
    """A model ``areal-agents sft`` makes into ``out`` (kept when there already)."""
    if not (out / "model.safetensors").is_file():
        cli("sft", *args, f"sft.output_dir={out}", f"output_dir={out.parent / 'runs'}")
    return out


def warm_policy() -> Path:
    from areal_agents.config.loader import load_config
    from trainers.sft import ensure_warm_model

    return ensure_warm_model(load_config(None, ["env.name=math"]), progress=False, warm_start=True)


def one_run(kind: str, policy: Path, judges: dict[str, Path], steps: int, out: Path) -> dict[str, Any]:
    extra = [] if kind == "python" else [f"judge.model_path={judges[kind]}", "env.kwargs.reward=math-judge"
                                         if kind == "judge" else "rollout.group_reward=math-group-judge"]
    t0 = time.monotonic()
    cli("run", "--env", "math", f"actor.path={policy}", f"trainer.total_steps={steps}", "trainer.save_every=0",
        "eval.every=0", "eval.env_kwargs.reward=math", f"output_dir={out}", *extra)
    rows = [json.loads(line) for line in (out / "math" / "trial" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    late = train[2:]
    return {"kind": kind, "seconds": round(time.monotonic() - t0, 1),
            "step_s": (late[-1]["time/elapsed_s"] - late[0]["time/elapsed_s"]) / max(1, len(late) - 1),
            "reward_s": statistics.fmean(r.get("time/reward_s", 0.0) for r in late),
            "judge_calls_per_s": statistics.fmean(r.get("perf/judge_calls_per_s", 0.0) for r in late),
            "trained_reward": statistics.fmean(r["rollout/reward"] for r in late),
            "accuracy_before": evals[0], "accuracy_after": evals[-1]}


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--judge", type=Path, help="the math-judge model (default: made into the cache)")
    ap.add_argument("--group-judge", type=Path, help="a math-group-judge model: its runs too")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    load = os.getloadavg()  # the machine's load before anything of ours ran
    from trainers.tiny_model import cache_dir

    made = cache_dir() / "judges"
    judges = {"judge": args.judge or made_model(made / "math-judge", "--env", "math-grading")}
    kinds = ["python", "judge"] + (["group-judge"] if args.group_judge else [])
    if args.group_judge:
        judges["group-judge"] = args.group_judge
    policy = warm_policy()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for kind in kinds:
                runs.append(one_run(kind, policy, judges, args.steps, Path(tmp) / f"{kind}-{repeat}"))
                print(json.dumps(runs[-1]), flush=True)
    summary: dict[str, Any] = {}
    for kind in kinds:
        mine = [r for r in runs if r["kind"] == kind]
        summary[kind] = {key: spread([r[key] for r in mine]) for key in mine[0] if key != "kind"}
    for kind in kinds[1:]:
        summary[kind]["step_s_ratio_to_python"] = summary[kind]["step_s"]["mean"] / summary["python"]["step_s"]["mean"]
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": args.steps,
              "repeats": args.repeats, "load_before": load, "judges": {k: str(v) for k, v in judges.items()},
              "runs": runs, "summary": summary}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "judge.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
