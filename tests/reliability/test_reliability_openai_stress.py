"""256 concurrent episodes of an agent that speaks HTTP with the official ``openai`` client
(several calls, tool calls) to the episode endpoint, over two embedded servers: once sending
each ``/generate`` alone and once batching them (``inference.batch_window``), while the weights
are updated again and again, and in the second run while one server is killed. Every episode
must end, ``ok`` or with a named failure status; none may wait forever (no episode deadline
here: a lost request would hang the gather, which the test's own deadline reports)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest

from areal_agents.config import ExperimentConfig
from areal_agents.env import Env
from areal_agents.inference import control
from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import launch_servers
from areal_agents.llm import ClientLLM
from areal_agents.openai_compat.agent import OpenAIAgent
from areal_agents.rollout.episode import make_episode_fn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai_compat"))
from openai_support import ADD_TOOL, build_model, load_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow

EPISODES = 256
NAMED = {"ok", "server_error", "aborted", "agent_error"}  # what an episode may end as under these faults


class Question(Env):
    """One question; the agent's own return is the reward."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return str((options or {}).get("prompt", "")), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return "", 0.0, True, False, {}


async def tool_agent(client: Any, row: dict[str, Any]) -> float:
    """Up to three calls with the ``add`` tool, answering each tool call; a fresh official client."""
    async with openai.AsyncOpenAI(base_url=await client.http_endpoint(), api_key=client.api_key,
                                  max_retries=0, timeout=600) as oc:
        messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
        for _ in range(3):
            reply = await oc.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL],
                                                     max_tokens=24, temperature=1.0)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "42"} for c in message.tool_calls]
    return 1.0


def _churn_weights(addresses: list[str], model: Path, stop: threading.Event, versions: list[int]) -> None:
    """Weight updates one after another until ``stop`` (a server that is gone is skipped)."""
    version = 0
    while not stop.is_set():
        version += 1
        for addr in addresses:
            try:
                control.update_weights_from_disk([addr], str(model), version, timeout=60)
            except Exception:  # noqa: BLE001 - the killed server
                continue
        versions.append(version)
        stop.wait(0.5)


async def _run(addresses: list[str], tokenizer: Any, window: float, kill: Any) -> tuple[Counter[str], list[Any]]:
    client = InferenceClient(addresses, timeout=120, batch_window=window, reprobe_after=1.0)
    fn = make_episode_fn(Question, OpenAIAgent(tool_agent), lambda rid: ClientLLM(tokenizer, client, rid=rid))
    tasks = [asyncio.ensure_future(fn({"prompt": f"What is {i % 50} + {i % 37}?"}, i, f"ep-{i}"))
             for i in range(EPISODES)]
    if kill is not None:
        while min(client.inflight) < 1 and not all(t.done() for t in tasks):  # requests at every server
            await asyncio.sleep(0.01)
        await asyncio.to_thread(kill)
    done, pending = await asyncio.wait(tasks, timeout=480)
    for task in pending:
        task.cancel()
    await client.aclose()
    assert not pending, f"{len(pending)} of {EPISODES} episodes never ended"
    trajs = [t.result() for t in done]
    return Counter(t.status for t in trajs), trajs


def test_256_http_episodes_end_under_weight_updates_and_a_killed_server(tmp_path: Path) -> None:
    model = build_model(tmp_path)
    tokenizer = load_tokenizer(model)
    cfg = ExperimentConfig()
    with launch_servers(cfg, model, 2, log_dir=tmp_path / "logs", env={"OMP_NUM_THREADS": "1"}) as group:
        addresses = group.addresses
        for window, kill in ((0.0, None), (0.002, group[1].close)):
            stop, versions = threading.Event(), []
            churn = threading.Thread(target=_churn_weights, args=(addresses, model, stop, versions), daemon=True)
            churn.start()
            t0 = time.monotonic()
            try:
                statuses, trajs = asyncio.run(_run(addresses, tokenizer, window, kill))
            finally:
                stop.set()
                churn.join(120)
            assert set(statuses) <= NAMED, statuses
            assert statuses["ok"] >= EPISODES // 2, statuses  # faults cost some episodes, not most
            assert versions, "no weight update happened during the run"
            failed = [t.info.get("error", "") for t in trajs if t.status != "ok"]
            assert all(e and "\n" not in e for e in failed), failed[:3]  # each failure names its cause
            print(f"batch_window={window} kill={kill is not None}: {dict(statuses)} "
                  f"in {time.monotonic() - t0:.1f} s, {len(versions)} weight updates")
