"""Batched next-token sampling with SGLang's logprob semantics (torch)."""

from __future__ import annotations

import torch

__all__ = ["prompt_logprobs", "sample_next", "scaled_logprobs", "top_logprobs"]


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    generator: torch.Generator | None = None,
    row_generators: list[torch.Generator | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return it with its logprob.

    Args:
        logits: ``[B, V]`` next-token logits (any float dtype; computed in float32).
        temperature: ``[B]`` float; ``0`` means greedy (argmax).
        top_p: ``[B]`` float in ``(0, 1]``.
        top_k: ``[B]`` long; ``<= 0`` disables.
        generator: optional RNG for reproducible sampling.
        row_generators: optional ``[B]`` per-row RNGs; a row with one samples from it
            (a seeded request draws the same tokens whatever it is batched with).

    Returns:
        ``(tokens [B] long, logprobs [B] float32)`` where ``logprobs`` is
        ``log_softmax(logits / temperature)`` at the chosen token, taken *before* top-p /
        top-k filtering; greedy rows use temperature 1 (SGLang's default semantics).
    """
    logits = logits.float()
    greedy = temperature <= 0
    scaled, logp = scaled_logprobs(logits, temperature)
    if bool(greedy.all()):
        tokens = logits.argmax(dim=-1)
    else:
        vocab = logits.shape[-1]
        filtered = scaled
        need_k = (top_k > 0) & (top_k < vocab)
        need_p = top_p < 1.0
        if bool(need_k.any()) or bool(need_p.any()):
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            rank = torch.arange(vocab, device=logits.device)[None, :]
            drop = need_k[:, None] & (rank >= top_k[:, None])
            probs = torch.softmax(sorted_logits, dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            drop |= need_p[:, None] & (mass_before >= top_p[:, None].to(probs.dtype))
            drop[:, 0] = False  # always keep the most likely token
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            filtered = torch.empty_like(scaled).scatter_(1, order, sorted_logits)
        probs = torch.softmax(filtered, dim=-1)
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        for i, own in enumerate(row_generators or []):
            if own is not None:
                sampled[i] = torch.multinomial(probs[i], 1, generator=own)[0]
        tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def scaled_logprobs(logits: torch.Tensor, temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits / T, log_softmax(logits / T))`` in float32, ``T = 1`` where ``temperature <= 0``."""
    logits = logits.float()
    temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).to(logits.dtype)
    scaled = logits / temp[:, None]
    return scaled, torch.log_softmax(scaled, dim=-1)


def top_logprobs(logp: torch.Tensor, nums: list[int]) -> list[tuple[list[float], list[int]] | None]:
    """Row ``i``'s ``nums[i]`` most likely tokens as ``(logprobs, token_ids)``, best first (``None`` for 0)."""
    k = min(max(nums, default=0), logp.shape[-1])
    if k <= 0:
        return [None] * len(nums)
    values, ids = logp.topk(k, dim=-1)
    vals, idx = values.tolist(), ids.tolist()
    return [(vals[i][:n], idx[i][:n]) if n > 0 else None for i, n in enumerate(nums)]


def prompt_logprobs(
    logits: torch.Tensor, ids: list[int], start: int, top_n: int
) -> tuple[list[float | None], list[tuple[list[float], list[int]] | None]]:
    """SGLang's input logprobs of ``ids[start:]`` from the prompt's logits (row ``p`` predicts ``ids[p + 1]``).

    The first token of the window has no logprob (``None``), as in SGLang, whatever ``start``
    is; the others get ``log_softmax(logits)`` (temperature 1) at their position. The second
    list holds each position's ``top_n`` alternatives (``None`` first, and everywhere when
    ``top_n`` is 0).
    """
    n = len(ids)
    if start >= n:
        return [], []
    logp = torch.log_softmax(logits[start : n - 1].float(), dim=-1)
    targets = torch.tensor(ids[start + 1 :], dtype=torch.long, device=logp.device)
    values: list[float | None] = [None, *logp.gather(1, targets[:, None]).squeeze(1).tolist()]
    tops: list[tuple[list[float], list[int]] | None] = [None, *top_logprobs(logp, [top_n] * (n - 1 - start))]
    return values, tops
