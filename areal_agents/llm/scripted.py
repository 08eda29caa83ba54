"""A scripted model: an LLM that replies from a script, over a character-level tokenizer (no model files).

:class:`ScriptedLLM` answers from a script instead of a model and makes up its logprobs. The
preflight check plays one episode of the user's env and agent with it before any model or
server starts; tests and demos drive envs, agents and the token bookkeeping of
:class:`~areal_agents.llm.LLM` with it. Training rollouts use the inference client
(:class:`~areal_agents.llm.ClientLLM`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from areal_agents.llm.base import LLM, Generation

__all__ = ["CharTokenizer", "ScriptedLLM"]


class CharTokenizer:
    """Deterministic character-level tokenizer with a ChatML chat template (no model files).

    Special tokens ``<|endoftext|>`` (0), ``<|im_start|>`` (1) and ``<|im_end|>`` (2) are
    single ids; every other character ``c`` is id ``3 + ord(c)``. ``eos_token_id`` is
    ``<|im_end|>``, as in ChatML models. Encoding recognises special-token strings inside
    text, like Hugging Face tokenizers do.
    """

    SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    OFFSET = len(SPECIALS)
    _SPECIAL_SPLIT = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")

    def __init__(self) -> None:
        self.eos_token = "<|im_end|>"
        self.eos_token_id: int | None = self.SPECIALS.index(self.eos_token)
        self.pad_token_id = 0
        self.bos_token_id: int | None = None
        self.vocab_size = self.OFFSET + 0x110000
        self.all_special_ids = list(range(self.OFFSET))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for part in self._SPECIAL_SPLIT.split(text):
            ids += [self.SPECIALS.index(part)] if part in self.SPECIALS else [self.OFFSET + ord(c) for c in part]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(t - self.OFFSET) if t >= self.OFFSET else "" if skip_special_tokens else self.SPECIALS[t]
                       for t in map(int, ids))

    def apply_chat_template(
        self,
        conversation: Sequence[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message."""
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text


Script = Sequence[str] | Callable[[list[dict[str, Any]]], str]


class ScriptedLLM(LLM):
    """An :class:`~areal_agents.llm.LLM` that replies from a script, not from a model.

    ``script`` is a list of replies used in order, or ``callable(messages) -> str`` given
    the conversation so far (for :meth:`generate` calls, ``messages`` is empty). Replies are
    encoded with the tokenizer and followed by ``eos_token_id`` (unless ``append_eos`` is
    false); ``max_new_tokens`` cuts them (finish reason ``length``) and ``stop`` strings end
    them early (finish reason ``stop``, the stop string kept).

    The logprobs are **fabricated** (``-0.1 * (1 + i % 5)`` for the i-th token of a reply) so
    that bookkeeping tests can tell positions apart; ``version`` is reported as the weight
    version of every token.
    """

    def __init__(
        self,
        script: Script,
        tokenizer: Any | None = None,
        default_sampling: dict[str, Any] | None = None,
        *,
        version: int = 0,
        append_eos: bool = True,
    ) -> None:
        super().__init__(tokenizer if tokenizer is not None else CharTokenizer(), default_sampling)
        self.script = script
        self.version = version
        self.append_eos = append_eos
        self.calls: list[dict[str, Any]] = []
        self._next = 0

    def _reply(self) -> str:
        if callable(self.script):
            return str(self.script(self.messages))
        if self._next >= len(self.script):
            raise RuntimeError(f"ScriptedLLM: the script has only {len(self.script)} replies")
        self._next += 1
        return self.script[self._next - 1]

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        self.calls.append({"input_ids": list(input_ids), "sampling": dict(sampling)})
        text = self._reply()
        stops = sampling.get("stop") or []
        cut = [text.find(s) + len(s) for s in ([stops] if isinstance(stops, str) else stops) if s and s in text]
        if cut:
            text = text[: min(cut)]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        eos = self.tokenizer.eos_token_id
        if self.append_eos and not cut and eos is not None:
            ids.append(eos)
        limit = sampling.get("max_new_tokens")
        finish = "stop"
        if limit is not None and len(ids) > int(limit):
            ids, finish = ids[: int(limit)], "length"
        return Generation(output_ids=ids, logprobs=[-0.1 * (1 + i % 5) for i in range(len(ids))],
                          versions=[self.version] * len(ids), finish_reason=finish,
                          text=self.tokenizer.decode(ids, skip_special_tokens=True))
