"""Token logprobs of a causal LM, computed only for the tokens that are used.

A policy's logprobs are used only where the loss is: the generated tokens (``loss_mask``). A
multi-turn episode's row is mostly context (its prompt, env messages, chat-template tokens), so
the output layer, the log-softmax and the entropy run only at the positions that predict a
scored token; the decoder still runs over every token (the context shapes those predictions).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["head_only_at", "logprobs_at", "scored_tokens", "token_logprobs"]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-aligned ``log_softmax(logits / temperature)`` of the tokens that were fed.

    ``logits`` [B,T,V] (position ``t`` predicts token ``t+1``), ``input_ids`` [B,T] →
    logprobs [B,T] with index 0 = 0 and index ``t`` the logprob of ``input_ids[:, t]``;
    with ``with_entropy`` also the entropy [B,T] of the distribution that produced token ``t``.
    """
    logp, ent = logprobs_at(logits[:, :-1], input_ids[:, 1:], temperature, with_entropy)
    pad = torch.nn.functional.pad
    return pad(logp, (1, 0)), (pad(ent, (1, 0)) if ent is not None else None)


def logprobs_at(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(logits / temperature)`` of ``targets``: ``logits`` [...,V], ``targets`` [...]
    → logprobs [...] (float32) and, with ``with_entropy``, the entropy [...] of each distribution."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, (-(logp_all.exp() * logp_all).sum(-1) if with_entropy else None)


def scored_tokens(mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[B,T] bool: the tokens whose logprob is used: the loss mask where the batch has one (else
    every real token), never a row's first token (nothing predicts it). A batch whose loss mask
    is empty scores its real tokens instead, so that every forward pass reaches the output layer."""
    real = mb["attention_mask"].bool().clone()
    real[:, 0] = False
    want = mb["loss_mask"].bool() & real if "loss_mask" in mb else real
    return want if bool(want.any()) else real


@contextmanager
def head_only_at(model: nn.Module, index: torch.Tensor) -> Iterator[None]:
    """While inside, ``model``'s output layer runs only on the flat positions ``index`` of its
    input: hidden states [N,L,H] become [1,K,H] (``K = len(index)``, position ``n*L + l``), so
    the model's logits are [1,K,V]. Works for any model whose ``get_output_embeddings()`` is the
    layer applied to the last hidden states (Hugging Face causal LMs, with or without adapters)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Module):
        raise TypeError(f"{type(model).__name__} has no output layer (get_output_embeddings() is {head!r})")

    def select(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        hidden = args[0]
        return (hidden.reshape(-1, hidden.shape[-1])[index].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()
