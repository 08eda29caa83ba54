"""examples/custom_algorithm: a median-baseline advantage estimator registered from one file and trained."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from examples_support import ROOT, TINY, metrics_rows, run_command, train_steps

from areal_agents.config import AlgorithmConfig
from areal_agents.config.loader import load_config
from areal_agents.registry import algorithms


@pytest.fixture(scope="module")
def median_grpo() -> Iterator[ModuleType]:
    path = ROOT / "examples" / "custom_algorithm" / "median_grpo.py"
    spec = importlib.util.spec_from_file_location("median_grpo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    algorithms.remove("median-grpo")


def _batch(rewards: list[float], groups: list[int], lengths: list[int]) -> dict[str, torch.Tensor]:
    mask = torch.zeros(len(rewards), max(lengths) + 2, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, 2 : 2 + n] = True  # two prompt tokens, then n generated
    return {"loss_mask": mask, "rewards": torch.tensor(rewards), "group_ids": torch.tensor(groups)}


def test_median_baseline_values(median_grpo: ModuleType) -> None:
    cfg = AlgorithmConfig(name="median-grpo", adv_eps=0.0)
    # group 0: rewards 0, 0, 1 -> median 0, MAD 1/3; group 1: 1, 0, 0.5, 1 -> median 0.75, MAD 0.375
    batch = _batch([0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0], [7, 7, 7, 3, 3, 3, 3], [1, 2, 3, 1, 2, 3, 4])
    adv = median_grpo.median_advantages(batch, cfg)
    expected = [0.0, 0.0, 3.0, 0.25 / 0.375, -0.75 / 0.375, -0.25 / 0.375, 0.25 / 0.375]
    assert adv.shape == batch["loss_mask"].shape and adv.dtype == torch.float32
    for i, want in enumerate(expected):
        row = adv[i][batch["loss_mask"][i]]
        assert torch.allclose(row, torch.full_like(row, want), atol=1e-6), (i, row, want)
    assert (adv[~batch["loss_mask"]] == 0).all()
    # equal rewards: no signal; the median ignores one outlier that would move GRPO's mean
    flat = median_grpo.median_advantages(_batch([0.5, 0.5, 0.5], [1, 1, 1], [2, 2, 2]), AlgorithmConfig())
    assert (flat == 0).all()
    outlier = median_grpo.median_advantages(_batch([0.0, 0.0, 0.0, 100.0], [1, 1, 1, 1], [1] * 4), cfg)
    assert outlier[:, 2].tolist() == [0.0, 0.0, 0.0, 4.0]  # median 0, MAD 25


def test_turn_credit_is_rejected(median_grpo: ModuleType) -> None:
    cfg = dataclasses.replace(AlgorithmConfig(), credit="turn")
    with pytest.raises(ValueError, match="credit=trajectory only"):
        median_grpo.median_advantages(_batch([1.0], [0], [1]), cfg)


def test_registration_applies_the_spec_defaults(median_grpo: ModuleType) -> None:
    median_grpo.register()
    median_grpo.register()  # importing/registering the same object twice is not a clash
    cfg = load_config(str(ROOT / "examples" / "custom_algorithm" / "config.yaml"), ["algorithm.eps_clip=0.3"])
    assert cfg.algorithm.name == "median-grpo" and algorithms.get("median-grpo") is median_grpo.MEDIAN_GRPO
    assert cfg.algorithm.loss_agg_mode == "token-mean" and cfg.algorithm.use_decoupled_loss is False
    assert cfg.algorithm.eps_clip == 0.3 and cfg.algorithm.adv_eps == 0.01  # the user's values win


def test_script_trains_with_the_new_estimator(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    warm_cache("math-tiny")
    run_command([sys.executable, "examples/custom_algorithm/median_grpo.py", "--config",
                 "examples/custom_algorithm/config.yaml", *TINY, f"output_dir={tmp_path / 'runs'}"], tmp_path)
    run_dir = tmp_path / "runs" / "custom-algorithm" / "median-grpo"
    assert "name: median-grpo" in (run_dir / "config.yaml").read_text()
    steps = train_steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["version"] == 2
    assert all(r["train/n_seqs"] == 4 for r in steps)  # batch_size 2 x group_size 2


# Two groups of three episodes with known rewards and different lengths, trained in trainer-only
# mode (mode=train) from a JSONL whose behaviour logprobs are the model's own, so the first step's
# ratio is 1 and its policy loss is minus the token-mean advantage: that pins down which
# estimator produced the advantages.
REWARDS = [[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
LENGTHS = [[3, 5, 9], [2, 4, 11]]


def _token_mean(advantages: list[list[float]]) -> float:
    weighted = sum(a * n for group, lens in zip(advantages, LENGTHS, strict=True) for a, n in zip(group, lens, strict=True))
    return weighted / sum(map(sum, LENGTHS))


def test_script_trains_with_the_median_advantages(tmp_path: Path) -> None:
    import transformers

    from areal_agents.types import Trajectory
    from trainers.tiny_model import build_tiny_model

    model_dir = build_tiny_model([f"{a}+{b}={a + b}" for a in range(20) for b in range(20)], tmp_path / "model",
                                 hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for g, (rewards, lengths) in enumerate(zip(REWARDS, LENGTHS, strict=True)):
        for reward, n in zip(rewards, lengths, strict=True):
            ids = torch.randint(10, 200, (4 + n,), generator=gen)  # 4 prompt tokens, n generated
            with torch.no_grad():
                logp = torch.log_softmax(model(ids[None]).logits[0, :-1].float(), -1).gather(-1, ids[1:, None])[:, 0]
            behaviour = [0.0] * 4 + logp[3:].tolist()
            rows.append(Trajectory(input_ids=ids.tolist(), loss_mask=[0] * 4 + [1] * n, logprobs=behaviour,
                                   versions=[-1] * 4 + [0] * n, turn_rewards=[reward], turn_spans=[(4, 4 + n)],
                                   turn_returns=[reward], reward=reward, group_id=f"g{g}").to_json())
    data = tmp_path / "episodes.jsonl"
    data.write_text("\n".join(rows) + "\n")
    run_command([sys.executable, "examples/custom_algorithm/median_grpo.py", "--config",
                 "examples/custom_algorithm/config.yaml", "mode=train", f"train_data={data}", f"actor.path={model_dir}",
                 "rollout.batch_size=2", "rollout.group_size=3", "trainer.total_steps=1", "logging.plots=false",
                 "logging.tensorboard=false", "logging.progress=false", f"output_dir={tmp_path / 'runs'}"], tmp_path)
    step = next(r for r in metrics_rows(tmp_path / "runs" / "custom-algorithm" / "median-grpo") if "train/pg_loss" in r)
    eps = 0.01  # adv_eps in the example's config.yaml
    # median 0, mean |R - 0| = 1/3; median 1, mean |R - 1| = 1/3
    median = [[0.0, 0.0, 1 / (1 / 3 + eps)], [0.0, 0.0, -1 / (1 / 3 + eps)]]
    mean = [[(r - sum(g) / 3) / (torch.tensor(g).std().item() + eps) for r in g] for g in REWARDS]  # GRPO's baseline
    assert step["train/pg_loss"] == pytest.approx(-_token_mean(median), abs=1e-4), step
    assert abs(_token_mean(median) - _token_mean(mean)) > 0.05  # GRPO's advantages would be told apart (0.07 here)
    assert step["train/n_seqs"] == 6 and step["train/clip_frac"] == 0.0  # all six episodes, ratio 1
