"""Reward models: a causal LM given a score head, and trained on preference pairs (Bradley-Terry).

A reward model here is a Hugging Face ``AutoModelForSequenceClassification`` directory with one
label: what :mod:`areal_agents.inference.scoring` serves and
:class:`~areal_agents.rewards.reward_model.RewardModel` asks. :func:`reward_head` makes one from a
causal LM (its body, a fresh score head); :func:`train_reward_model` trains it on pairs
``(conversation, chosen reply, rejected reply)`` with the Bradley-Terry loss
``-log sigmoid(r(chosen) - r(rejected))``; ``areal-agents rm --env NAME`` does both on the env's
preference rows (:func:`run_rm`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from trainers.hf_io import write_model_dir

if TYPE_CHECKING:
    from areal_agents.config import ExperimentConfig

__all__ = ["PreferencePair", "RMReport", "bradley_terry_loss", "load_reward_model", "pairwise_accuracy",
           "preference_pairs", "reward_head", "run_rm", "train_reward_model"]


def load_reward_model(model_dir: str | os.PathLike[str], *, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the reward model at ``model_dir``, or, for a causal LM, its body under
    a fresh score head (one output, seeded), float32, with a padding id set (batches are padded)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from areal_agents.inference.scoring import is_reward_model

    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "score.weight newly initialized" is the point of a fresh head
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            extra: dict[str, Any] = {} if is_reward_model(model_dir) else {"num_labels": 1}
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32, **extra)
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model, tokenizer


def reward_head(lm_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """An untrained reward model at ``out_dir``: the causal LM at ``lm_dir`` under a fresh score
    head (:func:`load_reward_model`), with its tokenizer files (written atomically)."""
    model, _ = load_reward_model(lm_dir, seed=seed)
    return write_model_dir(out_dir, lm_dir, lambda tmp: model.save_pretrained(tmp))


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: the conversation so far (chat messages), the reply preferred and the other."""

    messages: tuple[dict[str, str], ...]
    chosen: str
    rejected: str


def preference_pairs(rows: Sequence[dict[str, Any]]) -> list[PreferencePair]:
    """The pairs of dataset rows ``{"prompt": str | messages, "chosen": str, "rejected": str}``
    (a ``ValueError`` naming the first row without them)."""
    out = []
    for i, row in enumerate(rows):
        prompt, chosen, rejected = row.get("prompt"), row.get("chosen"), row.get("rejected")
        if not (isinstance(chosen, str) and isinstance(rejected, str) and isinstance(prompt, (str, list))):
            raise ValueError(f"preference row {i} needs 'prompt' (text or chat messages), 'chosen' and 'rejected' "
                             f"(texts); it has {sorted(row)}")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        out.append(PreferencePair(tuple(messages), chosen, rejected))
    return out


