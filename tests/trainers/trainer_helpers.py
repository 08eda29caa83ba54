"""Shared pieces of the trainer tests: a tiny Qwen2 dir, synthetic trajectories, a simple loss.

Imported by tests/trainers/test_trainer_*.py and by the worker processes they start.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from areal_agents.config import ActorConfig, ExperimentConfig, TrainerConfig
from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory

__all__ = ["VOCAB", "hsdp_worker", "linear_adam", "make_cfg", "make_trajs", "mismatch_step", "mismatch_worker",
           "nll_loss_fn", "one_step_cfg", "step_batch", "tiny_qwen", "train_worker"]

VOCAB = 64


def tiny_qwen(path: str | Path, seed: int = 0, tie: bool = True) -> Path:
    """Save a randomly initialised 2-layer Qwen2 (vocab 64, hidden 32) to ``path``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tie, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(path)
    return Path(path)


def make_trajs(n: int, seed: int = 0, min_len: int = 6, max_len: int = 40) -> list[Trajectory]:
    """``n`` trajectories of mixed lengths: a prompt, then one or two generated turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(min_len, max_len)
        ids = [rng.randrange(2, VOCAB) for _ in range(length)]
        prompt = rng.randint(2, max(2, length // 2))
        mask = [0] * prompt + [1] * (length - prompt)
        spans = [(prompt, length)]
        if length - prompt >= 6:  # two turns with an env reply in between
            mid = prompt + (length - prompt) // 2
            mask[mid : mid + 2] = [0, 0]
            spans = [(prompt, mid), (mid + 2, length)]
        traj = Trajectory(input_ids=ids, loss_mask=mask,
                          logprobs=[-rng.random() if m else 0.0 for m in mask],
                          versions=[0 if m else -1 for m in mask], turn_spans=spans,
                          group_id=f"g{i // 4}", finish_reason=rng.choice(["stop", "length"]))
        traj.set_rewards([rng.random() for _ in spans])
        settle_returns(traj, 0.9)  # as the rollout leaves it
        out.append(traj)
    return out


def make_cfg(nproc: int = 1, **actor: Any) -> ExperimentConfig:
    """Float32 CPU config with a constant LR for ``nproc`` ranks (actor fields overridable)."""
    a = {"lr": 1e-2, "max_tokens_per_mb": 10_000, "max_grad_norm": 1.0, **actor}
    return ExperimentConfig(actor=ActorConfig(**a), trainer=TrainerConfig(total_steps=100, nproc=nproc))


def nll_loss_fn(logp: torch.Tensor, mb: dict[str, torch.Tensor], cfg: Any, norm: Any, *,
                entropy: torch.Tensor | None = None, values: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Return-weighted token-mean NLL over the whole batch: ``-Σ G_t logp_t / norm.tokens``."""
    mask = mb["loss_mask"].float()
    loss = -(logp * mb["turn_returns"] * mask).sum() / norm.tokens
    metrics = {"logp_mean": float((logp.detach() * mask).sum()) / norm.tokens}  # sums to the batch mean
    if entropy is not None:
        metrics["entropy"] = float((entropy.detach() * mask).sum()) / norm.tokens
    return loss, metrics

def step_batch(step: int) -> list[Trajectory]:
    """The batch of training step ``step``; rewards draw from the global torch RNG, so a
    resumed run matches only if the RNG state was restored too."""
    trajs = make_trajs(8, seed=100 + step)
    noise = torch.rand(len(trajs)).tolist()
    for t, z in zip(trajs, noise, strict=True):
        t.turn_returns = [r * (0.5 + z) for r in t.turn_returns]
    return trajs


def train_worker(rank: int, world: int, model_path: str, out_file: str, steps: int,
                 actors: list[dict[str, Any]]) -> None:
    """Spawned rank: for each actor config, ``steps`` training steps on :func:`step_batch`;
    rank 0 saves, per config, the losses, logprobs of the next batch and the full final
    state dict to ``out_file``."""
    from trainers.engine import TrainEngine

    results = []
    for actor in actors:
        engine = TrainEngine(make_cfg(nproc=world, **actor), model_path)
        torch.manual_seed(0)
        losses = [engine.train_batch(step_batch(s), nll_loss_fn)["loss"] for s in range(steps)]
        logp = engine.compute_logprobs(step_batch(steps))
        results.append({"losses": losses, "logp": logp, "state": engine.full_state_dict()})
    if rank == 0:
        torch.save(results, out_file)


