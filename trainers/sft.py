"""Supervised fine-tuning (loss on completion tokens only) and the warm start of the tiny default model.

``ensure_warm_model(cfg)`` is what ``areal-agents run`` calls without ``actor.path``: it builds
the tiny model for the env's text (:mod:`trainers.tiny_model`), renders each
training row as ``chat_template([user: prompt], add_generation_prompt) + reference + eos`` (or,
for an env with ``reference_conversation``, the whole conversation with the env's ``tools``,
only the assistant turns trained), fine-tunes on that, and caches the result under a hash of
(env, dataset, SFT config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch.nn.utils.rnn import pad_sequence

from algorithms.losses import LossNorm
from areal_agents.config import AlgorithmConfig, ConfigError, ExperimentConfig, LoraConfig, SFTConfig
from areal_agents.env import reference_completion, reference_conversation
from areal_agents.rollout.preflight import check_reference_turns
from areal_agents.types import Trajectory
from trainers.tiny_corpus import ensure_env_tiny_model
from trainers.warm_check import episode_check, is_multi_turn

if TYPE_CHECKING:
    from areal_agents.env import Env
    from trainers.engine import TrainEngine

__all__ = ["SFTReport", "ensure_warm_model", "exact_match_accuracy", "greedy_accuracy", "render_examples", "run_sft",
           "sft_loss", "sft_train"]

Example = tuple[Sequence[int], Sequence[int]] | tuple[str, str] | Trajectory
_CHECK_ROWS = 200
_WARM_VERSION = 6  # bump when the warm start recipe changes, so cached models are rebuilt


def sft_loss(logp: torch.Tensor, mb: Mapping[str, torch.Tensor], cfg: AlgorithmConfig, norm: LossNorm, *,
             entropy: torch.Tensor | None = None, values: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL over completion tokens of the whole batch: ``-Σ mask·logp / norm.tokens``.

    ``logp``/``mb["loss_mask"]`` are [B,T]; metrics are global sums like the RL losses'.
    """
    mask = mb["loss_mask"]
    loss = -torch.where(mask, logp, torch.zeros_like(logp)).sum() / max(norm.tokens, 1.0)
    return loss, {"sft/nll": float(loss.detach())}


def _to_ids(examples: Sequence[Example], tokenizer: Any) -> list[Trajectory]:
    out = []
    made: dict[tuple[int, int], Trajectory] = {}  # examples that share their lists (render_examples') share one
    for i, example in enumerate(examples):
        if isinstance(example, Trajectory):
            if not any(example.loss_mask):
                raise ValueError(f"example {i}: the trajectory has no trained (loss mask 1) tokens")
            out.append(example)
            continue
        prompt, completion = example
        key = (id(prompt), id(completion))  # the same objects, alive in ``examples``: the same example
        if key in made:
            out.append(made[key])
            continue
        if isinstance(prompt, str) != isinstance(completion, str):
            raise ValueError(f"example {i}: prompt and completion must both be text or both token ids")
        if isinstance(prompt, str):  # sft_train has loaded a tokenizer for text examples
            p = tokenizer.encode(prompt, add_special_tokens=False)
            c = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]
        else:
            p, c = [int(t) for t in prompt], [int(t) for t in completion]
        if not p or not c:
            raise ValueError(f"example {i}: prompt and completion must be non-empty")
        made[key] = _trajectory(p, c)
        out.append(made[key])
    return out


def _trajectory(prompt: list[int], completion: list[int]) -> Trajectory:
    n_p, n_c = len(prompt), len(completion)
    return Trajectory(input_ids=prompt + completion, loss_mask=[0] * n_p + [1] * n_c, logprobs=[0.0] * (n_p + n_c),
                      versions=[-1] * n_p + [0] * n_c, turn_spans=[(n_p, n_p + n_c)])


