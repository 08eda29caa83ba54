"""Agents written on real agent frameworks — the OpenAI Agents SDK (its Responses model and its
chat-completions model) and LangChain/LangGraph — play ``unit-convert`` episodes unchanged through
the episode's HTTP endpoint on a real inference server: every episode ends ``ok``, every call
is recorded, and every generated token's recorded logprob is the model's (a re-forward)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from openai_support import corpus, load_tokenizer, reforward, served

from areal_agents.config import ExperimentConfig
from areal_agents.config.loader import load_config
from areal_agents.data import load_dataset_rows
from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import ServerGroup
from areal_agents.rollout.wiring import build_episode_fn, sampling_params
from areal_agents.types import Trajectory

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
AGENTS = {"sdk-unit-convert": "openai_agents_sdk", "sdk-unit-convert-chat": "openai_agents_sdk",
          "langgraph-unit-convert": "langgraph_agent"}
EPISODES = 4


def load_example(folder: str) -> ModuleType:
    """Import an example's agent file once (it registers its agents)."""
    name = f"example_{folder}_unit_agent"
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / folder / "unit_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]) -> Path:
    for folder in sorted(set(AGENTS.values())):
        load_example(folder)
    return tiny_model(corpus(), seed=0)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    with served(model, tmp_path_factory.mktemp("logs")) as group:
        yield group


def play(cfg: ExperimentConfig, tokenizer: Any, server: ServerGroup, rows: list[dict[str, Any]]) -> list[Trajectory]:
    async def main() -> list[Trajectory]:
        client = InferenceClient(server.addresses)
        try:
            fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg), episode_timeout=120)
            return list(await asyncio.gather(*(fn(row, i, f"ep-{i}") for i, row in enumerate(rows))))
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_framework_agent_plays_episodes_recorded_token_exact(agent: str, model: Path, server: ServerGroup) -> None:
    cfg = load_config(None, ["env.name=unit-convert", f"agent.name={agent}", "sampling.max_new_tokens=24"])
    tokenizer = load_tokenizer(model)
    trajs = play(cfg, tokenizer, server, load_dataset_rows(cfg, "train")[:EPISODES])
    assert [t.status for t in trajs] == ["ok"] * EPISODES, [t.info.get("error") for t in trajs]
    for traj in trajs:
        assert traj.info["num_calls"] >= 1
        flat = traj.flatten()
        assert sum(len(t.turn_spans) for t in flat) == traj.info["num_calls"]  # every call is trained on
        for part in flat:
            part.validate()
            for start, end in part.turn_spans:
                assert all(part.loss_mask[start:end]) and end > start
                ref, _ = reforward(model, part.input_ids[:start], part.input_ids[start:end])
                assert max(abs(a - b) for a, b in zip(ref, part.logprobs[start:end], strict=True)) < 1e-4
