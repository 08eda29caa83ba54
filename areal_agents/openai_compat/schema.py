"""Checking an OpenAI chat-completions request (no torch).

:func:`parse_request` turns a request body into a :class:`ChatRequest` or raises
:class:`APIError` with a 4xx status and OpenAI's error fields (``message``, ``type``,
``param``, ``code``), which :meth:`APIError.body` shapes as ``{"error": {...}}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["APIError", "ChatRequest", "normalize_message", "parse_request", "sampling_params"]

_ROLES = ("system", "developer", "user", "assistant", "tool")
# Fields a request may carry that change nothing here (metadata, hints for OpenAI's service).
_IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prediction", "reasoning_effort",
            "modalities", "audio", "web_search_options", "prompt_cache_key", "safety_identifier", "verbosity"}
_KNOWN = {"model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens",
          "stop", "n", "seed", "logprobs", "top_logprobs", "stream", "stream_options", "frequency_penalty",
          "presence_penalty", "logit_bias", "response_format", "functions", "function_call", *_IGNORED}
MAX_N = 64
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """A request refused with ``status`` (4xx) and OpenAI's error fields."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:  # noqa: A002 - OpenAI's name
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> APIError:
    return APIError(f"{param}: {message}", param=param)


@dataclass
class ChatRequest:
    """A checked request; ``max_tokens`` is None when the caller gave no limit."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False

    @property
    def parse_tools(self) -> bool:
        """Whether replies are parsed for tool calls (tools given and ``tool_choice`` not ``none``)."""
        return bool(self.tools) and self.tool_choice != "none"


def _text(content: object, param: str) -> str:
    """A message's content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"{param}[{i}]", "only text content parts are supported ({'type': 'text', 'text': ...})")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(param, "must be a string or a list of text parts")


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _bad(param, "must be a list")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
            raise _bad(f"{param}[{i}]", "needs function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        out.append({"id": str(call.get("id") or f"call_{i}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def normalize_message(msg: Any, i: int) -> dict[str, Any]:
    """One message as the chat template gets it: role, text content, tool calls / tool call id."""
    param = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _bad(param, "must be an object")
    role = msg.get("role")
    if role not in _ROLES:
        raise _bad(f"{param}.role", f"must be one of {', '.join(_ROLES)} (got {role!r})")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _text(msg.get("content"), f"{param}.content")}
    if role == "assistant" and msg.get("tool_calls"):
        out["tool_calls"] = _tool_calls(msg["tool_calls"], f"{param}.tool_calls")
    elif role != "assistant" and msg.get("content") is None:
        raise _bad(f"{param}.content", "is required")
    if role == "tool":
        tcid = msg.get("tool_call_id")
        if not isinstance(tcid, str):
            raise _bad(f"{param}.tool_call_id", "is required for role 'tool'")
        out["tool_call_id"] = tcid
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and fn["name"]):
            raise _bad(f"tools[{i}]", "must be {'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise _bad(f"tools[{i}].function.parameters", "must be a JSON schema object")
    return [{"type": "function", "function": dict(t["function"])} for t in tools] or None


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(key, f"must be a number in [{lo}, {hi}] (got {v!r})")
    return float(v)


def _integer(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise _bad(key, f"must be an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "") + f" (got {v!r})")
    return v


def _flag(body: dict[str, Any], key: str) -> bool:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise _bad(key, f"must be true or false (got {v!r})")
    return bool(v)


def _neutral(body: dict[str, Any], key: str, neutral: Any) -> None:
    v = body.get(key)
    if v is not None and v != neutral and v != {}:
        raise _bad(key, f"is not supported (only {json.dumps(neutral)} or null)")


def parse_request(body: object) -> ChatRequest:
    """Check a ``/v1/chat/completions`` body; :class:`APIError` (400) names the first bad field."""
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _bad(unknown[0], "unknown parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "is required (a string)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    for key in ("frequency_penalty", "presence_penalty"):
        _neutral(body, key, 0)
    for key in ("logit_bias", "functions", "function_call"):
        _neutral(body, key, None)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _bad("response_format", "only {'type': 'text'} is supported")
    tool_choice = "auto" if body.get("tool_choice") is None else body["tool_choice"]
    if not (tool_choice in ("auto", "none", "required") or isinstance(tool_choice, dict)
            and isinstance(tool_choice.get("function"), dict)):
        raise _bad("tool_choice", "must be auto, none, required or {'type': 'function', 'function': {'name': ...}}")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else ([] if stop is None else stop)
    if not (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop)):
        raise _bad("stop", "must be a string or a list of up to 4 non-empty strings")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    max_tokens = _integer(body, "max_tokens", 1) if max_tokens is None else max_tokens
    logprobs = _flag(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise _bad("top_logprobs", "needs logprobs: true")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", "must be an object")
    include_usage = bool((options or {}).get("include_usage"))
    if options and not stream:
        raise _bad("stream_options", "is only allowed with stream: true")
    return ChatRequest(
        model=model, messages=[normalize_message(m, i) for i, m in enumerate(messages)],
        tools=_tools(body.get("tools")), tool_choice=tool_choice,
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0),
        max_tokens=max_tokens, stop=stop, n=_integer(body, "n", 1, MAX_N) or 1, seed=_integer(body, "seed", -2**63),
        logprobs=logprobs, top_logprobs=top, stream=stream, include_usage=include_usage,
    )


def sampling_params(req: ChatRequest, defaults: dict[str, Any]) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``req``: its values over the run's ``defaults``.

    ``top_p`` of 0 means greedy; ``seed`` becomes ``sampling_seed`` (mapped into [0, 2^63)),
    which the session offsets by the choice's index so that ``n`` choices differ.
    """
    out = dict(defaults)
    if req.temperature is not None:
        out["temperature"] = req.temperature
    if req.top_p is not None:
        if req.top_p <= 0.0:
            out["temperature"] = 0.0
        else:
            out["top_p"] = req.top_p
    if req.max_tokens is not None:
        out["max_new_tokens"] = req.max_tokens
    if req.stop:
        out["stop"] = list(req.stop)
    if req.seed is not None:
        out["sampling_seed"] = req.seed % 2**63
    return out