class SFTReport(TypedDict):
    """What :func:`sft_train` did: the loss of each step, each eval (``{"step": n, **eval_fn(engine)}``),
    whether an eval reached ``stop_at``, the seconds it took and where the model was written."""

    loss: list[float]
    evals: list[dict[str, float]]
    stopped_early: bool
    seconds: float
    path: str


def sft_train(model_path: str | os.PathLike[str], examples: Sequence[Example], sft: SFTConfig, out_dir: str | os.PathLike[str],
              *, cfg: ExperimentConfig | None = None, tokenizer: Any = None,
              eval_fn: Callable[[TrainEngine], dict[str, float]] | None = None, progress: bool = True,
              seed: int = 0, stop_at: float | None = None) -> SFTReport:
    """Fine-tune ``model_path`` on ``examples`` and export the result to ``out_dir`` (atomic).

    ``examples``: ``(prompt_ids, completion_ids)`` (the completion should end with eos),
    ``(prompt_text, completion_text)`` (tokenised without special tokens, eos appended), or a
    :class:`Trajectory` (trained where its loss mask is 1, e.g. a whole reference conversation).
    ``sft.steps`` steps of ``sft.batch_size`` examples (seeded epochs), AdamW at ``sft.lr``
    with warmup + cosine decay (with ``stop_at``: warmup, then constant, since the run stops
    at an accuracy rather than a step count), on the FSDP2 engine (``cfg`` gives the actor/trainer
    settings). ``eval_fn(engine)`` (the :class:`~trainers.engine.TrainEngine`; ``engine.model`` is the
    policy module) runs every ``sft.eval_every`` steps and at the end; with
    ``stop_at``, training stops at the first eval whose first value is ``>= stop_at``, and while
    that value is under half of ``stop_at`` (the flat start of the curve) the next eval comes
    ``sft.warm_start_far_check_every`` steps later (when set).
    Returns an :class:`SFTReport`.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from trainers.engine import TrainEngine

    if not examples:
        raise ValueError("sft_train needs at least one example")
    if tokenizer is None and any(not isinstance(e, Trajectory) and isinstance(e[0], str) for e in examples):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
    pairs = _to_ids(examples, tokenizer)
    base = cfg if cfg is not None else ExperimentConfig()
    actor = dataclasses.replace(base.actor, lr=sft.lr, warmup_steps=sft.warmup_steps,
                                lr_schedule="cosine" if stop_at is None else "constant")
    exp = dataclasses.replace(base, actor=actor, algorithm=dataclasses.replace(base.algorithm, kl_ctl=0.0))
    engine = TrainEngine(exp, model_path, critic=False, total_steps=max(1, sft.steps))
    rng = random.Random(seed)
    order: list[int] = []
    losses: list[float] = []
    evals: list[dict[str, float]] = []
    stopped_early = False
    t0 = time.monotonic()
    next_eval = sft.eval_every
    columns = (TextColumn("[bold]sft"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[acc]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not progress or engine.rank != 0, transient=False) as bar:
        task = bar.add_task("sft", total=sft.steps, loss=float("nan"), acc="")
        for step in range(sft.steps):
            batch = []
            for _ in range(sft.batch_size):
                if not order:
                    order = list(range(len(pairs)))
                    rng.shuffle(order)
                batch.append(pairs[order.pop()])
            metrics = engine.train_batch(batch, sft_loss, temperature=1.0, n_minibatches=1)
            losses.append(metrics["loss"])
            bar.update(task, advance=1, loss=metrics["loss"])
            if eval_fn is not None and sft.eval_every and step + 1 == next_eval and step + 1 < sft.steps:
                result = {"step": step + 1, **eval_fn(engine)}
                evals.append(result)
                bar.update(task, acc=" ".join(f"{k} {v:.2f}" for k, v in result.items() if k != "step"))
                first = next(v for k, v in result.items() if k != "step")
                if stop_at is not None and first >= stop_at:
                    stopped_early = True
                    bar.update(task, total=step + 1)
                    break
                far = sft.warm_start_far_check_every if stop_at is not None and first < stop_at / 2 else None
                next_eval += far or sft.eval_every
        if eval_fn is not None and not stopped_early:
            result = {"step": sft.steps, **eval_fn(engine)}
            evals.append(result)
            bar.update(task, acc=" ".join(f"{k} {v:.2f}" for k, v in result.items() if k != "step"))
    seconds = time.monotonic() - t0
    return {"loss": losses, "evals": evals, "stopped_early": stopped_early, "seconds": seconds,
            "path": str(engine.export_final(out_dir))}


@torch.no_grad()
def greedy_accuracy(model: Any, tokenizer: Any, env: Env, rows: Sequence[dict[str, Any]],
                    prompts: Sequence[list[int]], max_new_tokens: int = 16, batch_size: int = 64) -> float:
    """Fraction of ``rows`` whose greedy completion equals the env's reference completion or
    gets reward >= 1 from ``env.step`` (checked only for the others: rewards run out of process).

    ``prompts`` are the rendered prompt ids of ``rows`` (left-padded here for ``generate``).
    """
    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    hits = 0
    try:
        for start in range(0, len(rows), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in chunk], device=device)
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
            for row, seq in zip(rows[start : start + batch_size], out[:, width:].tolist(), strict=True):
                text = tokenizer.decode(seq, skip_special_tokens=True)
                ref = reference_completion(env, row)
                if ref is not None and text.strip() == ref.strip():  # a reference answer is correct by definition
                    hits += 1
                    continue
                env.reset(options=row)
                hits += env.step(text)[1] >= 1.0
    finally:
        model.train(was_training)
    return hits / max(1, len(rows))


@torch.no_grad()
def exact_match_accuracy(model: torch.nn.Module, examples: Sequence[tuple[list[int], list[int]] | Trajectory], pad_token_id: int,
                         batch_size: int = 256) -> float:
    """Fraction of ``(prompt_ids, completion_ids + eos)`` pairs (or trajectories, trained where
    their loss mask is 1) whose greedy completion is exactly the reference, from one
    teacher-forced forward pass per batch (no decoding loop).

    Greedy decoding reproduces the reference iff the argmax at every completion position (eos
    included) is the reference token, so this equals greedy exact match (for a conversation,
    every reply given the reference context, which is greedy exact match when the context
    between replies, e.g. a tool's result, follows from the replies); it is a lower bound
    of :func:`greedy_accuracy`, which also counts other completions the reward accepts.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hits = 0
    try:
        for start in range(0, len(examples), batch_size):
            chunk = [(e.input_ids, e.loss_mask) if isinstance(e, Trajectory)
                     else (list(e[0]) + list(e[1]), [0] * len(e[0]) + [1] * len(e[1]))
                     for e in examples[start : start + batch_size]]
            ids = pad_sequence([torch.tensor(seq) for seq, _ in chunk], batch_first=True, padding_value=pad_token_id)
            attn = pad_sequence([torch.ones(len(seq), dtype=torch.long) for seq, _ in chunk], batch_first=True)
            target = pad_sequence([torch.tensor(mask, dtype=torch.bool) for _, mask in chunk], batch_first=True)
            ids, attn, target = ids.to(device), attn.to(device), target.to(device)
            pred = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].argmax(-1)
            wrong = (pred != ids[:, 1:]) & target[:, 1:]
            hits += int((~wrong.any(1)).sum())
    finally:
        model.train(was_training)
    return hits / max(1, len(examples))


