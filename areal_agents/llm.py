"""The ``llm`` an agent talks to: text in, text out, exact tokens recorded underneath.

An :class:`LLM` is bound to one episode. ``chat`` renders the conversation with the
tokenizer's chat template *once*, then extends the token sequence by appending only the
new messages' tokens, so the trainer sees exactly what was sampled. Backends implement
:meth:`LLM._generate` (the inference client does, over HTTP; tests use a scripted one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Generation", "LLM", "Tokenizer"]


class Tokenizer(Protocol):
    """The subset of a Hugging Face tokenizer the SDK relies on."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass
class Generation:
    """One completion of ``input_ids`` as the server returned it.

    ``logprobs[i]`` is ``log_softmax(logits / temperature)`` of ``output_ids[i]``;
    ``versions[i]`` is the weight version that produced it (they differ when the request
    was interrupted by a weight update and resumed). ``finish_reason`` is ``stop``,
    ``length`` or ``abort``.
    """

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str = "stop"
    text: str = ""
    info: dict[str, Any] = field(default_factory=dict)


class LLM(ABC):
    """Per-episode, token-recording language model handle (see the module docstring)."""

    tokenizer: Tokenizer

    @abstractmethod
    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        """Complete ``input_ids`` with SGLang ``sampling_params`` (``max_new_tokens``, ...)."""
