"""The served policy is the trained one: a LoRA trainer syncs its adapter (disk and gloo
broadcast) to a real embedded server on loopback HTTP; the server's logprobs equal the
trainer's, both keep their base weights bitwise, and without the adapter the server is the base."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from trainer_helpers import make_cfg, nll_loss_fn

from areal_agents.config import LoraConfig
from areal_agents.inference import control
from areal_agents.inference.launcher import free_port
from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory
from trainers.engine import TrainEngine
from trainers.tiny_model import build_tiny_model
from trainers.weight_sync import DiskWeightSync, DistributedWeightSync

TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    texts = [f"What is {a} + {b}? The answer is {a + b}." for a, b in
             ((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(200))]
    return build_tiny_model(texts, tmp_path_factory.mktemp("lora-serve") / "base", seed=0)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[tuple[str, Any]]:
    """The embedded server's app in this process (so its weights can be inspected), on loopback HTTP."""
    from aiohttp import web

    from areal_agents.inference._engine import Engine
    from areal_agents.inference.server import create_app, load_model

    model, tokenizer = load_model(model_dir)
    engine = Engine(model, tokenizer, max_batch_size=8)
    app = create_app(engine, str(model_dir))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{port}", engine
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def lora_engine(model_dir: Path) -> TrainEngine:
    cfg = make_cfg(lr=5e-2)
    cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, lora=LoraConfig(rank=4, alpha=8.0)),
                              algorithm=dataclasses.replace(cfg.algorithm, kl_ctl=0.1))
    return TrainEngine(cfg, model_dir)


def batch(seed: int, vocab: int) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for _ in range(6):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 20))]
        mask = [0] * 4 + [1] * (len(ids) - 4)
        t = Trajectory(input_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), versions=[0] * len(ids))
        t.set_rewards([rng.random()])
        settle_returns(t)
        out.append(t)
    return out


def generate(addr: str, prompt: list[int], lora: str | None) -> tuple[list[int], list[float], str]:
    body: dict[str, Any] = {"input_ids": prompt, "return_logprob": True,
                            "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True}}
    if lora is not None:
        body["lora_path"] = lora
    reply = httpx.post(f"http://{addr}/generate", json=body, timeout=60).raise_for_status().json()
    meta = reply["meta_info"]
    return reply["output_ids"], [row[0] for row in meta["output_token_logprobs"]], meta["weight_version"]


def trainer_logprobs(engine: TrainEngine, prompt: list[int], out: list[int], *, ref: bool = False) -> list[float]:
    ids = prompt + out
    traj = Trajectory(input_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(out), logprobs=[0.0] * len(ids),
                      versions=[0] * len(ids))
    fn = engine.compute_ref_logprobs if ref else engine.compute_logprobs
    return fn([traj], temperature=1.0)[0, len(prompt):].tolist()


def base_unchanged(state: dict[str, torch.Tensor], model_dir: Path) -> bool:
    from safetensors.torch import load_file

    saved = load_file(str(model_dir / "model.safetensors"))
    return all(torch.equal(state[k], v) for k, v in saved.items())


def test_served_adapter_gives_the_trainers_logprobs(model_dir: Path, server: tuple[str, Any], tmp_path: Path) -> None:
    addr, served = server
    engine = lora_engine(model_dir)
    vocab = int(engine.hf_config.vocab_size)
    sync = DiskWeightSync([addr], tmp_path / "weights")
    sync.sync(engine, 0)
    assert set(served.lora.adapters) == {"policy"}
    for step in range(1, 4):
        engine.train_batch(batch(step, vocab), nll_loss_fn)
        sync.sync(engine, step)
    exported = sync.path_for(3)
    assert sorted(p.name for p in exported.iterdir() if p.name.startswith("adapter")) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert not list(exported.glob("model*.safetensors"))  # the adapter only, not the model
    assert control.model_info(addr)["weight_version"] == "3"  # every sync bumps the version
    prompt = [5, 9, 14, 20, 7]
    out, lps, version = generate(addr, prompt, "policy")
    assert version == "3"
    ours = trainer_logprobs(engine, prompt, out)
    assert max(abs(a - b) for a, b in zip(lps, ours, strict=True)) <= TOL
    base_out, base_lps, _ = generate(addr, prompt, None)  # no lora_path: the base model
    theirs = trainer_logprobs(engine, prompt, base_out, ref=True)  # the trainer's base: adapter disabled
    assert max(abs(a - b) for a, b in zip(base_lps, theirs, strict=True)) <= TOL
    assert max(abs(a - b) for a, b in zip(base_lps, trainer_logprobs(engine, prompt, base_out), strict=True)) > 1e-3
    # the base weights are bitwise as loaded, in the trainer and in the server (never merged)
    trainer_base = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v
                    for k, v in engine.full_state_dict().items() if ".lora_" not in k}
    assert base_unchanged(trainer_base, model_dir)
    assert base_unchanged(served.model.state_dict(), model_dir)
    # unloading the adapter gives the base back; requests naming it are refused
    control.load_lora_adapter(addr, "policy", str(exported), 3)
    httpx.post(f"http://{addr}/unload_lora_adapter", json={"lora_name": "policy"}, timeout=30).raise_for_status()
    again = httpx.post(f"http://{addr}/generate", json={"input_ids": prompt, "lora_path": "policy"}, timeout=30)
    assert again.status_code == 400 and "not loaded" in again.json()["error"]["message"]
    out2, lps2, _ = generate(addr, prompt, None)
    assert max(abs(a - b) for a, b in zip(lps2, trainer_logprobs(engine, prompt, out2, ref=True), strict=True)) <= TOL


