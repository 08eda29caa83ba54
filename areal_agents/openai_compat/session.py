"""One episode's chat completions: render, generate token ids, parse, record (no torch).

A :class:`ChatSession` answers OpenAI chat-completions requests over a token-level
``generate`` function (the inference client's ``/generate``). It keeps every conversation it
has answered as token ids (a *tip*: the prompt, the sampled tokens and the template's
end-of-turn). A request that repeats a tip's messages, with the reply it was given, and adds
new ones is answered by appending only the new messages' tokens to that tip, exactly as
``llm.chat`` extends an episode, so the sampled tokens are never re-tokenised; any other
request is rendered afresh with the chat template. Every completion is recorded as a
:class:`CallRecord`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from areal_agents.llm import LLM, Generation, Tokenizer, memo, tokenizer_cache
from areal_agents.llm.reference import assistant_text
from areal_agents.openai_compat.schema import APIError, ChatRequest, sampling_params
from areal_agents.runtime.ids import new_id
from areal_agents.tools.calls import parse_tool_calls

__all__ = ["CallRecord", "ChatSession", "GenerateFn", "completion_chunks"]

GenerateFn = Callable[[list[int], dict[str, Any], int], Awaitable[Generation]]
"""``await generate(input_ids, sampling_params, top_logprobs) -> Generation``."""

_MAX_TIPS = 256
_PROBE = '{"zq7probe": 1}'  # arguments no template writes by itself


@dataclass
class CallRecord:
    """One completion as sampled: the exact prompt and output tokens, behaviour logprobs,
    the weight version of each output token and the server's finish reason
    (``stop``/``length``/``abort``); ``index`` orders the episode's completions; ``state_key``
    is the default key of the observation it answered (:func:`~areal_agents.llm.observation_key`)."""

    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    request_id: str = ""
    state_key: str = ""


class _ChainLLM(LLM):
    """The token bookkeeping of one conversation; generation goes to the session."""

    def __init__(self, tokenizer: Tokenizer, generate: GenerateFn) -> None:
        self._gen_fn = generate
        self.top_logprobs = 0
        super().__init__(tokenizer)

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        return await self._gen_fn(input_ids, sampling, self.top_logprobs)


@dataclass
class _Tip:
    llm: LLM
    messages: list[dict[str, Any]]  # the request's messages and the reply it got
    tools: list[dict[str, Any]] | None = None


def _same_call(a: dict[str, Any], b: dict[str, Any]) -> bool:
    fa, fb = a.get("function", {}), b.get("function", {})
    if fa.get("name") != fb.get("name"):
        return False
    try:
        return bool(json.loads(fa.get("arguments") or "{}") == json.loads(fb.get("arguments") or "{}"))
    except ValueError:
        return False


def _same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether ``a`` (sent by the caller) repeats ``b`` (seen or replied before)."""
    if a["role"] != b["role"] or (a.get("content") or "") != (b.get("content") or ""):
        return False
    if a["role"] == "tool":
        return bool(a.get("tool_call_id") == b.get("tool_call_id"))
    ca, cb = a.get("tool_calls") or [], b.get("tool_calls") or []
    return len(ca) == len(cb) and all(map(_same_call, ca, cb))


