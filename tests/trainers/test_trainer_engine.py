"""FSDP2 engine: micro-batch/rank invariance, logprob alignment, HF export round trip."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from trainer_helpers import (
    VOCAB,
    hsdp_worker,
    linear_adam,
    make_cfg,
    make_trajs,
    mismatch_step,
    mismatch_worker,
    nll_loss_fn,
    one_step_cfg,
    step_batch,
    tiny_qwen,
    train_worker,
)

from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory
from trainers.batching import EpisodeTooLong
from trainers.dist import spawn
from trainers.engine import TrainEngine, lr_lambda, token_logprobs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen(tmp_path_factory.mktemp("tiny") / "model")


def _params(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.full_state_dict().items()}


def test_logprobs_match_plain_forward(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    trajs = make_trajs(6, seed=3)
    engine = TrainEngine(make_cfg(max_tokens_per_mb=64), model_dir)
    got = engine.compute_logprobs(trajs, temperature=0.7)
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for i, t in enumerate(trajs):
        ids = torch.tensor([t.input_ids])
        logits = ref_model(input_ids=ids).logits[0]
        want = torch.log_softmax(logits[:-1] / 0.7, -1).gather(-1, ids[0, 1:, None])[:, 0]
        scored = torch.tensor(t.loss_mask[1:], dtype=torch.bool)  # the output layer runs only there
        assert scored.any() and not scored.all()
        assert got[i, 0] == 0
        torch.testing.assert_close(got[i, 1 : len(t.input_ids)][scored], want[scored], atol=1e-5, rtol=1e-5)
        assert torch.all(got[i, 1 : len(t.input_ids)][~scored] == 0)
        assert torch.all(got[i, len(t.input_ids) :] == 0)


def test_micro_batches_do_not_change_the_loss(model_dir: Path) -> None:
    trajs = make_trajs(12, seed=1)
    one = TrainEngine(make_cfg(max_tokens_per_mb=100_000), model_dir)
    many = TrainEngine(make_cfg(max_tokens_per_mb=60), model_dir)
    for _ in range(3):
        a = one.train_batch(trajs, nll_loss_fn)
        b = many.train_batch(trajs, nll_loss_fn)
        assert a["n_mbs"] == 1 and b["n_mbs"] >= 4
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    pa, pb = _params(one), _params(many)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-5, rtol=1e-4)
    assert a["loss"] < one.train_batch(trajs, nll_loss_fn)["loss"] + 1.0  # it trains without diverging


def test_two_ranks_equal_one_process(model_dir: Path, tmp_path: Path) -> None:
    # Full sharding (mesh 2) and HSDP (2 replicas x 1 shard), in the same two processes. A tiny
    # token budget gives the ranks different numbers of micro-batches (empty ones are padded).
    actors = [{"max_tokens_per_mb": 70, "hsdp_replicate": 1}, {"max_tokens_per_mb": 70, "hsdp_replicate": 2}]
    out = tmp_path / "two.pt"
    spawn(train_worker, 2, str(model_dir), str(out), 3, actors)
    results = torch.load(out)
    single = TrainEngine(make_cfg(max_tokens_per_mb=70), model_dir)
    assert not single.actor.sharded  # one float32 rank runs the plain module
    torch.manual_seed(0)
    losses = [single.train_batch(step_batch(s), nll_loss_fn)["loss"] for s in range(3)]
    logp = single.compute_logprobs(step_batch(3))
    mine = single.full_state_dict()
    for two in results:
        assert two["losses"] == pytest.approx(losses, rel=1e-5)
        torch.testing.assert_close(two["logp"], logp, atol=1e-5, rtol=1e-5)
        assert set(two["state"]) == set(mine)
        for k, v in mine.items():
            torch.testing.assert_close(two["state"][k], v, atol=1e-4, rtol=1e-4)  # Adam steps are ~lr=1e-2


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all tensors."""
    num = sum(float((a[k] - b[k]).double().pow(2).sum()) for k in b)
    return (num / sum(float(b[k].double().pow(2).sum()) for k in b)) ** 0.5


