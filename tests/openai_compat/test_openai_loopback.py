"""The loopback endpoint shared by a loop's episodes: one server and one base URL, each episode
under its own key (API key or path), requests of a finished episode cancelled, the server gone
with its loop, and agents' clients, unclosed or kept past the loop, left holding nothing bound to
it (no ``Event loop is closed`` noise)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai_support import corpus, load_tokenizer

from areal_agents.env import Env
from areal_agents.llm import LLM, Generation
from areal_agents.openai_compat.agent import OpenAIAgent
from areal_agents.openai_compat.loopback import close_loop_endpoint, loop_endpoint
from areal_agents.rollout.episode import make_episode_fn

USER = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Callable[..., Path]) -> Any:
    return load_tokenizer(tiny_model(corpus(), seed=0))


class Echo(Env):
    """One turn; any reply ends the episode with reward 0."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return str((options or {}).get("prompt", "")), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return "", 0.0, True, False, {}


class InstantLLM(LLM):
    """Generation without a server: the token ids of "42" at once, or waits for ``gate`` first."""

    def __init__(self, tokenizer: Any, gate: asyncio.Event | None = None, started: Callable[[], None] | None = None):
        super().__init__(tokenizer, {"max_new_tokens": 4})
        self.gate, self.started = gate, started

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        if self.started is not None:
            self.started()
        if self.gate is not None:
            await self.gate.wait()
        ids = self.tokenizer.encode("42", add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return Generation(output_ids=ids, logprobs=[-0.1] * len(ids), versions=[0] * len(ids), finish_reason="stop",
                          text=self.tokenizer.decode(ids))


def play(tokenizer: Any, agent: Any, n: int, llm: Callable[[], LLM] | None = None) -> list[Any]:
    fn = make_episode_fn(Echo, OpenAIAgent(agent), lambda rid: llm() if llm else InstantLLM(tokenizer))
    return list(asyncio.run(_gather(fn, n)))


async def _gather(fn: Any, n: int) -> list[Any]:
    return await asyncio.gather(*(fn({"prompt": f"q{i}"}, i, f"ep-{i}") for i in range(n)))


def test_episodes_share_one_server_under_their_own_keys(tokenizer: Any) -> None:
    seen: list[tuple[str, str]] = []

    async def agent(client: Any, row: dict[str, Any]) -> None:
        url = await client.http_endpoint()
        seen.append((url, client.api_key))
        async with openai.AsyncOpenAI(base_url=url, api_key=client.api_key, max_retries=0) as oc:
            reply = await oc.chat.completions.create(model="policy", messages=USER)
        assert reply.choices[0].message.content == "42"
        keyed = url.removesuffix("/v1") + f"/{client.api_key}/v1"  # the same server, the key in the path instead
        async with openai.AsyncOpenAI(base_url=keyed, api_key="unused", max_retries=0) as oc:
            await oc.chat.completions.create(model="policy", messages=USER)

    trajs = play(tokenizer, agent, 12)
    assert [t.status for t in trajs] == ["ok"] * 12
    assert all(t.info["num_calls"] == 2 for t in trajs)  # both routes reached the episode's own session
    assert len({url for url, _ in seen}) == 1 and len({key for _, key in seen}) == 12  # one URL, a key each
    assert next(iter(seen))[0].endswith("/v1")


def test_one_client_per_process_on_its_aiohttp_transport_reaches_each_episode(tokenizer: Any) -> None:
    """The pattern the docs recommend for speed: one official client with its aiohttp transport,
    bound to each episode with ``with_options``; every call lands in its own episode's record."""
    shared: dict[str, Any] = {}

    async def agent(client: Any, row: dict[str, Any]) -> None:
        if "client" not in shared:
            shared["client"] = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="-", max_retries=0,
                                                  http_client=openai.DefaultAioHttpClient())
        oc = shared["client"].with_options(base_url=await client.http_endpoint(), api_key=client.api_key)
        for _ in range(2):
            await oc.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])

    async def main() -> list[Any]:
        fn = make_episode_fn(Echo, OpenAIAgent(agent), lambda rid: InstantLLM(tokenizer))
        try:
            return await asyncio.gather(*(fn({"prompt": f"question {i}"}, i, f"ep-{i}") for i in range(16)))
        finally:
            await shared["client"].close()

    trajs = asyncio.run(main())
    assert [t.status for t in trajs] == ["ok"] * 16
    assert [t.info["num_calls"] for t in trajs] == [2] * 16
    assert all(f"question {i}<|im_end|>" in t.prompt_text for i, t in enumerate(trajs))


