"""The running batch's KV cache: left-padded rows that can join and leave (torch).

Every layer keeps keys/values in a buffer ``[rows, H_kv, capacity, D]`` whose first ``B``
rows and ``length`` columns are live; a decode step writes one column in place instead of
concatenating, and the buffer doubles when full. Admitted rows are written into spare rows
and finished ones compacted in place, so the buffers are rebuilt only when a new row is
longer than the batch. Rows are left-padded: ``valid[b, t]`` says whether column ``t`` of
row ``b`` holds a real token, and each row's next position id is its count of real tokens.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["BatchKV"]

_HEADROOM = 64


class _GrowingLayer(DynamicLayer):
    """A cache layer over a preallocated buffer ``[rows, H, capacity, D]``: its first ``batch``
    rows and ``length`` columns are live; rows join and leave in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, batch: int, length: int) -> None:
        super().__init__()
        self.kbuf, self.vbuf, self.batch, self.length = keys, values, batch, length
        self.is_initialized = True
        self.device = keys.device
        self._views()

    def _views(self) -> None:
        self.keys = self.kbuf[: self.batch, :, : self.length]
        self.values = self.vbuf[: self.batch, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        n = key_states.shape[-2]
        if self.length + n > self.kbuf.shape[2]:
            pad = (0, 0, 0, max(2 * self.kbuf.shape[2], self.length + n + _HEADROOM) - self.length)  # zeroed columns
            self.kbuf = torch.nn.functional.pad(self.kbuf[:, :, : self.length], pad)
            self.vbuf = torch.nn.functional.pad(self.vbuf[:, :, : self.length], pad)
        self.kbuf[: self.batch, :, self.length : self.length + n] = key_states
        self.vbuf[: self.batch, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values


class BatchKV:
    """KV cache, validity mask and positions of the running batch (one row per sequence)."""

    def __init__(self, config: Any, device: torch.device, dtype: torch.dtype, max_rows: int = 1) -> None:
        self.config = config
        self.max_rows = max_rows  # rows the buffers hold once rebuilt (the engine's batch limit)
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
        """Attention mask ``[B, 1, 1, T + 1]`` (bool) and position ids ``[B, 1]`` for one new token
        (the column and the position are taken: the next step's come after them)."""
        ones = torch.ones(self.batch, 1, dtype=torch.bool, device=self.device)
        self.valid = torch.cat([self.valid, ones], dim=1)
        pos, self.pos = self.pos, self.pos + 1
        return self.valid[:, None, None, :], pos[:, None]

    def merge(self, prefill: DynamicCache, valid: torch.Tensor, rows: list[int]) -> None:
        """Append ``rows`` of a prefilled cache (``valid``: ``[n, L]``) to the batch.

        New rows no longer than the batch's are written into spare rows of its buffers, in
        place (right-aligned, left-padded); otherwise the buffers are rebuilt, with room for
        ``max_rows`` rows, so that later admissions fit.
        """
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        new_valid, n = valid[idx], len(rows)
        b_old, t_old, t_new = self.batch, int(self.valid.shape[1]), int(new_valid.shape[1])
        old = cast("list[_GrowingLayer]", self.cache.layers) if b_old else []
        length = max(t_old, t_new)
        if not (old and t_new <= t_old and b_old + n <= old[0].kbuf.shape[0]):  # rebuild, the old rows right-aligned
            layers: list[Any] = []
            for i, fresh in enumerate(prefill.layers):
                bufs = []
                for name in ("keys", "values"):
                    _, h, _, d = getattr(fresh, name).shape
                    buf = torch.zeros(max(self.max_rows, b_old + n), h, length + _HEADROOM, d, dtype=self.dtype,
                                      device=self.device)
                    if old:
                        buf[:b_old, :, length - t_old : length] = getattr(old[i], name)
                    bufs.append(buf)
                layers.append(_GrowingLayer(bufs[0], bufs[1], b_old, length))
            self.cache = self.fresh_cache()
            self.cache.layers = layers
        for layer, fresh in zip(cast("list[_GrowingLayer]", self.cache.layers), prefill.layers, strict=True):
            for buf, name in ((layer.kbuf, "keys"), (layer.vbuf, "values")):
                buf[b_old : b_old + n, :, : length - t_new] = 0
                buf[b_old : b_old + n, :, length - t_new : length] = getattr(fresh, name)[idx]
            layer.batch += n
            layer._views()
        merged_valid = torch.zeros(b_old + n, length, dtype=torch.bool, device=self.device)
        merged_valid[:b_old, length - t_old :] = self.valid
        merged_valid[b_old:, length - t_new :] = new_valid
        self.valid = merged_valid
        self.pos = torch.cat([self.pos, new_valid.sum(dim=1)])

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (moved to the top of the buffers, in place) and drop leading
        columns that no remaining row uses."""
        if not rows:
            self.clear()
            return
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        valid = self.valid[idx]
        lead = int(valid.int().argmax(dim=1).min())  # first real column of the longest row
        length = int(valid.shape[1]) - lead
        for layer in cast("list[_GrowingLayer]", self.cache.layers):
            for buf in (layer.kbuf, layer.vbuf):
                buf[: len(rows), :, :length] = buf[idx, :, lead : lead + length]  # gathered first, then copied
            layer.batch, layer.length = len(rows), length
            layer._views()
        self.valid = valid[:, lead:]
        self.pos = self.pos[idx]
