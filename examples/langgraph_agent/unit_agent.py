"""A unit-conversion agent written with LangChain and LangGraph, trained unchanged.

A tool-calling graph built by hand: a model node (``langchain_openai.ChatOpenAI`` with the tool
bound) and a ``ToolNode``, looping until the model answers without a tool call. The only
project-specific lines point ``ChatOpenAI`` at the episode's endpoint (``await
client.http_endpoint()``, the episode key as the API key) and register it.

    areal-agents run --config examples/langgraph_agent/config.yaml
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from areal_agents import register_agent
from envs.unit_convert import convert as convert_units

INSTRUCTIONS = "Convert the quantity. Call the convert tool, then answer with the number only."


@tool
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


def build_graph(llm: ChatOpenAI) -> Any:
    """model -> (tools -> model)* -> end."""
    model = llm.bind_tools([convert])

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([convert], handle_tool_errors=True))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile()


def score(answer: str, expected: str) -> float:
    """1.0 when the answer's first word is the expected number (to 2 decimals)."""
    try:
        return float(abs(float(answer.strip().split()[0]) - float(expected)) < 0.005)
    except (ValueError, IndexError):
        return 0.0


@register_agent("langgraph-unit-convert")
async def langgraph_unit_convert(client: Any, row: dict[str, Any], max_model_calls: int = 3) -> float:
    """Run the graph on ``row["prompt"]`` through the episode's endpoint; the reward."""
    llm = ChatOpenAI(model="policy", base_url=await client.http_endpoint(), api_key=client.api_key, max_retries=0)
    graph = build_graph(llm)
    try:
        state = await graph.ainvoke({"messages": [SystemMessage(INSTRUCTIONS), HumanMessage(row["prompt"])]},
                                    {"recursion_limit": 2 * max_model_calls})
    except GraphRecursionError:  # still calling tools at the limit
        return 0.0
    return score(str(state["messages"][-1].content), str(row["answer"]))
