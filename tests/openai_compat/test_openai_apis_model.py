"""``/v1/responses`` and ``/v1/messages`` on a real model: on ``areal-agents serve``'s own address
(the embedded server) and on an episode's endpoint, where every call is recorded exactly as a
chat completion is (the same prompt tokens, the sampled tokens and their logprobs, which equal
the model's own in a re-forward)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from openai_support import corpus, load_tokenizer, reforward, served

from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import ServerGroup
from areal_agents.openai_compat.http import Endpoint
from areal_agents.openai_compat.session import ChatSession

QUESTION = "What is 12 + 30?"


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model(corpus(), seed=0)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    with served(model, tmp_path_factory.mktemp("logs")) as group:
        yield group


def url(group: ServerGroup) -> str:
    return "http://" + group.addresses[0].removeprefix("http://")


def test_serve_answers_all_three_apis_alike(server: ServerGroup) -> None:
    async def main() -> tuple[Any, Any, Any]:
        async with openai.AsyncOpenAI(base_url=url(server) + "/v1", api_key="none", max_retries=0) as client:
            chat = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0)
            resp = await client.responses.create(model="policy", input=QUESTION, max_output_tokens=12, temperature=0)
        async with anthropic.AsyncAnthropic(base_url=url(server), api_key="none", max_retries=0) as claude:
            msg = await claude.messages.create(model="policy", max_tokens=12, extra_body={"temperature": 0},
                                               messages=[{"role": "user", "content": QUESTION}])
        return chat, resp, msg

    chat, resp, msg = asyncio.run(main())
    text = chat.choices[0].message.content  # greedy: one prompt, one reply, whichever API asked
    assert resp.output_text == text and msg.content[0].text == text
    assert resp.usage.input_tokens == msg.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == msg.usage.output_tokens == chat.usage.completion_tokens
    assert (resp.status == "incomplete") == (msg.stop_reason == "max_tokens") == (chat.choices[0].finish_reason
                                                                                   == "length")


def test_episode_endpoint_records_responses_and_messages_calls_exactly(server: ServerGroup, model: Path) -> None:
    tokenizer = load_tokenizer(model)
    inference = InferenceClient(server.addresses)

    async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Any:
        return await inference.generate(ids, sampling, rid="episode-1", top_logprobs=top)

    session = ChatSession(tokenizer, generate, {"max_new_tokens": 16})

    async def main() -> tuple[Any, Any]:
        endpoint = Endpoint()
        key = endpoint.add(session)
        base = await endpoint.start()
        try:
            async with openai.AsyncOpenAI(base_url=f"{base}/{key}/v1", api_key="x", max_retries=0) as client:
                resp = await client.responses.create(model="policy", input=QUESTION,
                                                     include=["message.output_text.logprobs"])
            async with anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0) as claude:
                msg = await claude.messages.create(model="policy", max_tokens=16,
                                                   messages=[{"role": "user", "content": QUESTION}])
        finally:
            await endpoint.close()
            await inference.aclose()
        return resp, msg

    resp, msg = asyncio.run(main())
    first, second = session.records
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    assert first.prompt_ids == second.prompt_ids == prompt  # the same rendering as a chat completion
    assert [lp.logprob for lp in resp.output[0].content[0].logprobs] == pytest.approx(first.logprobs, abs=0)
    assert resp.usage.output_tokens == len(first.completion_ids)
    assert msg.usage.output_tokens == len(second.completion_ids)
    for rec in session.records:
        ref, _ = reforward(model, rec.prompt_ids, rec.completion_ids)
        assert max(abs(a - b) for a, b in zip(ref, rec.logprobs, strict=True)) < 1e-4
        assert set(rec.versions) == {0}
