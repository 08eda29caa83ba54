"""The FSDP2 training engine: HF models sharded with ``fully_shard`` over a device mesh.

A :class:`TrainEngine` holds the policy (``actor``), a frozen reference copy and a critic (value
head on the same architecture, its body initialised from the policy) when asked for them. It
knows no algorithm: forward passes (:meth:`TrainEngine.compute_logprobs`, ``compute_ref_logprobs``,
``compute_values``) and a backward pass with an optimiser step (:meth:`TrainEngine.train_batch`)
are all it offers; the recipe (:func:`trainers.loop.train_step`) decides from the algorithm's spec
which of them a step needs. Every rank holds the same full batch (the RL loop gives every rank the same
trajectories). :meth:`TrainEngine.compute_logprobs` splits the rows over ranks, runs
length-sorted micro-batches and all-reduces, so every rank ends with the full ``[B, T]``
tensor. :meth:`TrainEngine.train_batch` accumulates gradients over this rank's micro-batches
and takes one optimiser step; the loss function sees global denominators (``LossNorm``), so
the micro-batch losses of all ranks sum to the full-batch loss however the batch is split.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from algorithms.losses import LossNorm, combine_metrics, metric_reduction
from algorithms.specs import LossFn
from areal_agents.config import ExperimentConfig
from areal_agents.types import Trajectory
from trainers import dist as tdist
from trainers.batching import Batch, check_lengths, collate, micro_batch_indices, rank_indices, select, seq_lens
from trainers.hf_io import TORCH_DTYPES, write_hf_dir
from trainers.logprobs import head_only_at, logprobs_at, scored_tokens, token_logprobs
from trainers.lora import (
    adapter_config,
    adapter_disabled,
    adapter_key,
    apply_lora,
    is_adapter_key,
    merge_state,
    write_adapter_dir,
)
from trainers.prefix_packing import Packed, pack_prefixes
from trainers.value_model import ValueModel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["LossFn", "ShardedModel", "TrainEngine", "ValueModel", "lr_lambda", "token_logprobs"]



def lr_lambda(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """LR multiplier: linear warmup over ``warmup`` steps, then constant or cosine to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _plain_tensors(state: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """``state`` (a full, unsharded model state dict: every value a tensor) as a dict of tensors."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"model state {key!r}: a full state dict holds tensors, got {type(value).__name__}")
        out[key] = value
    return out


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (non-reentrant), through whichever name the installed transformers gives it."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.x; gradient_checkpointing_enable is its deprecated alias
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]


class ShardedModel:
    """One HF model sharded per decoder layer plus the root, with its optimiser and schedule.

    ``kind``: ``lm`` (causal LM) or ``value`` (:class:`ValueModel`). ``lr=None``
    freezes the model (no optimiser). With ``actor.lora.rank > 0`` the LM gets LoRA adapters
    before sharding and only they (and a critic's value head) train and are in the optimiser.
    """

    def __init__(self, cfg: ExperimentConfig, path: Path, mesh: DeviceMesh, device: torch.device, *, kind: str,
                 lr: float | None, total_steps: int) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.random.fork_rng(devices=[]):  # fresh weights (a value head, ...) are identical on every rank
            torch.manual_seed(cfg.seed)
            if kind == "value" and not cfg.actor.init_critic_from_actor:  # the critic's body starts from scratch
                lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
            else:
                lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            config = lm.config
            self.lora = cfg.actor.lora.enabled and lr is not None
            if self.lora:
                lm = apply_lora(lm, cfg.actor.lora)
            model = ValueModel(lm.get_base_model() if self.lora else lm) if kind == "value" else lm
        self.kind, self.config = kind, config
        # custom block masks need an attention that takes a 4D mask (not flash-attention kernels)
        self.pack_prompts = (cfg.actor.pack_prompts and kind == "lm"
                             and config._attn_implementation in ("sdpa", "eager"))
        model.to(device)
        self.positions_run = 0  # positions the forward passes ran (packed or padded), for the step's metrics
        a = cfg.actor
        if a.gradient_checkpointing and lr is not None:
            checkpoint_activations(model.body if isinstance(model, ValueModel) else model)
        mp = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[a.dtype], reduce_dtype=TORCH_DTYPES[a.grad_reduce_dtype])
        # One rank in float32 has nothing to shard or cast: the plain module is the same maths
        # without FSDP's per-layer copies (about 1.5x faster for the tiny model on CPU).
        self.sharded = mesh.size() > 1 or a.dtype != "float32" or a.grad_reduce_dtype != "float32"
        if self.sharded:
            layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
            if not layers:
                raise ValueError(f"{type(model).__name__}: no *DecoderLayer modules to shard")
            for layer in layers:
                fully_shard(layer, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
        self.model = model
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if lr is None:
            model.eval().requires_grad_(False)
            return
        model.train()  # dropout is 0 in these configs; train mode enables gradient checkpointing
        params = [p for p in model.parameters() if p.requires_grad] if self.lora else model.parameters()
        self.optimizer = torch.optim.AdamW(params, lr=lr, betas=(a.betas[0], a.betas[1]),
                                           weight_decay=a.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, a.warmup_steps, total_steps, a.lr_schedule, a.min_lr_ratio))

    def forward(self, mb: Batch, device: torch.device, temperature: float,
                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token-aligned logprobs (``lm``) or values (``value``) [B,T] for micro-batch ``mb``.

        Values are 0 on padding; logprobs (and entropies) are 0 outside the scored tokens
        (:func:`~trainers.logprobs.scored_tokens`: the loss mask), the only ones the output
        layer runs for."""
        attn, ids = mb["attention_mask"].to(device), mb["input_ids"].to(device)
        if self.kind == "value":  # values[:, t] = value of the state before token t
            self.positions_run += ids.numel()
            out = self.model(input_ids=ids, attention_mask=attn, use_cache=False)
            return torch.nn.functional.pad(out[:, :-1].float(), (1, 0)) * attn, None
        want = scored_tokens(mb).to(device)
        rows, cols = want.nonzero(as_tuple=True)
        src = rows * want.shape[1] + cols - 1  # the flat position that predicts each scored token
        packed = self._packed(mb)
        if packed is not None:  # prefixes that rows share run once (trainers.prefix_packing)
            src = packed.gather.to(device).reshape(-1)[src]
            inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids,
                      "attention_mask": packed.attention_mask}
        else:
            inputs = {"input_ids": ids, "attention_mask": attn}
        self.positions_run += inputs["input_ids"].numel()
        with head_only_at(self.model, src):
            logits = self.model(**{k: v.to(device) for k, v in inputs.items()}, use_cache=False).logits
        lp, ent = logprobs_at(logits[0], ids[rows, cols], temperature, with_entropy)
        zeros = torch.zeros(want.shape, dtype=lp.dtype, device=device)
        return zeros.index_put((rows, cols), lp), (zeros.index_put((rows, cols), ent) if ent is not None else None)

    def _packed(self, mb: Batch) -> Packed | None:
        """The micro-batch with shared prefixes packed, when that saves compute (policy and reference).

        Packing saves the copies of shared prefixes, but a packed sequence is longer than a row,
        attention grows with the square of its length, and its tree mask keeps attention off the
        fused causal kernels. So a layout is taken only when it costs under 0.8 of the padded
        rows, counting per sequence ``L * (1 + L / (6 * hidden))``: the weights' FLOPs per token
        (~24 h^2) against attention's (~4 L h).
        """
        if not self.pack_prompts:
            return None
        scale = 6.0 * int(getattr(self.config, "hidden_size", 1024))
        return pack_prefixes(mb["input_ids"], seq_lens(mb), lambda n, length: n * length * (1.0 + length / scale),
                             margin=0.8)

    def clip_and_step(self, max_norm: float) -> float:
        """Clip gradients (``max_norm`` 0 = off), step unless the norm is not finite; return the norm."""
        assert self.optimizer is not None and self.scheduler is not None
        total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm or float("inf"))
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm


class TrainEngine:
    """Policy + optional reference and critic, sharded with FSDP2 (see the module docstring).

    World size 1 needs no launcher (a one-rank gloo group is created); N ranks come from
    ``torchrun`` or :func:`trainers.dist.spawn`. ``critic`` builds a value model; ``reference`` a
    frozen copy of the initial policy (with LoRA none: the policy with its adapter disabled is
    the reference); :func:`trainers.loop.build_engine` sets both from the algorithm's spec.
    ``total_steps`` sets the LR schedule length (default
    ``trainer.total_steps × algorithm.ppo_n_minibatches``).
    """

    def __init__(self, cfg: ExperimentConfig, model_path: str | os.PathLike[str], *, critic: bool = False,
                 reference: bool = False, total_steps: int | None = None) -> None:
        self.cfg, self.model_path = cfg, Path(model_path)
        self.rank, self.world = tdist.init_distributed(cfg.trainer.device, cfg.trainer_first_gpu)
        self.mesh = tdist.build_mesh(cfg.trainer.device, cfg.actor.hsdp_replicate)
        self.device = torch.device("cuda", torch.cuda.current_device()) if cfg.trainer.device == "cuda" \
            else torch.device("cpu")
        total = total_steps if total_steps is not None else cfg.trainer.total_steps * cfg.algorithm.ppo_n_minibatches
        self.actor = ShardedModel(cfg, self.model_path, self.mesh, self.device, kind="lm",
                                  lr=cfg.actor.lr, total_steps=total)
        self.lora = cfg.actor.lora if cfg.actor.lora.enabled else None
        # With LoRA the reference is the policy with its adapter disabled: no second model.
        self.ref = ShardedModel(cfg, self.model_path, self.mesh, self.device, kind="lm", lr=None,
                                total_steps=total) if reference and self.lora is None else None
        self.critic = ShardedModel(cfg, self.model_path, self.mesh, self.device, kind="value",
                                   lr=cfg.actor.critic_lr, total_steps=total) if critic else None
        self.hf_config = self.actor.config
        self.step = 0

    @property
    def model(self) -> torch.nn.Module:
        return self.actor.model

    @property
    def pad_token_id(self) -> int:
        pad = self.hf_config.pad_token_id
        return int(pad) if pad is not None else 0

    def trainable(self) -> dict[str, ShardedModel]:
        """The models that have optimisers (what a checkpoint must hold)."""
        return {"actor": self.actor, **({"critic": self.critic} if self.critic is not None else {})}

    # -- batches ------------------------------------------------------------------------------
    def to_batch(self, data: Sequence[Trajectory] | Mapping[str, torch.Tensor]) -> Batch:
        """Collate trajectories (pad id from the model config) or pass a batch through; an episode
        longer than the model's context or ``actor.max_tokens_per_mb`` is refused in one line
        (:func:`~trainers.batching.check_lengths`)."""
        if isinstance(data, Mapping):
            return dict(data)
        trajs = list(data)
        check_lengths(trajs, getattr(self.actor.config, "max_position_embeddings", None), self.cfg.actor.max_tokens_per_mb)
        return collate(trajs, pad_token_id=self.pad_token_id)

    def _all_reduce(self, t: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        if self.world > 1:
            t = t.to(self.device)
            dist.all_reduce(t, op=op)
        return t.cpu()

    def _plan(self, batch: Batch) -> tuple[list[int], list[list[int]]]:
        """This rank's rows and their micro-batches (row lists into ``batch``); every rank gets
        the same number of micro-batches (padded with empty ones) so FSDP collectives match."""
        lens = seq_lens(batch)
        mine = rank_indices(lens, self.world, self.rank)
        budget = self.cfg.actor.max_tokens_per_mb
        n_local = len(micro_batch_indices([lens[i] for i in mine], budget)) if mine else 0
        n = int(self._all_reduce(torch.tensor([float(n_local)]), dist.ReduceOp.MAX).item())
        mbs = micro_batch_indices([lens[i] for i in mine], budget, min_count=max(n, 1))
        return mine, [[mine[j] for j in mb] for mb in mbs]

    def _dummy(self) -> Batch:
        return {"input_ids": torch.full((1, 2), self.pad_token_id, dtype=torch.long),
                "attention_mask": torch.ones((1, 2), dtype=torch.long)}

    def _temperature(self, temperature: float | None) -> float:
        t = self.cfg.sampling.temperature if temperature is None else temperature
        return t if t > 0 else 1.0  # greedy sampling reports temperature-1 logprobs

    @torch.no_grad()
    def _gather_forward(self, model: ShardedModel, data: Any, temperature: float | None) -> torch.Tensor:
        batch = self.to_batch(data)
        temp = self._temperature(temperature)
        out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
        for rows in self._plan(batch)[1]:
            res = model.forward(select(batch, rows) if rows else self._dummy(), self.device, temp)[0]
            if rows:
                out[torch.tensor(rows), : res.shape[1]] = res.float().cpu()
        return self._all_reduce(out)

    def compute_logprobs(self, data: Sequence[Trajectory] | Mapping[str, torch.Tensor],
                         temperature: float | None = None) -> torch.Tensor:
        """Policy logprobs [B,T] of the current weights at ``temperature`` (default
        ``sampling.temperature``), token-aligned like ``batch["logprobs"]``; on every rank."""
        return self._gather_forward(self.actor, data, temperature)

    def compute_ref_logprobs(self, data: Sequence[Trajectory] | Mapping[str, torch.Tensor],
                             temperature: float | None = None) -> torch.Tensor:
        """Reference-model logprobs [B,T] (an engine built with ``reference=True``); with LoRA,
        the policy's base model (its adapter disabled for this pass)."""
        if self.lora is not None:
            with adapter_disabled(self.actor.model):
                return self._gather_forward(self.actor, data, temperature)
        if self.ref is None:
            raise RuntimeError("no reference model: build the engine with reference=True "
                               "(the RL loop does when the algorithm needs one: algorithm.kl_ctl > 0)")
        return self._gather_forward(self.ref, data, temperature)

    def compute_values(self, data: Sequence[Trajectory] | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Critic values [B,T]; ``values[:, t]`` is the value of the state before token ``t``."""
        if self.critic is None:
            raise RuntimeError("no critic: build the engine with critic=True (the RL loop does for algorithms "
                               "whose spec has needs_critic)")
        return self._gather_forward(self.critic, data, 1.0)

    # -- training -----------------------------------------------------------------------------
    def loss_norm(self, batch: Batch, rows: Sequence[int]) -> LossNorm:
        """Global denominators over all ranks: loss tokens, sequences with a loss token, and the
        response-length cap (``algorithm.max_response_tokens``, else ``agent.max_tokens``)."""
        mask = batch["loss_mask"][torch.tensor(list(rows), dtype=torch.long)] if rows else torch.zeros(0, 1).bool()
        counts = self._all_reduce(torch.tensor([float(mask.sum()), float((mask.sum(1) > 0).sum())]))
        cap = self.cfg.algorithm.max_response_tokens
        assert cap is not None, "ExperimentConfig sets algorithm.max_response_tokens (default: agent.max_tokens)"
        return LossNorm(tokens=float(counts[0]), seqs=float(counts[1]), max_len=float(cap))

    def train_batch(self, data: Sequence[Trajectory] | Mapping[str, torch.Tensor], loss_fn: LossFn, *,
                    temperature: float | None = None, n_minibatches: int | None = None,
                    detached_logp_key: str | None = None) -> dict[str, float]:
        """Gradient accumulation over micro-batches, one optimiser step per minibatch.

        ``loss_fn(logp [B,T], mb, cfg.algorithm, norm, entropy=[B,T], values=[B,T] | None)``
        returns ``(loss, metrics)``; ``values`` carries gradients into the critic when there
        is one. With ``detached_logp_key``, a micro-batch without that key gets the logprobs of
        its own forward pass under it, detached (the weights before this minibatch's step,
        without a second forward pass). Rows are split into ``n_minibatches`` (default
        ``algorithm.ppo_n_minibatches``) strided minibatches. Returns metrics averaged over minibatches: ``loss`` (full-batch),
        ``grad_norm``, ``lr``, ``n_tokens``, ``n_seqs``, ``n_mbs``, ``pad_ratio``, ``computed_tokens``
        (the positions the policy's forward passes ran: packed sequences or padded rows) and the loss
        function's metrics summed over micro-batches and ranks (they are globally normalised),
        but for names ending in ``_max`` / ``_min``: the max / min over micro-batches, ranks
        and minibatches (:func:`algorithms.losses.metric_reduction`).
        """
        batch = self.to_batch(data)
        n = n_minibatches or self.cfg.algorithm.ppo_n_minibatches
        b = int(batch["input_ids"].shape[0])
        chunks = [list(range(i, b, n)) for i in range(n)] if n > 1 else [list(range(b))]
        results = [self._train_minibatch(batch if n == 1 else select(batch, c), loss_fn, temperature,
                                         detached_logp_key) for c in chunks if c]
        out: dict[str, float] = {}
        for k in results[0]:
            values, op = [r[k] for r in results], metric_reduction(k)
            out[k] = max(values) if op == "max" else min(values) if op == "min" else sum(values) / len(values)
        return out

    def _train_minibatch(self, batch: Batch, loss_fn: LossFn, temperature: float | None,
                         detached_logp_key: str | None) -> dict[str, float]:
        temp = self._temperature(temperature)
        mine, mbs = self._plan(batch)
        norm = self.loss_norm(batch, mine)
        grad_entropy = self.cfg.algorithm.entropy_coef > 0
        total_loss = 0.0
        parts: list[Mapping[str, float]] = []
        real = padded = 0
        ran_before = self.actor.positions_run
        for rows in mbs:
            if not rows:  # keep collectives in step with ranks that have more micro-batches
                dummy = self._dummy()
                zero = torch.stack([m.forward(dummy, self.device, temp)[0].sum() for m in self.trainable().values()]).sum()
                (zero * 0.0).backward()
                continue
            mb = select(batch, rows)
            logp, ent = self.actor.forward(mb, self.device, temp, with_entropy=True)
            if ent is not None and not grad_entropy:
                ent = ent.detach()
            values = self.critic.forward(mb, self.device, 1.0)[0] if self.critic is not None else None
            mb_dev = {k: v.to(self.device) for k, v in mb.items()}
            if detached_logp_key is not None and detached_logp_key not in mb_dev:
                mb_dev[detached_logp_key] = logp.detach()  # the weights before the step: no second forward
            loss, metrics = loss_fn(logp, mb_dev, self.cfg.algorithm, norm, entropy=ent, values=values)
            (loss * self.world).backward()  # FSDP averages gradients over ranks; the loss is a global sum
            total_loss += float(loss.detach())
            parts.append({k: float(v.detach() if isinstance(v, torch.Tensor) else v) for k, v in metrics.items()})
            real += int(mb["attention_mask"].sum())
            padded += int(mb["input_ids"].numel())
        lr = self.actor.scheduler.get_last_lr()[0] if self.actor.scheduler else 0.0
        grad_norm = self.actor.clip_and_step(self.cfg.actor.max_grad_norm)
        extra = {"critic/grad_norm": self.critic.clip_and_step(self.cfg.actor.max_grad_norm)} if self.critic else {}
        self.step += 1
        sums = combine_metrics(parts)
        keys = sorted(k for k in sums if metric_reduction(k) == "sum")
        ran = float(self.actor.positions_run - ran_before)
        red = self._all_reduce(torch.tensor([total_loss, float(real), float(padded), ran, *(sums[k] for k in keys)],
                                            dtype=torch.float64))
        # extremes in one MAX all-reduce, the minima negated
        ext = sorted(k for k in sums if metric_reduction(k) != "sum")
        sign = [1.0 if metric_reduction(k) == "max" else -1.0 for k in ext]
        top = self._all_reduce(torch.tensor([s * sums[k] for s, k in zip(sign, ext, strict=True)],
                                            dtype=torch.float64), dist.ReduceOp.MAX).tolist() if ext else []
        out = {"loss": float(red[0]), "grad_norm": grad_norm, "lr": lr, "n_tokens": norm.tokens,
               "n_seqs": norm.seqs, "n_mbs": float(len(mbs)),
               "pad_ratio": 1.0 - float(red[1]) / max(1.0, float(red[2])), "computed_tokens": float(red[3]),
               "skipped_step": float(not math.isfinite(grad_norm)), **extra}
        return {**out, **dict(zip(keys, red[4:].tolist(), strict=True)),
                **{k: s * v for s, k, v in zip(sign, ext, top, strict=True)}}

    # -- export -------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded policy parameters on CPU (collective: every rank must call). One rank's shards
        are whole: read off the module, without the gather's checks (~8 ms of each step's sync)."""
        if self.world == 1:
            return {k: (v.to_local() if isinstance(v, DTensor) else v).detach().cpu() for k, v in self.actor.model.state_dict().items()}
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return _plain_tensors(get_model_state_dict(self.actor.model, options=opts))

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's LoRA adapter, unsharded on CPU, under PEFT's saved names (collective)."""
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = _plain_tensors(get_model_state_dict(self.actor.model, options=opts))  # (it adds tied output embeddings)
        return {adapter_key(k): v for k, v in state.items() if is_adapter_key(k)}

    def export_hf(self, out_dir: str | os.PathLike[str], *, merged: bool = False, durable: bool = True) -> Path:
        """Write the policy as a HF model dir (safetensors in ``actor.dtype``, config, tokenizer).

        With LoRA: a PEFT adapter dir (``adapter_config.json``, ``adapter_model.safetensors``),
        or with ``merged`` the base model with the adapter folded in, as a plain HF model dir.
        Collective. Rank 0 writes to a temporary sibling and renames it into place, so a reader
        never sees a half-written directory; ``durable=False`` skips the fsyncs (a weight-sync
        hand-off, not a result to keep). Returns ``out_dir``.
        """
        out, dtype = Path(out_dir), TORCH_DTYPES[self.cfg.actor.dtype]
        if self.lora is not None and not merged:
            adapter = self.adapter_state_dict()
            if self.rank == 0:
                config = adapter_config(self.lora, self.model_path, self.actor.model)
                write_adapter_dir(adapter, config, self.model_path, out, dtype, durable=durable)
            tdist.barrier()
            return out
        sd = self.full_state_dict()
        if self.lora is not None:
            sd = merge_state(sd, self.lora.alpha / self.lora.rank)
        if self.rank == 0:
            write_hf_dir(sd, self.hf_config, self.model_path, out, dtype, durable=durable)
        tdist.barrier()
        return out

    def export_final(self, out_dir: str | os.PathLike[str]) -> Path:
        """The result of a run: a HF model dir at ``out_dir`` (with LoRA the merged model, and
        the adapter itself in ``<out_dir>_adapter``). Collective; returns ``out_dir``."""
        if self.lora is not None:
            out = Path(out_dir)
            self.export_hf(out.with_name(out.name + "_adapter"))
        return self.export_hf(out_dir, merged=True)
