"""A unit-conversion agent written with the OpenAI Agents SDK (``openai-agents``), trained unchanged.

The agent is plain Agents SDK code: an ``Agent`` with a ``@function_tool`` and ``Runner.run``.
The only project-specific lines point its model at the episode's endpoint (``await
client.http_endpoint()``, the episode key as the API key) and register it. Two registrations,
one per model class of the SDK: ``sdk-unit-convert`` uses its default Responses model
(``POST /v1/responses``), ``sdk-unit-convert-chat`` its chat-completions model.

    areal-agents run --config examples/openai_agents_sdk/config.yaml
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from areal_agents import register_agent
from envs.unit_convert import convert as convert_units

set_tracing_disabled(True)  # traces would be sent to OpenAI's service

INSTRUCTIONS = "Convert the quantity. Call the convert tool, then answer with the number only."


@function_tool
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a quantity between units (m, km, ft, mi, kg, g, lb, oz).

    Args:
        value: The quantity.
        from_unit: The unit symbol it is in.
        to_unit: The unit symbol to express it in.
    """
    try:
        return convert_units(value, from_unit, to_unit)
    except ValueError as exc:
        return f"error: {exc}"


def score(answer: str, expected: str) -> float:
    """1.0 when the answer's first word is the expected number (to 2 decimals)."""
    try:
        return float(abs(float(answer.strip().split()[0]) - float(expected)) < 0.005)
    except (ValueError, IndexError):
        return 0.0


async def solve(client: Any, row: dict[str, Any], *, responses_api: bool, max_turns: int = 3) -> float:
    """Run the agent on ``row["prompt"]`` through the episode's endpoint; the reward."""
    openai_client = AsyncOpenAI(base_url=await client.http_endpoint(), api_key=client.api_key, max_retries=0)
    model_cls = OpenAIResponsesModel if responses_api else OpenAIChatCompletionsModel
    agent = Agent(name="converter", instructions=INSTRUCTIONS, tools=[convert],
                  model=model_cls(model="policy", openai_client=openai_client))
    try:
        result = await Runner.run(agent, row["prompt"], max_turns=max_turns)
    except (MaxTurnsExceeded, ModelBehaviorError):  # still calling tools at the turn limit / a malformed call
        return 0.0
    finally:
        await openai_client.close()
    return score(str(result.final_output), str(row["answer"]))


@register_agent("sdk-unit-convert")
async def sdk_unit_convert(client: Any, row: dict[str, Any]) -> float:
    """The Agents SDK's default model class (the Responses API)."""
    return await solve(client, row, responses_api=True)


@register_agent("sdk-unit-convert-chat")
async def sdk_unit_convert_chat(client: Any, row: dict[str, Any]) -> float:
    """The Agents SDK's chat-completions model class."""
    return await solve(client, row, responses_api=False)
