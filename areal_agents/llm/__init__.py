"""The ``llm`` an agent talks to: text in, text out, exact tokens recorded underneath (no torch).

* :mod:`.base` — :class:`LLM` (chat template once, then appended tokens; the recording), the
  :class:`Tokenizer` protocol, and :class:`ClientLLM` over the inference client;
* :mod:`.reference` — a known-good conversation replayed as a trajectory (supervised warm start);
* :mod:`.scripted` — :class:`ScriptedLLM`, a model that replies from a script (the preflight check, tests).
"""

from __future__ import annotations

from areal_agents.llm.base import (
    LLM,
    ClientLLM,
    Generation,
    Tokenizer,
    memo,
    observation_key,
    tokenizer_cache,
    tokens_key,
)

__all__ = ["LLM", "ClientLLM", "Generation", "Tokenizer", "memo", "observation_key", "tokenizer_cache", "tokens_key"]
