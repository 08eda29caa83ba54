"""Named algorithms: registry, config defaults, a user-registered algorithm, end-to-end use."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from algorithms.losses import LossNorm
from algorithms.specs import AlgorithmSpec, get_algorithm
from areal_agents.config import ConfigError
from areal_agents.config.loader import load_config
from areal_agents.registry import algorithms

BUILTINS = ("grpo", "dr-grpo", "dapo", "rloo", "reinforce++", "ppo", "decoupled-ppo", "gigpo")
ROOT = Path(__file__).resolve().parents[2]


def test_specs_module_does_not_import_torch() -> None:
    code = "import sys, algorithms.specs as s; s.GRPO.defaults; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_builtins_are_registered_and_listed() -> None:
    for name in BUILTINS:
        spec = get_algorithm(name)
        assert spec.name == name and callable(spec.advantage_fn()) and callable(spec.loss_fn())
        assert spec.formula and spec.description
    assert get_algorithm("ppo").needs_critic and not get_algorithm("grpo").needs_critic
    out = subprocess.run(["areal-agents", "list", "algorithms"], capture_output=True, text=True, check=True,
                         env={"COLUMNS": "200", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"})
    for name in BUILTINS:
        assert name in out.stdout


def test_defaults_sit_under_user_values() -> None:
    dapo = load_config(overrides=["algorithm.name=dapo"]).algorithm
    assert (dapo.eps_clip_high, dapo.loss_agg_mode, dapo.overlong_tokens) == (0.28, "token-mean", 256)
    assert load_config(overrides=["algorithm.name=dapo", "algorithm.eps_clip_high=0.4"]).algorithm.eps_clip_high == 0.4
    dr = load_config(overrides=["algorithm.name=dr-grpo"]).algorithm
    assert dr.group_std_norm is False and dr.loss_agg_mode == "seq-mean-token-sum-norm"
    dec = load_config(overrides=["algorithm.name=decoupled-ppo"]).algorithm
    assert dec.use_decoupled_loss and dec.recompute_logprob
    assert load_config(overrides=["algorithm.name=grpo"]).algorithm.use_decoupled_loss is False
    # max_response_tokens (L_max of the overlong penalty) follows agent.max_tokens unless set
    assert load_config(overrides=["agent.max_tokens=77"]).algorithm.max_response_tokens == 77
    assert load_config(overrides=["algorithm.max_response_tokens=9"]).algorithm.max_response_tokens == 9
    with pytest.raises(ConfigError, match="algorithm.overlong_tokens: must be >= 1"):
        load_config(overrides=["algorithm.overlong_tokens=0"])
    assert get_algorithm("grpo").needs_reference(load_config(overrides=["algorithm.kl_ctl=0.1"]).algorithm)
    gigpo = load_config(overrides=["algorithm.name=gigpo"]).algorithm
    assert (gigpo.group_std_norm, gigpo.step_adv_weight, gigpo.credit, gigpo.use_decoupled_loss) == (
        True, 1.0, "trajectory", False)
    assert load_config(overrides=["algorithm.name=gigpo", "algorithm.step_adv_weight=0.5"]).algorithm.step_adv_weight \
        == 0.5
    with pytest.raises(ConfigError, match="algorithm.step_adv_weight: must be >= 0"):
        load_config(overrides=["algorithm.step_adv_weight=-1"])


def test_pyproject_registers_every_builtin_spec() -> None:
    import algorithms.specs as specs

    section = (ROOT / "pyproject.toml").read_text().split('[project.entry-points."areal_agents.algorithms"]')[1]
    lines = [line for line in section.split("\n[")[0].splitlines() if "=" in line]  # no tomllib on Python 3.10
    declared = {k.strip().strip('"'): v.strip().strip('"') for k, v in (line.split("=", 1) for line in lines)}
    assert set(declared) == set(BUILTINS)
    for name, target in declared.items():
        module, attr = target.split(":")
        assert module == "algorithms.specs" and getattr(specs, attr).name == name


def test_bad_specs_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown AlgorithmConfig field"):
        AlgorithmSpec(name="x", advantage="algorithms.advantages:grpo_advantages", defaults={"eps": 1})
    with pytest.raises(ValueError, match=r"field\(s\) \['gamma', 'lam'\] \(gamma: renamed to token_discount; "
                                         r"lam: renamed to gae_lambda\)$"):
        AlgorithmSpec(name="x", advantage="algorithms.advantages:grpo_advantages", defaults={"lam": 0.9, "gamma": 1})
    with pytest.raises(ValueError, match="module:attr"):
        AlgorithmSpec(name="x", advantage="grpo_advantages")


def synthetic_batch(bsz: int = 6, width: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(bsz, width, dtype=torch.bool)
    mask[:, 1:] = torch.rand(bsz, width - 1, generator=g) < 0.8
    behav = torch.where(mask, -torch.rand(bsz, width, generator=g), 0.0)
    return {
        "input_ids": torch.randint(0, 50, (bsz, width), generator=g),
        "attention_mask": torch.ones(bsz, width, dtype=torch.bool),
        "loss_mask": mask,
        "logprobs": behav,
        "prox_logp": behav,
        "ref_logp": behav - 0.1,
        "values": torch.randn(bsz, width, generator=g),
        "rewards": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]),
        "turn_returns": torch.where(mask, 0.5, 0.0),
        "group_ids": torch.tensor([0, 0, 0, 1, 1, 1]),
        "state_ids": torch.where(mask, torch.arange(width) % 2, -1),
        "no_eos": torch.tensor([False, False, True, False, False, False]),
        "response_lengths": mask.sum(-1),
    }


@pytest.mark.parametrize("name", BUILTINS)
def test_each_named_algorithm_trains_one_step(name: str) -> None:
    spec = get_algorithm(name)
    cfg = load_config(overrides=[f"algorithm.name={name}", "algorithm.kl_ctl=0.05", "agent.max_tokens=4"]).algorithm
    batch = synthetic_batch()
    given = dict(batch)
    batch["advantages"] = spec.advantage_fn()(batch, cfg)
    assert given.keys() | {"advantages"} == batch.keys()  # the estimator wrote nothing into the batch
    assert batch["advantages"].shape == batch["loss_mask"].shape
    assert bool(batch["advantages"].abs().sum() > 0)
    assert spec.needs_critic == (spec.value_targets is not None)
    if spec.needs_critic:  # what the recipe does for a critic
        batch["returns"] = spec.value_targets_fn()(batch, cfg)
    logp = (batch["logprobs"] + 0.05).requires_grad_()
    values = (batch["values"] + 0.1).requires_grad_() if spec.needs_critic else None
    loss, metrics = spec.loss_fn()(logp, batch, cfg, LossNorm.from_batch(batch, 4), values=values)
    loss.backward()
    assert logp.grad is not None and bool(torch.isfinite(logp.grad).all()) and bool(logp.grad.abs().sum() > 0)
    assert metrics["train/loss"] == pytest.approx(loss.item())
    assert ("train/value_loss" in metrics) == spec.needs_critic
    assert ("train/imp_weight_mean" in metrics) == cfg.use_decoupled_loss


USER_FILE = '''
"""A user's algorithm in one file: REINFORCE on turn-level returns with ReBN."""
from algorithms.specs import AlgorithmSpec
from areal_agents import register_algorithm