def test_one_rank_state_dict_is_the_gather_it_skips(model_dir: Path) -> None:
    """One rank reads its weights off the module (every step's weight sync): the same names and
    values as the checkpoint gather it skips, for the bfloat16-sharded module too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    for cfg in (make_cfg(), make_cfg(dtype="bfloat16")):
        engine = TrainEngine(cfg, model_dir)
        got = engine.full_state_dict()
        want = get_model_state_dict(engine.actor.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        assert set(got) == set(want) and "lm_head.weight" in got
        for k, v in want.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


@pytest.mark.slow
def test_hsdp_two_replicas_of_two_shards(model_dir: Path, tmp_path: Path) -> None:
    """4 gloo ranks, mesh (replicate=2, shard=2): sharded inside a replica group, replicated
    across groups, and one step equal to the single-process step (float32 and bfloat16 reduce)."""
    spawn(hsdp_worker, 4, str(model_dir), str(tmp_path), ["float32", "bfloat16"])
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    single = TrainEngine(one_step_cfg(), model_dir)
    linear_adam(single)
    before = {k: v.clone() for k, v in single.full_state_dict().items()}
    torch.manual_seed(0)
    want = single.train_batch(step_batch(0), nll_loss_fn)
    want_delta = {k: v - before[k] for k, v in single.full_state_dict().items()}
    deltas = {}
    for dtype in ("float32", "bfloat16"):
        runs = [r[dtype] for r in ranks]
        assert runs[0]["mesh"] == [[0, 1], [2, 3]] and runs[0]["dims"] == ("replicate", "shard")
        assert set(runs[0]["reduce_dtypes"].values()) == {f"torch.{dtype}"}  # every FSDP module's policy
        assert {"FSDPQwen2DecoderLayer", "FSDPQwen2ForCausalLM"} <= set(runs[0]["reduce_dtypes"])
        assert len(runs[0]["params"]) >= 20  # every parameter (the tied lm_head is the embedding)
        for name in runs[0]["params"]:
            full = runs[0]["before"][name]
            p = [run["params"][name] for run in runs]
            assert p[0]["placements"] == ["Replicate()", "Shard(dim=0)"], (name, p[0]["placements"])
            for when, state in (("local_before", runs[0]["before"]), ("local_after", runs[0]["after"])):
                # ranks 0 and 1 (replica group 0) each hold half of dim 0; 2 and 3 hold the same halves
                assert p[0][when].shape[0] * 2 == full.shape[0] and p[0][when].shape[1:] == full.shape[1:]
                torch.testing.assert_close(torch.cat([p[0][when], p[1][when]]), state[name], rtol=0, atol=0)
                assert torch.equal(p[0][when], p[2][when]) and torch.equal(p[1][when], p[3][when])
        assert all(torch.equal(run["after"][k], runs[0]["after"][k]) for run in runs for k in run["after"])
        torch.testing.assert_close(runs[0]["before"], before, rtol=0, atol=0)
        assert runs[0]["metrics"]["loss"] == pytest.approx(want["loss"], rel=1e-5)
        deltas[dtype] = {k: v - before[k] for k, v in runs[0]["after"].items()}
    assert _rel(deltas["float32"], want_delta) < 1e-5
    # bfloat16 reduce: about 3 significant digits on the gradient, visibly not the float32 reduce
    assert 1e-4 < _rel(deltas["bfloat16"], want_delta) < 3e-2
    assert _rel(deltas["bfloat16"], deltas["float32"]) > 1e-4
    assert ranks[0]["bfloat16"]["metrics"]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-2)


def test_export_reloads_with_identical_logits(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    engine = TrainEngine(make_cfg(), model_dir)
    trajs = make_trajs(8, seed=5)
    engine.train_batch(trajs, nll_loss_fn)
    out = engine.export_hf(tmp_path / "export")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not any(p.name.startswith(".export") for p in tmp_path.iterdir())  # no temp dir left behind
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    batch = engine.to_batch(trajs)
    want = engine.compute_logprobs(batch, temperature=1.0)
    logits = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    got = token_logprobs(logits, batch["input_ids"])[0] * batch["loss_mask"]  # the engine scores the loss mask
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_reference_model_stays_frozen_and_critic_trains(model_dir: Path) -> None:
    engine = TrainEngine(make_cfg(), model_dir, critic=True, reference=True)  # the engine reads no algorithm config
    trajs = make_trajs(6, seed=9)
    ref0 = engine.compute_ref_logprobs(trajs)
    v0 = engine.compute_values(trajs)

    def loss_with_value(logp, mb, cfg, norm, *, entropy=None, values=None):
        pg, metrics = nll_loss_fn(logp, mb, cfg, norm)
        mask = mb["loss_mask"].float()
        vloss = (((values - mb["turn_returns"]) ** 2) * mask).sum() / norm.tokens
        return pg + vloss, {**metrics, "vloss": float(vloss.detach())}

    m = [engine.train_batch(trajs, loss_with_value) for _ in range(3)]
    torch.testing.assert_close(engine.compute_ref_logprobs(trajs), ref0)
    assert not torch.allclose(engine.compute_logprobs(trajs), ref0)
    assert not torch.allclose(engine.compute_values(trajs), v0)
    assert m[-1]["vloss"] < m[0]["vloss"] and m[0]["critic/grad_norm"] > 0


@pytest.mark.parametrize("from_actor", [True, False])
def test_critic_body_starts_from_the_actor_or_from_scratch(model_dir: Path, from_actor: bool) -> None:
    cfg = make_cfg()
    cfg.actor.init_critic_from_actor = from_actor
    engine = TrainEngine(cfg, model_dir, critic=True)
    actor = dict(engine.actor.model.named_parameters())
    body = {f"model.{k}": v for k, v in engine.critic.model.body.named_parameters()}
    assert body and set(body) <= set(actor)
    # matrices only: norms start at 1 and biases at 0 either way
    same = [torch.equal(v, actor[k]) for k, v in body.items() if k.endswith("weight") and "norm" not in k]
    assert all(same) if from_actor else not any(same)


def test_lr_schedule() -> None:
    assert [lr_lambda(s, 2, 10, "constant", 0.1) for s in (0, 1, 5)] == [0.5, 1.0, 1.0]
    assert lr_lambda(2, 2, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_lambda(10, 2, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert 0.1 < lr_lambda(6, 2, 10, "cosine", 0.1) < 1.0


def test_grpo_step_is_invariant_to_micro_batches(model_dir: Path) -> None:
    from algorithms.specs import get_algorithm

    spec = get_algorithm("grpo")
    engines = [TrainEngine(make_cfg(max_tokens_per_mb=b), model_dir) for b in (100_000, 50)]
    trajs = make_trajs(16, seed=11)
    results = []
    for engine in engines:
        batch = engine.to_batch(trajs)
        batch["prox_logp"] = engine.compute_logprobs(batch, 1.0)
        batch["advantages"] = spec.advantage_fn()(batch, engine.cfg.algorithm)
        results.append([engine.train_batch(batch, spec.loss_fn(), temperature=1.0) for _ in range(2)][-1])
    one, many = results
    assert many["n_mbs"] > 4 * one["n_mbs"]
    assert one["loss"] == pytest.approx(many["loss"], rel=1e-5, abs=1e-7)
    assert one["train/loss"] == pytest.approx(one["loss"], rel=1e-6, abs=1e-9)
    for k in ("train/clip_frac", "train/imp_weight_mean", "train/entropy"):
        assert one[k] == pytest.approx(many[k], rel=1e-5, abs=1e-7)
    assert one["grad_norm"] == pytest.approx(many["grad_norm"], rel=1e-4) and one["grad_norm"] > 0


@pytest.mark.parametrize(("mode", "correction"), [("auto", "mask"), ("sequence", "truncate")])
def test_mismatch_weight_metrics_of_a_train_step(model_dir: Path, tmp_path: Path, mode: str, correction: str) -> None:
    from algorithms.importance import WEIGHT_METRIC_NAMES

    # one micro-batch, many, and (sequence mode) two ranks of several each: extremes are never summed
    (one, w, capped, mask), (many, *_) = (mismatch_step(model_dir, 1, budget, mode, correction) for budget in (100_000, 60))
    runs = [one, many]
    if mode == "sequence":
        spawn(mismatch_worker, 2, str(model_dir), str(tmp_path / "two.pt"), mode, correction)
        runs.append(torch.load(tmp_path / "two.pt"))
    assert one["n_mbs"] == 1 and many["n_mbs"] > 2 and set(WEIGHT_METRIC_NAMES) <= set(one)
    assert bool(capped.any()) and not bool(capped[mask].all())
    expected = {"train/behav_imp_weight": float(w.sum()) / float(mask.sum()),
                "train/behav_imp_weight_max": float(w[mask].max()), "train/behav_imp_weight_min": float(w[mask].min()),
                "train/behav_imp_weight_capped_frac": float(capped.sum()) / float(mask.sum())}
    for run in runs:
        for k, v in expected.items():
            assert run[k] == pytest.approx(v, rel=1e-4), k
    # the decoupled loss (make_cfg's algorithm) keeps its own names for the weight it applies
    assert one["train/imp_weight_mean"] == one["train/behav_imp_weight"]


def test_bfloat16_mixed_precision_keeps_float32_master_weights(model_dir: Path) -> None:
    trajs = make_trajs(8, seed=4)
    fp32 = TrainEngine(make_cfg(), model_dir)
    bf16 = TrainEngine(make_cfg(dtype="bfloat16"), model_dir)
    assert bf16.actor.sharded and not fp32.actor.sharded
    a, b = fp32.train_batch(trajs, nll_loss_fn), bf16.train_batch(trajs, nll_loss_fn)
    assert b["loss"] == pytest.approx(a["loss"], rel=2e-2)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())  # sharded master copy
    assert all(opt_state["exp_avg"].dtype == torch.float32 for opt_state in bf16.actor.optimizer.state.values())


def _groups_sharing_prompts(n_groups: int, size: int, seed: int) -> list[Trajectory]:
    """``size`` samples per prompt (some multi-turn, mixed lengths) as GRPO groups have them."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.randint(3, 12))]
        for _ in range(size):
            turns = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 2))]
            ids, mask, spans = list(prompt), [0] * len(prompt), []
            for k, turn in enumerate(turns):
                if k:  # an env reply between turns
                    ids += [5, 6]
                    mask += [0, 0]
                spans.append((len(ids), len(ids) + len(turn)))
                ids += turn
                mask += [1] * len(turn)
            traj = Trajectory(input_ids=ids, loss_mask=mask, logprobs=[-rng.random() if m else 0.0 for m in mask],
                              versions=[0 if m else -1 for m in mask], turn_spans=spans, group_id=f"g{g}")
            traj.set_rewards([rng.random() for _ in spans])
            settle_returns(traj, 0.9)  # as the rollout leaves it
            out.append(traj)
    return out


