"""An eval keeps each server's batch full: as many episodes at once as the server decodes together.

A real embedded server on loopback serves the session's tiny model; ``run_eval`` plays 200 greedy
``math`` episodes against it, and the server's own ``/metrics`` say how many sequences it decoded
together at most (the eval used to send 64 at a time, whatever the server could take)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from areal_agents.config.loader import load_config
from areal_agents.data import load_dataset_rows
from areal_agents.inference.launcher import launch_servers
from areal_agents.rollout.evaluation import run_eval


def corpus(n: int = 200) -> Iterator[str]:
    rng = random.Random(0)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"<|im_start|>user\n{a}+{b}=<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n"


def test_an_eval_fills_the_servers_batch(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    model = tiny_model(corpus(), seed=0)
    cfg = load_config(overrides=["env.name=math", f"actor.path={model}", "inference.max_batch_size=128",
                                 "sampling.max_new_tokens=8"])
    rows = load_dataset_rows(cfg, "test")[:200]
    with launch_servers(cfg, model, log_dir=tmp_path / "logs") as group:
        report = run_eval(cfg, AutoTokenizer.from_pretrained(model), group.addresses, rows)
        metrics = httpx.get(f"http://{group.addresses[0]}/metrics", timeout=30).text
    seen = {k: float(v) for k, v in (line.split() for line in metrics.splitlines() if line)}
    assert report["eval/n"] == 200 and report["eval/failed"] == 0
    assert 64 < seen["embedded_max_batch_size_seen"] <= 128, seen
