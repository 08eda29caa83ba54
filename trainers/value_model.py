"""A critic for PPO: the transformer body of a causal LM with a linear value head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["ValueModel"]


class ValueModel(nn.Module):
    """A critic: the transformer body of a causal LM and a linear value head (one output per token)."""

    def __init__(self, lm: PreTrainedModel) -> None:
        from transformers import PreTrainedModel

        super().__init__()
        body = lm.get_submodule(lm.base_model_prefix)
        if not isinstance(body, PreTrainedModel):
            raise TypeError(f"{type(lm).__name__}.{lm.base_model_prefix} is not a transformers model")
        self.body = body
        self.config = lm.config
        hidden = int(lm.config.hidden_size)
        self.value_weight = nn.Parameter(torch.randn(hidden) * (1.0 / hidden**0.5) * 0.1)
        self.value_bias = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                use_cache: bool = False) -> torch.Tensor:
        """``input_ids`` [B,T] → per-position values [B,T] (position ``t`` sees tokens ``<= t``)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache).last_hidden_state
        return (hidden * self.value_weight.to(hidden.dtype)).sum(-1) + self.value_bias.to(hidden.dtype)

