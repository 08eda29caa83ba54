"""A reference conversation as the exact tokens a rollout would record (no torch).

The warm start of an env with :meth:`~areal_agents.env.Env.reference_conversation` trains on
whole episodes: the user prompt, the model's tool call, the tool's result, the model's answer.
:func:`reference_trajectory` replays such a conversation through the same
:class:`~areal_agents.llm.LLM` bookkeeping that ``llm.chat`` and the OpenAI-compatible client use
(prompt rendered once with ``tools``, each reply appended as generated tokens ending in eos, the
template's end of turn and every later message appended as context), so what is trained is token
for token what the policy later sees and samples; only the assistant replies have loss mask 1.
"""

from __future__ import annotations

import weakref
from collections.abc import Coroutine
from typing import Any

from areal_agents.llm.base import LLM, Generation, Tokenizer
from areal_agents.types import Trajectory

__all__ = ["assistant_text", "reference_trajectory"]


class _Replay(LLM):
    """Generates the next queued reply (token ids, eos included) instead of sampling."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.queue: list[list[int]] = []

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        ids = self.queue.pop(0)
        return Generation(output_ids=ids, logprobs=[0.0] * len(ids), versions=[0] * len(ids))


_REPLAYS: weakref.WeakKeyDictionary[Any, _Replay] = weakref.WeakKeyDictionary()


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (no event loop needed: replay awaits nothing)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("reference replay suspended")


def assistant_text(tokenizer: Tokenizer, before: list[dict[str, Any]], reply: dict[str, Any],
                   tools: list[dict[str, Any]] | None = None) -> str:
    """What the model writes for the assistant message ``reply`` after ``before``, as the chat
    template renders it (content, then its ``tool_calls`` in the template's markup), without the
    template's end of turn."""
    extra = {"tools": tools} if tools else {}
    head = tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=True, **extra)
    full = tokenizer.apply_chat_template([*before, reply], tokenize=False, add_generation_prompt=False, **extra)
    probe = tokenizer.apply_chat_template([*before, {"role": "assistant", "content": "Zq7ProbeQz"}], tokenize=False,
                                          add_generation_prompt=False, **extra)
    end = probe[probe.rfind("Zq7ProbeQz") + len("Zq7ProbeQz"):]
    if not (isinstance(full, str) and isinstance(head, str) and full.startswith(head) and full.endswith(end)):
        raise ValueError("the chat template does not render an assistant reply as generation prompt + text + "
                         "end of turn, so its reference conversations cannot be replayed")
    return full[len(head): len(full) - len(end)]


def reference_trajectory(tokenizer: Tokenizer, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None = None) -> Trajectory:
    """The tokens of ``messages`` (OpenAI chat messages ending in an assistant reply) as
    ``llm.chat`` records them: one turn per assistant message, trained (loss mask 1, eos
    included); everything else context. Raises ``ValueError`` for a conversation that does not
    start with a non-assistant message or has no assistant reply."""
    if not messages or messages[0].get("role") == "assistant":
        raise ValueError("a reference conversation starts with a system or user message")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token to end the replies with")
    llm = _REPLAYS.setdefault(tokenizer, _Replay(tokenizer))  # one per tokenizer: its end of turn is probed once
    llm.reset()
    llm.queue.clear()
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        text = assistant_text(tokenizer, messages[:i], msg, tools)
        llm.queue.append([*tokenizer.encode(text, add_special_tokens=False), int(tokenizer.eos_token_id)])
        _run(llm.chat(messages[:i], tools=tools))
    if not llm.turn_spans:
        raise ValueError("a reference conversation needs at least one assistant message")
    traj = llm.to_trajectory()
    end = traj.turn_spans[-1][1]  # as a rollout ends: at the last reply's eos, without the turn end after it
    traj.input_ids, traj.loss_mask = traj.input_ids[:end], traj.loss_mask[:end]
    traj.logprobs, traj.versions = traj.logprobs[:end], traj.versions[:end]
    return traj
