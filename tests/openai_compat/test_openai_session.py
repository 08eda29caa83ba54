"""Chat completions on the token path without a server: request checks, tool calls, the chat
template's tool format, recording and trajectory assembly (a scripted backend stands in for
the model so that replies, tool calls included, are known; the tokenizer is the tiny model's)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai_support import ADD_TOOL, corpus, load_tokenizer

from areal_agents.llm import observation_key
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.openai_compat.client import EpisodeClient
from areal_agents.openai_compat.schema import APIError, parse_request
from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble
from areal_agents.rollout.returns import settle_returns
from areal_agents.tools.calls import parse_tool_calls
from areal_agents.types import Trajectory
from trainers.tiny_model import CHAT_TEMPLATE

USER = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Callable[..., Path]) -> Any:
    return load_tokenizer(tiny_model(corpus(), seed=0))


def scripted(tokenizer: Any, replies: list[str]) -> tuple[ChatSession, ScriptedLLM]:
    backend = ScriptedLLM(replies, tokenizer, version=3)

    async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Any:
        return await backend._generate(ids, sampling)

    return ChatSession(tokenizer, generate, {"max_new_tokens": 64}), backend


@pytest.mark.parametrize("body, param", [
    ({"messages": USER}, "model"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "tool", "content": "4"}]}, "messages[0].tool_call_id"),
    ({"model": "m", "messages": USER, "temperature": 3}, "temperature"),
    ({"model": "m", "messages": USER, "n": 0}, "n"),
    ({"model": "m", "messages": USER, "max_tokens": -1}, "max_tokens"),
    ({"model": "m", "messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"model": "m", "messages": USER, "stop": [""]}, "stop"),
    ({"model": "m", "messages": USER, "tools": [{"type": "function"}]}, "tools[0]"),
    ({"model": "m", "messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "m", "messages": USER, "bogus": 1}, "bogus"),
    ({"model": "m", "messages": USER, "logit_bias": {"1": 5}}, "logit_bias"),
])
def test_bad_requests_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_request(body)
    assert info.value.status == 400 and info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_request_fields_are_read() -> None:
    req = parse_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                         "max_completion_tokens": 7, "stop": "X", "n": 3, "logprobs": True, "top_logprobs": 2,
                         "temperature": 0, "tools": [ADD_TOOL], "tool_choice": "none"})
    assert req.messages == [{"role": "user", "content": "hi"}]
    assert (req.max_tokens, req.stop, req.n, req.top_logprobs, req.temperature) == (7, ["X"], 3, 2, 0.0)
    assert req.tools is not None and not req.parse_tools  # tool_choice none: replies stay text


def test_tool_call_parsing_and_malformed_calls() -> None:
    content, calls = parse_tool_calls('Let me add.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert content == "Let me add." and len(calls) == 1
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'} and calls[0]["id"].startswith("call_")
    for bad in ('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>', '<tool_call>{"name": "add"',
                '<tool_call>["add"]</tool_call>', '<tool_call>{"name": "mul", "arguments": {}}</tool_call>',
                '<tool_call>{"name": "add", "arguments": {}}</tool_call> and then some'):
        assert parse_tool_calls(bad, {"add"}) == (bad, [])


def test_template_renders_tools_and_is_unchanged_without_them(tokenizer: Any) -> None:
    assert tokenizer.chat_template == CHAT_TEMPLATE
    msgs = [{"role": "system", "content": "Be brief."}, *USER]
    plain = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n" \
                    "<|im_start|>assistant\n"
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    text = tokenizer.apply_chat_template(
        [*msgs, {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "5", "tool_call_id": "c1"}], tools=[ADD_TOOL], tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n<tools>\nadd(a: number, b: number)\n</tools><|im_end|>\n")
    assert text.count("<|im_start|>system") == 1
    assert '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>\n' \
           '<|im_start|>tool\n5<|im_end|>\n' in text


def test_tool_call_reply_then_tool_result_extends_the_tokens(tokenizer: Any) -> None:
    session, _ = scripted(tokenizer, ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                                      "The answer is 5."])

    async def agent() -> tuple[dict[str, Any], dict[str, Any]]:
        first = await session.create(parse_request({"model": "m", "messages": USER, "tools": [ADD_TOOL]}))
        msg = first["choices"][0]["message"]
        tool = {"role": "tool", "content": "5", "tool_call_id": msg["tool_calls"][0]["id"]}
        second = await session.create(parse_request({"model": "m", "messages": [*USER, msg, tool],
                                                     "tools": [ADD_TOOL]}))
        return first, second

    first, second = asyncio.run(agent())
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert second["choices"][0] == {"index": 0, "finish_reason": "stop", "logprobs": None,
                                    "message": {"role": "assistant", "content": "The answer is 5.", "refusal": None}}
    r1, r2 = session.records
    assert r2.prompt_ids[:len(r1.prompt_ids) + len(r1.completion_ids)] == r1.prompt_ids + r1.completion_ids
    assert first["usage"]["prompt_tokens"] == len(r1.prompt_ids)
    [traj] = assemble(session.records, 1.0)
    settle_returns(traj, 0.5)
    assert traj.turn_spans and len(traj.turn_spans) == 2
    gen = [t for t, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m]
    assert gen == r1.completion_ids + r2.completion_ids
    assert traj.versions == [3 if m else -1 for m in traj.loss_mask]
    assert traj.turn_rewards == [0.0, 1.0] and traj.turn_returns == [0.5, 1.0] and traj.reward == 0.5
    assert "<tools>" in tokenizer.decode(traj.input_ids[:traj.turn_spans[0][0]])
    # each turn's state key hashes what it answered (the tool result, whatever its call id)
    assert traj.state_keys == [observation_key(USER), observation_key([{"role": "tool", "content": "5"}])]


def test_rewritten_history_gives_one_trajectory_per_call_with_the_turn_discount(tokenizer: Any) -> None:
    session, _ = scripted(tokenizer, ["a", "b", "c"])

    async def agent() -> None:  # each call summarises the history instead of appending to it
        summary = "start"
        for _ in range(3):
            reply = await session.create(parse_request({"model": "m", "messages": [
                {"role": "user", "content": f"Summary so far: {summary}"}]}))
            summary += reply["choices"][0]["message"]["content"]

    asyncio.run(agent())
    trajs = assemble(session.records, 2.0)
    assert len(trajs) == 3 and [t.info["calls"] for t in trajs] == [[0], [1], [2]]
    assert [t.turn_rewards for t in trajs] == [[2.0], [2.0], [2.0]]  # each earns R; the rollout discounts
    trajs[-1].segments = trajs[:-1]
    settle_returns(trajs[-1], 0.5)
    assert [t.reward for t in trajs] == [0.5, 1.0, 2.0]  # γ² R, γ R, R: the last call gets γ⁰
    for traj, rec in zip(trajs, session.records, strict=True):
        assert traj.input_ids == rec.prompt_ids + rec.completion_ids and traj.num_generated == len(rec.completion_ids)


def test_n_choices_are_separate_until_one_is_continued(tokenizer: Any) -> None:
    session, _ = scripted(tokenizer, ["one", "two", "three"])

    async def agent() -> dict[str, Any]:
        first = await session.create(parse_request({"model": "m", "messages": USER, "n": 2}))
        pick = first["choices"][1]["message"]
        await session.create(parse_request({"model": "m", "messages": [*USER, pick, {"role": "user", "content": "?"}]}))
        return first

    first = asyncio.run(agent())
    assert [c["message"]["content"] for c in first["choices"]] == ["one", "two"]
    r0, r1, r2 = session.records
    assert r0.prompt_ids == r1.prompt_ids and r0.request_id == r1.request_id
    assert r2.prompt_ids[:len(r1.prompt_ids) + len(r1.completion_ids)] == r1.prompt_ids + r1.completion_ids
    trajs = assemble(session.records, 1.0)
    assert [t.info["calls"] for t in trajs] == [[0], [1, 2]]
    # the n choices answered the same observation: one state key
    assert r0.state_key == r1.state_key == observation_key(USER) != r2.state_key
    assert [t.state_keys for t in trajs] == [[r0.state_key], [r1.state_key, observation_key([{"role": "user",
                                                                                            "content": "?"}])]]


def test_in_process_client_returns_the_official_types(tokenizer: Any) -> None:
    session, _ = scripted(tokenizer, ["Hello there.", "Hello there.", "x"])
    client = EpisodeClient(session)

    async def agent() -> tuple[Any, list[Any]]:
        reply = await client.chat.completions.create(model="policy", messages=USER, logprobs=True, stop=["there"])
        stream = await client.chat.completions.create(model="policy", messages=USER, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="policy", messages=USER, temperature=9)
        assert info.value.status_code == 400 and info.value.body["param"] == "temperature"
        return reply, chunks

    reply, chunks = asyncio.run(agent())
    assert isinstance(reply, ChatCompletion) and reply.choices[0].message.content == "Hello "
    rec = session.records[0]
    assert [e.logprob for e in reply.choices[0].logprobs.content] == pytest.approx(rec.logprobs)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there."
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens == \
        len(session.records[1].completion_ids)


def test_segments_travel_with_the_episode_and_flatten_for_training(tokenizer: Any) -> None:
    session, _ = scripted(tokenizer, ["a", "b"])

    async def agent() -> None:
        for text in ("first", "second"):  # unrelated prompts: two trajectories
            await session.create(parse_request({"model": "m", "messages": [{"role": "user", "content": text}]}))

    asyncio.run(agent())
    *others, main = assemble(session.records, 1.0)
    main.segments, main.group_id, main.start_version = others, "g7", 4
    settle_returns(main, 0.5)  # as where the episode ends: the segment is one call before the last
    back = Trajectory.from_json(main.to_json())
    assert back.segments[0].input_ids == others[0].input_ids and back.segments[0].reward == 0.5
    flat = back.flatten()
    assert [t.reward for t in flat] == [0.5, 1.0] and all(not t.segments for t in flat)
    assert {(t.group_id, t.start_version) for t in flat} == {("g7", 4)}
    back.segments[0].loss_mask.pop()
    with pytest.raises(ValueError, match="loss_mask"):
        back.validate()


def test_a_template_that_refuses_the_messages_is_a_400(tokenizer: Any) -> None:
    session, _ = scripted(tokenizer, ["a"])
    session.tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    session.tokenizer.chat_template = "{{ raise_exception('only user messages') }}"
    with pytest.raises(APIError) as info:
        asyncio.run(session.create(parse_request({"model": "m", "messages": USER})))
    assert info.value.status == 400 and "only user messages" in info.value.message and not session.records


def test_tool_choice_required_or_named_forces_a_call_as_context(tokenizer: Any) -> None:
    """``required`` starts the reply with ``<tool_call>``, a named function with the call up to
    its arguments (the template's own markup); the forced text is prompt (not sampled, not
    trained), the model's continuation completes the call."""
    session, backend = scripted(tokenizer, ['{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                                            '{"a": 4, "b": 5}}</tool_call>'])
    client = EpisodeClient(session)

    async def agent() -> list[Any]:
        replies = [await client.chat.completions.create(model="policy", messages=USER, tools=[ADD_TOOL],
                                                        tool_choice=choice)
                   for choice in ("required", {"type": "function", "function": {"name": "add"}})]
        for bad, param in (({"type": "function", "function": {"name": "mul"}}, "tool_choice"),
                           ("required", "tool_choice")):
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="policy", messages=USER, tool_choice=bad,
                                                     tools=[ADD_TOOL] if bad != "required" else None)
            assert info.value.body["param"] == param
        return replies

    required, named = asyncio.run(agent())
    for reply, args in ((required, {"a": 2, "b": 3}), (named, {"a": 4, "b": 5})):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "add"
        assert json.loads(choice.message.tool_calls[0].function.arguments) == args
    forced = ["<tool_call>", '<tool_call>{"name": "add", "arguments": ']
    assert len(backend.calls) == 2
    for rec, text in zip(session.records, forced, strict=True):
        assert tokenizer.decode(rec.prompt_ids).endswith("<|im_start|>assistant\n" + text)
        assert not tokenizer.decode(rec.completion_ids).startswith("<tool_call>")  # sampled: only the rest
    assert len(session.records) == 2  # the refused requests generated nothing


