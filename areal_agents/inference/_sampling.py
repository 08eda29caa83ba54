"""Batched next-token sampling with SGLang's logprob semantics (torch)."""

from __future__ import annotations

import torch

__all__ = ["sample_next"]


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return it with its logprob.

    Args:
        logits: ``[B, V]`` next-token logits (any float dtype; computed in float32).
        temperature: ``[B]`` float; ``0`` means greedy (argmax).
        top_p: ``[B]`` float in ``(0, 1]``.
        top_k: ``[B]`` long; ``<= 0`` disables.
        generator: optional RNG for reproducible sampling.

    Returns:
        ``(tokens [B] long, logprobs [B] float32)`` where ``logprobs`` is
        ``log_softmax(logits / temperature)`` at the chosen token, taken *before* top-p /
        top-k filtering; greedy rows use temperature 1 (SGLang's default semantics).
    """
    logits = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    scaled = logits / temp[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
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
        tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