def test_a_finished_episode_key_is_refused_and_the_server_ends_with_its_loop(tokenizer: Any) -> None:
    urls: list[str] = []

    keys: list[str] = []

    async def agent(client: Any, row: dict[str, Any]) -> None:
        urls.append(await client.http_endpoint())
        keys.append(client.api_key)
        await client.chat.completions.create(model="policy", messages=USER)

    async def main() -> list[tuple[int, str]]:
        fn = make_episode_fn(Echo, OpenAIAgent(agent), lambda rid: InstantLLM(tokenizer))
        assert (await fn({"prompt": "q"}, 0, "ep")).status == "ok"
        codes = []
        async with httpx.AsyncClient() as http:  # the episode is over: its key no longer routes, in either place
            for url, headers in [(urls[0], {"Authorization": f"Bearer {keys[0]}"}),
                                 (urls[0].removesuffix("/v1") + f"/{keys[0]}/v1", {})]:
                reply = await http.post(url + "/chat/completions", json={"model": "p", "messages": USER},
                                        headers=headers)
                codes.append((reply.status_code, reply.json()["error"]["code"]))
        return codes

    assert asyncio.run(main()) == [(401, "invalid_api_key")] * 2
    with pytest.raises(httpx.ConnectError):  # asyncio.run finalized the loop, and the server with it
        httpx.post(urls[0] + "/chat/completions", json={"model": "p", "messages": USER}, timeout=5)


def test_an_ended_episode_cancels_its_requests_in_flight(tokenizer: Any) -> None:
    gate = asyncio.Event()  # never set: the generation waits until it is cancelled
    state: dict[str, Any] = {}

    class Gated(InstantLLM):
        async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
            state["started"].set()
            try:
                return await super()._generate(input_ids, sampling)
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise

    async def agent(client: Any, row: dict[str, Any]) -> float:
        url = await client.http_endpoint()
        oc = openai.AsyncOpenAI(base_url=url, api_key=client.api_key, max_retries=0)
        call = asyncio.ensure_future(oc.chat.completions.create(model="policy", messages=USER))
        await state["started"].wait()
        state["call"], state["client"] = call, oc
        return 1.0  # the agent ends its episode with its call still being answered

    async def main() -> None:
        state["started"] = asyncio.Event()
        fn = make_episode_fn(Echo, OpenAIAgent(agent), lambda rid: Gated(tokenizer, gate))
        traj = await fn({"prompt": "q"}, 0, "ep")
        assert traj.status == "agent_error"  # no call finished, so no trajectory
        with pytest.raises(openai.APIError):  # the server hung up on the cancelled request
            await asyncio.wait_for(state["call"], 60)
        await state["client"].close()

    asyncio.run(main())
    assert state["cancelled"] is True


def test_unclosed_agent_clients_leave_no_event_loop_errors(tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    async def agent(client: Any, row: dict[str, Any]) -> None:  # like many framework agents: never closes it
        oc = openai.AsyncOpenAI(base_url=await client.http_endpoint(), api_key=client.api_key, max_retries=0)
        await oc.chat.completions.create(model="policy", messages=USER)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):  # each eval on a loop of its own, as run_eval does
            assert {t.status for t in play(tokenizer, agent, 16)} == {"ok"}
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage() or "closed" in r.getMessage()]


def test_a_client_kept_past_its_loop_closes_and_serves_on_later_loops(tokenizer: Any,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A client that outlives the loop it was used on, as in a framework's cache (LangChain keeps
    one HTTP client per base URL): its connections were opened on that loop, and the endpoint
    closes them there when the loop ends, so the client serves the next loop's episodes and
    closes on yet another loop without touching a closed one."""
    kept: dict[str, openai.AsyncOpenAI] = {}

    async def agent(client: Any, row: dict[str, Any]) -> None:
        url = await client.http_endpoint()
        if "client" not in kept:
            kept["client"] = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0)
        oc = kept["client"].with_options(base_url=url, api_key=client.api_key)
        await oc.chat.completions.create(model="policy", messages=USER)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):  # each eval on a loop of its own, as run_eval does
            assert {t.status for t in play(tokenizer, agent, 4)} == {"ok"}
        asyncio.run(kept["client"].close())  # raised "Event loop is closed" when a connection was left open
    assert not [r.getMessage() for r in caplog.records]


def test_close_loop_endpoint_stops_serving_now(tokenizer: Any, tmp_path: Path) -> None:
    async def main() -> None:
        endpoint = loop_endpoint()
        assert loop_endpoint() is endpoint  # one per loop
        url = await endpoint.start()
        await close_loop_endpoint()
        assert loop_endpoint() is not endpoint  # the next episode starts a new one
        async with httpx.AsyncClient() as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(url + "/v1/models")

    asyncio.run(main())
