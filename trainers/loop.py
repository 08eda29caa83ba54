"""The RL recipe, top to bottom: ``areal-agents run``.

    rows ─► RolloutExecutor (async episodes on the inference servers, bounded staleness)
         ─► prepare_batch ─► proximal / reference logprobs ─► advantages ─► train_batch
         ─► pause rollout ─► weights to servers (version + 1) ─► resume ─► log / eval / save

η = ``rollout.max_head_offpolicyness``: 0 gives synchronous RL, η > 0 lets rollouts run up to
η versions ahead of the trainer. Both come from this same loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from areal_agents.config import ExperimentConfig
from areal_agents.config_loader import to_yaml
from areal_agents.data import load_dataset_rows
from areal_agents.episodes import build_episode_fn, evaluate, sampling_params
from areal_agents.inference.client import InferenceClient
from areal_agents.registry import algorithms
from areal_agents.rewards import RewardRunner, set_default_runner
from areal_agents.rollout import RolloutExecutor, write_rollouts
from trainers.batching import collate, load_trajectories
from trainers.checkpoint import Checkpointer
from trainers.engine import TrainEngine
from trainers.metrics import MetricsLogger
from trainers.progress import RunDisplay
from trainers.servers import inference_servers
from trainers.sft import ensure_warm_model
from trainers.weight_sync import DiskWeightSync

__all__ = ["cli_run", "run"]


def cli_run(args: argparse.Namespace) -> int:
    run(args.cfg)
    return 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_eval(cfg: ExperimentConfig, tokenizer: Any, addresses: list[str], rows: list[dict[str, Any]],
             display: RunDisplay | None = None) -> dict[str, Any]:
    """Greedy (and pass@k) accuracy on ``rows`` with a client of its own."""

    async def go() -> dict[str, Any]:
        client = InferenceClient(addresses, timeout=cfg.inference.request_timeout)
        try:
            return await evaluate(cfg, tokenizer, client, rows, k=cfg.eval.k, temperature=cfg.eval.temperature,
                                  progress=display.progress if display else None)
        finally:
            await client.aclose()

    return asyncio.run(go())


def train_step(engine: TrainEngine, spec: Any, cfg: ExperimentConfig, trajs: list[Any]) -> dict[str, float]:
    """One optimiser step on finished episodes: logprobs the loss needs, advantages, update."""
    batch = collate(trajs, pad_token_id=engine.pad_token_id)
    temperature = cfg.sampling.temperature or 1.0
    if cfg.algorithm.recompute_logprob or cfg.algorithm.use_decoupled_loss:
        batch["prox_logp"] = engine.compute_logprobs(batch, temperature)
    if cfg.algorithm.kl_ctl > 0:
        batch["ref_logp"] = engine.compute_ref_logprobs(batch, temperature)
    if spec.needs_critic:
        batch["values"] = engine.compute_values(batch)
    batch["advantages"] = spec.advantage_fn()(batch, cfg.algorithm)
    stats = engine.train_batch(batch, spec.loss_fn())
    return {k if "/" in k else f"train/{k}": v for k, v in stats.items()}


def run(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train (or, with ``mode``, only roll out / only train) and return the summary."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    seed_everything(cfg.seed)
    display = RunDisplay(cfg, enabled=cfg.logging.progress)
    t_start = time.monotonic()

    # 1. The model: a user's HF dir, or the tiny default, built and SFT-warm-started once (cached).
    model_path = cfg.actor.path or str(ensure_warm_model(cfg))
    import transformers

    transformers.utils.logging.disable_progress_bar()

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    spec = algorithms.get(cfg.algorithm.name)
    set_default_runner(RewardRunner(timeout=cfg.rollout.reward_timeout))
    logger = MetricsLogger(run_dir, cfg.logging, config={"experiment": cfg.experiment_name})

    if cfg.mode == "train":  # trainer-only debug mode: learn from a rollout JSONL, no servers
        engine = TrainEngine(cfg, model_path)
        trajs = load_trajectories(cfg.train_data or "")
        per_step = cfg.rollout.batch_size * cfg.rollout.group_size
        for step in range(cfg.trainer.total_steps):
            chunk = [trajs[(step * per_step + i) % len(trajs)] for i in range(per_step)]
            logger.log(step + 1, train_step(engine, spec, cfg, chunk))
        engine.export_hf(run_dir / "final")
        logger.close()
        return {"run_dir": str(run_dir), "steps": cfg.trainer.total_steps}

    train_rows = load_dataset_rows(cfg, "train")
    test_rows = load_dataset_rows(cfg, "test")[: cfg.eval.n]
    summary: dict[str, Any] = {"run_dir": str(run_dir)}
    with contextlib.ExitStack() as stack:
        # 2. Inference servers (embedded subprocesses, SGLang, or remote) and the rollout executor.
        addresses = stack.enter_context(inference_servers(cfg, model_path))
        client = InferenceClient(addresses, schedule=cfg.inference.schedule, timeout=cfg.inference.request_timeout,
                                 retries=cfg.inference.request_retries)
        episode_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg))
        executor = RolloutExecutor(cfg.rollout, episode_fn=episode_fn, rows=train_rows, seed=cfg.seed, shuffle=cfg.data.shuffle,
                                   on_shutdown=[client.aclose], bounded_staleness=cfg.mode == "full")
        stack.callback(executor.shutdown)

        if cfg.mode == "rollout":  # inference-only debug mode: write trajectories
            out = cfg.rollout.output_path or str(run_dir / "rollouts.jsonl")
            executor.start()
            write_rollouts(executor, cfg.rollout.num_episodes, out)
            summary.update(rollouts=out, **executor.stats())
            logger.close()
            return summary

        # 3. Trainer, weight sync, checkpoints; recover a killed run when asked.
        engine = TrainEngine(cfg, model_path)
        sync = DiskWeightSync(addresses, run_dir / "weights")
        ckpt = Checkpointer(run_dir / "checkpoints")
        step = version = 0
        if cfg.trainer.recover == "auto" and (state := ckpt.load_latest(engine)) is not None:
            step, version = state["step"], state["version"]
            executor.load_state_dict(state["rollout"])
            sync.sync(engine, version)
            display.note(f"recovered step {step} (weight version {version}) from {ckpt.root}")
        executor.set_version(version)
        stack.enter_context(ckpt.save_on_sigterm(lambda: (engine, step, version, executor.state_dict())))

        before = run_eval(cfg, tokenizer, addresses, test_rows, display) if test_rows else {}
        logger.log(step, before)
        executor.start()
        display.start(total=cfg.trainer.total_steps, done=step)
        while step < cfg.trainer.total_steps:
            if cfg.trainer.max_time_s is not None and time.monotonic() - t_start > cfg.trainer.max_time_s:
                display.note(f"trainer.max_time_s={cfg.trainer.max_time_s} reached at step {step}")
                break
            # 4. One step: a batch of finished groups, then the update.
            t0 = time.monotonic()
            groups = executor.prepare_batch()
            trajs = [t for group in groups for t in group if t.input_ids]
            t1 = time.monotonic()
            metrics = train_step(engine, spec, cfg, trajs)
            t2 = time.monotonic()
            # 5. New weights to the servers between pause and resume: version + 1.
            executor.pause()
            version += 1
            sync.sync(engine, version)
            executor.set_version(version)
            executor.resume()
            step += 1
            n_tokens = sum(t.num_tokens for t in trajs)
            metrics.update(executor.stats())
            metrics.update({
                "version": version, "time/rollout_wait_s": t1 - t0, "time/train_s": t2 - t1,
                "time/sync_s": time.monotonic() - t2, "perf/train_tokens_per_s": n_tokens / max(t2 - t1, 1e-9),
            })
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.total_steps and test_rows:
                metrics.update(run_eval(cfg, tokenizer, addresses, test_rows, display))
            logger.log(step, metrics)
            logger.log_samples(step, trajs)
            display.update(step, metrics)
            if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                ckpt.save(engine, step=step, version=version, rollout=executor.state_dict())
        display.stop()

        # 6. Final eval, weights, summary, plots.
        after = run_eval(cfg, tokenizer, addresses, test_rows, display) if test_rows else {}
        logger.log(step, {**after, "version": version})
        final_dir = run_dir / "final"
        engine.export_hf(final_dir)
        summary.update(
            steps=step, version=version, wall_time_s=round(time.monotonic() - t_start, 1),
            accuracy_before=before.get("eval/accuracy"), accuracy_after=after.get("eval/accuracy"),
            final_model=str(final_dir), metrics=str(run_dir / "metrics.jsonl"),
            gen_tokens_per_s=np.mean([r.get("perf/gen_tokens_per_s", 0.0) for r in logger.history[1:]] or [0.0]),
        )
    logger.close()
    if cfg.logging.plots:
        from areal_agents.plotting import plot_run

        summary["plots"] = [str(p) for p in plot_run(run_dir)]
    display.summary(summary)
    return summary
