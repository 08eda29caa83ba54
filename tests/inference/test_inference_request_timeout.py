"""A request the server never answers fails within ``inference.request_timeout`` (retries included)
with a one-line error, also when it comes through an episode's HTTP endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from areal_agents.inference.client import InferenceClient, InferenceError


@pytest.fixture()
def silent_server() -> Iterator[str]:
    """Fault injection: a TCP server that accepts connections, reads, and never answers."""
    from areal_agents.runtime.loop_thread import LoopThread

    thread = LoopThread("silent-server")
    thread.start()

    async def start() -> asyncio.AbstractServer:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.read(65536):
                pass
            writer.close()

        return await asyncio.start_server(hold, "127.0.0.1", 0)

    server = thread.run(start())
    yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def stop() -> None:
        server.close()
        await server.wait_closed()

    thread.run(stop())
    thread.stop(10)


def test_an_unanswered_generate_fails_within_the_request_timeout(silent_server: str) -> None:
    async def main() -> InferenceError:
        async with InferenceClient([silent_server], timeout=1.0, retries=3, backoff=0.05) as client:
            with pytest.raises(InferenceError) as info:  # not the 60 s guard's TimeoutError
                await asyncio.wait_for(client.generate([1, 2, 3], {"max_new_tokens": 4}), 60)
            return info.value

    message = str(asyncio.run(main()))
    assert "no reply within 1 s" in message and "inference.request_timeout" in message and "\n" not in message
    assert "; 1 attempts," in message  # the timeout bounds the request, retries included: not retries x timeout


def test_the_episode_endpoint_answers_an_unanswered_request_with_an_error(silent_server: str, tmp_path: Any) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai_compat"))
    from openai_support import build_model, load_tokenizer

    from areal_agents.llm import ClientLLM
    from areal_agents.openai_compat.agent import OpenAIAgent
    from areal_agents.rollout.episode import make_episode_fn
    from envs.math import MathEnv

    tokenizer = load_tokenizer(build_model(tmp_path))
    errors: list[openai.APIStatusError] = []

    async def agent(client: Any, row: dict[str, Any]) -> None:
        async with openai.AsyncOpenAI(base_url=await client.http_endpoint(), api_key=client.api_key,
                                      max_retries=0) as oc:
            try:
                await oc.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}])
            except openai.APIStatusError as exc:
                errors.append(exc)
                raise

    async def main() -> Any:
        async with InferenceClient([silent_server], timeout=1.0) as client:
            fn = make_episode_fn(MathEnv, OpenAIAgent(agent), lambda rid: ClientLLM(tokenizer, client, rid=rid))
            return await asyncio.wait_for(fn({"prompt": "1+1?", "answer": "2"}, 0, "ep"), 60)

    traj = asyncio.run(main())
    assert traj.status == "agent_error" and "request_timeout" in traj.info["error"]
    assert errors and errors[0].status_code == 502 and "\n" not in errors[0].message
