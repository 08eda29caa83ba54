"""The episode record's costs: reading a 100,000-episode record, and a train step with and without recording.

**Reading.** A synthetic run of ``--episodes`` episodes shaped like the default ``math`` env's
(prompts of 40-80 tokens, completions of 8-32, one turn, groups of 8, the default
``logging.episodes`` groups per step file) is written with the real writer
(:class:`~areal_agents.record.EpisodeRecorder`); then :func:`~areal_agents.record.summary` is timed
cold (a fresh process's first call) and warm (a live viewer's next call), and one
:func:`~areal_agents.record.episode` lookup. Reported with the record's bytes per 1,000 episodes.
The target: the summary of 100,000 episodes well under 1 s.

**A train step.** The default ``math`` run's batch (``rollout.batch_size`` × ``group_size``
real episodes of the env, written once by ``areal-agents run --env math mode=rollout`` with the
warm-started default model) trained by :func:`trainers.loop.train_step` on the real engine, in
blocks of ``--block`` steps without recording and with it (the advantages handed over as the
run does, the step queued to a live :class:`EpisodeRecorder` whose writer process works beside
the next steps), the trainer's threads as a run sets them beside its embedded server
(``--all-cores``: every core). The blocks go off-on, on-off, ... so that a drift of the
machine cancels out; the cost is the median of the ``--repeats`` paired ratios (with their
range). Also reported: the hand-off's seconds on the training thread and the writer process's
CPU seconds, per step. The target is a recording cost of at most 2 %.

**A run's step.** ``--runs N`` also times N pairs of whole default runs (``areal-agents run --env
math``, the warm start cached first) with ``logging.episodes=0`` and with the default, in
alternating order: the seconds per training step from ``metrics.jsonl`` (``time/elapsed_s`` from
the first step to the last, divided by the steps between), rollout, eval and weight syncs
included, as a user's run spends them. Reported: each pair's ratio, their median and range.

Writes ``benchmarks/results/record.json``.

    python benchmarks/bench_record.py [--episodes 100000] [--repeats 20] [--block 8] [--runs 0] [--skip-train]
    python benchmarks/bench_record.py --smoke    # tiny sizes: checks that it runs, times nothing that counts
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
TARGET_SUMMARY_S = 1.0
TARGET_COST = 0.02

__all__ = ["main", "read_costs", "synthetic_run", "train_costs"]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def synthetic_run(run_dir: Path, episodes: int, groups_per_step: int, group_size: int = 8, seed: int = 0) -> int:
    """Write a record of ``episodes`` episodes (``groups_per_step`` groups per step file) with the
    real writer; returns the number of step files."""
    from areal_agents.record import EpisodeRecorder, Recorded
    from areal_agents.types import Trajectory

    rng = random.Random(seed)
    per_step = groups_per_step * group_size
    steps = -(-episodes // per_step)
    with EpisodeRecorder(run_dir, env="math", queue_size=8) as rec:  # token texts: the ids
        for step in range(1, steps + 1):
            rows: list[Recorded] = []
            for g in range(groups_per_step):
                gid = f"rollout-{step * groups_per_step + g}"
                for k in range(group_size):
                    if len(rows) + (step - 1) * per_step >= episodes:
                        break
                    p, r = rng.randint(40, 80), rng.randint(8, 32)
                    t = Trajectory(group_id=gid, info={"episode_id": f"{gid}-{k}", "success": rng.random() < 0.5})
                    t.append_tokens([rng.randrange(3, 400) for _ in range(p)], generated=False)
                    t.append_tokens([rng.randrange(3, 400) for _ in range(r)], generated=True,
                                    logprobs=[-rng.random() for _ in range(r)], versions=[step - 1] * r)
                    t.turn_spans.append((p, p + r))
                    t.turn_rewards = t.turn_returns = [float(t.info["success"])]
                    t.reward = t.turn_rewards[0]
                    adv = [0.0] * p + [t.reward - 0.5] * r
                    rows.append(Recorded(f"{gid}-{k}", k, t, adv))
            rec.record(step, rows, policy_version=step)
    return steps


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def read_costs(run_dir: Path) -> dict[str, Any]:
    """Seconds of a cold and a warm summary and of one episode lookup (the cold one in a fresh process)."""
    code = ("import sys, time; from areal_agents.record import summary, episode; t0 = time.perf_counter(); "
            "s = summary(sys.argv[1]); t1 = time.perf_counter(); summary(sys.argv[1]); t2 = time.perf_counter(); "
            "eid = s['episode_id'][s.num_rows // 2].as_py(); episode(sys.argv[1], eid); t3 = time.perf_counter(); "
            "print(s.num_rows, t1 - t0, t2 - t1, t3 - t2)")
    out = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    rows, cold, warm, lookup = int(out[0]), float(out[1]), float(out[2]), float(out[3])
    return {"episodes": rows, "summary_cold_s": cold, "summary_warm_s": warm, "episode_lookup_s": lookup}


def _rollouts(cfg_overrides: list[str], out: Path, episodes: int) -> Path:
    """Real episodes of the default math env from the warm-started default model (``mode=rollout``)."""
    path = out / "rollouts.jsonl"
    subprocess.run([sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", "mode=rollout",
                    f"rollout.num_episodes={episodes}", f"rollout.output_path={path}", f"output_dir={out / 'runs'}",
                    "logging.progress=false", *cfg_overrides], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return path


def train_costs(overrides: list[str], out: Path, repeats: int, block: int, all_cores: bool = False) -> dict[str, Any]:
    """Median train-step seconds without and with recording, blocks interleaved (see the module doc);
    the trainer's threads as a run sets them beside its embedded server, or ``all_cores``."""
    import torch
    import transformers

    from algorithms.specs import get_algorithm
    from areal_agents.config.loader import load_config
    from areal_agents.record import EpisodeRecorder, Recorded
    from areal_agents.runtime.cpus import trainer_threads
    from trainers.batching import load_trajectories
    from trainers.loop import build_engine, train_step
    from trainers.sft import ensure_warm_model

    cfg = load_config(None, ["env.name=math", f"output_dir={out / 'runs'}", "logging.progress=false", *overrides])
    model = str(ensure_warm_model(cfg, progress=False, warm_start=True))
    per_step = cfg.rollout.batch_size * cfg.rollout.group_size
    trajs = [t for t in load_trajectories(_rollouts([f"actor.path={model}", *overrides], out, per_step * 2))
             if t.input_ids]
    batches = [trajs[i:i + per_step] for i in range(0, len(trajs) - per_step + 1, per_step)]
    spec = get_algorithm(cfg.algorithm.name)
    threads = (os.cpu_count() or 1) if all_cores else trainer_threads(cfg.inference.num_servers)
    torch.set_num_threads(threads)
    engine = build_engine(cfg, model, spec)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    blocks: dict[str, list[float]] = {"off": [], "on": []}  # mean step seconds of each block
    kept: list[Any] = []
    handoff: list[float] = []  # training-thread seconds of each step's hand-off to the recorder

    def keep(b: Any) -> None:  # what the run's on_trained does: one copy of the advantages
        t0 = time.perf_counter()
        kept[:] = [b["advantages"].detach().to("cpu", torch.float32).numpy().copy(), b["seq_lens"].tolist()]
        handoff.append(time.perf_counter() - t0)

    with EpisodeRecorder(out / "record-run", keep=cfg.logging.episodes_kept, env="math", tokenizer=tokenizer) as rec:
        step = 0
        for warm in batches[:2]:  # warm-up: the allocator and the first shapes
            train_step(engine, spec, cfg, warm)
        for r in range(repeats):
            for arm in (["off", "on"] if r % 2 == 0 else ["on", "off"]):  # ABBA: a drift cancels out
                t_block = time.perf_counter()
                for _ in range(block):
                    batch = batches[step % len(batches)]
                    step += 1
                    kept.clear()
                    if arm == "on":
                        train_step(engine, spec, cfg, batch, keep)
                        t0 = time.perf_counter()
                        adv, lens = kept
                        rec.record(step, [Recorded(str(batch[i].info.get("episode_id", i)), i % cfg.rollout.group_size,
                                                   batch[i], adv[i, :lens[i]])
                                          for i in rec.kept([t.group_id for t in batch])], policy_version=step)
                        handoff[-1] += time.perf_counter() - t0
                    else:
                        train_step(engine, spec, cfg, batch)
                blocks[arm].append((time.perf_counter() - t_block) / block)
        writer_cpu = _writer_cpu_s()
    ratios = [on / off - 1.0 for on, off in zip(blocks["on"], blocks["off"], strict=True)]
    record = out / "record-run" / "episodes"
    recorded = sum(1 for _ in record.glob("step-*.parquet")) and _episodes_in(record.parent)
    on_steps = repeats * block
    return {"step_s_off": statistics.median(blocks["off"]), "step_s_on": statistics.median(blocks["on"]),
            "cost": statistics.median(ratios), "cost_min": min(ratios), "cost_max": max(ratios),
            "handoff_s": statistics.median(handoff), "writer_cpu_s_per_step": writer_cpu / on_steps,
            "steps_per_arm": on_steps, "block": block, "repeats": repeats,
            "episodes_per_step": per_step, "kept_groups": cfg.logging.episodes, "trainer_threads": threads,
            "bytes_per_1000_episodes": round(_dir_bytes(record) / max(1, recorded) * 1000), "blocks": blocks}


