"""``POST /v1/responses`` and ``POST /v1/messages`` on a real loopback endpoint, driven by the
official ``openai`` and ``anthropic`` clients: replies, tool calls and their results, streaming,
each API's error shape, and the recording (a tool round trip extends one trajectory). The
replies come from a script (``ScriptedLLM``) so that tool calls are certain; the token-exact
recording on a real model is in ``test_openai_apis_model.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.responses import Response
from openai_support import corpus, load_tokenizer

from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.openai_compat.http import Endpoint
from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ADD = {"name": "add", "description": "Add two numbers.",
       "schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}
RESPONSES_TOOL = {"type": "function", "name": ADD["name"], "description": ADD["description"],
                  "parameters": ADD["schema"]}
ANTHROPIC_TOOL = {"name": ADD["name"], "description": ADD["description"], "input_schema": ADD["schema"]}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Callable[..., Path]) -> Any:
    return load_tokenizer(tiny_model(corpus(), seed=0))


def serve(tokenizer: Any, replies: list[str]) -> tuple[ChatSession, Endpoint]:
    backend = ScriptedLLM(replies, tokenizer)

    async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Any:
        return await backend._generate(ids, sampling)

    session = ChatSession(tokenizer, generate, {"max_new_tokens": 64})
    endpoint = Endpoint()
    endpoint.add(session, key="k1")
    return session, endpoint


def test_responses_tool_round_trip_extends_one_trajectory(tokenizer: Any) -> None:
    session, endpoint = serve(tokenizer, [CALL, "The answer is 5.", "Five."])

    async def main() -> tuple[Any, Any, list[Any]]:
        base = await endpoint.start()
        try:
            async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k1", max_retries=0) as client:
                first = await client.responses.create(model="policy", input="What is 2 + 3?",
                                                      instructions="Be brief.", tools=[RESPONSES_TOOL])
                [call] = [item for item in first.output if item.type == "function_call"]
                history = [{"role": "user", "content": "What is 2 + 3?"},
                           *[item.model_dump(exclude_none=True) for item in first.output],
                           {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
                second = await client.responses.create(model="policy", input=history, instructions="Be brief.",
                                                       tools=[RESPONSES_TOOL])
                stream = await client.responses.create(model="policy", input="Again?", stream=True)
                events = [e async for e in stream]
        finally:
            await endpoint.close()
        return first, second, events

    first, second, events = asyncio.run(main())
    assert first.object == "response" and first.status == "completed"
    assert [(i.type, i.name, json.loads(i.arguments)) for i in first.output] == [("function_call", "add",
                                                                                  {"a": 2, "b": 3})]
    assert second.output_text == "The answer is 5." and second.output[0].role == "assistant"
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens  # the history grew
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Five."
    assert events[-1].response.output_text == "Five."
    trajs = assemble(session.records, 1.0)  # the tool round trip extended the first call's tokens
    assert [t.info["calls"] for t in trajs] == [[0, 1], [2]]
    assert trajs[0].input_ids[: len(session.records[0].prompt_ids)] == session.records[0].prompt_ids
    rendered = tokenizer.decode(session.records[0].prompt_ids)
    assert "Be brief." in rendered and "add(a: number, b: number)" in rendered  # instructions and tools are in the prompt


@pytest.mark.parametrize("body, param", [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
    ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "hi", "bogus": 1}, "bogus"),
])
def test_responses_errors_are_openai_shaped(tokenizer: Any, body: dict[str, Any], param: str) -> None:
    _, endpoint = serve(tokenizer, [])

    async def main() -> httpx.Response:
        base = await endpoint.start()
        try:
            async with httpx.AsyncClient() as http:
                return await http.post(f"{base}/k1/v1/responses", json=body)
        finally:
            await endpoint.close()

    resp = asyncio.run(main())
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"].startswith(param)


def test_messages_tool_round_trip_with_the_anthropic_client(tokenizer: Any) -> None:
    session, endpoint = serve(tokenizer, [CALL, "It is 5. END more", "Five."])

    async def main() -> tuple[Any, Any, list[Any]]:
        base = await endpoint.start()
        try:
            async with anthropic.AsyncAnthropic(base_url=base, api_key="k1", max_retries=0) as client:
                question = {"role": "user", "content": "What is 2 + 3?"}
                first = await client.messages.create(model="policy", max_tokens=64, system="Be brief.",
                                                     messages=[question], tools=[ANTHROPIC_TOOL])
                [use] = first.content
                second = await client.messages.create(
                    model="policy", max_tokens=64, system="Be brief.", tools=[ANTHROPIC_TOOL],
                    stop_sequences=["END"],
                    messages=[question, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                            "content": "5"}]}])
                stream = await client.messages.create(model="policy", max_tokens=64, stream=True,
                                                      messages=[{"role": "user", "content": "Again?"}])
                events = [e async for e in stream]
        finally:
            await endpoint.close()
        return first, second, events

    first, second, events = asyncio.run(main())
    assert first.type == "message" and first.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in first.content] == [("tool_use", "add", {"a": 2, "b": 3})]
    assert second.content[0].text == "It is 5. " and second.stop_reason == "stop_sequence"
    assert second.stop_sequence == "END"
    assert [e.type for e in events] == ["message_start", "content_block_start", "content_block_delta",
                                        "content_block_stop", "message_delta", "message_stop"]
    assert events[2].delta.text == "Five." and events[4].delta.stop_reason == "end_turn"
    assert events[4].usage.output_tokens == len(session.records[2].completion_ids)
    trajs = assemble(session.records, 1.0)
    assert [t.info["calls"] for t in trajs] == [[0, 1], [2]]


@pytest.mark.parametrize("body, status, kind", [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error"),  # no max_tokens
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
     "invalid_request_error"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "top_k": 5}, 400,
     "invalid_request_error"),
])
def test_messages_errors_are_anthropic_shaped(tokenizer: Any, body: dict[str, Any], status: int, kind: str) -> None:
    _, endpoint = serve(tokenizer, [])

    async def main() -> tuple[httpx.Response, httpx.Response]:
        base = await endpoint.start()
        try:
            async with httpx.AsyncClient() as http:
                bad = await http.post(f"{base}/v1/messages", json=body, headers={"x-api-key": "k1"})
                unknown = await http.post(f"{base}/v1/messages", json=body, headers={"x-api-key": "nope"})
                return bad, unknown
        finally:
            await endpoint.close()

    bad, unknown = asyncio.run(main())
    assert bad.status_code == status and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == kind and bad.json()["error"]["message"]
    assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("finish, calls", [("length", []), ("stop", []), ("tool_calls", [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}])])
def test_replies_and_events_validate_as_the_official_types(finish: str, calls: list[dict[str, Any]]) -> None:
    from anthropic.types import Message, RawMessageStreamEvent
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    from areal_agents.openai_compat import messages, responses

    message: dict[str, Any] = {"role": "assistant", "content": "partial", "refusal": None}
    if calls:
        message["tool_calls"] = calls
    completion = {"id": "chatcmpl-x", "created": 1, "model": "policy", "usage": {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, "choices": [{
            "index": 0, "finish_reason": finish, "logprobs": None, "message": message}]}
    out = Response.model_validate(responses.reply({"model": "policy", "input": "hi"}, completion))
    assert out.output_text == "partial" and [i.type for i in out.output] == ["message"] + ["function_call"] * len(calls)
    assert out.status == ("incomplete" if finish == "length" else "completed")
    assert (out.incomplete_details.reason if out.incomplete_details else None) == (
        "max_output_tokens" if finish == "length" else None)
    for name, data in responses.events(out.model_dump()):
        assert TypeAdapter(ResponseStreamEvent).validate_python(data).type == name
    msg = Message.model_validate(messages.reply({"max_tokens": 8}, completion, "partial"))
    assert msg.stop_reason == {"length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use"}[finish]
    assert [b.type for b in msg.content] == ["text"] + ["tool_use"] * len(calls)
    for name, data in messages.events(msg.model_dump()):
        assert TypeAdapter(RawMessageStreamEvent).validate_python(data).type == name


def test_agents_sdk_streamed_run_calls_the_tool_through_responses_events(tokenizer: Any) -> None:
    """``Runner.run_streamed`` reads the Responses stream: the function call runs, the answer is final."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[tuple[float, float]] = []

    @function_tool
    def add(a: float, b: float) -> str:
        """Add two numbers."""
        seen.append((a, b))
        return str(a + b)

    session, endpoint = serve(tokenizer, [CALL, "The answer is 5."])

    async def main() -> Any:
        base = await endpoint.start()
        try:
            async with openai.AsyncOpenAI(base_url=f"{base}/k1/v1", api_key="x", max_retries=0) as client:
                agent = Agent(name="adder", instructions="Be brief.", tools=[add],
                              model=OpenAIResponsesModel(model="policy", openai_client=client))
                run = Runner.run_streamed(agent, "What is 2 + 3?")
                kinds = [event.type async for event in run.stream_events()]
                return run.final_output, kinds
        finally:
            await endpoint.close()

    final, kinds = asyncio.run(main())
    assert final == "The answer is 5." and seen == [(2, 3)]
    assert "raw_response_event" in kinds
    [traj] = assemble(session.records, 1.0)  # the SDK resent the call and its output: one trajectory
    assert traj.info["calls"] == [0, 1]
