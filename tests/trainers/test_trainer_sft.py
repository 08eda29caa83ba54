"""SFT: completion-only loss, learning from text pairs, the cached warm start of the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.config import ConfigError, SFTConfig
from areal_agents.config.loader import load_config
from trainers.sft import (
    _to_ids,
    _trajectory,
    ensure_warm_model,
    exact_match_accuracy,
    render_examples,
    run_sft,
    sft_loss,
    sft_train,
)
from trainers.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [f"say {w} please {w}" for w in ("red", "green", "blue", "cyan")] * 20
    return build_tiny_model(texts, tmp_path_factory.mktemp("m") / "tiny", hidden_size=64, num_layers=2,
                            intermediate_size=128)


def test_sft_loss_is_nll_over_completion_tokens() -> None:
    from algorithms.losses import LossNorm
    from trainers.batching import collate

    batch = collate([_trajectory([5, 6, 7], [8, 9]), _trajectory([5], [4, 3, 2])])
    logp = torch.randn(batch["input_ids"].shape)
    loss, metrics = sft_loss(logp, batch, None, LossNorm(tokens=5.0, seqs=2.0, max_len=8.0))
    want = -(logp[0, 3] + logp[0, 4] + logp[1, 1] + logp[1, 2] + logp[1, 3]) / 5
    torch.testing.assert_close(loss, want)
    assert metrics["sft/nll"] == pytest.approx(float(want))


def test_exact_match_accuracy_is_greedy_decoding_exact_match(chat_model: Path) -> None:
    """The teacher-forced check counts a row iff greedy decoding reproduces its completion."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_model)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, model.config.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(2, 9, (24,), generator=gen)]
    examples, want = [], 0
    for i, p in enumerate(prompts):
        out = model.generate(input_ids=torch.tensor([p]), max_new_tokens=4, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(p):].tolist()
        if i % 3 == 0:  # a reference that differs from greedy decoding at one position
            j = i % len(out)
            out[j] = out[j] % (model.config.vocab_size - 4) + 3 if out[j] + 1 >= model.config.vocab_size else out[j] + 1
        else:
            want += 1
        examples.append((p, out))
    assert exact_match_accuracy(model, examples, pad_token_id=0, batch_size=5) == pytest.approx(want / len(examples))


