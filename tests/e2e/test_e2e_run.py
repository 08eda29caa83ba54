"""End to end: `areal-agents run` against a real embedded server, then the trainer-only mode.

The test launches the server itself and attaches the run to it (``inference.backend=remote``)
so that, after the run, it can check the server holds exactly the weights the trainer
exported: same greedy logprobs for a probe prompt.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from areal_agents.config.loader import load_config
from areal_agents.inference.launcher import launch_servers
from trainers.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

ETA = 1
STEPS = 4


def _cli(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "areal_agents.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_run_then_train_only(tmp_path: Path) -> None:
    texts = [f"{a}+{b}= {a + b}" for a in range(10, 60) for b in range(10, 60)]
    model = build_tiny_model(texts, tmp_path / "model")
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    common = [f"actor.path={model}", f"output_dir={tmp_path / 'runs'}", "experiment_name=e2e",
              "rollout.batch_size=2", "rollout.group_size=4", "sampling.max_new_tokens=6", "eval.n=6",
              "eval.every=2", "logging.progress=false", "trainer.save_every=2", "actor.lr=1e-3"]
    cfg = load_config(overrides=common)
    with launch_servers(cfg, model, 1, log_dir=tmp_path / "logs") as servers:
        addr = servers.addresses[0]
        proc = _cli(["run", "--env", "math", *common, "inference.backend=remote", f"inference.addresses=[{addr}]",
                     f"trainer.total_steps={STEPS}", f"rollout.max_head_offpolicyness={ETA}"], env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "its own process" in proc.stdout  # rollout.process: the default, not a fallback
        run_dir = tmp_path / "runs" / "e2e" / "trial"
        for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "final/config.json", "final/model.safetensors",
                     "plots/reward_vs_step.png", "plots/reward_vs_time.png", "plots/throughput.png",
                     "plots/staleness.png", "checkpoints/latest"):
            assert (run_dir / name).exists(), name
        assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train_rows = [r for r in rows if "train/loss" in r]
        assert [r["version"] for r in train_rows] == list(range(1, STEPS + 1))  # one version per step
        for r in train_rows:
            for key, value in r.items():
                if isinstance(value, float):
                    assert math.isfinite(value), (key, value)
            assert r["staleness/max"] <= ETA
            assert r["rollout/accepted"] >= 8
            assert r["time/train_s"] > 0 and r["perf/train_tokens_per_s"] > 0 and r["time/sync_s"] >= 0
        # Evals before the first step, at step 2 (beside step 3, ended before its weight sync) and after the
        # last, each a row of its own after the step whose weights it measured (no token of newer ones).
        evals = [(i, r) for i, r in enumerate(rows) if "eval/accuracy" in r]
        assert [(r["step"], r["eval/weight_version"]) for _, r in evals] == [(0, 0), (2, 2), (STEPS, STEPS)]
        assert [rows[i - 1]["step"] for i, _ in evals[1:]] == [2, STEPS] and rows[evals[1][0] + 1]["step"] == 3
        assert all(r["time/eval_s"] >= 0 and r["eval/wall_s"] > 0 for _, r in evals)
        samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
        assert samples and all("+" in s["prompt"] and s["completion"] for s in samples)
        # The episode record: one file per step, every trained episode of it (logging.episodes keeps 4 groups,
        # the batch holds 2), its tokens as the trainer saw them (tests/record compares them with the batch).
        from areal_agents.record import load

        assert sorted(p.name for p in (run_dir / "episodes").iterdir()) == [f"step-{s:06d}.parquet"
                                                                            for s in range(1, STEPS + 1)]
        record = load(run_dir).to_pylist()
        trained = [r for r in record if r["status"] == "ok"]
        assert [r["step"] for r in trained] == [s for s in range(1, STEPS + 1) for _ in range(8)]
        for r in trained:
            assert r["env"] == "math" and "+" in r["prompt"] and r["n_tokens"] == len(r["input_ids"])
            assert r["n_trained"] == sum(r["loss_mask"]) > 0 and len(r["token_text"]) == r["n_tokens"]
            assert 0 <= r["staleness"] <= ETA and r["version_max"] <= r["step"] - 1
            assert all(a == 0 for a, m in zip(r["advantages"], r["loss_mask"], strict=True) if not m)

        # The server serves exactly the weights the trainer exported last.
        info = httpx.get(f"http://{addr}/model_info", timeout=30).json()
        assert str(info["weight_version"]) == str(STEPS)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(run_dir / "final")
        probe = tok.apply_chat_template([{"role": "user", "content": "12+34="}], add_generation_prompt=True,
                                        tokenize=True)
        probe = list(probe["input_ids"] if isinstance(probe, dict) or hasattr(probe, "keys") else probe)
        reply = httpx.post(f"http://{addr}/generate", json={
            "input_ids": probe, "sampling_params": {"max_new_tokens": 5, "temperature": 0.0},
            "return_logprob": True}, timeout=60).json()
        out_ids = reply["output_ids"]
        served = [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
        final = AutoModelForCausalLM.from_pretrained(run_dir / "final").eval()
        with torch.no_grad():
            logits = final(torch.tensor([probe + out_ids])).logits[0].float()
        logp = logits.log_softmax(-1)
        expected = [float(logp[len(probe) - 1 + i, t]) for i, t in enumerate(out_ids)]
        assert out_ids and max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-4

        # Rollout-only JSONL, then trainer-only mode on it (no servers).
        jsonl = tmp_path / "rollouts.jsonl"
        proc = _cli(["run", "--env", "math", *common, "inference.backend=remote", f"inference.addresses=[{addr}]",
                     "mode=rollout", "rollout.num_episodes=16", f"rollout.output_path={jsonl}",
                     "experiment_name=e2e-rollout"], env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    # the untrained model rarely solves a sum: give one episode per group reward 1, so the file carries a signal
    episodes = [json.loads(line) for line in jsonl.read_text().splitlines()]
    firsts = {e["group_id"]: i for i, e in reversed(list(enumerate(episodes)))}
    assert len(episodes) >= 16 and len(firsts) >= 4
    for i in firsts.values():
        episodes[i]["reward"] = 1.0
    jsonl.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    proc = _cli(["run", "--env", "math", *common, "mode=train", f"train_data={jsonl}", "trainer.total_steps=2",
                 "experiment_name=e2e-train"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(mode=train)" in proc.stdout and "trained from" in proc.stdout and "final model" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "runs" / "e2e-train" / "trial" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["train/loss"]) for r in rows)
    assert all(r["train/n_seqs"] == 8 for r in rows)  # batch_size x group_size episodes of the file per step
    assert all(r["time/train_s"] > 0 and r["train/computed_tokens"] >= r["train/n_tokens"] > 0 for r in rows)
    from safetensors.torch import load_file

    before = load_file(model / "model.safetensors")
    after = load_file(tmp_path / "runs" / "e2e-train" / "trial" / "final" / "model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)  # it learned
    assert all(r["train/grad_norm"] > 0 for r in rows)


def test_run_on_two_trainer_ranks_with_gloo_weight_broadcast(tmp_path: Path) -> None:
    """``trainer.nproc=2`` re-launches the run under torchrun: two FSDP2 ranks train, rank 0
    owns the embedded server and broadcasts each version to it over gloo."""
    texts = [f"{a}+{b}= {a + b}" for a in range(10, 40) for b in range(10, 40)]
    model = build_tiny_model(texts, tmp_path / "model")
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = _cli(["run", "--env", "math", f"actor.path={model}", f"output_dir={tmp_path / 'runs'}",
                 "experiment_name=ranks", "trainer.nproc=2", "trainer.weight_sync=gloo", "trainer.total_steps=3",
                 "trainer.save_every=3", "rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=6",
                 "eval.n=4", "eval.every=0", "logging.progress=false", "logging.plots=false"], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "ranks" / "trial"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["version"] for r in train] == [1, 2, 3] and all(math.isfinite(r["train/loss"]) for r in train)
    assert "goes through disk" not in proc.stdout + proc.stderr and not (run_dir / "weights").exists()
    shards = sorted(p.name for p in (run_dir / "checkpoints").rglob("*.distcp"))
    assert any(n.startswith("__0_") for n in shards) and any(n.startswith("__1_") for n in shards), shards
    assert (run_dir / "final" / "model.safetensors").exists()


def test_rerun_resumes_its_own_checkpoint_and_refuses_another_runs(tmp_path: Path) -> None:
    """A second run in the same run dir resumes (``trainer.recover=auto``) and appends to the
    metrics; a run that differs in env, model or algorithm is refused in one line and changes
    nothing there."""
    texts = [f"{a}+{b}= {a + b}" for a in range(10, 40) for b in range(10, 40)]
    model = build_tiny_model(texts, tmp_path / "model")
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    common = ["run", "--env", "math", f"actor.path={model}", f"output_dir={tmp_path / 'runs'}", "trainer.save_every=1",
              "rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=6", "eval.n=4", "eval.every=0",
              "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]  # fmt: skip
    first = _cli([*common, "trainer.total_steps=2"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "runs" / "math" / "trial"  # experiment_name defaults to the env's name
    before = {name: (run_dir / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}

    refused = _cli([*common, "trainer.total_steps=3", "algorithm.name=rloo"], env)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trainer.recover:"), refused.stderr
    assert "algorithm 'grpo' (now 'rloo')" in lines[0] and "Traceback" not in refused.stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before

    resumed = _cli([*common, "trainer.total_steps=3"], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "recovered step 2" in resumed.stdout + resumed.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]  # the first run's history is kept
