"""Tool calls in replies: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (no torch).

The format of Qwen2.5/Hermes chat templates (and of the tiny default model's). A reply whose
tool-call markup does not parse stays plain content: :func:`parse_tool_calls` never raises.
"""

from __future__ import annotations

import json
import re
from typing import Any

from areal_agents.runtime.ids import new_id

__all__ = ["parse_tool_calls"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _call(blob: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(blob.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"id": new_id("call_"), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, names: set[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a reply.

    Every ``<tool_call>...</tool_call>`` block must hold a JSON object with a ``name`` (one of
    ``names`` when given) and object ``arguments``; the text before the first block is the
    content (None when empty). If any block is malformed, or a ``<tool_call>`` is left open,
    the whole reply is plain content and there are no tool calls.
    """
    if "<tool_call>" not in text:
        return text, []
    calls = []
    for match in _CALL.finditer(text):
        call = _call(match.group(1))
        if call is None or (names is not None and call["function"]["name"] not in names):
            return text, []
        calls.append(call)
    rest = _CALL.sub("", text)
    if not calls or "<tool_call>" in rest or rest[text.index("<tool_call>"):].strip():
        return text, []
    content = text[: text.index("<tool_call>")].strip()
    return content or None, calls
