"""Anthropic's Messages API (``POST /v1/messages``) as chat completions (pure functions; no torch).

:func:`to_chat` turns a Messages request into a chat-completions body: ``system`` (a string or
text blocks) becomes a system message; a message's ``content`` is a string or a list of blocks —
``text``, ``tool_use`` (the assistant's tool calls, ``input`` an object) and ``tool_result``
(in a user message: one tool message each, before the message's text); ``thinking`` blocks are
dropped. ``tools`` are ``{"name", "description", "input_schema"}``; ``tool_choice`` is
``auto``/``any``/``none``/``{"type": "tool", "name"}``; ``max_tokens`` is required;
``stop_sequences`` stop a reply (named in ``stop_sequence``). :func:`reply` shapes the
``chat.completion`` as a ``message`` object, :func:`events` as the stream's events,
:func:`error_body` an error as Anthropic sends it (``{"type": "error", "error": {"type", "message"}}``).
"""

from __future__ import annotations

import json
from typing import Any

from areal_agents.openai_compat.routes import API, Event, joined_text
from areal_agents.openai_compat.routes import bad as _bad
from areal_agents.openai_compat.schema import APIError

__all__ = ["MESSAGES", "error_body", "events", "reply", "to_chat"]

# Fields that change nothing here (metadata, hints for Anthropic's service).
_IGNORED = {"metadata", "service_tier", "cache_control", "diagnostics", "inference_geo", "speed", "user_profile_id",
            "workspace_id"}
_KNOWN = {*_IGNORED, "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
          "tools", "tool_choice", "stream", "thinking", "container", "mcp_servers", "output_config"}
_COPIED = {"model": "model", "max_tokens": "max_tokens", "stop_sequences": "stop", "temperature": "temperature",
           "top_p": "top_p", "stream": "stream"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


_TEXT = {"text": "text"}


def _text_blocks(content: object, param: str) -> str:
    """A string, or the text of a list of ``text`` blocks."""
    return joined_text(content, param, _TEXT)


def _tool_use(block: dict[str, Any], param: str) -> dict[str, Any]:
    if not (isinstance(block.get("id"), str) and block["id"] and isinstance(block.get("name"), str) and block["name"]):
        raise _bad(param, "a tool_use block needs an id and a name")
    args = block.get("input", {})
    if not isinstance(args, dict):
        raise _bad(f"{param}.input", "must be an object")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _message(msg: Any, param: str) -> list[dict[str, Any]]:
    """The chat messages of one Messages-API message."""
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
        raise _bad(f"{param}.role", "must be user or assistant")
    role, content = msg["role"], msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad(f"{param}.content", "must be a string or a list of content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        where = f"{param}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, where))
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise _bad(f"{where}.tool_use_id", "is required")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _text_blocks(block.get("content", ""), f"{where}.content")})
        elif kind not in ("thinking", "redacted_thinking"):
            raise _bad(where, f"{kind!r} blocks are not supported here (text, tool_use in assistant messages, "
                              "tool_result in user messages)")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            out["tool_calls"] = calls
        return [out]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not (isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool["name"]
                and isinstance(tool.get("input_schema"), dict) and tool.get("type", "custom") == "custom"):
            raise _bad(f"tools[{i}]", "must be {'name': ..., 'input_schema': {...}} (client tools only)")
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice", "must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body of a Messages request (see the module docstring)."""
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _bad(unknown[0], "unknown parameter")
    if body.get("max_tokens") is None:
        raise _bad("max_tokens", "is required")
    for key in ("top_k", "container", "mcp_servers"):
        if body.get(key) is not None:
            raise _bad(key, "is not supported")
    config = body.get("output_config")
    if config is not None and not (isinstance(config, dict) and config.get("format") is None):
        raise _bad("output_config", "is not supported with a format (structured outputs)")
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise _bad("thinking", "is not supported (only {'type': 'disabled'})")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise _bad("messages", "must be a non-empty list")
    for i, msg in enumerate(body["messages"]):
        messages += _message(msg, f"messages[{i}]")
    chat = {target: body[key] for key, target in _COPIED.items() if body.get(key) is not None}
    chat["messages"] = messages
    chat["stream"] = False  # the whole reply is built, then sent as events
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if not tools and chat["tool_choice"] not in ("auto", "none"):
            raise _bad("tool_choice", "needs tools")
        if not tools:
            del chat["tool_choice"]
    return chat


def _stop(choice: dict[str, Any], stops: list[str], raw: str) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a choice; ``raw`` is its text with any stop string."""
    if choice["finish_reason"] == "length":
        return "max_tokens", None
    if choice["finish_reason"] == "tool_calls":
        return "tool_use", None
    hits = [(raw.find(s), s) for s in stops if s in raw]
    return ("stop_sequence", min(hits)[1]) if hits else ("end_turn", None)


def reply(body: dict[str, Any], completion: dict[str, Any], raw: str = "") -> dict[str, Any]:
    """The ``message`` object of a finished ``chat.completion`` (its first choice)."""
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content") or not message.get("tool_calls"):
        content.append({"type": "text", "text": message.get("content") or ""})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"])})
    stop_reason, stop_sequence = _stop(choice, list(body.get("stop_sequences") or []), raw)
    usage = completion["usage"]
    return {"id": "msg_" + completion["id"].removeprefix("chatcmpl-"), "type": "message", "role": "assistant",
            "model": completion["model"], "content": content, "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def events(message: dict[str, Any]) -> list[Event]:
    """The server-sent events of a stream that ends with ``message``."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**message["usage"], "output_tokens": 0}}
    out: list[Event] = [("message_start", {"message": start})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            out += [("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}),
                    ("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}})]
        else:
            out += [("content_block_start", {"index": i, "content_block": {**block, "input": {}}}),
                    ("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                   "partial_json": json.dumps(block["input"])}})]
        out.append(("content_block_stop", {"index": i}))
    out += [("message_delta", {"delta": {"stop_reason": message["stop_reason"],
                                         "stop_sequence": message["stop_sequence"]},
                               "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
            ("message_stop", {})]
    return [(name, {"type": name, **data}) for name, data in out]


def error_body(err: APIError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``, as Anthropic sends it."""
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


MESSAGES = API("messages", to_chat, reply, events, error_body,
               renamed={"stop": "stop_sequences", "n": "n"})