def _games(shared_turns: int, seed: int, turns: int | None = None) -> list[Trajectory]:
    """Two groups of eight multi-turn episodes (a short prompt, ``turns`` or up to seven turns of a
    short reply and the env's answer); the episodes of a group play the same first ``shared_turns`` turns."""
    rng = random.Random(seed)
    trajs = []
    for g in range(2):
        prompt = [rng.randrange(2, VOCAB) for _ in range(6)]
        opening = [[rng.randrange(2, VOCAB) for _ in range(3)] for _ in range(shared_turns)]
        for _ in range(8):
            ids, mask, spans = list(prompt), [0] * 6, []
            for k in range(turns or rng.randint(max(1, shared_turns), 7)):
                spans.append((len(ids), len(ids) + 3))
                ids += (opening[k] if k < shared_turns else [rng.randrange(2, VOCAB) for _ in range(3)])
                ids += [5, 6, 7, 8, 9, 10, 11, 12]
                mask += [1, 1, 1] + [0] * 8
            traj = Trajectory(input_ids=ids, loss_mask=mask, logprobs=[-0.5 if m else 0.0 for m in mask],
                              versions=[0 if m else -1 for m in mask], turn_spans=spans, group_id=f"g{g}")
            traj.set_rewards([0.0] * (len(spans) - 1) + [1.0])
            settle_returns(traj)
            trajs.append(traj)
    return trajs


