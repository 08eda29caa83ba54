"""The running batch's KV cache: left-padded rows that can join and leave (torch).

Every layer keeps keys/values in a buffer ``[B, H_kv, capacity, D]`` whose first
``length`` columns are live; a decode step writes one column in place instead of
concatenating, and the buffer doubles when full. Rows are left-padded: ``valid[b, t]``
says whether column ``t`` of row ``b`` holds a real token, and each row's next position
id is its count of real tokens.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["BatchKV"]

_HEADROOM = 64


class _GrowingLayer(DynamicLayer):
    """A cache layer over a preallocated buffer ``[B, H, capacity, D]``."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self.kbuf, self.vbuf, self.length = keys, values, length
        self.is_initialized = True
        self.device = keys.device
        self._views()

    def _views(self) -> None:
        self.keys = self.kbuf[:, :, : self.length]
        self.values = self.vbuf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        n = key_states.shape[-2]
        if self.length + n > self.kbuf.shape[2]:
            cap = max(2 * self.kbuf.shape[2], self.length + n + _HEADROOM)
            self.kbuf = _resize(self.kbuf, cap, self.length)
            self.vbuf = _resize(self.vbuf, cap, self.length)
        self.kbuf[:, :, self.length : self.length + n] = key_states
        self.vbuf[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values


def _resize(buf: torch.Tensor, cap: int, length: int) -> torch.Tensor:
    """The first ``length`` columns of ``buf`` in a zeroed buffer of ``cap`` columns."""
    return _pad(buf[:, :, :length], 0, cap - length)


def _pad(kv: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """``kv`` ``[B, H, T, D]`` with ``left``/``right`` zero columns added along ``T``."""
    return torch.nn.functional.pad(kv, (0, 0, left, right))


class BatchKV:
    """KV cache, validity mask and positions of the running batch (one row per sequence)."""

    def __init__(self, config: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self.cache = self.fresh_cache()
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [B, T]
        self.pos = torch.zeros(0, dtype=torch.long, device=device)  # [B] next position id

    def fresh_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @property
    def batch(self) -> int:
        return int(self.valid.shape[0])

    def clear(self) -> None:
        self.cache = self.fresh_cache()
        self.valid = self.valid[:0, :0]
        self.pos = self.pos[:0]

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask ``[B, 1, 1, T + 1]`` (bool) and position ids ``[B, 1]`` for one new token."""
        ones = torch.ones(self.batch, 1, dtype=torch.bool, device=self.device)
        self.valid = torch.cat([self.valid, ones], dim=1)
        return self.valid[:, None, None, :], self.pos[:, None]

    def advance(self) -> None:
        self.pos = self.pos + 1

    def merge(self, prefill: DynamicCache, valid: torch.Tensor, rows: list[int]) -> None:
        """Append ``rows`` of a prefilled cache (``valid``: ``[n, L]``) to the batch."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        new_valid = valid[idx]
        b_old, t_old, t_new = self.batch, int(self.valid.shape[1]), int(new_valid.shape[1])
        length = max(t_old, t_new)
        merged_valid = torch.zeros(b_old + len(rows), length, dtype=torch.bool, device=self.device)
        merged_valid[:b_old, length - t_old :] = self.valid
        merged_valid[b_old:, length - t_new :] = new_valid
        layers: list[Any] = []
        for i, fresh in enumerate(prefill.layers):
            old = self.cache.layers[i] if b_old else None
            parts = []
            for name in ("keys", "values"):  # old rows, then the new ones, left-padded to ``length``
                kvs = [getattr(old, name)] if old is not None else []
                kvs.append(getattr(fresh, name)[idx].to(self.dtype))
                parts.append(torch.cat([_pad(kv, length - kv.shape[2], _HEADROOM) for kv in kvs]))
            layers.append(_GrowingLayer(parts[0], parts[1], length))
        self.cache = self.fresh_cache()
        self.cache.layers = layers
        self.valid = merged_valid
        self.pos = torch.cat([self.pos, new_valid.sum(dim=1)])

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` and drop leading columns that no remaining row uses."""
        if not rows:
            self.clear()
            return
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        valid = self.valid[idx]
        lead = int(valid.int().argmax(dim=1).min())  # first real column of the longest row
        length = int(valid.shape[1]) - lead
        layers: list[Any] = []
        for layer in cast("list[_GrowingLayer]", self.cache.layers):
            keys, values = (_pad(buf[idx, :, lead : lead + length], 0, _HEADROOM) for buf in (layer.kbuf, layer.vbuf))
            layers.append(_GrowingLayer(keys, values, length))
        self.cache.layers = layers
        self.valid = valid[:, lead:]
        self.pos = self.pos[idx]
