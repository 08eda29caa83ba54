"""LoRA on the trainer side (PEFT): wrap a causal LM before sharding, read its adapter, write it.

With ``actor.lora.rank > 0`` the policy is ``peft.get_peft_model(lm, LoraConfig(...))``: the base
weights are frozen and only the ``lora_A``/``lora_B`` matrices train. The adapter leaves the
trainer in PEFT's own format (``adapter_config.json`` + ``adapter_model.safetensors``, keys
``base_model.model.<module>.lora_A.weight``), which PEFT, SGLang's ``/load_lora_adapter`` and the
embedded server all read. :func:`merge_state` folds an adapter into the base weights
(``W + alpha/r · B @ A``) for a plain HF model dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from areal_agents.config import ConfigError, LoraConfig
from trainers.hf_io import write_model_dir

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_config", "adapter_disabled", "adapter_key", "apply_lora",
           "is_adapter_key", "merge_state", "write_adapter_dir"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _peft() -> ModuleType:
    try:
        import peft
    except ImportError:
        raise ConfigError("actor.lora.rank", "LoRA needs the peft package: pip install 'areal-agents[lora]'") from None
    return peft


def _targets(cfg: LoraConfig) -> str | list[str]:
    return "all-linear" if list(cfg.target_modules) == ["all-linear"] else list(cfg.target_modules)


def apply_lora(lm: nn.Module, cfg: LoraConfig) -> nn.Module:
    """``lm`` wrapped with fresh LoRA adapters (PEFT; ``lora_B`` starts at 0, so the wrapped model
    computes what ``lm`` does); every base parameter is frozen."""
    peft = _peft()
    config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=_targets(cfg), bias="none", task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft 0.21 reads a property transformers 5 deprecates
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
            return peft.get_peft_model(lm, config)
    except ValueError as exc:  # target modules the model does not have
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ConfigError("actor.lora.target_modules", f"{first} (got {list(cfg.target_modules)})") from None


def adapter_config(cfg: LoraConfig, base: str | os.PathLike[str], model: nn.Module | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` of an adapter trained with ``cfg`` on the model at ``base``
    (the wrapped ``model`` gives the resolved target module names)."""
    peft_cfg = getattr(model, "peft_config", {}).get("default")
    targets = sorted(peft_cfg.target_modules) if peft_cfg is not None else _targets(cfg)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
            "r": cfg.rank, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout, "target_modules": targets,
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "modules_to_save": None, "inference_mode": True}


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_key(name: str) -> str:
    """A wrapped model's parameter name in PEFT's saved form (adapter name ``default`` dropped)."""
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def write_adapter_dir(state: dict[str, torch.Tensor], config: dict[str, Any], src_dir: str | os.PathLike[str],
                      out_dir: str | os.PathLike[str], dtype: torch.dtype, *, durable: bool = True) -> Path:
    """Write a PEFT adapter dir (config, weights, the tokenizer files of ``src_dir``) atomically
    (:func:`~trainers.hf_io.write_model_dir`, ``durable`` as there)."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        tensors = {adapter_key(k): v.detach().to(dtype).contiguous() for k, v in state.items() if is_adapter_key(k)}
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1))

    return write_model_dir(out_dir, src_dir, write, durable=durable)


def merge_state(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A wrapped model's full state dict as the plain model's, each adapter folded into its
    layer: ``W + scale · B @ A`` (in float32), names without PEFT's prefixes."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if is_adapter_key(name):
            continue
        key = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if name.endswith(".base_layer.weight"):
            prefix = name[: -len(".base_layer.weight")]
            a, b = state.get(f"{prefix}.lora_A.default.weight"), state.get(f"{prefix}.lora_B.default.weight")
            if a is not None and b is not None:
                tensor = (tensor.float() + scale * (b.float() @ a.float())).to(tensor.dtype)
        out[key] = tensor
    return out


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[None]:
    """Inside, the wrapped ``model`` computes its base model's outputs (no second copy in memory).

    Flips the adapter layers' ``disable_adapters`` flag only: PEFT's own ``disable_adapter()``
    also toggles ``requires_grad``, which sharded parameters must keep."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, flag in zip(layers, before, strict=True):
            m._disable_adapters = flag