def test_long_episodes_after_a_short_shared_prompt_are_not_packed(model_dir: Path) -> None:
    """Episodes that share only a short prompt save too little to pay for a packed layout's longer
    attention; a group whose episodes play the same first turns packs."""
    from trainers.batching import collate, seq_lens
    from trainers.prefix_packing import pack_prefixes

    batch = collate(_games(0, seed=3, turns=6))  # rows of one length: nothing to save but the prompts
    assert pack_prefixes(batch["input_ids"], seq_lens(batch)) is not None  # which save a few tokens, but
    engine = TrainEngine(make_cfg(pack_prompts=True, lr=1e-3), model_dir)
    assert engine.actor._packed(batch) is None
    assert engine.actor._packed(collate(_games(3, seed=3))) is not None
    assert engine.actor._packed(collate(_groups_sharing_prompts(4, 8, seed=5))) is not None  # short answers too


@pytest.mark.parametrize("kind", ["single-turn", "multi-turn"])
def test_packed_prefixes_give_the_same_logprobs_loss_and_update(model_dir: Path, kind: str) -> None:
    from algorithms.specs import get_algorithm
    from trainers.batching import collate, select, seq_lens
    from trainers.prefix_packing import pack_prefixes

    trajs = _groups_sharing_prompts(4, 8, seed=5) if kind == "single-turn" else _games(3, seed=4)
    batch = collate(trajs)
    packed = pack_prefixes(batch["input_ids"], seq_lens(batch))
    assert packed is not None
    assert int(packed.attention_mask.sum()) < int(batch["attention_mask"].sum()) ** 2  # and far fewer tokens:
    assert sum(int(x) for x in (packed.input_ids != 0).sum(1)) < 0.8 * int(batch["attention_mask"].sum())

    spec = get_algorithm("grpo")
    engines = {p: TrainEngine(make_cfg(pack_prompts=p, lr=1e-3), model_dir) for p in (False, True)}
    assert engines[True].actor._packed(batch) is not None and engines[False].actor._packed(batch) is None
    got = {p: e.compute_logprobs(trajs, temperature=0.8) for p, e in engines.items()}
    torch.testing.assert_close(got[True], got[False], atol=2e-5, rtol=1e-5)
    stats = {}
    for p, engine in engines.items():
        b = engine.to_batch(trajs)
        b["advantages"] = spec.advantage_fn()(b, engine.cfg.algorithm)
        stats[p] = [engine.train_batch(b, spec.loss_fn(), detached_logp_key="prox_logp") for _ in range(2)]
    for k in ("loss", "grad_norm", "train/entropy", "train/clip_frac"):
        assert stats[True][-1][k] == pytest.approx(stats[False][-1][k], rel=1e-4, abs=1e-6), k
    # the step reports the positions its forward passes ran: the padded rows, or the packed layout's
    lens, mbs = seq_lens(batch), engines[False]._plan(batch)[1]
    padded = sum(len(mb) * max(lens[i] for i in mb) for mb in mbs)
    packed_run = sum(engines[True].actor._packed(select(batch, mb)).input_ids.numel() for mb in mbs)  # type: ignore[union-attr]
    assert stats[False][0]["computed_tokens"] == padded and stats[True][0]["computed_tokens"] == packed_run < padded
    pa, pb = _params(engines[True]), _params(engines[False])
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-5, rtol=1e-4)