def test_ids_and_keys_need_no_system_call_and_differ_in_a_forked_child(tokenizer: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Completion and tool-call ids and episode keys come from a per-process prefix and a counter
    (fault injection: reading the OS's random source raises), are unique, and a forked child draws
    a prefix of its own."""
    import os
    import re
    import warnings

    from areal_agents.runtime.ids import new_id, new_key

    def no_urandom(n: int) -> bytes:
        raise AssertionError("os.urandom read on the request path")

    child_read, child_write = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork() with threads; the child only writes an id
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child reports one id and exits at once
        os.write(child_write, new_id("x-").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child_id = os.read(child_read, 64).decode()
    monkeypatch.setattr(os, "urandom", no_urandom)
    ids = [new_id("chatcmpl-") for _ in range(2000)]
    keys = [new_key() for _ in range(2000)]
    assert len(set(ids)) == 2000 and all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids)
    assert len(set(keys)) == 2000 and all(re.fullmatch(r"[0-9a-f]{32}", k) for k in keys)
    assert child_id[2:14] != new_id()[:12]  # the child's process prefix is not the parent's
    session, _ = scripted(tokenizer, ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'])
    reply = asyncio.run(session.create(parse_request({"model": "m", "messages": USER, "tools": [ADD_TOOL]})))
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", reply["id"])
    assert re.fullmatch(r"call_[0-9a-f]{24}", reply["choices"][0]["message"]["tool_calls"][0]["id"])


def test_forced_call_prefix_is_rendered_once_per_tokenizer_and_tools(tokenizer: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The opening a forced ``tool_choice`` puts on the reply is rendered from the chat template
    once: the same request again needs no rendering at all (fault injection: the template raises)."""
    replies = ['{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'] * 2
    session, _ = scripted(tokenizer, replies)
    body = {"model": "m", "messages": USER, "tools": [ADD_TOOL], "tool_choice": "required"}
    first = asyncio.run(session.create(parse_request(body)))

    def no_render(*args: Any, **kwargs: Any) -> str:
        raise ValueError("the chat template was rendered again")

    monkeypatch.setattr(tokenizer, "apply_chat_template", no_render)
    again, _ = scripted(tokenizer, replies)
    second = asyncio.run(again.create(parse_request(body)))
    assert first["choices"][0]["message"]["tool_calls"][0]["function"] == \
        second["choices"][0]["message"]["tool_calls"][0]["function"]
    assert again.records[0].prompt_ids == session.records[0].prompt_ids
    other = {**ADD_TOOL, "function": {**ADD_TOOL["function"], "name": "plus"}}  # other tools: rendered afresh
    with pytest.raises(APIError, match="no <tool_call> format"):
        asyncio.run(again.create(parse_request({**body, "tools": [other]})))
