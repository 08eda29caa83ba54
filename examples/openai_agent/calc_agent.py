"""An agent written only against the OpenAI client, with a calculator tool, trained unchanged.

Nothing here is specific to areal-agents except the registration: ``client`` is what
``openai.AsyncOpenAI()`` would be, so the same function runs against any OpenAI-compatible
server. Train it with ``areal-agents run --config examples/openai_agent/config.yaml``.
"""

from __future__ import annotations

import json
from typing import Any

from areal_agents import register_agent

CALCULATOR = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def run_tool(name: str, arguments: str) -> str:
    """The tool's result as text (an error message for a bad call: the model reads it)."""
    try:
        args = json.loads(arguments)
        if name == "add":
            return str(int(args["a"]) + int(args["b"]))
        return f"error: unknown tool {name}"
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


@register_agent("openai-calc")
async def calc_agent(client: Any, row: dict[str, Any], max_tool_calls: int = 1) -> float:
    """Answer ``row["prompt"]``, calling the calculator when the model asks for it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(max_tool_calls + 1):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        if not message.tool_calls:
            return float((message.content or "").strip() == str(row["answer"]))
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    return 0.0  # still calling tools when the budget ran out