def test_sft_learns_text_pairs(chat_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pairs = [(f"say {w} please", f" {w}") for w in ("red", "green", "blue", "cyan")]
    evals = []

    def eval_fn(engine: Any) -> dict[str, float]:
        evals.append(1)
        return {"calls": float(len(evals))}

    report = sft_train(chat_model, pairs, SFTConfig(steps=40, batch_size=8, lr=1e-2, warmup_steps=2, eval_every=20),
                       tmp_path / "out", eval_fn=eval_fn, progress=False)
    assert report["loss"][-1] < 0.2 * report["loss"][0]
    assert [e["step"] for e in report["evals"]] == [20, 40]
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")  # tokenizer files travel with the export
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    for prompt, completion in pairs:
        ids = tok.encode(prompt, add_special_tokens=False)
        out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[0, len(ids):]
        assert tok.decode(out, skip_special_tokens=True) == completion


def test_warm_start_checks_sparsely_while_far_below_its_target(chat_model: Path, tmp_path: Path) -> None:
    """Under half the target (the flat start of the SFT curve) the next check comes
    ``warm_start_far_check_every`` steps later; near the target every ``eval_every`` steps, and
    the first check at the target stops."""
    pairs = [(f"say {w} please", f" {w}") for w in ("red", "green")]
    accs = iter([0.0, 0.1, 0.2, 0.3, 0.4, 0.6])

    def eval_fn(engine: Any) -> dict[str, float]:
        return {"acc": next(accs)}

    report = sft_train(chat_model, pairs, SFTConfig(steps=100, batch_size=2, lr=1e-3, warmup_steps=1, eval_every=2,
                                                    warm_start_far_check_every=8),
                       tmp_path / "out", eval_fn=eval_fn, progress=False, stop_at=0.5)
    assert [e["step"] for e in report["evals"]] == [2, 10, 18, 26, 28, 30]
    assert report["stopped_early"] and len(report["loss"]) == 30


def test_sft_trains_trajectories_without_a_tokenizer(chat_model: Path, tmp_path: Path) -> None:
    """A :class:`Trajectory` example carries its own token ids and loss mask: no tokenizer needed."""
    examples = [_trajectory([5, 6, 3 + i], [8 + i, 9]) for i in range(4)]
    report = sft_train(chat_model, examples, SFTConfig(steps=30, batch_size=4, lr=1e-2, warmup_steps=2, eval_every=0),
                       tmp_path / "out", progress=False)
    assert report["loss"][-1] < 0.2 * report["loss"][0]


def test_sft_rejects_mixed_examples(chat_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both be text or both token ids"):
        sft_train(chat_model, [("text", [1, 2])], SFTConfig(steps=1), tmp_path / "o", progress=False)


@pytest.mark.slow
def test_examples_render_each_prompt_once_and_repeat_as_one_example(chat_model: Path) -> None:
    """Rows repeat (a warm start reads sft.steps x sft.batch_size of them): each distinct prompt
    goes through the chat template once, the examples are those of rendering every row alone,
    and a repeated row trains as the same example."""
    from transformers import AutoTokenizer

    from areal_agents.gym.registration import make_env

    cfg = load_config(None, ["env.name=math"])
    tokenizer = AutoTokenizer.from_pretrained(chat_model)  # byte-level: any text encodes
    env = make_env("math")
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(12, 13), (14, 15), (12, 13), (16, 10), (14, 15)]]
    rendered: list[Any] = []
    template = tokenizer.apply_chat_template

    def counted(messages: Any, **kw: Any) -> Any:
        rendered.append(messages[-1]["content"])
        return template(messages, **kw)

    tokenizer.apply_chat_template = counted
    examples, prompts = render_examples(cfg, tokenizer, env, rows)
    assert sorted(rendered) == sorted({r["prompt"] for r in rows})  # 3 distinct prompts of 5 rows
    tokenizer.apply_chat_template = template
    for row, prompt, (p, c) in zip(rows, prompts, examples, strict=True):
        alone = tokenizer.encode(template([{"role": "user", "content": row["prompt"]}], tokenize=False,
                                          add_generation_prompt=True), add_special_tokens=False)
        assert prompt == p == alone
        assert c == tokenizer.encode(row["answer"], add_special_tokens=False) + [tokenizer.eos_token_id]
    trajs = _to_ids(examples, tokenizer)
    assert trajs[0] is trajs[2] and trajs[1] is trajs[4] and len({id(t) for t in trajs}) == 3
    assert [t.input_ids for t in trajs] == [_trajectory(p, c).input_ids for p, c in examples]


@pytest.mark.slow  # a learning run: 1,000 SFT steps from a fresh tiny model (~90 s on 2 cores)
def test_warm_start_learns_two_digit_addition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default SFT budget takes the tiny model from ~0 to >= 50% greedy accuracy."""
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, ["env.name=math", "data.test_size=100"])
    path = ensure_warm_model(cfg, progress=False)
    report = json.loads((path / "sft_report.json").read_text())
    accs = [e["acc"] for e in report["evals"]]
    print(f"warm start: {report.get('seconds')} s, greedy accuracy by eval: {accs}")
    assert report["evals"][-1]["step"] == cfg.sft.steps
    assert accs[-1] >= 0.5
    made = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_warm_model(cfg, progress=False) == path  # cached: not trained again
    assert (path / "model.safetensors").stat().st_mtime_ns == made and json.loads((path / "sft_report.json").read_text()) == report


def test_warm_start_cache_key_follows_training_rows_not_eval_settings(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    tiny = ["env.name=math", "sft.warm_start_steps=2", "sft.batch_size=4", "sft.eval_every=0", "data.test_size=8"]
    first = ensure_warm_model(load_config(None, tiny), progress=False, warm_start=True)
    made = (first / "model.safetensors").stat().st_mtime_ns
    same = ensure_warm_model(load_config(None, [*tiny, "data.test_size=20", "eval.n=5", "eval.every=3"]),
                             progress=False, warm_start=True)
    assert same == first and (same / "model.safetensors").stat().st_mtime_ns == made  # not rebuilt
    other = ensure_warm_model(load_config(None, [*tiny, "data.train_size=3000"]), progress=False, warm_start=True)
    assert other != first  # other training rows: another warm start
    bf16 = ensure_warm_model(load_config(None, [*tiny, "actor.dtype=bfloat16"]), progress=False, warm_start=True)
    assert bf16 not in (first, other)  # weights trained in another precision: another warm start


def test_a_warm_start_says_what_it_builds_and_where_it_caches_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """What ``serve`` without ``--model``, ``run``, ``eval`` and ``sft`` print before the SFT bar; a cached one says nothing."""
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, ["env.name=math", "sft.steps=2", "sft.batch_size=4", "sft.eval_every=0", "data.test_size=8"])
    path = ensure_warm_model(cfg)
    lines = capsys.readouterr().out.splitlines()
    assert (f"warm start: building the tiny default model of env 'math' and fine-tuning it on the env's reference "
            f"replies (first use; cached in {path})") in lines, lines
    assert path.is_relative_to(tmp_path / "cache") and any(line.startswith("sft") and "2/2" in line for line in lines)
    assert ensure_warm_model(cfg) == path and capsys.readouterr().out == ""
    assert ensure_warm_model(cfg, progress=False) == path and capsys.readouterr().out == ""


def test_a_warm_start_on_games_longer_than_max_turns_is_refused_before_building(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``guess-number``'s bisection games take more than 4 guesses on many of its rows: ``agent.max_turns=4`` could finish none of those."""
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, ["env.name=guess-number", "agent.max_turns=4"])
    with pytest.raises(ConfigError, match=r"^agent\.max_turns: env 'guess-number': reference games take up to (\d+) "
                                          r"assistant turns but agent\.max_turns=4; set agent\.max_turns=\1 \(or more\)$"):
        ensure_warm_model(cfg, progress=False, warm_start=True)
    assert not (tmp_path / "cache").exists()


