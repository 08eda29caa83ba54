"""Logprobs only where they are used: the output layer at the scored positions, same numbers and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import linear_adam, make_cfg, make_trajs, nll_loss_fn, tiny_qwen

from trainers.batching import collate
from trainers.engine import TrainEngine
from trainers.logprobs import head_only_at, logprobs_at, scored_tokens, token_logprobs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen(tmp_path_factory.mktemp("tiny") / "model")


def test_head_only_at_gives_the_full_logits_at_the_chosen_positions(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(3, 60, (3, 11), generator=torch.Generator().manual_seed(0))
    full = model(input_ids=ids).logits  # [3, 11, V]
    index = torch.tensor([0, 5, 12, 32, 21])  # flat positions n*11 + l, any order
    with head_only_at(model, index):
        part = model(input_ids=ids).logits
    assert part.shape == (1, len(index), full.shape[-1])
    torch.testing.assert_close(part[0], full.reshape(-1, full.shape[-1])[index], atol=1e-6, rtol=1e-6)
    assert model(input_ids=ids).logits.shape == full.shape  # the hook is gone afterwards


def test_logprobs_at_match_token_logprobs() -> None:
    logits = torch.randn(2, 6, 9, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 9, (2, 6), generator=torch.Generator().manual_seed(2))
    want, want_ent = token_logprobs(logits, ids, 0.7, with_entropy=True)
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([3, 1, 5])
    got, ent = logprobs_at(logits[rows, cols - 1], ids[rows, cols], 0.7, with_entropy=True)
    assert ent is not None and want_ent is not None
    torch.testing.assert_close(got, want[rows, cols])
    torch.testing.assert_close(ent, want_ent[rows, cols])


def test_scored_tokens_are_the_loss_mask_never_the_first_token() -> None:
    attn = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    loss = torch.tensor([[1, 0, 1, 1, 1], [0, 0, 1, 0, 1]], dtype=torch.bool)  # padding is never scored
    got = scored_tokens({"attention_mask": attn, "loss_mask": loss})
    assert got.tolist() == [[False, False, True, True, False], [False, False, True, False, True]]
    # without a loss mask, or with an empty one: every real token after the first
    real = [[False, True, True, True, False], [False, True, True, True, True]]
    assert scored_tokens({"attention_mask": attn}).tolist() == real
    assert scored_tokens({"attention_mask": attn, "loss_mask": torch.zeros_like(loss)}).tolist() == real


@pytest.mark.parametrize("pack", [False, True], ids=["unpacked", "packed"])
def test_an_update_equals_a_plain_step_on_the_full_logits(model_dir: Path, pack: bool) -> None:
    """The engine's step (output layer at the loss mask only) moves the weights exactly as a plain
    PyTorch step over every position's logits with the same loss."""
    from transformers import AutoModelForCausalLM

    trajs = make_trajs(8, seed=4)
    for i, t in enumerate(trajs):  # share prompts, so the packed case really packs
        t.input_ids[:4] = trajs[i - i % 4].input_ids[:4]
    engine = TrainEngine(make_cfg(pack_prompts=pack), model_dir)
    linear_adam(engine)
    lr = engine.train_batch(trajs, nll_loss_fn)["lr"]  # the schedule's first value

    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    b = collate(trajs, pad_token_id=0)
    logp = token_logprobs(plain(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                          b["input_ids"])[0]
    mask = b["loss_mask"].float()
    (-(logp * b["turn_returns"] * mask).sum() / mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
    opt = torch.optim.AdamW(plain.parameters(), lr=lr, eps=1.0, weight_decay=engine.cfg.actor.weight_decay,
                            betas=tuple(engine.cfg.actor.betas))
    opt.step()
    after = engine.full_state_dict()
    for name, p in plain.state_dict().items():
        torch.testing.assert_close(after[name], p, atol=1e-7, rtol=1e-5, msg=name)
