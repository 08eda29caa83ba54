"""The official ``openai`` client against real endpoints: the embedded server's own ``/v1``
(``areal-agents serve``) and a per-episode loopback endpoint over the inference client.
Checks replies, streaming, logprobs, 4xx errors, token exactness against a re-forward of the
model, and a call interrupted by a weight update."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai_support import ADD_TOOL, corpus, load_tokenizer, reforward

from areal_agents.config import ExperimentConfig
from areal_agents.inference import control
from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import ServerGroup, launch_servers
from areal_agents.openai_compat.http import Endpoint
from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble

USER = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path]) -> tuple[Path, Path]:
    return tiny_model(corpus(), seed=0), tiny_model(corpus(), seed=1)


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 120.0
    with launch_servers(cfg, models[0], 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group


def url(group: ServerGroup) -> str:
    return "http://" + group.addresses[0].removeprefix("http://")


def test_serve_endpoint_with_the_official_client(server: ServerGroup) -> None:
    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=url(server) + "/v1", api_key="none", max_retries=0) as client:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["policy"]
            plain = await client.chat.completions.create(model="policy", messages=USER, max_tokens=12, temperature=0,
                                                         logprobs=True, top_logprobs=3)
            choice = plain.choices[0]
            assert plain.object == "chat.completion" and choice.finish_reason in ("stop", "length")
            assert len(choice.logprobs.content) == plain.usage.completion_tokens > 0
            assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
            for entry in choice.logprobs.content:  # greedy: the chosen token is the most likely one
                assert len(entry.top_logprobs) == 3
                assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs), abs=1e-5)
            stream = await client.chat.completions.create(model="policy", messages=USER, max_tokens=12, temperature=0,
                                                          stream=True)
            chunks = [c async for c in stream]
            assert all(c.object == "chat.completion.chunk" for c in chunks)
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
            assert chunks[-1].choices[0].finish_reason == choice.finish_reason
            several = await client.chat.completions.create(model="policy", messages=USER, max_tokens=8, n=3)
            assert [c.index for c in several.choices] == [0, 1, 2]
            assert all(c.finish_reason in ("stop", "length") for c in several.choices)
            assert 3 <= several.usage.completion_tokens <= 24  # 3 choices of at most 8 tokens
            seeded = [await client.chat.completions.create(model="policy", messages=USER, max_tokens=12, seed=s, n=n)
                      for s, n in ((7, 1), (7, 1), (7, 3))]
            assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content  # reproducible
            assert seeded[2].choices[0].message.content == seeded[0].choices[0].message.content
            assert len({c.message.content for c in seeded[2].choices}) > 1  # the n choices take seeds 7, 8, 9
            tools = await client.chat.completions.create(model="policy", messages=USER, max_tokens=4, tools=[ADD_TOOL])
            assert tools.usage.prompt_tokens > plain.usage.prompt_tokens  # the tool specs are in the prompt
            for kwargs, param in (({"temperature": 5}, "temperature"), ({"n": 0}, "n"),
                                  ({"messages": [{"role": "user"}]}, "messages[0].content")):
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(**{"model": "policy", "messages": USER, **kwargs})
                assert info.value.status_code == 400 and info.value.body["param"] == param

    asyncio.run(main())
    raw = httpx.post(url(server) + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.post(url(server) + "/nokey/v1/chat/completions", json={}, timeout=30).status_code == 401


def episode(server: ServerGroup, defaults: dict[str, Any], tokenizer: Any) -> tuple[ChatSession, InferenceClient]:
    client = InferenceClient(server.addresses)

    async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Any:
        return await client.generate(ids, sampling, rid="episode-1", top_logprobs=top)

    return ChatSession(tokenizer, generate, defaults), client


def test_episode_endpoint_records_the_exact_sampled_tokens(server: ServerGroup, models: tuple[Path, Path]) -> None:
    tokenizer = load_tokenizer(models[0])
    session, inference = episode(server, {"max_new_tokens": 16}, tokenizer)

    async def main() -> list[Any]:
        endpoint = Endpoint()
        key = endpoint.add(session)
        base = await endpoint.start()
        replies = []
        try:  # the base URL carries the episode key; the API key may carry it instead
            for base_url, api_key in ((f"{base}/{key}/v1", "unused"), (f"{base}/v1", key)):
                async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
                    messages = list(USER)
                    for _ in range(2):
                        reply = await client.chat.completions.create(model="policy", messages=messages, logprobs=True)
                        replies.append(reply)
                        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                                     {"role": "user", "content": "Again?"}]
        finally:
            await endpoint.close()
            await inference.aclose()
        return replies

    replies = asyncio.run(main())
    assert len(session.records) == 4
    for reply, rec in zip(replies, session.records, strict=True):
        assert [e.logprob for e in reply.choices[0].logprobs.content] == pytest.approx(rec.logprobs, abs=0)
        ref, _ = reforward(models[0], rec.prompt_ids, rec.completion_ids)
        assert max(abs(a - b) for a, b in zip(ref, rec.logprobs, strict=True)) < 1e-4
        assert set(rec.versions) == {0}
    trajs = assemble(session.records, 1.0)  # two conversations of two calls, each extended by tokens
    assert [t.info["calls"] for t in trajs] == [[0, 1], [2, 3]]
    for traj in trajs:
        gen = [i for i, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m]
        assert gen == [t for c in traj.info["calls"] for t in session.records[c].completion_ids]


def test_greedy_tokens_equal_the_model_argmax(server: ServerGroup, models: tuple[Path, Path]) -> None:
    tokenizer = load_tokenizer(models[0])
    session, inference = episode(server, {"max_new_tokens": 10}, tokenizer)

    async def main() -> None:
        from areal_agents.openai_compat.client import EpisodeClient

        try:
            await EpisodeClient(session).chat.completions.create(model="policy", messages=USER, temperature=0)
        finally:
            await inference.aclose()

    asyncio.run(main())
    [rec] = session.records
    _, argmax = reforward(models[0], rec.prompt_ids, rec.completion_ids)
    assert rec.completion_ids == argmax  # each recorded token is the one the model ranks first
    assert rec.prompt_ids == tokenizer.apply_chat_template(USER, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)


def test_weight_update_in_the_middle_of_a_call(server: ServerGroup, models: tuple[Path, Path]) -> None:
    tokenizer = load_tokenizer(models[0])
    n = 160
    session, inference = episode(server, {"max_new_tokens": n, "ignore_eos": True}, tokenizer)
    addr = server.addresses[0]

    async def main() -> Any:
        endpoint = Endpoint()
        key = endpoint.add(session)
        base = await endpoint.start()
        try:
            async with openai.AsyncOpenAI(base_url=f"{base}/{key}/v1", api_key="x", max_retries=0) as client:
                async def generated() -> int:
                    info = await asyncio.to_thread(httpx.get, f"http://{addr}/server_info")
                    return int(info.json()["batching"]["generated_tokens"])

                before = await generated()
                call = asyncio.ensure_future(client.chat.completions.create(model="policy", messages=USER))
                while inference.inflight[0] < 1 or await generated() == before:  # until the reply is decoding
                    await asyncio.sleep(0.002)

                def update() -> None:
                    control.pause_generation(addr, mode="abort")
                    control.update_weights_from_disk(addr, str(models[1]), 1)
                    control.continue_generation(addr)

                await asyncio.to_thread(update)
                return await call
        finally:
            await endpoint.close()
            await inference.aclose()

    try:
        reply = asyncio.run(main())
    finally:
        control.update_weights_from_disk(addr, str(models[0]), 0)
    [rec] = session.records
    assert reply.usage.completion_tokens == len(rec.completion_ids) == n  # nothing lost to the interruption
    assert rec.versions == sorted(rec.versions) and set(rec.versions) == {0, 1}
    [choice] = reply.choices  # a well-formed reply: the text of the recorded tokens, cut at max_new_tokens
    assert (choice.finish_reason, choice.message.role) == ("length", "assistant")
    assert choice.message.content == tokenizer.decode(rec.completion_ids, skip_special_tokens=True)
    assert json.loads(json.dumps(reply.model_dump())) == reply.model_dump()
