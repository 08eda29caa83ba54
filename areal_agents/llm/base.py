"""The ``llm`` an agent talks to: text in, text out, exact tokens recorded underneath.

An :class:`LLM` is bound to one episode. ``chat`` renders the conversation with the
tokenizer's chat template *once*, then extends the token sequence by appending only the
new messages' tokens, so the trainer sees exactly what was sampled. Backends implement
:meth:`LLM._generate`: :class:`ClientLLM` over the inference client (HTTP), and tests use a
scripted one. The reply, :class:`Generation`, is the wire type of
:mod:`areal_agents.inference.protocol` (re-exported here).
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from areal_agents.inference.protocol import Generation  # the reply's wire type, re-exported here
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.inference.client import InferenceClient

__all__ = ["ClientLLM", "Generation", "LLM", "Tokenizer", "memo", "observation_key", "tokenizer_cache", "tokens_key"]

# What a tokenizer has rendered and encoded, shared by the episodes that use it: the 8
# episodes of a group render and encode the same prompt, and every turn ends with the same
# template text. Keys: ``("text", text)`` -> token ids; ``("render", json)`` -> template text.
_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()
_CACHE_MAX = 8192


def tokenizer_cache(tokenizer: Any) -> dict[tuple[str, str], Any] | None:
    """The cache shared by the users of ``tokenizer`` (see :func:`memo`); None for a tokenizer
    that cannot be weakly referenced or hashed."""
    try:
        return _CACHE.setdefault(tokenizer, {})
    except TypeError:
        return None


def memo(cache: dict[tuple[str, str], Any] | None, key: tuple[str, str], compute: Callable[[], Any]) -> Any:
    """``cache[key]``, computed (and stored, unless ``cache`` is None) when missing; a full
    cache (``_CACHE_MAX`` keys) is emptied first. ``compute`` must not return None."""
    value = cache.get(key) if cache is not None else None
    if value is None:
        value = compute()
        if cache is not None:
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            cache[key] = value
    return value


def _digest(kind: str, payload: str) -> str:
    return f"{kind}:{hashlib.blake2b(payload.encode(), digest_size=8).hexdigest()}"


def observation_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """The default state key of a chat turn: a stable hash (the same in every process) of the
    observation it responds to, the ``role`` and ``content`` of the messages after the last
    assistant message (for the first turn: the whole prompt, system message included)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    shown = [[m.get("role"), m.get("content")] for m in messages[last + 1:]]
    return _digest("obs", json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str))


def tokens_key(ids: Sequence[int]) -> str:
    """The default state key of a token-level turn (:meth:`LLM.generate`): a stable hash of the
    token ids it added before generating (for the first turn: the whole prompt)."""
    return _digest("ids", ",".join(str(int(i)) for i in ids))