@pytest.mark.slow
def test_broadcast_sends_only_the_adapter(model_dir: Path, tmp_path: Path) -> None:
    from areal_agents.config import ExperimentConfig
    from areal_agents.inference.launcher import launch_servers

    engine = lora_engine(model_dir)
    engine.train_batch(batch(7, int(engine.hf_config.vocab_size)), nll_loss_fn)
    # a server process of its own: torch's process-group names are per process
    with launch_servers(ExperimentConfig(), model_dir, 1, log_dir=tmp_path, env={"OMP_NUM_THREADS": "1"}) as group:
        addr = group.addresses[0]
        sync = DistributedWeightSync([addr], backend="gloo", timeout_s=60)
        try:
            sync.sync(engine, 11)
            assert sync.last_error is None
        finally:
            sync.close()
        held = control.server_info(addr)["lora_adapters"]["policy"]
        sent = sum(t.numel() * t.element_size() for t in engine.adapter_state_dict().values())
        model_bytes = (model_dir / "model.safetensors").stat().st_size
        assert held["bytes"] == sent and held["modules"] == 4 * 7 and sent * 3 < model_bytes
        prompt = [11, 4, 8]
        out, lps, version = generate(addr, prompt, "policy")
        assert version == "11"
        assert max(abs(a - b) for a, b in zip(lps, trainer_logprobs(engine, prompt, out), strict=True)) <= TOL
        base_out, base_lps, _ = generate(addr, prompt, None)
        ref = trainer_logprobs(engine, prompt, base_out, ref=True)
        assert max(abs(a - b) for a, b in zip(base_lps, ref, strict=True)) <= TOL


def test_load_lora_adapter_refuses_what_does_not_fit(server: tuple[str, Any], tmp_path: Path) -> None:
    addr, _ = server
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 2, "lora_alpha": 4}')
    from safetensors.torch import save_file

    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 5),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(7, 2)},
              str(bad / "adapter_model.safetensors"))
    reply = httpx.post(f"http://{addr}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(bad)}, timeout=30)
    assert reply.status_code == 400 and reply.json()["success"] is False and "shapes" in reply.json()["error_message"]
    missing = httpx.post(f"http://{addr}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)},
                         timeout=30)
    assert missing.status_code == 400 and "not a PEFT adapter dir" in missing.json()["error_message"]


@pytest.mark.slow
def test_lora_run_survives_kill_and_recovers(model_dir: Path, tmp_path: Path) -> None:
    """``areal-agents run`` with LoRA, SIGKILLed after its first checkpoint, resumes from it and
    goes on serving the adapter (versions continue, no error)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    args = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"actor.path={model_dir}",
            "actor.lora.rank=4", "trainer.save_every=2", "eval.every=0", "eval.n=4", "rollout.batch_size=2",
            "rollout.group_size=2", "sampling.max_new_tokens=4", "logging.progress=false", "logging.plots=false",
            "logging.tensorboard=false", f"output_dir={tmp_path}"]
    ckpts = tmp_path / "math" / "trial" / "checkpoints"
    first = subprocess.Popen([*args, "trainer.total_steps=50"], start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (ckpts / "latest").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert first.poll() is None and (ckpts / "latest").exists()
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    saved = int((ckpts / "latest").read_text().removeprefix("step_"))
    second = subprocess.run([*args, f"trainer.total_steps={saved + 2}"], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"recovered step {saved} (weight version {saved})" in second.stdout.replace("\n", " ")
    rows = [json.loads(line) for line in (tmp_path / "math" / "trial" / "metrics.jsonl").read_text().splitlines()]
    trained = [r["version"] for r in rows if "train/loss" in r]  # the killed run may have logged a step past it
    assert trained[-2:] == [saved + 1, saved + 2]
    assert (tmp_path / "math" / "trial" / "final_adapter" / "adapter_model.safetensors").is_file()
