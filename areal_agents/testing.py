"""Test utilities: a character-level tokenizer and a scripted LLM (no model files needed).

Both live in :mod:`areal_agents.llm.scripted` (the preflight check plays its scripted episode with
them); they are re-exported here for tests and demos. :class:`ScriptedLLM` answers from a script
instead of a model and its logprobs are made up, so that envs, agents and the token bookkeeping
of :class:`~areal_agents.llm.LLM` can be tested without a server. Real rollouts use the inference client.
"""

from __future__ import annotations

from areal_agents.llm.scripted import CharTokenizer, Script, ScriptedLLM

__all__ = ["CharTokenizer", "Script", "ScriptedLLM"]
