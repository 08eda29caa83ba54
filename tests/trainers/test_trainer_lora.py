"""LoRA on the FSDP2 engine: only adapters train and sit in the optimiser, the reference is the
base model with the adapter disabled, checkpoints hold adapter + optimiser and resume exactly,
and the exported adapter (PEFT) and merged model compute what the trainer computes."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
from trainer_helpers import make_cfg, make_trajs, nll_loss_fn, tiny_qwen

from areal_agents.config import ConfigError, ExperimentConfig, LoraConfig
from trainers.batching import collate
from trainers.checkpoint import Checkpointer
from trainers.engine import TrainEngine, token_logprobs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen(tmp_path_factory.mktemp("lora") / "base")


def lora_cfg(rank: int = 4, kl_ctl: float = 0.0, **lora: object) -> ExperimentConfig:
    cfg = make_cfg()
    actor = dataclasses.replace(cfg.actor, lora=LoraConfig(rank=rank, alpha=8.0, **lora))  # type: ignore[arg-type]
    return dataclasses.replace(cfg, actor=actor, algorithm=dataclasses.replace(cfg.algorithm, kl_ctl=kl_ctl))


def optim_bytes(engine: TrainEngine) -> int:
    opt = engine.actor.optimizer
    assert opt is not None
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


def plain_logprobs(model: torch.nn.Module, trajs: list) -> torch.Tensor:
    b = collate(trajs, pad_token_id=0)
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    return token_logprobs(logits, b["input_ids"])[0] * b["loss_mask"]  # the engine scores the loss mask


def test_only_adapters_train_and_the_reference_is_the_base(model_dir: Path) -> None:
    trajs = make_trajs(8)
    full = TrainEngine(make_cfg(), model_dir)
    base_logp = full.compute_logprobs(trajs)
    full.train_batch(trajs, nll_loss_fn)
    engine = TrainEngine(lora_cfg(kl_ctl=0.1), model_dir)
    assert engine.ref is None  # no second model in memory
    assert engine.actor.optimizer is not None
    in_optim = {id(p) for g in engine.actor.optimizer.param_groups for p in g["params"]}
    names = {n for n, p in engine.actor.model.named_parameters() if id(p) in in_optim}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * 2 * 7  # A and B, 2 layers x 7 linear layers
    before = {k: v.clone() for k, v in engine.full_state_dict().items() if ".lora_" not in k}
    assert torch.equal(engine.compute_logprobs(trajs), base_logp)  # lora_B starts at 0
    for _ in range(3):
        engine.train_batch(trajs, nll_loss_fn)
    after = engine.full_state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # base weights bitwise unchanged
    assert (engine.compute_logprobs(trajs) - base_logp).abs().max() > 1e-3  # the adapter learned
    assert torch.equal(engine.compute_ref_logprobs(trajs), base_logp)  # adapter disabled = base model
    assert optim_bytes(engine) * 4 < optim_bytes(full)


def test_checkpoint_holds_the_adapter_and_resumes_exactly(model_dir: Path, tmp_path: Path) -> None:
    trajs = make_trajs(8, seed=3)
    engine = TrainEngine(lora_cfg(), model_dir)
    for _ in range(2):
        engine.train_batch(trajs, nll_loss_fn)
    ckpt = Checkpointer(tmp_path / "ckpt")
    path = ckpt.save(engine, step=2, version=2)
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(path / "model")).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("actor.model.")]
    # the adapter (and the tied output embedding, which is the frozen input embedding), not the frozen base
    assert len([k for k in weights if ".lora_" in k]) == 28 and len(weights) <= 29
    assert len([k for k in saved if k.startswith("actor.optim.state.")]) >= 2 * 28  # Adam moments of each
    resumed = TrainEngine(lora_cfg(), model_dir)
    state = ckpt.load(resumed, path)
    assert state["step"] == 2 and resumed.step == 2
    assert torch.equal(resumed.compute_logprobs(trajs), engine.compute_logprobs(trajs))
    a, b = engine.train_batch(trajs, nll_loss_fn), resumed.train_batch(trajs, nll_loss_fn)
    assert a["loss"] == b["loss"]  # the optimiser moments came back too
    assert torch.equal(resumed.compute_logprobs(trajs), engine.compute_logprobs(trajs))


def test_exported_adapter_and_merged_model_match_the_trainer(model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trajs = make_trajs(6, seed=5)
    engine = TrainEngine(lora_cfg(), model_dir)
    for _ in range(2):
        engine.train_batch(trajs, nll_loss_fn)
    final = engine.export_final(tmp_path / "final")
    adapter = tmp_path / "final_adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    assert (adapter / "adapter_model.safetensors").stat().st_size * 3 < (final / "model.safetensors").stat().st_size
    ours = engine.compute_logprobs(trajs, temperature=1.0)
    merged = AutoModelForCausalLM.from_pretrained(final)
    assert (plain_logprobs(merged, trajs) - ours).abs().max() < 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft 0.21 on transformers 5
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter)
    assert (plain_logprobs(peft_model, trajs) - ours).abs().max() < 1e-5


def test_critic_trains_with_lora(model_dir: Path) -> None:
    engine = TrainEngine(lora_cfg(), model_dir, critic=True)
    assert engine.critic is not None and engine.critic.optimizer is not None
    names = {n for n, p in engine.critic.model.named_parameters() if p.requires_grad}
    assert "value_weight" in names and all(".lora_" in n or n.startswith("value_") for n in names)
    trajs = make_trajs(4, seed=7)
    before = engine.compute_values(trajs)

    def loss_fn(logp, mb, cfg, norm, *, entropy=None, values=None):  # type: ignore[no-untyped-def]
        return ((values - 1.0) ** 2 * mb["loss_mask"]).sum() / norm.tokens, {}

    for _ in range(3):
        engine.train_batch(trajs, loss_fn)
    assert not torch.equal(engine.compute_values(trajs), before)


def test_unknown_target_module_is_one_config_line(model_dir: Path) -> None:
    with pytest.raises(ConfigError) as err:
        TrainEngine(lora_cfg(target_modules=["no_such_proj"]), model_dir)
    assert str(err.value).startswith("actor.lora.target_modules: ") and "\n" not in str(err.value)


@pytest.mark.parametrize(("override", "message"), [
    (["actor.lora.rank=-1"], "actor.lora.rank: must be >= 0 (got -1)"),
    (["actor.lora.alpha=0"], "actor.lora.alpha: must be > 0 (got 0.0)"),
    (["actor.lora.dropout=1.0"], "actor.lora.dropout: must be in [0, 1) (got 1.0)"),
    (["actor.lora.target_modules=[]"], "actor.lora.target_modules: must be a non-empty list of module names (got [])"),
    (["actor.lora.rnk=4"], "actor.lora.rnk: unknown key (did you mean actor.lora.rank?)"),
    (["actor.lora.rank=8", "trainer.weight_sync=nccl", "inference.backend=remote", "inference.addresses=[h:1]"],
     "trainer.weight_sync: LoRA adapters reach SGLang servers through disk"),
])  # fmt: skip
def test_lora_config_errors_are_one_line(override: list[str], message: str) -> None:
    from areal_agents.config.loader import load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, override)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert load_config(None, ["actor.lora.rank=8"]).actor.lora.served == "policy"
    assert load_config(None, []).actor.lora.served is None  # off by default