class ChatSession:
    """Chat completions bound to one episode (see the module docstring).

    ``generate`` produces the tokens; ``defaults`` are the SGLang sampling params a request
    does not override (the run's ``sampling.*``); ``records`` lists every completion.
    """

    def __init__(self, tokenizer: Tokenizer, generate: GenerateFn, defaults: dict[str, Any] | None = None,
                 *, remember: bool = True) -> None:
        self.tokenizer = tokenizer
        self.generate = generate
        self.defaults = dict(defaults or {})
        self.remember = remember
        self.records: list[CallRecord] = []
        self.last_text = ""  # the text of the last reply (its first choice), tool-call markup included
        self._tips: list[_Tip] = []

    # ------------------------------------------------------------------ conversations
    def _find_tip(self, req: ChatRequest) -> _Tip | None:
        best: _Tip | None = None
        for tip in self._tips:
            k = len(tip.messages)
            if (len(req.messages) > k and tip.tools == req.tools and (best is None or k > len(best.messages))
                    and all(map(_same_message, req.messages[:k], tip.messages))):
                best = tip
        return best

    def _conversations(self, req: ChatRequest) -> tuple[list[LLM], list[dict[str, Any]]]:
        """The conversations the ``n`` choices of ``req`` are generated on, and the messages their
        ``chat`` gets: copies of the tip ``req`` extends (the tip's own records of the earlier
        turns, its assistant text with markup, then the new messages), or fresh ones."""
        tip = self._find_tip(req)
        forks: list[LLM]
        if tip is None:
            base: LLM = _ChainLLM(self.tokenizer, self.generate)
            forks, messages = [base] if req.n == 1 else [base.fork() for _ in range(req.n)], req.messages
        else:
            forks = [tip.llm.fork() for _ in range(req.n)]
            messages = tip.llm.messages + req.messages[len(tip.messages):]
        for fork in forks:
            if isinstance(fork, _ChainLLM):
                fork.top_logprobs = req.top_logprobs
        return forks, messages

    def _forced_prefix(self, req: ChatRequest) -> str:
        """The opening ``tool_choice`` forces on a reply, as this chat template writes a call:
        up to ``<tool_call>`` for ``required``, up to the arguments of the named function for
        ``{"type": "function", ...}``; "" for ``auto`` and ``none``."""
        choice = req.tool_choice
        if choice in ("auto", "none"):
            return ""
        if not req.tools:
            raise APIError("tool_choice: only allowed when tools are given", param="tool_choice")
        name = choice["function"].get("name") if isinstance(choice, dict) else req.tools[0]["function"]["name"]
        if name not in {t["function"]["name"] for t in req.tools}:
            raise APIError(f"tool_choice: function {name!r} is not one of the tools", param="tool_choice")
        tools = req.tools

        def render() -> str:  # the template's text of a call to ``name``, arguments _PROBE ("" if none)
            call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": _PROBE}}
            try:
                return assistant_text(self.tokenizer, [{"role": "user", "content": "x"}],
                                      {"role": "assistant", "content": "", "tool_calls": [call]}, tools)
            except ValueError:
                return ""

        text = memo(tokenizer_cache(self.tokenizer), ("forced_call", json.dumps([tools, name], sort_keys=True)), render)
        if "<tool_call>" not in text or _PROBE not in text:
            raise APIError("tool_choice: this model's chat template has no <tool_call> format to force a call with",
                           param="tool_choice")
        if choice == "required":
            return text[: text.index("<tool_call>") + len("<tool_call>")]
        return text[: text.index(_PROBE)]

    async def create(self, req: ChatRequest) -> dict[str, Any]:
        """Answer ``req``: a ``chat.completion`` object (as a dict); records each choice.

        ``tool_choice`` ``required`` or a named function starts every reply with the opening of a
        call (context, not sampled: see :meth:`_forced_prefix`), so the model writes a call."""
        prefix = self._forced_prefix(req)
        forks, messages = self._conversations(req)
        sampling = sampling_params(req, self.defaults)
        try:
            if len(forks) == 1:
                texts = [await forks[0].chat(messages, tools=req.tools, prefix=prefix, **sampling)]
            else:
                texts = await _sample_each(forks, messages, req.tools, prefix, sampling)
        except Exception as exc:
            if isinstance(exc, ValueError) or type(exc).__module__.startswith("jinja2"):
                # the chat template cannot render these messages (e.g. roles it does not know)
                raise APIError(f"messages: the chat template cannot render them: {exc}", param="messages") from None
            raise
        request_id = new_id("chatcmpl-")
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        names = {t["function"]["name"] for t in req.tools} if req.parse_tools and req.tools else set()
        for i, (fork, text) in enumerate(zip(forks, texts, strict=True)):
            gen = fork.last_generation
            assert gen is not None
            start, end = fork.turn_spans[-1]
            text = _cut_stop(text, req.stop)
            if i == 0:
                self.last_text = text
            content, calls = parse_tool_calls(text, names) if req.parse_tools else (text, [])
            finish = "length" if gen.finish_reason == "length" else "tool_calls" if calls else "stop"
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": i, "message": message, "finish_reason": finish,
                            "logprobs": self._logprobs(gen) if req.logprobs else None})
            prompt_tokens = start
            completion_tokens += end - start
            self.records.append(CallRecord(
                index=len(self.records), prompt_ids=fork.input_ids[:start], completion_ids=list(gen.output_ids),
                logprobs=list(gen.logprobs), versions=list(gen.versions), finish_reason=gen.finish_reason,
                request_id=request_id, state_key=fork.state_keys[-1]))
            if self.remember:
                reply = {"role": "assistant", "content": content or "", "tool_calls": calls}
                self._tips.append(_Tip(fork, [*req.messages, reply], req.tools))
                del self._tips[:-_MAX_TIPS]
        return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": req.model,
                "system_fingerprint": None, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}

    def _logprobs(self, gen: Generation) -> dict[str, Any]:
        tops = gen.info.get("top_logprobs") or [None] * len(gen.output_ids)
        content = []
        for tid, lp, top in zip(gen.output_ids, gen.logprobs, tops, strict=True):
            entry = self._token(tid, lp)
            entry["top_logprobs"] = [self._token(int(row[1]), row[0]) for row in top or [] if row[0] is not None]
            content.append(entry)
        return {"content": content, "refusal": None}