def _encode(tokenizer: Any, pair: PreferencePair, reply: str) -> list[int]:
    """The tokens the served reward model scores for ``reply``: the conversation rendered by the
    chat template as :class:`~areal_agents.rewards.reward_model.RewardModel` renders it."""
    text = tokenizer.apply_chat_template([*pair.messages, {"role": "assistant", "content": reply}], tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _scores(model: Any, seqs: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """The model's scores [N] for token sequences ``seqs`` (right-padded into one batch)."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, :len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        mask[i, :len(seq)] = 1
    return model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits[:, 0].float()


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Mean of ``-log sigmoid(chosen - rejected)`` over pairs; ``chosen``/``rejected`` [N] scores."""
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


@torch.no_grad()
def pairwise_accuracy(model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], batch_size: int = 64) -> float:
    """The fraction of ``pairs`` whose chosen reply the model scores above the rejected one."""
    was_training = model.training
    model.eval()
    pad, right = int(model.config.pad_token_id), 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        s = _scores(model, [_encode(tokenizer, p, r) for p in chunk for r in (p.chosen, p.rejected)], pad)
        right += int((s[0::2] > s[1::2]).sum())
    model.train(was_training)
    return right / max(1, len(pairs))


class RMReport(TypedDict):
    """What :func:`train_reward_model` did: losses per step, evals, seconds, the model directory."""

    loss: list[float]
    evals: list[dict[str, float]]
    seconds: float
    path: str


def train_reward_model(model_dir: str | os.PathLike[str], pairs: Sequence[PreferencePair], out_dir: str | os.PathLike[str],
                       *, steps: int, batch_size: int, lr: float, eval_pairs: Sequence[PreferencePair] = (),
                       eval_every: int = 0, seed: int = 0, progress: bool = True,
                       log: Callable[[dict[str, float]], None] | None = None) -> RMReport:
    """Train the reward model at ``model_dir`` (a causal LM gets a fresh score head) on ``pairs``:
    ``steps`` steps of ``batch_size`` pairs (seeded epochs), AdamW at ``lr`` with a linear warmup
    over the first tenth, the Bradley-Terry loss; pairwise accuracy on ``eval_pairs`` every
    ``eval_every`` steps and at the end. One process (CPU, or the first GPU when there is one).
    The result is written to ``out_dir`` (atomically) with its tokenizer; returns an :class:`RMReport`."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not pairs:
        raise ValueError("train_reward_model needs at least one preference pair")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_reward_model(model_dir, seed=seed)
    model = model.to(device).train()
    pad = int(model.config.pad_token_id)
    encoded = [(_encode(tokenizer, p, p.chosen), _encode(tokenizer, p, p.rejected)) for p in pairs]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    rng, order = random.Random(seed), list[int]()
    losses: list[float] = []
    evals: list[dict[str, float]] = []
    t0 = time.monotonic()
    columns = (TextColumn("[bold]reward model"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[acc]}"), TimeElapsedColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("rm", total=steps, loss=float("nan"), acc="")
        for step in range(steps):
            batch = []
            for _ in range(batch_size):
                if not order:
                    order = list(range(len(encoded)))
                    rng.shuffle(order)
                batch.append(encoded[order.pop()])
            s = _scores(model, [seq for pair in batch for seq in pair], pad)
            loss = bradley_terry_loss(s[0::2], s[1::2])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            bar.update(task, advance=1, loss=losses[-1])
            if eval_pairs and (eval_every and (step + 1) % eval_every == 0 or step + 1 == steps):
                evals.append({"step": step + 1, "accuracy": pairwise_accuracy(model, tokenizer, eval_pairs)})
                bar.update(task, acc=f"pairwise accuracy {evals[-1]['accuracy']:.3f}")
                if log is not None:
                    log(evals[-1])
    path = write_model_dir(out_dir, model_dir, lambda tmp: model.save_pretrained(tmp))
    return {"loss": losses, "evals": evals, "seconds": time.monotonic() - t0, "path": str(path)}


def run_rm(cfg: ExperimentConfig) -> Path:
    """What ``areal-agents rm --env NAME`` does: a reward model trained on the preference rows of
    the env's dataset (``data.name``; the ``train`` split, accuracy on ``reward_model.eval_pairs``
    rows of ``test``), from ``actor.path`` (a causal LM given a fresh score head, or a reward model
    trained further; default: the env's tiny warm start, the one ``run`` starts from), as the ``reward_model`` section says,
    written to ``reward_model.output_dir`` (default ``<run_dir>/reward_model``) with
    ``rm_report.json``. Returns the model directory."""
    import json

    from areal_agents.data import load_dataset_rows

    rm = cfg.reward_model
    out = Path(rm.output_dir or Path(cfg.run_dir) / "reward_model")
    base = cfg.actor.path
    if base is None:
        from trainers.sft import ensure_warm_model

        own = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, name=None, path=None, kwargs={}))
        base = str(ensure_warm_model(own, progress=cfg.logging.progress, warm_start=True))  # the run's, cached
    train = preference_pairs(load_dataset_rows(cfg, "train"))
    test = preference_pairs(load_dataset_rows(cfg, "test")[:rm.eval_pairs])
    steps = rm.steps or max(1, len(train) // rm.batch_size)
    report = train_reward_model(base, train, out, steps=steps, batch_size=rm.batch_size, lr=rm.lr,
                                eval_pairs=test, eval_every=rm.eval_every, seed=cfg.seed, progress=cfg.logging.progress)
    summary = {"steps": steps, "pairs": len(train), "final_loss": report["loss"][-1], "evals": report["evals"],
               "seconds": round(report["seconds"], 1), "base": str(base), "path": report["path"]}
    (out / "rm_report.json").write_text(json.dumps(summary, indent=1))
    return out
