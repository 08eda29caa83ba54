"""The OpenAI Responses API (``POST /v1/responses``) as chat completions (pure functions; no torch).

:func:`to_chat` turns a Responses request into a chat-completions body: ``instructions`` become a
system message; ``input`` is a string (one user message) or a list of items — messages (text
parts), ``function_call`` items (the assistant's tool calls, joined to the assistant message
before them) and ``function_call_output`` items (tool messages); ``reasoning`` items are
dropped. ``tools`` are function tools in the Responses shape (``{"type": "function", "name",
"parameters"}``). ``previous_response_id`` is not kept: send the whole conversation as
``input``. :func:`reply` shapes the ``chat.completion`` as a ``response`` object (a ``message``
item and ``function_call`` items), :func:`events` as the stream's events, :func:`error_body` an
error as OpenAI sends it.
"""

from __future__ import annotations

import time
from typing import Any

from areal_agents.openai_compat.routes import API, Event, joined_text
from areal_agents.openai_compat.routes import bad as _bad
from areal_agents.openai_compat.schema import APIError
from areal_agents.runtime.ids import new_id

__all__ = ["RESPONSES", "error_body", "events", "reply", "to_chat"]

# Fields that change nothing here (hints for OpenAI's service, storage, metadata).
_IGNORED = {"store", "metadata", "user", "parallel_tool_calls", "service_tier", "prompt_cache_key",
            "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "reasoning", "max_tool_calls",
            "context_management"}
_COPIED = {"model": "model", "temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens",
           "top_logprobs": "top_logprobs", "stream": "stream"}
_KNOWN = {*_IGNORED, *_COPIED, "input", "instructions", "tools", "tool_choice", "include", "text", "truncation",
          "previous_response_id", "background", "conversation", "prompt"}
_LOGPROBS = "message.output_text.logprobs"


_TEXT = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def _text(content: object, param: str) -> str:
    """Text content: a string or a list of ``input_text`` / ``output_text`` / ``text`` / ``refusal`` parts."""
    return joined_text(content, param, _TEXT)


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise _bad(f"{param}.{key}", "is required (a string)")
    return value


def _item(messages: list[dict[str, Any]], item: Any, param: str) -> None:
    """Append the chat message(s) of one input item to ``messages``."""
    if not isinstance(item, dict):
        raise _bad(param, "must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise _bad(f"{param}.role", f"must be user, system, developer or assistant (got {role!r})")
        messages.append({"role": role, "content": _text(item.get("content"), f"{param}.content")})
    elif kind == "function_call":
        call = {"id": _string(item, "call_id", param), "type": "function",
                "function": {"name": _string(item, "name", param), "arguments": _string(item, "arguments", param)}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)  # the calls of one reply follow its text
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", param),
                         "content": _text(output, f"{param}.output")})
    elif kind != "reasoning":
        raise _bad(f"{param}.type", f"{kind!r} items are not supported (message, function_call, "
                                    "function_call_output)")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str)):
            raise _bad(f"tools[{i}]", "only function tools are supported ({'type': 'function', 'name': ..., "
                                      "'parameters': {...}})")
        fn = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice", "must be auto, none, required or {'type': 'function', 'name': ...}")


def _check(body: dict[str, Any]) -> None:
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _bad(unknown[0], "unknown parameter")
    for key in ("previous_response_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise _bad(key, "is not supported: send the whole conversation as input")
    if body.get("background"):
        raise _bad("background", "is not supported")
    if body.get("truncation") not in (None, "disabled"):
        raise _bad("truncation", "only 'disabled' is supported")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if body.get("text") is not None and not isinstance(body["text"], dict) or fmt not in (None, {"type": "text"}):
        raise _bad("text", "only {'format': {'type': 'text'}} is supported")
    include = body.get("include") or []
    if not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise _bad("include", "must be a list of strings")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body of a Responses request (see the module docstring)."""
    _check(body)
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise _bad("instructions", "must be a string")
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        for i, item in enumerate(items):
            _item(messages, item, f"input[{i}]")
    else:
        raise _bad("input", "must be a string or a non-empty list of items")
    chat = {target: body[key] for key, target in _COPIED.items() if body.get(key) is not None}
    chat["messages"] = messages
    if _LOGPROBS in (body.get("include") or []) or body.get("top_logprobs"):
        chat["logprobs"] = True
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
    elif body.get("tool_choice") not in (None, "auto", "none"):
        raise _bad("tool_choice", "needs tools")
    if chat.get("stream"):  # the whole reply is built, then sent as events
        chat["stream"] = False
    return chat


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                              for t in e.get("top_logprobs") or []]} for e in content]


def reply(body: dict[str, Any], completion: dict[str, Any], raw: str = "") -> dict[str, Any]:
    """The ``response`` object of a finished ``chat.completion`` (its first choice)."""
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content") or not message.get("tool_calls"):
        output.append({"type": "message", "id": new_id("msg_"), "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": message.get("content") or "", "annotations": [],
                                    "logprobs": _logprobs(choice)}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": new_id("fc_"), "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    usage = completion["usage"]
    length = choice["finish_reason"] == "length"
    return {
        "id": "resp_" + completion["id"].removeprefix("chatcmpl-"), "object": "response",
        "created_at": completion["created"], "status": "incomplete" if length else "completed",
        "completed_at": int(time.time()), "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "model": completion["model"], "instructions": body.get("instructions"), "output": output,
        "parallel_tool_calls": True, "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None,
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": body.get("metadata") or {},
        "usage": {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage["total_tokens"]},
    }


def _item_events(index: int, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    ref = {"output_index": index, "item_id": item["id"]}
    out: list[tuple[str, dict[str, Any]]] = [
        ("response.output_item.added", {"output_index": index, "item": {**item, "status": "in_progress"}})]
    if item["type"] == "message":
        part = item["content"][0]
        out += [("response.content_part.added", {**ref, "content_index": 0, "part": {**part, "text": ""}}),
                ("response.output_text.delta", {**ref, "content_index": 0, "delta": part["text"],
                                                "logprobs": part["logprobs"]}),
                ("response.output_text.done", {**ref, "content_index": 0, "text": part["text"],
                                               "logprobs": part["logprobs"]}),
                ("response.content_part.done", {**ref, "content_index": 0, "part": part})]
    else:
        out += [("response.function_call_arguments.delta", {**ref, "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {**ref, "name": item["name"],
                                                           "arguments": item["arguments"]})]
    out.append(("response.output_item.done", {"output_index": index, "item": item}))
    return out


def events(response: dict[str, Any]) -> list[Event]:
    """The server-sent events of a stream that ends with ``response`` (numbered in order)."""
    start = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None,
             "completed_at": None}
    out = [("response.created", {"response": start}), ("response.in_progress", {"response": start})]
    for i, item in enumerate(response["output"]):
        out += _item_events(i, item)
    last = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    out.append((last, {"response": response}))
    return [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(out)]


def error_body(err: APIError) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, as OpenAI sends it."""
    return err.body()


RESPONSES = API("responses", to_chat, reply, events, error_body,
                renamed={"max_tokens": "max_output_tokens", "messages": "input"})
