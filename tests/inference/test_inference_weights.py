"""Weight updates while requests are decoding: atomic swaps and per-token versions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from inference_support import corpus, reforward_logprobs, start_servers

from areal_agents.inference import control
from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import ServerHandle

PROMPT = [7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path]) -> tuple[Path, Path]:
    return tiny_model(corpus(), seed=0), tiny_model(corpus(), seed=1)


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with start_servers(models[0], 1, tmp_path_factory.mktemp("logs")) as group:
        yield group[0]


def wait_for_progress(server: ServerHandle, tokens: int) -> None:
    """Block until the server is decoding and has made ``tokens`` more tokens."""
    start = control.server_info(server.address)["batching"]["generated_tokens"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        b = control.server_info(server.address)["batching"]
        if b["num_running"] >= 1 and b["generated_tokens"] - start >= tokens:
            return
        time.sleep(0.005)
    raise AssertionError("server made no progress")


def split_point(versions: list[int], old: int, new: int) -> int:
    k = versions.index(new)
    assert set(versions[:k]) == {old} and set(versions[k:]) == {new}, versions
    return k


def current(server: ServerHandle, models: tuple[Path, Path]) -> tuple[int, Path, Path]:
    """The served version, its model and the other one (version ``v`` serves ``models[v % 2]``)."""
    v = int(control.model_info(server.address)["weight_version"])
    return v, models[v % 2], models[(v + 1) % 2]


@pytest.mark.parametrize("mode", ["abort", "retract"])
def test_pause_update_continue_keeps_per_token_versions(mode: str, server: ServerHandle,
                                                        models: tuple[Path, Path]) -> None:
    """abort: the client resends the request from its partial output; retract (the weight
    sync's mode): it waits in the server's queue and is re-prefilled, no abort reaches the client."""
    before, old_model, new_model = current(server, models)

    async def run() -> object:
        client = InferenceClient([server.address], abort_wait=0.01)
        try:
            task = asyncio.ensure_future(client.generate(PROMPT, {"max_new_tokens": 800, "ignore_eos": True}, rid="ep"))
            await asyncio.to_thread(wait_for_progress, server, 30)

            def update() -> None:
                control.pause_generation(server.address, mode)
                if mode == "retract":  # back in the queue
                    assert control.server_info(server.address)["batching"]["num_running"] == 0
                control.update_weights_from_disk([server.address], str(new_model), before + 1)
                control.continue_generation([server.address])

            await asyncio.to_thread(update)
            return await task
        finally:
            await client.aclose()

    gen = asyncio.run(run())
    assert len(gen.output_ids) == 800 and gen.finish_reason == "length"
    assert gen.info["resumes"] >= 1 if mode == "abort" else gen.info["resumes"] == 0
    k = split_point(gen.versions, before, before + 1)
    assert 30 <= k < 800
    old = reforward_logprobs(old_model, PROMPT, gen.output_ids[:k])
    new = reforward_logprobs(new_model, PROMPT, gen.output_ids)[k:]
    assert max(abs(a - b) for a, b in zip(gen.logprobs[:k], old, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(gen.logprobs[k:], new, strict=True)) < 1e-4
    assert control.model_info(server.address)["weight_version"] == str(before + 1)


def test_in_place_update_recomputes_and_labels_tokens(server: ServerHandle, models: tuple[Path, Path]) -> None:
    before, old_model, new_model = current(server, models)

    async def run() -> dict:
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"input_ids": PROMPT, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 800, "ignore_eos": True}}  # fmt: skip
            task = asyncio.ensure_future(http.post(server.url + "/generate", json=body))
            await asyncio.to_thread(wait_for_progress, server, 30)
            reply = await asyncio.to_thread(control.update_weights_from_disk, server.address, str(new_model),
                                            before + 1)
            assert reply[0]["success"] is True and reply[0]["num_paused_requests"] == 1
            return (await task).json()

    out = asyncio.run(run())
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == str(before + 1)
    versions = [int(v) for v in meta["output_token_weight_versions"]]
    k = split_point(versions, before, before + 1)
    ids = out["output_ids"]
    got = [row[0] for row in meta["output_token_logprobs"]]
    old = reforward_logprobs(old_model, PROMPT, ids[:k])
    new = reforward_logprobs(new_model, PROMPT, ids)[k:]
    assert max(abs(a - b) for a, b in zip(got[:k], old, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(got[k:], new, strict=True)) < 1e-4


def test_bad_weights_are_refused_and_old_ones_kept(server: ServerHandle, tmp_path: Path) -> None:
    before = control.model_info(server.address)["weight_version"]
    with pytest.raises(control.ControlError, match="safetensors"):
        control.update_weights_from_disk(server.address, str(tmp_path), 99)
    import torch
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(control.ControlError, match="missing"):
        control.update_weights_from_disk(server.address, str(tmp_path), 99)
    assert control.model_info(server.address)["weight_version"] == before
    out = httpx.post(server.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})
    assert out.status_code == 200 and out.json()["meta_info"]["weight_version"] == before