def _writer_cpu_s() -> float:
    """CPU seconds of this process's episode-record writer children so far."""
    import psutil

    total = 0.0
    for child in psutil.Process().children():
        try:
            if any("writer_main" in part for part in child.cmdline()):
                cpu = child.cpu_times()
                total += cpu.user + cpu.system
        except psutil.Error:
            continue
    return total


def run_costs(pairs: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """Seconds per training step of whole default runs without and with the record (see the module doc)."""
    def step_seconds(episodes: str, name: str) -> float:
        subprocess.run([sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"output_dir={out}",
                        f"trial_name={name}", f"logging.episodes={episodes}", "logging.progress=false", *overrides],
                       check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
        rows = [json.loads(line) for line in (out / "math" / name / "metrics.jsonl").read_text().splitlines()]
        steps = [(r["step"], r["time/elapsed_s"]) for r in rows if "time/elapsed_s" in r and r.get("step", 0) >= 1]
        (s0, t0), (s1, t1) = steps[0], steps[-1]
        return (t1 - t0) / (s1 - s0)

    default = _default_episodes()
    runs: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(pairs):
        for arm in (["off", "on"] if i % 2 == 0 else ["on", "off"]):
            runs[arm].append(step_seconds("0" if arm == "off" else default, f"{arm}-{i}"))
            print(f"  run {arm}-{i}: {runs[arm][-1]:.4f} s a step", flush=True)
    ratios = [on / off - 1.0 for on, off in zip(runs["on"], runs["off"], strict=True)]
    return {"pairs": pairs, "step_s": runs, "cost": statistics.median(ratios), "cost_min": min(ratios),
            "cost_max": max(ratios), "logging.episodes": default}


def _default_episodes() -> str:
    from areal_agents.config.loader import load_config

    return str(load_config(None, ["env.name=math"]).logging.episodes)


def _episodes_in(run_dir: Path) -> int:
    from areal_agents.record import summary

    return int(summary(run_dir).num_rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--runs", type=int, default=0, help="pairs of whole default runs to time (0: none)")
    ap.add_argument("--skip-train", action="store_true", help="only the reading part")
    ap.add_argument("--all-cores", action="store_true",
                    help="train on every core (default: the cores a run leaves its trainer beside one embedded server)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs, no figure that counts")
    ap.add_argument("--override", nargs="*", default=[], help="config overrides of the train-step part")
    ap.add_argument("--out", type=Path, default=RESULTS / "record.json")
    args = ap.parse_args(argv)
    overrides = list(args.override)
    if args.smoke:
        args.episodes, args.repeats, args.block = 2_000, 1, 1
        overrides = ["rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=6",
                     "sft.warm_start_steps=10", "sft.warm_start_target=0", *overrides]
    from areal_agents.config.loader import load_config

    groups = load_config(None, ["env.name=math"]).logging.episodes_kept or 4
    result: dict[str, Any] = {"machine": platform.platform(), "cpus": os.cpu_count(), "smoke": args.smoke}
    with tempfile.TemporaryDirectory(prefix="bench-record-") as tmp:
        run = Path(tmp) / "synthetic"
        files = synthetic_run(run, args.episodes, groups)
        result["read"] = {**read_costs(run), "step_files": files, "groups_per_step": groups,
                          "bytes_per_1000_episodes": round(_dir_bytes(run / "episodes") / args.episodes * 1000)}
        r = result["read"]
        print(f"summary of {r['episodes']} episodes in {files} files: cold {r['summary_cold_s']:.3f} s, warm "
              f"{r['summary_warm_s']:.3f} s (target < {TARGET_SUMMARY_S} s); one episode {r['episode_lookup_s']:.3f} s; "
              f"{r['bytes_per_1000_episodes']} bytes per 1,000 synthetic episodes")
        if not args.skip_train:
            result["train"] = t = train_costs(overrides, Path(tmp), args.repeats, args.block, args.all_cores)
            print(f"train step ({t['trainer_threads']} trainer threads): {t['step_s_off']:.4f} s without recording, "
                  f"{t['step_s_on']:.4f} s with it: cost {100 * t['cost']:+.2f} % (median of {t['repeats']} paired "
                  f"blocks of {t['block']} steps; range {100 * t['cost_min']:+.1f} to {100 * t['cost_max']:+.1f} %; "
                  f"target <= {100 * TARGET_COST:.0f} %); hand-off on the training thread {1000 * t['handoff_s']:.2f} "
                  f"ms a step, the writer process's CPU {1000 * t['writer_cpu_s_per_step']:.2f} ms a step; "
                  f"{t['bytes_per_1000_episodes']} bytes per 1,000 real math episodes")
        if args.runs:
            result["run"] = u = run_costs(args.runs, Path(tmp) / "whole", overrides)
            print(f"a run's step: cost {100 * u['cost']:+.2f} % (median of {u['pairs']} pairs of default runs; range "
                  f"{100 * u['cost_min']:+.1f} to {100 * u['cost_max']:+.1f} %; target <= {100 * TARGET_COST:.0f} %)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