async def _sample_each(forks: list[LLM], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       prefix: str, sampling: dict[str, Any]) -> list[str]:
    """The replies of the ``n`` conversations ``forks``, generated concurrently (choice ``i`` with
    its own seed). A function of its own: the closure it needs would otherwise hold every request's
    locals in cells for as long as the request runs."""
    return list(await asyncio.gather(*(f.chat(messages, tools=tools, prefix=prefix, **_choice_seed(sampling, i))
                                       for i, f in enumerate(forks))))


def _choice_seed(sampling: dict[str, Any], index: int) -> dict[str, Any]:
    """The sampling params of choice ``index``: a seeded request's seed offset by it (choices differ)."""
    seed = sampling.get("sampling_seed")
    return sampling if seed is None else {**sampling, "sampling_seed": (seed + index) % 2**63}


def _cut_stop(text: str, stop: list[str]) -> str:
    """``text`` up to the first stop string (OpenAI replies leave the stop sequence out)."""
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def completion_chunks(completion: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """A finished ``chat.completion`` as the ``chat.completion.chunk`` objects of a stream.

    Per choice: the role, then the content (with its logprobs), then the tool calls, then the finish reason; with ``include_usage`` a last chunk with no
    choices carries the usage (and every earlier chunk ``usage: null``).
    """
    head = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    chunks: list[dict[str, Any]] = []

    def emit(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> None:
        chunk = {**head, "object": "chat.completion.chunk",
                 "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        if include_usage:
            chunk["usage"] = None
        chunks.append(chunk)

    for choice in completion["choices"]:
        i, msg, lps = choice["index"], choice["message"], choice.get("logprobs")
        emit(i, {"role": "assistant", "content": ""})
        content = msg.get("content") or ""
        if content or lps is not None:
            emit(i, {"content": content}, logprobs=lps)
        for j, call in enumerate(msg.get("tool_calls") or []):
            emit(i, {"tool_calls": [{"index": j, **call}]})
        emit(i, {}, finish=choice["finish_reason"])
    if include_usage:
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]})
    return chunks