class Tokenizer(Protocol):
    """The subset of a Hugging Face tokenizer the SDK relies on."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class LLM(ABC):
    """Per-episode, token-recording language model handle (see the module docstring).

    Public API: ``await chat(messages, **sampling) -> str``, ``await generate(input_ids,
    **sampling) -> Generation``, ``to_trajectory(**fields) -> Trajectory``, ``reset()``, and
    the recorded ``input_ids`` / ``loss_mask`` / ``logprobs`` / ``versions`` / ``turn_spans``
    / ``state_keys`` / ``finish_reasons`` / ``messages`` / ``last_generation``. Non-generated tokens have loss
    mask 0, logprob 0.0 and version -1. After a generated chat turn the template's
    end-of-turn text is appended as context with the next message (see :meth:`_close_turn`). Subclasses implement
    only :meth:`_generate`.
    """

    tokenizer: Tokenizer

    @abstractmethod
    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        """Complete ``input_ids`` with SGLang ``sampling_params`` (``max_new_tokens``, ...)."""

    # -- construction -------------------------------------------------------------------
    def __init__(self, tokenizer: Tokenizer, default_sampling: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.default_sampling: dict[str, Any] = dict(default_sampling or {})
        self._turn_end: str | None = None
        self._cache = tokenizer_cache(tokenizer)
        self.reset()

    def reset(self) -> None:
        """Forget the recorded episode (the handle can then play a new one)."""
        self._rec = Trajectory()  # the tokens so far: input_ids, loss_mask, logprobs, versions, turn_spans
        self._finish_reasons: list[str] = []
        self._turn_tail = ""  # the end of the last generated turn, not yet tokenized (see _close_turn)
        self._messages: list[dict[str, Any]] = []
        self._tools: list[dict[str, Any]] | None = None
        self.last_generation: Generation | None = None

    def fork(self) -> LLM:
        """A copy of this handle whose recording goes on separately (e.g. for ``n`` samples of one prompt)."""
        twin = copy.copy(self)
        twin._rec = self._rec.copy()
        twin._finish_reasons, twin._messages = list(self._finish_reasons), list(self._messages)
        return twin

    # -- recorded state ---------------------------------------------------------------------
    @property
    def input_ids(self) -> list[int]:
        """Every token of the episode so far: prompts, generations, env replies."""
        return list(self._rec.input_ids)

    @property
    def loss_mask(self) -> list[int]:
        return list(self._rec.loss_mask)

    @property
    def logprobs(self) -> list[float]:
        return list(self._rec.logprobs)

    @property
    def versions(self) -> list[int]:
        return list(self._rec.versions)

    @property
    def turn_spans(self) -> list[tuple[int, int]]:
        return list(self._rec.turn_spans)

    @property
    def state_keys(self) -> list[str]:
        """The state key of each turn, aligned with :attr:`turn_spans` (see :meth:`chat`)."""
        return list(self._rec.state_keys)

    @property
    def finish_reasons(self) -> list[str]:
        return list(self._finish_reasons)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation ``chat`` has seen, with the assistant replies it returned."""
        return [dict(m) for m in self._messages]

    @property
    def num_generated(self) -> int:
        return self._rec.num_generated

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        return list(memo(self._cache, ("text", text),
                         lambda: tuple(int(i) for i in self.tokenizer.encode(text, add_special_tokens=False))))

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        extra = {"tools": self._tools} if self._tools else {}

        def render() -> str:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                      **extra)
            if not isinstance(text, str):
                raise TypeError("tokenizer.apply_chat_template(tokenize=False) returned "
                                f"{type(text).__name__}, not str")
            return text

        try:
            key = json.dumps([messages, self._tools, generation_prompt], sort_keys=True)
        except (TypeError, ValueError):  # messages the cache cannot key (not JSON): render each time
            return render()
        return str(memo(self._cache, ("render", key), render))

    def _sampling(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in {**self.default_sampling, **overrides}.items() if v is not None}

    # -- token-level API ----------------------------------------------------------------------
    async def _record_generation(self, sampling: dict[str, Any], state_key: str) -> Generation:
        gen = await self._generate(list(self._rec.input_ids), self._sampling(sampling))
        n = len(gen.output_ids)
        if len(gen.logprobs) != n or len(gen.versions) != n:
            raise ValueError(f"backend returned {n} output ids but {len(gen.logprobs)} logprobs and "
                             f"{len(gen.versions)} versions")
        start = self._rec.num_tokens
        self._rec.append_tokens(gen.output_ids, generated=True, logprobs=gen.logprobs, versions=gen.versions)
        self._rec.turn_spans.append((start, start + n))
        self._rec.state_keys.append(state_key)
        self._finish_reasons.append(gen.finish_reason)
        self.last_generation = gen
        return gen

    async def generate(self, input_ids: list[int], *, state_key: str | None = None, **sampling: Any) -> Generation:
        """Complete ``input_ids`` and record the result (for token-level agents).

        ``input_ids`` must extend the tokens recorded so far (the first call may pass anything):
        the new tail is recorded as context (loss mask 0) and the output as generated tokens.
        ``state_key`` names the env state of this turn (default: :func:`tokens_key` of the new tail).
        """
        ids = [int(i) for i in input_ids]
        n = self._rec.num_tokens
        if ids[:n] != self._rec.input_ids:
            raise ValueError(f"llm.generate: input_ids must start with the {n} tokens recorded so far in this episode "
                             "(extend the sequence, or call llm.reset() to start a new episode)")
        self._rec.append_tokens(ids[n:], generated=False)
        self._turn_tail = ""  # the caller's ids hold whatever follows a chat turn
        return await self._record_generation(sampling, tokens_key(ids[n:]) if state_key is None else state_key)

    # -- chat API ---------------------------------------------------------------------------
    def _turn_end_text(self) -> str:
        """Text the chat template puts after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        if self._turn_end is None:
            probe = "Zq7ProbeQz"
            text = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": probe}], False)
            pos = text.rfind(probe)
            self._turn_end = text[pos + len(probe):] if pos >= 0 else ""
        return self._turn_end

    def _delta_text(self, new: list[dict[str, Any]]) -> str:
        """Rendered text of ``new`` messages appended to the recorded conversation (or, for
        templates that rewrite earlier turns, appended after a neutral stub)."""
        stub = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
        for before in (self._messages, stub):
            old, full = self._render(before, False), self._render(before + new, True)
            if full.startswith(old):
                return full[len(old):]
        raise ValueError("llm.chat: the tokenizer's chat template is not append-only (rendering more messages changes "
                         "the text of earlier ones), so new turns cannot be appended as tokens")

    def _close_turn(self, gen: Generation) -> None:
        """Keep the template's end-of-turn text after a generated turn, to be tokenized with
        the next message (as one rendering of the whole conversation is: ChatML's ``\\n`` and the
        next header can be one token).

        If the turn ended with an end-of-turn/EOS token whose text starts the template's
        turn end (``<|im_end|>`` for ChatML), only the rest (``\\n``) is kept; otherwise
        (cut by ``max_new_tokens``, a stop string, or another EOS) the whole turn end is.
        Either way it becomes context (loss mask 0) when the next message is appended: the
        model is never trained to emit an end-of-turn token it did not sample. An episode's
        last turn has no next message, so a trajectory ends where its last generation does.
        """
        end = self._turn_end_text()
        if gen.output_ids and gen.finish_reason == "stop":
            last = self.tokenizer.decode([gen.output_ids[-1]], skip_special_tokens=False)
            if last and end.startswith(last):
                end = end[len(last):]
        self._turn_tail = end

    async def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                   prefix: str = "", state_key: str | None = None, **sampling: Any) -> str:
        """Reply to ``messages`` (OpenAI-style dicts) and record the exact tokens.

        ``tools`` (OpenAI function specs) are passed to the chat template; they are fixed by
        the first call of an episode (a later call must pass the same ones or none).
        ``prefix`` starts the reply with fixed text (e.g. a tool call's opening, to force one):
        it is context (loss mask 0), the model continues it, and the returned text includes it.

        The first call renders the chat template with a generation prompt. Later calls must
        pass the previous conversation (including the assistant replies this method returned)
        plus new messages; only the rendered text of the new messages is tokenized and
        appended, never the earlier turns. Sampling keywords use SGLang names
        (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop``, ``stop_token_ids``).

        ``state_key`` names the env state this turn acts in (recorded in ``state_keys``; GiGPO
        compares the turns of a group with equal keys); default: :func:`observation_key` of
        ``messages``, so turns that respond to the same observation share a key.
        """
        messages = [dict(m) for m in messages]
        n = len(self._messages)
        if n == 0:
            if not messages:
                raise ValueError("llm.chat: messages is empty")
            self._tools = [dict(t) for t in tools] if tools else None
            text = self._render(messages, True)
        else:
            if len(messages) <= n or any(
                a.get("role") != b.get("role") or (a.get("role") != "assistant" and a.get("content") != b.get("content"))
                for a, b in zip(messages[:n], self._messages, strict=True)
            ) or (tools and tools != self._tools):
                raise ValueError(f"llm.chat: messages must repeat the {n} messages of this episode so far (with "
                                 "the replies chat returned) and add at least one new message; use a new LLM (or "
                                 "llm.reset()) per episode")
            text = self._turn_tail + self._delta_text(messages[n:])
        self._turn_tail = ""
        self._rec.append_tokens(self._encode(text), generated=False)
        self._messages += messages[n:]
        self._rec.append_tokens(self._encode(prefix), generated=False)
        gen = await self._record_generation(sampling, observation_key(messages) if state_key is None else state_key)
        text = prefix + self.tokenizer.decode(list(gen.output_ids), skip_special_tokens=True)
        self._close_turn(gen)
        self._messages.append({"role": "assistant", "content": text})
        return text

    # -- export -----------------------------------------------------------------------------
    def to_trajectory(self, **fields: Any) -> Trajectory:
        """The recorded tokens as a :class:`~areal_agents.types.Trajectory` (``fields`` override)."""
        traj = self._rec.copy()
        traj.finish_reason = self._finish_reasons[-1] if self._finish_reasons else "stop"
        cut = traj.turn_spans[0][0] if traj.turn_spans else traj.num_tokens
        traj.prompt_text = self.tokenizer.decode(traj.input_ids[:cut], skip_special_tokens=False)
        traj.completion_text = self.tokenizer.decode(traj.input_ids[cut:], skip_special_tokens=False)
        return replace(traj, **fields)


class ClientLLM(LLM):
    """An :class:`LLM` whose generations come from an :class:`~areal_agents.inference.client.InferenceClient`.

    ``rid`` identifies the episode (a fresh one is made when omitted), so every turn of
    the episode goes to the same server; ``default_sampling`` holds SGLang sampling
    params applied to every call unless overridden.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        client: InferenceClient,
        rid: str | None = None,
        default_sampling: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.rid = rid if rid is not None else uuid.uuid4().hex
        super().__init__(tokenizer, default_sampling)

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        return await self.client.generate(input_ids, sampling, rid=self.rid)
