"""The RL recipe, top to bottom: ``areal-agents run``.

    rows ─► RolloutExecutor (async episodes on the inference servers, bounded staleness)
         ─► prepare_batch ─► reference logprobs, values ─► advantages ─► proximal logprobs
         ─► train_batch ─► pause rollout ─► weights to servers (version + 1) ─► resume
         ─► log / eval / save

:func:`train_step` is where the algorithm's spec decides what a step computes (the engine
offers the forward and backward passes and knows no algorithm).

η = ``rollout.max_head_offpolicyness``: 0 gives synchronous RL, η > 0 lets rollouts run up to
η versions ahead of the trainer. Both come from this same loop. With ``trainer.nproc > 1``
the command re-launches itself under ``torchrun``: rank 0 owns servers, rollout, eval and
logs; every rank trains its FSDP2 shard on the batch rank 0 broadcasts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from algorithms.specs import AlgorithmSpec, get_algorithm
from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.config.loader import to_yaml
from areal_agents.inference.launcher import judge_server, starting_servers
from areal_agents.online.rollout import gateway_line
from areal_agents.record import EpisodeRecorder, Recorded
from areal_agents.rewards import RewardRunner
from areal_agents.rollout import Rollout
from areal_agents.rollout.interface import SavedRollout
from areal_agents.rollout.process import RolloutChild
from areal_agents.runtime.cpus import trainer_threads
from areal_agents.runtime.heap import freeze_setup
from areal_agents.types import Trajectory
from trainers import dist as tdist
from trainers.batching import Batch, collate, load_trajectories
from trainers.checkpoint import Checkpointer, CheckpointMismatch
from trainers.engine import TrainEngine
from trainers.evals import Evals
from trainers.metrics import MetricsLogger
from trainers.progress import RunDisplay
from trainers.rollout_only import write_rollouts
from trainers.rollout_setup import rollout_executor, start_rollout_child
from trainers.sft import ensure_warm_model
from trainers.weight_sync import WeightSync, make_weight_sync

__all__ = ["build_engine", "launch", "run", "train_step"]


def launch(cfg: ExperimentConfig, argv: Sequence[str]) -> int:
    """What ``areal-agents run`` hands over (``argv``: its arguments after the program name, for
    the ranks to re-enter it): the servers and ranks as Ray actors (``launcher=ray``), N trainer
    ranks under ``torchrun`` (``trainer.nproc * trainer.nnodes > 1``), or :func:`run` in this
    process (also what each launched rank does: ``WORLD_SIZE`` is set there). Returns the exit code."""
    ranks = cfg.trainer.nproc * cfg.trainer.nnodes
    if ranks > 1 and cfg.actor.path is None:  # the warm start would be a collective SFT per run
        raise ConfigError("trainer.nproc", "more than one trainer rank needs actor.path "
                          "(warm-start the tiny model first: areal-agents sft)")
    if cfg.launcher == "ray" and "WORLD_SIZE" not in os.environ:  # servers and ranks as Ray actors
        from trainers.ray_launcher import run_on_ray

        return run_on_ray(cfg)
    if ranks > 1 and "WORLD_SIZE" not in os.environ:  # re-launch on N trainer ranks (per node)
        command = tdist.torchrun_command(cfg.trainer.nproc, "areal_agents.cli", argv, nnodes=cfg.trainer.nnodes,
                                         rdzv_endpoint=cfg.trainer.rdzv_endpoint)
        return subprocess.call(command)
    if "WORLD_SIZE" in os.environ:  # a launched rank: ends with its launcher (a Ray actor) when asked to
        from areal_agents.runtime.lifeline import watch_parent_from_env

        watch_parent_from_env()
    run(cfg)
    if "WORLD_SIZE" in os.environ:  # a torchrun rank: leave together (after an error torchrun stops them all)
        tdist.shutdown()
    return 0


def _resume_point(ckpt: Checkpointer, recover: str) -> Path | None:
    try:
        return ckpt.resume_point(recover)
    except CheckpointMismatch as exc:
        raise ConfigError("trainer.recover", f"{exc}; set another experiment_name or trial_name, "
                                             "or trainer.recover=disabled to start over") from None


def build_engine(cfg: ExperimentConfig, model_path: str, spec: AlgorithmSpec) -> TrainEngine:
    """The training engine with the models ``spec`` needs: a critic (``needs_critic``) and a
    frozen reference (``needs_reference``)."""
    return TrainEngine(cfg, model_path, critic=spec.needs_critic, reference=spec.needs_reference(cfg.algorithm))


def train_step(engine: TrainEngine, spec: AlgorithmSpec, cfg: ExperimentConfig, trajs: list[Trajectory],
               on_trained: Callable[[Batch], None] | None = None) -> dict[str, float]:
    """One optimiser step on finished episodes: what the algorithm's loss reads, then the update.

    Reference logprobs when ``spec.needs_reference``; the critic's values and targets
    (``returns``) when ``spec.needs_critic``; the advantages; proximal logprobs when
    ``spec.needs_proximal`` (the policy before the step: computed first when several
    minibatches each take a step, else taken from the training forward pass itself).
    ``on_trained(batch)`` sees the batch the loss read (one row per trajectory, in order) after the step.
    """
    alg = cfg.algorithm
    batch = collate(trajs, pad_token_id=engine.pad_token_id)
    if spec.needs_reference(alg):
        batch["ref_logp"] = engine.compute_ref_logprobs(batch)  # at sampling.temperature (greedy: 1)
    if spec.needs_critic:
        batch["values"] = engine.compute_values(batch)
        batch["returns"] = spec.value_targets_fn()(batch, alg)
    batch["advantages"] = spec.advantage_fn()(batch, alg)
    proximal = spec.needs_proximal(alg)
    if proximal and alg.ppo_n_minibatches > 1:  # later minibatches would see updated weights
        batch["prox_logp"] = engine.compute_logprobs(batch)
    stats = engine.train_batch(batch, spec.loss_fn(), detached_logp_key="prox_logp" if proximal else None)
    if on_trained is not None:
        on_trained(batch)
    return {k if "/" in k else f"train/{k}": v for k, v in stats.items()}


def _timed_train_step(engine: TrainEngine, spec: AlgorithmSpec, cfg: ExperimentConfig, trajs: list[Trajectory],
                      on_trained: Callable[[Batch], None] | None = None) -> dict[str, Any]:
    """:func:`train_step` with the train phase's seconds (``time/train_s``) and row tokens (prompt,
    completion and env messages) per second (``perf/train_tokens_per_s``)."""
    t0 = time.monotonic()
    metrics: dict[str, Any] = train_step(engine, spec, cfg, trajs, on_trained)
    seconds = time.monotonic() - t0
    metrics.update({"time/train_s": seconds,
                    "perf/train_tokens_per_s": sum(t.num_tokens for t in trajs) / max(seconds, 1e-9)})
    return metrics


def train_from_file(cfg: ExperimentConfig, model_path: str, spec: AlgorithmSpec,
                    logger: MetricsLogger | None) -> dict[str, Any]:
    """Trainer-only debug mode: learn from a rollout JSONL, no servers."""
    engine = build_engine(cfg, model_path, spec)
    trajs = [t for t in load_trajectories(cfg.train_data or "") if t.input_ids]
    if not trajs:
        raise ValueError(f"train_data={cfg.train_data}: no trajectories with tokens to train on")
    per_step = cfg.rollout.batch_size * cfg.rollout.group_size
    for step in range(cfg.trainer.total_steps):
        chunk = [trajs[(step * per_step + i) % len(trajs)] for i in range(per_step)]
        metrics = _timed_train_step(engine, spec, cfg, chunk)
        if logger is not None:
            logger.log(step + 1, metrics)
    final = engine.export_final(Path(cfg.run_dir) / "final")
    return {"run_dir": cfg.run_dir, "steps": cfg.trainer.total_steps, "final_model": str(final)}


class _Rank0:
    """Rank 0's duties around the loop: the inference servers' rollout executor, evals (:class:`Evals`),
    the metrics log and the display. Other ranks hold one without executor or logger, whose calls
    do nothing, so the loop in :func:`run` reads the same on every rank."""

    def __init__(self, cfg: ExperimentConfig, tokenizer: Any, display: RunDisplay, logger: MetricsLogger | None,
                 addresses: list[str] | None = None, executor: Rollout | None = None,
                 eval_rewards: RewardRunner | None = None) -> None:
        self.cfg, self.display, self.logger = cfg, display, logger
        self.addresses, self.executor = addresses or [], executor
        self.evals = Evals(cfg, tokenizer, self.addresses if executor is not None else [], display.progress, eval_rewards)
        self.recorder: EpisodeRecorder | None = None  # the episode record (rank 0 of a training run)
        self._trained: list[tuple[str, int, Trajectory]] = []  # the batch's (episode id, group index, trajectory)
        self._advantages = np.zeros((0, 0), dtype=np.float32)  # the loss's advantages (rows: trajectories)
        self._seq_lens: list[int] = []  # each trajectory's tokens in that matrix
        self._failed: list[Trajectory] = []  # failed episodes the rollout dropped while the batch was gathered

    @classmethod
    def start_servers(cls, cfg: ExperimentConfig, stack: contextlib.ExitStack, addresses: list[str], model_path: str,
                      tokenizer: Any, display: RunDisplay, logger: MetricsLogger | None,
                      child: RolloutChild | None) -> _Rank0:
        """The rollout executor (in ``child`` when it runs in a process) and the evals' own reward
        runner, for the inference servers at ``addresses`` (the judge's, if any, is ready too)."""
        executor = rollout_executor(cfg, addresses, model_path, tokenizer, display, child)
        stack.callback(executor.shutdown)
        eval_rewards = stack.enter_context(RewardRunner.for_rollout(cfg.rollout))
        r0 = cls(cfg, tokenizer, display, logger, addresses, executor, eval_rewards)
        if cfg.mode in ("full", "online") and cfg.logging.episodes_kept != 0:  # the writer process gets a copy of the tokenizer
            r0.recorder = EpisodeRecorder(Path(cfg.run_dir), keep=cfg.logging.episodes_kept, env=cfg.env.name,
                                          tokenizer=tokenizer)
            stack.callback(r0.recorder.close)  # what is queued is written, at a normal end and on a stop alike
        return r0

    def rollout_only(self, run_dir: Path) -> dict[str, Any]:
        """``mode=rollout``: write trajectories, no trainer."""
        summary: dict[str, Any] = {"run_dir": str(run_dir)}
        if self.executor is not None:
            out = self.cfg.rollout.output_path or str(run_dir / "rollouts.jsonl")
            summary.update(write_rollouts(self.executor, self.cfg.rollout.num_episodes, out,
                                          progress=self.cfg.logging.progress), **self.executor.stats())
        return summary

    def batch(self) -> list[Trajectory]:
        """The next batch of finished episodes, waited for on rank 0 and broadcast to every rank."""
        groups = self.executor.prepare_batch() if self.executor is not None else []
        self._trained = [(_episode_id(t, k) + (f"/{j}" if len(parts) > 1 else ""), k, s)
                         for group in groups for k, t in enumerate(group)
                         for parts in [t.flatten()] for j, s in enumerate(parts) if s.input_ids]
        if self.recorder is not None and self.executor is not None:
            self._failed = self.executor.take_failed()
        return tdist.broadcast_object([s for _, _, s in self._trained])

    def keep_advantages(self, batch: Batch) -> None:
        """``on_trained`` of :func:`train_step`: the advantages as the loss used them (one copy of
        the batch's matrix; the rows the record keeps are cut from it in :meth:`record`)."""
        self._advantages = batch["advantages"].detach().to("cpu", torch.float32).numpy().copy()
        self._seq_lens = batch["seq_lens"].tolist()

    def record(self, step: int, version: int) -> None:
        """Hand the step's kept trajectories and the failed episodes to the episode record (weights
        ``version - 1`` were trained); the writer process does the rest."""
        if self.recorder is None:
            return
        assert len(self._seq_lens) == len(self._trained), "keep_advantages saw another batch"
        trained = []
        for i in self.recorder.kept([t.group_id for _, _, t in self._trained]):
            eid, k, t = self._trained[i]
            trained.append(Recorded(eid, k, t, self._advantages[i, : self._seq_lens[i]]))
        failed = [Recorded(_episode_id(t, _group_index(t)), _group_index(t), t) for t in self._failed]
        self.recorder.record(step, trained, failed, policy_version=version - 1)
        self._trained, self._failed = [], []

    def pause(self) -> None:
        """Before the servers' weights change: the eval beside the loop (which measures the weights
        they hold) ends and is logged, and rollout stops launching episodes."""
        done = self.evals.settle()
        if done is not None:
            self.log(*done)
            self.display.show_eval(done[1])
        if self.executor is not None:
            self.executor.pause()

    def resume(self, version: int) -> None:
        """Rollout goes on with the weights of ``version`` (also the first start)."""
        if self.executor is not None:
            self.executor.set_version(version)
            if self.executor.running:
                self.executor.resume()
            else:
                self.executor.start()
                if self.cfg.mode == "online":  # where the agents outside the run reach it
                    self.display.note(gateway_line(self.cfg.run_dir))

    def state_dict(self) -> SavedRollout | None:
        return self.executor.state_dict() if self.executor is not None else None

    def load_state_dict(self, state: SavedRollout | None) -> None:
        if self.executor is not None:
            if state is None:
                raise ValueError("invalid rollout state (the checkpoint holds none)")
            self.executor.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        return self.executor.stats() if self.executor is not None else {}

    def ledger(self) -> dict[str, Any]:
        """For the summary of an online run: ``{"sessions": {opened, trained, dropped, dropped/<reason>,
        in_flight, ...}}`` (opened == trained + dropped + in_flight); nothing for other runs."""
        if self.cfg.mode != "online" or self.executor is None:
            return {}
        return {"sessions": {name: int(v) for k, v in self.stats().items()
                             for prefix, _, name in [k.partition("/")] if prefix == "online" and name != "batch_groups"}}

    def log(self, step: int, metrics: dict[str, Any], trajs: list[Trajectory] | None = None) -> None:
        if self.logger is not None:
            self.logger.log(step, metrics)
            if trajs is not None:
                self.logger.log_samples(step, trajs)

    def finish(self, summary: dict[str, Any], *, plots: bool = False) -> dict[str, Any]:
        """Close the log, draw the plots (of an RL run) and show the summary (rank 0)."""
        if self.logger is None:
            return summary
        self.logger.close()
        if plots and self.cfg.logging.plots:
            from trainers.plotting import plot_run

            summary["plots"] = [str(p) for p in plot_run(summary["run_dir"])]
        self.display.summary(summary)
        return summary


def _episode_id(traj: Trajectory, k: int) -> str:
    return str(traj.info.get("episode_id") or f"{traj.group_id}-{k}")


def _group_index(traj: Trajectory) -> int:
    """An episode's index in its group, from the id the executor gave it (``<group_id>-<k>``)."""
    tail = str(traj.info.get("episode_id", "")).rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def _trainer_threads(cfg: ExperimentConfig) -> None:
    """On a CPU shared with embedded servers, the trainer takes the cores they leave."""
    if cfg.trainer.device == "cpu" and cfg.inference.backend == "embedded" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(trainer_threads(cfg.inference.num_servers))


def run(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train (or, with ``mode``, only roll out / only train) and return the summary."""
    rank, _ = tdist.init_distributed(cfg.trainer.device, cfg.trainer_first_gpu)
    main, run_dir = rank == 0, Path(cfg.run_dir)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    display = RunDisplay(cfg, enabled=cfg.logging.progress and main)
    t_start = time.monotonic()
    tdist.seed_all(cfg.seed + rank)  # random, numpy and torch

    # 1. The model: a user's HF dir, or the tiny default, built and SFT-warm-started once (cached).
    hf_logging.disable_progress_bar()
    model_path = cfg.actor.path or str(ensure_warm_model(cfg, progress=cfg.logging.progress, warm_start=True))
    ckpt = Checkpointer(run_dir / "checkpoints", fingerprint={
        "env": cfg.env.name, "model": str(Path(model_path).resolve()), "algorithm": cfg.algorithm.name,
        **({"lora_rank": cfg.actor.lora.rank} if cfg.actor.lora.enabled else {}),
        **({"mode": "online"} if cfg.mode == "online" else {})})
    resume_from = _resume_point(ckpt, cfg.trainer.recover) if cfg.mode in ("full", "online") else None
    if main:  # after the checks above, so that a refused run leaves the directory as it was
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    spec = get_algorithm(cfg.algorithm.name)
    logger = MetricsLogger(run_dir, cfg.logging, resume=resume_from is not None,
                           config={"experiment": cfg.experiment_name}) if main else None
    if cfg.mode == "train":  # trainer-only debug mode
        return _Rank0(cfg, tokenizer, display, logger).finish(train_from_file(cfg, model_path, spec, logger))

    with contextlib.ExitStack() as stack:
        # 2. Rank 0's servers and rollout process start; the trainer is built while they load.
        r0, engine = _set_up(cfg, stack, main, model_path, spec, tokenizer, display, logger)
        if engine is None:  # inference-only debug mode
            return r0.finish(r0.rollout_only(run_dir))

        # 3. Weight sync (all ranks), checkpoints; recover a killed run when asked.
        sync, step, version = _start_trainer(cfg, engine, r0, ckpt, resume_from, stack, display)
        stack.enter_context(ckpt.save_on_sigterm(lambda: (engine, step, version, r0.state_dict())))

        with ckpt.interruptible():
            before = r0.evals.now()
        r0.log(step, before)
        r0.resume(version)
        display.start(total=cfg.trainer.total_steps, done=step)
        while step < cfg.trainer.total_steps and not ckpt.stop_requested():
            out_of_time = cfg.trainer.max_time_s is not None and time.monotonic() - t_start > cfg.trainer.max_time_s
            if tdist.broadcast_object(out_of_time):
                display.note(f"trainer.max_time_s={cfg.trainer.max_time_s} reached at step {step}")
                break
            # 4-5. One step on a batch, then its weights to the servers: version + 1.
            version += 1
            metrics, trajs = _rl_step(cfg, spec, engine, r0, sync, display, version, ckpt)
            step += 1
            r0.record(step, version)
            r0.log(step, metrics, trajs)
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.total_steps:
                r0.evals.start(step)  # beside the next step, settled before its weight sync
            display.update(step, metrics)
            if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                ckpt.save(engine, step=step, version=version, rollout=r0.state_dict())
        display.stop()

        # 6. Final eval (rollout stopped: its episodes would train nothing), weights, summary.
        with ckpt.interruptible():
            r0.pause()
            after = r0.evals.now()
        final_dir = engine.export_final(run_dir / "final")
        r0.log(step, {**after, "version": version})
        history = logger.history[1:] if logger is not None else []
        summary = {
            "run_dir": str(run_dir), "steps": step, "version": version,
            "wall_time_s": round(time.monotonic() - t_start, 1), "accuracy_before": before.get("eval/accuracy"),
            "accuracy_after": after.get("eval/accuracy"), "final_model": str(final_dir),
            "metrics": str(run_dir / "metrics.jsonl"),
            "gen_tokens_per_s": float(np.mean([r.get("perf/gen_tokens_per_s", 0.0) for r in history] or [0.0])),
            "rollout": r0.executor.runs_in if r0.executor is not None else "a thread of the trainer",
        }
        summary.update(r0.ledger())
    return r0.finish(summary, plots=True)


def _set_up(cfg: ExperimentConfig, stack: contextlib.ExitStack, main: bool, model_path: str, spec: AlgorithmSpec,
            tokenizer: Any, display: RunDisplay, logger: MetricsLogger | None) -> tuple[_Rank0, TrainEngine | None]:
    """Step 2 of :func:`run`: rank 0's servers (the judge's too) and rollout process start, the
    trainer is built (every rank; none with ``mode=rollout``) while they load, then rank 0's duties
    for the servers' addresses."""
    servers = stack.enter_context(starting_servers(cfg, model_path)) if main else None
    judge = stack.enter_context(judge_server(cfg)) if main else None  # $AREAL_AGENTS_JUDGE_URL set for the rollout
    child = start_rollout_child(cfg, stack) if main else None
    _trainer_threads(cfg)
    engine = build_engine(cfg, model_path, spec) if cfg.mode != "rollout" else None
    if servers is None or judge is None:
        return _Rank0(cfg, tokenizer, display, logger), engine
    addresses, _ = servers(), judge()  # both ready before the first episode
    return _Rank0.start_servers(cfg, stack, addresses, model_path, tokenizer, display, logger, child), engine


def _start_trainer(cfg: ExperimentConfig, engine: TrainEngine, r0: _Rank0, ckpt: Checkpointer,
                   resume_from: Path | None, stack: contextlib.ExitStack, display: RunDisplay
                   ) -> tuple[WeightSync, int, int]:
    """Step 3 of :func:`run`: the weight sync (closed with ``stack``), the engine recovered from
    ``resume_from`` when given; returns the sync with the step and weight version to go on from."""
    sync = make_weight_sync(cfg, r0.addresses, cfg.weights_dir)
    stack.callback(sync.close)
    step = version = 0
    if resume_from is not None:
        state = ckpt.load(engine, resume_from)
        step, version = state["step"], state["version"]
        r0.load_state_dict(state["rollout"])
        sync.sync(engine, version)
        display.note(f"recovered step {step} (weight version {version}) from {state['path']}")
    elif engine.lora is not None:  # the servers load the (fresh) adapter that /generate names
        sync.sync(engine, version)
    freeze_setup()  # from here on the heap's setup part is never scanned again (an eval: ~0.1 s less)
    return sync, step, version


def _rl_step(cfg: ExperimentConfig, spec: AlgorithmSpec, engine: TrainEngine, r0: _Rank0, sync: WeightSync,
             display: RunDisplay, version: int, ckpt: Checkpointer) -> tuple[dict[str, Any], list[Trajectory]]:
    """Steps 4 and 5 of :func:`run`: rank 0 waits for a batch of finished groups, every rank trains on
    it, then the new weights (``version``) go to the servers while rollout is paused. Returns the
    step's metrics and the batch."""
    t0 = time.monotonic()
    with ckpt.interruptible():  # SIGTERM while waiting for a batch ends the run at once
        trajs = r0.batch()
    t1 = time.monotonic()
    metrics = _timed_train_step(engine, spec, cfg, trajs, r0.keep_advantages if r0.recorder is not None else None)
    with ckpt.interruptible():  # the eval beside this step, if any, may still run (its wait: in its row)
        r0.pause()
    t2 = time.monotonic()
    sync.sync(engine, version)
    while sync.events:
        display.note(sync.events.pop(0))
    r0.resume(version)
    metrics.update({
        **r0.stats(), "version": version, "time/rollout_wait_s": t1 - t0,
        "time/sync_s": time.monotonic() - t2, "inference/servers_down": len(sync.down),
    })
    return metrics, trajs