def render_examples(cfg: ExperimentConfig, tokenizer: Any, env: Env, rows: Sequence[dict[str, Any]]
                    ) -> tuple[list[tuple[list[int], list[int]] | Trajectory], list[list[int]]]:
    """``(prompt_ids, completion_ids + eos)`` for rows with a reference completion (a
    :class:`Trajectory` of the whole episode for rows with a reference conversation), and the
    rendered prompt ids of every row (chat template with the generation prompt)."""
    from areal_agents.llm.reference import reference_trajectory

    prompts: list[list[int]] = []
    examples: list[tuple[list[int], list[int]] | Trajectory] = []
    replayed: dict[str, Trajectory] = {}  # rows repeat: replay each conversation once
    rendered: dict[str, list[int]] = {}  # and render each prompt once (a warm start's 64,000 rows of math hold ~7,300)
    encoded: dict[str, list[int]] = {}
    for row in rows:
        conv = reference_conversation(env, row)
        if conv is not None:
            if cfg.agent.system_prompt and conv[0].get("role") != "system":  # as the agent starts its episodes
                conv = [{"role": "system", "content": cfg.agent.system_prompt}, *conv]
            key = json.dumps(conv, sort_keys=True, default=str)
            if key not in replayed:
                replayed[key] = reference_trajectory(tokenizer, conv, getattr(env, "tools", None))
            traj = replayed[key]
            examples.append(traj)
            prompts.append(traj.input_ids[: traj.turn_spans[0][0]])
            continue
        prompt = str(row["prompt"])
        if prompt not in rendered:
            messages = ([{"role": "system", "content": cfg.agent.system_prompt}] if cfg.agent.system_prompt else [])
            messages.append({"role": "user", "content": prompt})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            rendered[prompt] = tokenizer.encode(text, add_special_tokens=False)
        p = rendered[prompt]
        prompts.append(p)
        ref = reference_completion(env, row)
        if ref is not None:
            if ref not in encoded:
                encoded[ref] = tokenizer.encode(ref, add_special_tokens=False) + [tokenizer.eos_token_id]
            examples.append((p, encoded[ref]))
    return examples, prompts