def test_an_episode_longer_than_the_model_or_the_budget_is_refused_in_one_line(model_dir: Path) -> None:
    engine = TrainEngine(make_cfg(max_tokens_per_mb=200), model_dir)  # the model knows 256 positions
    (fits,) = make_trajs(1, seed=5, min_len=190, max_len=190)
    assert math.isfinite(engine.train_batch([fits], nll_loss_fn)["loss"])
    (over_budget,) = make_trajs(1, seed=5, min_len=230, max_len=230)
    over_budget.info["episode_id"] = "rollout-7-3"
    with pytest.raises(EpisodeTooLong) as err:
        engine.train_batch([fits, over_budget], nll_loss_fn)
    assert str(err.value).startswith("episode rollout-7-3 has 230 tokens, more than one micro-batch takes "
                                     "(actor.max_tokens_per_mb=200): raise actor.max_tokens_per_mb to at least 230")
    (over_context,) = make_trajs(1, seed=5, min_len=300, max_len=300)
    with pytest.raises(EpisodeTooLong, match=r"^episode 0 has 300 tokens, more than the model's context \(256 positions\)"):
        TrainEngine(make_cfg(), model_dir).compute_logprobs([over_context])
    assert "\n" not in str(err.value)


def test_an_8k_token_episode_trains_with_activation_checkpointing(tmp_path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "long")
    (episode,) = make_trajs(1, seed=2, min_len=8192, max_len=8192)  # a prompt, two long turns
    engine = TrainEngine(make_cfg(max_tokens_per_mb=8192, gradient_checkpointing=True), tmp_path / "long")
    before = _params(engine)
    metrics = engine.train_batch([episode], nll_loss_fn)
    assert math.isfinite(metrics["loss"]) and metrics["n_tokens"] == sum(episode.loss_mask)
    after = engine.full_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