def test_sft_command_says_where_it_wrote_the_model(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "COLUMNS": "400"}
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "sft", "--env", "math", "sft.steps=2",
                           "sft.batch_size=4", "sft.eval_every=0", "logging.progress=false"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("model written to:"))
    model = Path(line.split(": ", 1)[1].split(" (", 1)[0])
    assert model.is_relative_to(tmp_path / "cache") and (model / "model.safetensors").is_file()
    assert "in the model cache" in line and "sft.output_dir" in line and "actor.path" in line


def test_the_tokenizer_corpus_has_what_an_env_answers_to_wrong_replies() -> None:
    """A multi-turn env's feedback to wrong replies (which no reference game shows) is in the tiny
    tokenizer's corpus, so it is learned as words, not spelled byte by byte; a single-turn env adds nothing."""
    from areal_agents.data import load_dataset_rows
    from areal_agents.gym.registration import make_env
    from trainers.tiny_corpus import probe_replies

    cfg = load_config(overrides=["env.name=countdown"])
    rows = load_dataset_rows(cfg, "train")
    replies = probe_replies(make_env("countdown"), rows, n=8)
    assert "Invalid expression." in replies
    assert any(r.startswith("Use only ") for r in replies) and len(replies) == 16
    math_rows = load_dataset_rows(load_config(overrides=["env.name=math"]), "train")
    assert probe_replies(make_env("math"), math_rows, n=8) == []

    class Broken(type(make_env("countdown"))):  # fault injection: an env whose step fails
        def play_turn(self, action: str, row: dict[str, Any]) -> Any:
            raise RuntimeError("boom")

    assert probe_replies(Broken(), rows, n=4) == []
    with pytest.warns(RuntimeWarning, match="took over 0 s; kept the first 0"):
        assert probe_replies(make_env("countdown"), rows, n=8, budget_s=0.0) == []


def test_fine_tuning_a_model_reports_its_own_steps_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sft`` with ``actor.path`` checks greedy accuracy every ``sft.eval_every`` steps and writes its
    own ``sft_report.json``: the base's report (a warm start's) is not carried into the new model."""
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    base = ensure_warm_model(load_config(None, ["env.name=math", "sft.steps=3", "sft.batch_size=4", "sft.eval_every=0",
                                                "data.test_size=8"]), progress=False)
    assert json.loads((base / "sft_report.json").read_text())["steps"] == 3
    out = run_sft(load_config(None, ["env.name=math", f"actor.path={base}", "sft.steps=4", "sft.batch_size=4",
                                     "sft.eval_every=2", "data.test_size=8", f"sft.output_dir={tmp_path / 'tuned'}"]))
    report = json.loads((out / "sft_report.json").read_text())
    assert (report["steps"], report["check"], report["base_model"]) == (4, "greedy", str(base))
    assert [e["step"] for e in report["evals"]] == [2, 4] and all(0.0 <= e["acc"] <= 1.0 for e in report["evals"])