def _defaults(env_name: str) -> dict[str, Any]:
    """The default values of the env's constructor arguments (none when it has no signature to read)."""
    from areal_agents.registry import envs

    try:
        params = inspect.signature(envs.get(env_name)).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _warm_key(cfg: ExperimentConfig, base: Path, train_rows: list[dict[str, Any]]) -> str:
    """Hash of what decides the warm-started weights: the training rows themselves (not the data
    config, so eval and test-split settings do not rebuild it), env, SFT settings, base model, the
    precision it is trained in (``actor.dtype``), seed."""
    rows = hashlib.sha256(json.dumps(train_rows, sort_keys=True, default=str).encode()).hexdigest()
    # an argument at its default is no other env: a judge-trained run measured by exact answers
    # (eval.env_kwargs) shares the warm start of the run trained on them
    defaults = _defaults(cfg.env.name)
    env_kwargs = {k: v for k, v in cfg.env.kwargs.items() if k not in defaults or defaults[k] != v}
    blob = json.dumps({"v": _WARM_VERSION, "env": cfg.env.name, "env_kwargs": env_kwargs, "rows": rows,
                       "sft": {k: v for k, v in dataclasses.asdict(cfg.sft).items() if k != "output_dir"},
                       "system": cfg.agent.system_prompt, "base": base.name, "dtype": cfg.actor.dtype,
                       "seed": cfg.seed},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _announce(cfg: ExperimentConfig, base: Path, out: Path, *, progress: bool) -> contextlib.AbstractContextManager[Any]:
    """Say (with ``progress``, on the first rank) that the warm start into ``out`` begins and where it
    goes; the spinner returned (a terminal's) runs while the tiny model ``base`` is built, if it must be."""
    if not progress or os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()
    from rich.console import Console

    console = Console()
    where = f"written to {out}" if cfg.sft.output_dir else f"first use; cached in {out}"
    console.print(f"warm start: building the tiny default model of env {cfg.env.name!r} and fine-tuning it on the "
                  f"env's reference replies ({where})", markup=False, highlight=False, soft_wrap=True)
    if (base / "config.json").is_file():
        return contextlib.nullcontext()
    return console.status(f"building the tiny model's tokenizer and weights in {base}")


def ensure_warm_model(cfg: ExperimentConfig, *, progress: bool = True, warm_start: bool = False) -> Path:
    """The SFT-warm-started tiny model for ``cfg.env`` (built and cached on first use).

    ``warm_start=True`` (what ``run`` and ``eval`` use) trains at ``sft.warm_start_lr`` and
    stops at the first check (every ``sft.warm_start_check_every`` steps, at most
    ``sft.warm_start_steps``) whose greedy exact-match accuracy on the eval rows reaches
    ``sft.warm_start_target``: a policy that is right part of the time, so that RL has
    something to learn, whichever seed or machine (a fixed step count lands anywhere on the
    steep part of the SFT curve). The checks are teacher-forced (:func:`exact_match_accuracy`,
    one forward pass), so checking often costs little; an env whose rows lack a reference
    completion is checked by greedy decoding on the first 200 eval rows instead.

    The env plays with ``eval.env_kwargs`` over ``env.kwargs``, as evals do (see :func:`_warm_key`).
    Cached at ``sft.output_dir`` or ``<cache>/warm/<env>-<hash>``; the hash covers the env,
    the training rows and the SFT config. The finished model dir appears atomically, with ``sft_report.json``.
    With ``progress``, a build says what it builds and where, then shows a bar of the SFT steps.
    ``warm_start=True`` first checks that the env's reference games fit in ``agent.max_turns``
    (:func:`~areal_agents.rollout.preflight.check_reference_turns`, a ``ConfigError``).
    """
    from transformers import AutoTokenizer

    from areal_agents.data import load_dataset_rows
    from areal_agents.gym.registration import make_env
    from trainers.tiny_model import cache_dir, tiny_model_dir

    stop_at = (cfg.sft.warm_start_target or None) if warm_start else None
    cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, lora=LoraConfig()),  # the base is trained whole
                              env=dataclasses.replace(cfg.env, kwargs={**cfg.env.kwargs, **cfg.eval.env_kwargs}))
    if warm_start:
        cfg = dataclasses.replace(cfg, sft=dataclasses.replace(
            cfg.sft, steps=cfg.sft.warm_start_steps, lr=cfg.sft.warm_start_lr,
            eval_every=cfg.sft.warm_start_check_every if stop_at else cfg.sft.eval_every))
    sft = cfg.sft
    data = dataclasses.replace(cfg.data, train_size=max(cfg.data.train_size, sft.steps * sft.batch_size))
    train_rows = load_dataset_rows(dataclasses.replace(cfg, data=data), "train")
    test_rows = load_dataset_rows(cfg, "test")[: cfg.eval.n or cfg.data.test_size]
    env = make_env(cfg.env.name, **cfg.env.kwargs)
    if warm_start:  # the run's episodes play what it teaches: its reference games must fit agent.max_turns
        check_reference_turns(cfg, env, train_rows)
    exact = bool(stop_at) and all(reference_completion(env, r) is not None for r in test_rows)

    base = tiny_model_dir(cfg.env.name)  # where ensure_env_tiny_model builds it
    out = Path(sft.output_dir) if sft.output_dir else cache_dir() / "warm" / f"{cfg.env.name}-{_warm_key(cfg, base, train_rows)}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    with _announce(cfg, base, out, progress=progress):
        ensure_env_tiny_model(cfg, env, train_rows)
    tokenizer = AutoTokenizer.from_pretrained(base)
    examples, _ = render_examples(cfg, tokenizer, env, train_rows)
    if not examples:
        raise ConfigError("actor.path", f"env {cfg.env.name!r} gives no reference_completion for its rows, so the "
                          "tiny default model cannot be warm-started on it: set actor.path to a model")
    with contextlib.ExitStack() as stack:
        eval_fn, check = _checker(cfg, base, tokenizer, env, test_rows, out, stack, exact=exact, sample=bool(stop_at))
        report = sft_train(base, examples, sft, out, cfg=cfg, tokenizer=tokenizer, eval_fn=eval_fn, progress=progress,
                           seed=cfg.seed, stop_at=stop_at)
    _write_report(out, report, stop_at=stop_at, check=check, base=base)
    return out


