"""Rank 0's evals beside the loop (:class:`trainers.evals.Evals`), against a real embedded server on
loopback with the session's tiny model: an eval started between steps hands back its row when settled,
an eval cannot begin while another runs, and a failed eval's error reaches the loop's thread."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from areal_agents.config.loader import load_config
from areal_agents.inference.launcher import launch_servers
from areal_agents.rollout import EpisodesFailed
from trainers.evals import Evals

SUMS = [f"<|im_start|>user\n{a}+{b}=<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n"
        for a in range(3, 100, 11) for b in range(5, 100, 9)]  # 99 sums to build the tiny model from


def test_an_eval_beside_the_loop_is_settled_with_its_step(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    model = tiny_model(SUMS, seed=0)
    cfg = load_config(overrides=["env.name=math", f"actor.path={model}", "eval.n=40", "sampling.max_new_tokens=6"])
    with launch_servers(cfg, model, log_dir=tmp_path / "logs") as group:
        evals = Evals(cfg, AutoTokenizer.from_pretrained(model), group.addresses)
        assert evals.settle() is None  # nothing started: nothing to wait for
        first = evals.now()
        evals.start(7)
        with pytest.raises(RuntimeError, match="settle"):
            evals.now()  # one eval at a time: the final eval waits for the one beside the loop
        with pytest.raises(RuntimeError, match="settle"):
            evals.start(8)
        step, report = evals.settle()  # type: ignore[misc]
        assert evals.settle() is None
    assert step == 7 and report["eval/n"] == first["eval/n"] == 40 and report["eval/failed"] == 0
    assert report["eval/weight_version"] == first["eval/weight_version"] == 0  # the weights the servers hold
    assert report["eval/accuracy"] == first["eval/accuracy"]  # greedy, same weights: the same episodes
    assert report["time/eval_s"] >= 0 and report["eval/wall_s"] > 0 and first["eval/wall_s"] == first["time/eval_s"]


def test_an_eval_that_failed_beside_the_loop_raises_in_the_loop(tiny_model: Callable[..., Path]) -> None:
    model = tiny_model(SUMS, seed=0)
    with socket.socket() as s:  # a port nothing listens on: every request is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = load_config(overrides=["env.name=math", f"actor.path={model}", "eval.n=4", "inference.request_retries=0"])
    evals = Evals(cfg, AutoTokenizer.from_pretrained(model), [f"127.0.0.1:{port}"])
    evals.start(3)
    with pytest.raises(EpisodesFailed, match="eval: all 4 episodes failed"):
        evals.settle()
    assert evals.settle() is None  # the failed eval is gone: the next one may start


def test_ranks_without_servers_have_no_evals() -> None:
    evals = Evals(load_config(overrides=["env.name=math"]), tokenizer=None, addresses=[])
    evals.start(1)
    assert evals.rows == [] and evals.settle() is None and evals.now() == {}


class _HeldEvals(Evals):
    """Fault injection: an eval that cannot end before the loop begins to wait for it."""

    def __init__(self, cfg: Any, waited: threading.Event) -> None:
        super().__init__(cfg, tokenizer=None, addresses=[])
        self.rows, self.waited = [{"prompt": "1+1="}], waited

    def _eval(self) -> dict[str, Any]:
        assert self.waited.wait(timeout=120), "nothing waited for the eval"
        return {"eval/accuracy": 0.5, "eval/n": 1, "time/eval_s": 0.0}

    def settle(self) -> tuple[int, dict[str, Any]] | None:
        self.waited.set()
        return super().settle()


def test_rollout_pauses_for_a_weight_sync_only_after_the_eval_beside_it_ended(tmp_path: Path) -> None:
    """The eval beside the loop measures the weights the servers hold: ``pause`` (what precedes every
    weight sync and the final eval) waits for it and logs its row before rollout pauses."""
    from trainers.loop import _Rank0
    from trainers.metrics import MetricsLogger
    from trainers.progress import RunDisplay

    cfg = load_config(overrides=["env.name=math", f"output_dir={tmp_path}", "logging.tensorboard=false"])
    logger = MetricsLogger(tmp_path, cfg.logging)
    seen: list[list[dict[str, Any]]] = []

    class Executor:  # what rank 0's rollout executor does at a pause: here, look at the log
        def pause(self) -> None:
            seen.append([json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()])

    r0 = _Rank0(cfg, None, RunDisplay(cfg, enabled=False), logger, executor=Executor())  # type: ignore[arg-type]
    r0.evals = _HeldEvals(cfg, threading.Event())
    r0.evals.start(5)
    r0.pause()
    logger.close()
    assert len(seen) == 1 and [(r["step"], r["eval/accuracy"]) for r in seen[0]] == [(5, 0.5)]