def mismatch_step(model_path: str | Path, nproc: int, budget: int, mode: str, correction: str
                  ) -> tuple[dict[str, float], torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoupled-PPO step with ``behav_imp_weight_mode=mode`` (cap 1.5) on trajectories whose
    behaviour logprobs are the trainer's off by ~.3 nat per token (enough to reach the cap at
    times). Returns (the step's metrics, and the weights ``[B, T]``, capped ``[B, T]`` and mask
    ``[B, T]`` the same logprobs give)."""
    from algorithms.importance import behav_importance_weights
    from algorithms.losses import ppo_loss
    from trainers.engine import TrainEngine

    cfg = make_cfg(nproc=nproc, max_tokens_per_mb=budget)
    cfg.algorithm.behav_imp_weight_mode, cfg.algorithm.behav_imp_weight_correction = mode, correction
    cfg.algorithm.behav_imp_weight_cap = 1.5
    engine = TrainEngine(cfg, model_path)
    batch = engine.to_batch(make_trajs(12, seed=13))
    mask = batch["loss_mask"].bool()
    g = torch.Generator().manual_seed(5)
    trainer = engine.compute_logprobs(batch, 1.0)
    batch["logprobs"] = torch.where(mask, trainer + 0.3 * torch.randn(trainer.shape, generator=g), 0.0)
    batch["advantages"] = torch.where(mask, torch.randn(trainer.shape, generator=g), 0.0)
    w, capped = behav_importance_weights(trainer, batch["logprobs"], mask, cfg.algorithm.imp_weight_mode,
                                         correction, 1.5)
    return engine.train_batch(batch, ppo_loss, temperature=1.0, detached_logp_key="prox_logp"), w, capped, mask


def mismatch_worker(rank: int, world: int, model_path: str, out_file: str, mode: str, correction: str) -> None:
    """Spawned rank of :func:`mismatch_step` (a token budget that gives each rank several
    micro-batches); rank 0 saves the step's metrics to ``out_file``."""
    metrics = mismatch_step(model_path, world, 60, mode, correction)[0]
    if rank == 0:
        torch.save(metrics, out_file)


def one_step_cfg(nproc: int = 1, **actor: Any) -> ExperimentConfig:
    """:func:`make_cfg` for comparing one optimiser step: LR 1, no clipping, no weight decay."""
    return make_cfg(nproc, **{"lr": 1.0, "max_grad_norm": 0.0, "weight_decay": 0.0, "max_tokens_per_mb": 70, **actor})


def linear_adam(engine: Any) -> None:
    """AdamW's first step is ``lr * g / (|g| + eps)``: about ``lr * sign(g)`` with the usual eps,
    blind to how precisely ``g`` was reduced. ``eps = 1`` makes it about ``lr * g``."""
    for group in engine.actor.optimizer.param_groups:
        group["eps"] = 1.0


def hsdp_worker(rank: int, world: int, model_path: str, out_dir: str, reduce_dtypes: list[str]) -> None:
    """Spawned rank of a 2 x 2 HSDP mesh: for each ``grad_reduce_dtype``, one training step on
    ``step_batch(0)``; saves to ``out_dir/rank{rank}.pt`` the mesh, each parameter's placements
    and local shard before and after, the reduce dtype FSDP was given, the metrics and (the
    same on every rank) the full parameters before and after."""
    from torch.distributed.tensor import DTensor

    from trainers.engine import TrainEngine

    torch.set_num_threads(1)  # four ranks share the machine's cores
    results = {}
    for reduce_dtype in reduce_dtypes:
        engine = TrainEngine(one_step_cfg(world, hsdp_replicate=2, grad_reduce_dtype=reduce_dtype), model_path)
        linear_adam(engine)
        params = dict(engine.model.named_parameters())
        assert all(isinstance(p, DTensor) for p in params.values())
        layout = {k: {"placements": [repr(pl) for pl in p.placements], "shape": tuple(p.shape),
                      "local_before": p.to_local().detach().clone()} for k, p in params.items()}  # fmt: skip
        full_before = engine.full_state_dict()
        torch.manual_seed(0)  # step_batch's returns draw from the global RNG
        metrics = engine.train_batch(step_batch(0), nll_loss_fn)
        for k, p in params.items():
            layout[k]["local_after"] = p.to_local().detach().clone()
        policies = {type(m).__name__: str(m._get_fsdp_state()._mp_policy.reduce_dtype)
                    for m in engine.model.modules() if hasattr(m, "_get_fsdp_state")}  # fmt: skip
        results[reduce_dtype] = {
            "mesh": engine.mesh.mesh.tolist(), "dims": engine.mesh.mesh_dim_names, "params": layout,
            "reduce_dtypes": policies, "metrics": metrics, "before": full_before, "after": engine.full_state_dict(),
        }  # fmt: skip
    torch.save(results, f"{out_dir}/rank{rank}.pt")


def _main() -> None:
    """``python trainer_helpers.py MODEL CKPT_DIR LOSSES STEPS SLEEP``: train with a checkpoint
    every 2 steps and recover=auto, appending ``step loss`` lines to LOSSES (fsynced)."""
    import os
    import sys
    import time

    from trainers.checkpoint import Checkpointer
    from trainers.engine import TrainEngine

    model, ckpt_dir, losses_file, steps, pause = sys.argv[1:6]
    torch.manual_seed(0)
    engine = TrainEngine(make_cfg(), model)
    ckpt = Checkpointer(ckpt_dir, keep=2)
    state = ckpt.load_latest(engine)
    start = state["step"] if state else 0
    with open(losses_file, "a") as fh:
        for s in range(start, int(steps)):
            loss = engine.train_batch(step_batch(s), nll_loss_fn)["loss"]
            fh.write(f"{s} {loss!r}\n")
            fh.flush()
            os.fsync(fh.fileno())
            if (s + 1) % 2 == 0:
                ckpt.save(engine, step=s + 1, version=s + 1, rollout={"next_row": s + 1})
            time.sleep(float(pause))


if __name__ == "__main__":
    _main()