MY_ALGO = register_algorithm("{name}")(AlgorithmSpec(
    name="{name}",
    advantage="algorithms.advantages:reinforce_advantages",
    loss="algorithms.losses:ppo_loss",
    defaults={{"rebn": True, "credit": "turn", "use_decoupled_loss": False, "eps_clip": 0.1}},
    description="REINFORCE + return batch normalisation",
    formula="A_t = (G_t - mean_B G) / std_B G",
))
'''


def test_custom_algorithm_from_a_user_file(tmp_path: Path) -> None:
    name = "reinforce-rebn-test"
    path = tmp_path / "my_algo.py"
    path.write_text(textwrap.dedent(USER_FILE.format(name=name)))
    module_spec = importlib.util.spec_from_file_location("my_algo", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        assert name in algorithms.names() and get_algorithm(name) is module.MY_ALGO
        cfg = load_config(overrides=[f"algorithm.name={name}"]).algorithm
        assert (cfg.name, cfg.rebn, cfg.credit, cfg.eps_clip) == (name, True, "turn", 0.1)
        batch = synthetic_batch()
        ends = torch.tensor([5, 4, 3, 5, 2, 4])[:, None]  # one contiguous turn per row
        batch["loss_mask"] = (torch.arange(5) >= 1) & (torch.arange(5) < ends)
        batch["turn_returns"] = torch.where(batch["loss_mask"], batch["rewards"][:, None], 0.0)
        adv = get_algorithm(name).advantage_fn()(batch, cfg)
        # ReBN of episode-level turn returns 1,0,1,1,0,0 (one turn each): mean .5, std .5 -> +-1
        expected = torch.where(batch["loss_mask"], batch["rewards"][:, None] * 2 - 1, 0.0)
        torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    finally:
        algorithms.remove(name)
    with pytest.raises(ConfigError, match="algorithm.name"):
        load_config(overrides=[f"algorithm.name={name}"])


@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILTINS)
def test_each_named_algorithm_on_cuda(name: str) -> None:
    if not torch.cuda.is_available():
        pytest.fail("the gpu marker needs a CUDA device")
    spec = get_algorithm(name)
    cfg = load_config(overrides=[f"algorithm.name={name}", "algorithm.kl_ctl=0.05", "agent.max_tokens=4"]).algorithm
    cpu = synthetic_batch()
    batch = {k: v.cuda() for k, v in cpu.items()}
    batch["advantages"] = spec.advantage_fn()(batch, cfg)
    cpu["advantages"] = spec.advantage_fn()(cpu, cfg)
    torch.testing.assert_close(batch["advantages"].cpu(), cpu["advantages"])
    if spec.needs_critic:
        batch["returns"] = spec.value_targets_fn()(batch, cfg)
    logp = (batch["logprobs"] + 0.05).requires_grad_()
    values = (batch["values"] + 0.1).requires_grad_() if spec.needs_critic else None
    loss, _ = spec.loss_fn()(logp, batch, cfg, LossNorm.from_batch(batch, 4), values=values)
    loss.backward()
    assert loss.device.type == "cuda" and bool(torch.isfinite(logp.grad).all())  # type: ignore[arg-type]