def _checker(cfg: ExperimentConfig, base: str | os.PathLike[str], tokenizer: Any, env: Any, test_rows: list[dict[str, Any]],
             out: Path, stack: contextlib.ExitStack, *, exact: bool, sample: bool
             ) -> tuple[Callable[[TrainEngine], dict[str, float]] | None, str]:
    """The check an SFT runs on the eval rows, and its name: teacher-forced exact match (``exact``,
    single-turn rows with references: one forward pass), episodes played on a server of the model
    being trained (multi-turn envs, under ``stack``), or greedy decoding; ``sample`` keeps the
    frequent checks of a warm start cheap (the first 200 eval rows when not exact)."""
    multi = bool(test_rows) and is_multi_turn(cfg, env, test_rows[0])  # checked by playing episodes, as evals do
    if sample and not (exact and not multi):
        test_rows = test_rows[:_CHECK_ROWS]
    if not test_rows:
        return None, "none"
    if exact and not multi:  # band checks: teacher-forced, one forward pass
        test_examples, _ = render_examples(cfg, tokenizer, env, test_rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return (lambda engine: {"acc": exact_match_accuracy(engine.model, test_examples, pad)}), "exact_match"
    if multi:
        return stack.enter_context(episode_check(cfg, Path(base), tokenizer, test_rows, out.with_name(f".{out.name}-check"))), "episodes"
    _, test_prompts = render_examples(cfg, tokenizer, env, test_rows)
    return (lambda engine: {"acc": greedy_accuracy(engine.model, tokenizer, env, test_rows, test_prompts,
                                                   max_new_tokens=cfg.sampling.max_new_tokens)}), "greedy"


def _write_report(out: Path, report: SFTReport, *, stop_at: float | None, check: str, base: str | os.PathLike[str]) -> None:
    """``out/sft_report.json``: steps, whether ``stop_at`` was reached, seconds, final loss, the checks (atomic)."""
    summary = {"steps": len(report["loss"]), "target": stop_at, "reached": report["stopped_early"],
               "seconds": round(report["seconds"], 1), "final_loss": report["loss"][-1] if report["loss"] else None,
               "check": check, "evals": report["evals"], "base_model": str(base)}
    tmp = out / ".sft_report.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out / "sft_report.json")


def run_sft(cfg: ExperimentConfig) -> Path:
    """What ``areal-agents sft`` does: warm-start the tiny model of ``cfg.env`` (cached), or, with
    ``actor.path``, fine-tune that model on the env's reference completions (into
    ``sft.output_dir``, default ``<run_dir>/sft``). Returns the model directory."""
    if cfg.actor.path is None:
        return ensure_warm_model(cfg, progress=cfg.logging.progress)
    from transformers import AutoTokenizer

    from areal_agents.data import load_dataset_rows
    from areal_agents.gym.registration import make_env

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor.path)
    env = make_env(cfg.env.name, **cfg.env.kwargs)
    examples, _ = render_examples(cfg, tokenizer, env, load_dataset_rows(cfg, "train"))
    test_rows = load_dataset_rows(cfg, "test")[: cfg.eval.n or cfg.data.test_size] if cfg.sft.eval_every else []
    path = Path(cfg.sft.output_dir or Path(cfg.run_dir) / "sft")
    with contextlib.ExitStack() as stack:
        eval_fn, check = _checker(cfg, cfg.actor.path, tokenizer, env, test_rows, path, stack, exact=False, sample=False)
        report = sft_train(cfg.actor.path, examples, cfg.sft, path, cfg=cfg, tokenizer=tokenizer, eval_fn=eval_fn,
                           progress=cfg.logging.progress, seed=cfg.seed)
    _write_report(path, report, stop_at=None, check=check, base=cfg.actor.path)
    return path
