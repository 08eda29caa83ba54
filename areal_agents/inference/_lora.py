"""LoRA adapters in the embedded server: loaded by name, applied per request in the forward pass.

An adapter is PEFT's saved format (``adapter_config.json`` + ``adapter_model.safetensors``, keys
``base_model.model.<module>.lora_A.weight`` / ``lora_B``), read from disk
(``/load_lora_adapter``) or received over a weight-update group. It is never merged: a forward
hook on each adapted linear layer adds ``scale · (x Aᵀ) Bᵀ`` to that layer's output for the batch
rows whose request named the adapter (``lora_path`` of ``/generate``), so the base weights stay
bitwise as loaded, rows without an adapter see the base model, and rows with different adapters
share one forward pass.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

__all__ = ["LoraAdapter", "LoraSet", "adapter_from_tensors", "read_adapter"]

_CONFIG, _WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


@dataclass
class LoraAdapter:
    """One adapter: ``weights[module] = (A [r, in], B [out, r])`` and its output scale."""

    name: str
    path: str
    scale: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _scale(config: Mapping[str, Any], where: str) -> float:
    r, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1 or not isinstance(alpha, (int, float)):
        raise ValueError(f"{where}: adapter config needs an integer 'r' >= 1 and a number 'lora_alpha'")
    for key in ("use_dora", "fan_in_fan_out"):
        if config.get(key):
            raise ValueError(f"{where}: {key}=true adapters are not supported by the embedded server")
    return float(alpha) / (math.sqrt(r) if config.get("use_rslora") else r)


def adapter_from_tensors(name: str, path: str, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                         model: torch.nn.Module) -> LoraAdapter:
    """An adapter from PEFT-named ``tensors``; ``ValueError`` naming the problem when they do not
    fit ``model`` (a module that is not a linear layer of it, wrong shapes, an A without its B)."""
    scale = _scale(config, path)
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        body = key.removeprefix("base_model.model.")
        for part in ("lora_A", "lora_B"):
            if body.endswith(f".{part}.weight"):
                pairs.setdefault(body[: -len(f".{part}.weight")], {})[part] = tensor
                break
        else:
            raise ValueError(f"{path}: {key!r} is not a LoRA weight (lora_A/lora_B; modules_to_save is not supported)")
    adapter = LoraAdapter(name=name, path=path, scale=scale)
    param = next(model.parameters())
    for module, ab in sorted(pairs.items()):
        layer = modules.get(module)
        if not isinstance(layer, torch.nn.Linear):
            raise ValueError(f"{path}: {module!r} is not a linear layer of the served model")
        a, b = ab.get("lora_A"), ab.get("lora_B")
        if a is None or b is None:
            raise ValueError(f"{path}: {module!r} has {'lora_B' if a is None else 'lora_A'} only")
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != layer.in_features or b.shape[0] != layer.out_features \
                or a.shape[0] != b.shape[1]:
            raise ValueError(f"{path}: {module!r} has shapes A {list(a.shape)}, B {list(b.shape)}; the layer maps "
                             f"{layer.in_features} -> {layer.out_features}")
        adapter.weights[module] = (a.to(param).contiguous(), b.to(param).contiguous())  # the model's device and dtype
    if not adapter.weights:
        raise ValueError(f"{path}: the adapter has no LoRA weights")
    return adapter


def read_adapter(name: str, path: str | Path, model: torch.nn.Module) -> LoraAdapter:
    """Read a PEFT adapter dir; ``ValueError`` (or ``OSError``) naming what is wrong."""
    from safetensors.torch import load_file

    root = Path(path)
    if not (root / _CONFIG).is_file() or not (root / _WEIGHTS).is_file():
        raise ValueError(f"{path}: not a PEFT adapter dir (needs {_CONFIG} and {_WEIGHTS})")
    try:
        config = json.loads((root / _CONFIG).read_text())
    except ValueError as exc:
        raise ValueError(f"{path}/{_CONFIG}: {exc}") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{path}: not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    return adapter_from_tensors(name, str(path), config, load_file(str(root / _WEIGHTS)), model)


class LoraSet:
    """The adapters a server holds, and the hooks that apply them to the rows of a forward pass."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.adapters: dict[str, LoraAdapter] = {}
        self._modules = dict(model.named_modules())
        self._hooks: dict[str, RemovableHandle] = {}
        self._active: list[tuple[LoraAdapter, torch.Tensor | None]] = []  # (adapter, rows or None = all rows)

    def add(self, adapter: LoraAdapter) -> None:
        """Hold ``adapter`` under its name (replacing one of that name)."""
        for module in adapter.weights:
            if module not in self._hooks:
                self._hooks[module] = self._modules[module].register_forward_hook(self._hook(module))
        self.adapters[adapter.name] = adapter

    def remove(self, name: str) -> None:
        del self.adapters[name]
        used = {m for a in self.adapters.values() for m in a.weights}
        for module in [m for m in self._hooks if m not in used]:
            self._hooks.pop(module).remove()

    @contextlib.contextmanager
    def rows(self, names: Sequence[str | None]) -> Iterator[None]:
        """Inside, a forward pass over a batch applies to row ``i`` the adapter ``names[i]`` (None: none)."""
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            if name is not None:
                groups.setdefault(name, []).append(i)
        device = next(self.model.parameters()).device
        self._active = [(self.adapters[n], None if len(rows) == len(names) else torch.tensor(rows, device=device))
                        for n, rows in groups.items()]
        try:
            yield
        finally:
            self._active = []

    def _hook(self, module: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]:
        def apply(layer: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
            for adapter, rows in self._active:
                ab = adapter.weights.get(module)
                if ab is None:
                    continue
                x = inputs[0] if rows is None else inputs[0].index_select(0, rows)
                delta = torch.nn.functional.linear(torch.nn.functional.linear(x, ab[0]), ab[1]) * adapter.scale
                out = out + delta if rows is None else out.index_add(0, rows, delta)
            return out

        return apply
