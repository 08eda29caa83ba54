"""The tiny default model: offline, deterministic, loadable like any HF model dir."""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainers.tiny_model import (
    EOS_TOKEN,
    build_tiny_model,
    ensure_tiny_model,
    tiny_model_dir,
)


def corpus(n: int = 400, seed: int = 0) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n"


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(corpus(), tmp_path_factory.mktemp("tiny") / "m", seed=3)


def test_same_inputs_give_identical_files(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(corpus(), tmp_path / "again", seed=3)
    assert digests(again) == digests(model_dir)
    other_seed = build_tiny_model(corpus(), tmp_path / "seed4", seed=4)
    d4 = digests(other_seed)
    assert d4["model.safetensors"] != digests(model_dir)["model.safetensors"]
    assert d4["tokenizer.json"] == digests(model_dir)["tokenizer.json"]


def test_a_build_prints_nothing_and_leaves_no_thread(tmp_path: Path) -> None:
    """Building is quiet (no progress bar for a one-shard write) and leaves no thread behind: a
    progress bar would start its library's monitor thread, which the leak checks would count."""
    script = ("import sys, threading\nfrom pathlib import Path\nfrom trainers.tiny_model import build_tiny_model\n"
              "build_tiny_model(['<|im_start|>user\\n1+1<|im_end|>\\n'] * 50, Path(sys.argv[1]))\n"
              "print(sorted(t.name for t in threading.enumerate()))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['MainThread']" and proc.stderr == "", (proc.stdout, proc.stderr)


def test_loads_with_auto_classes(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 300_000 < n_params < 2_000_000
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_id == model.config.eos_token_id
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    ids = tok.encode("sum 12345")
    assert [tok.decode([i]) for i in ids[-5:]] == list("12345")
    assert tok.decode(tok.encode("What is 7 + 8?\n  x")) == "What is 7 + 8?\n  x"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))


def test_chat_template_is_chatml(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    msgs = [{"role": "user", "content": "What is 1 + 2?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids.count(tok.eos_token_id) == 1
    # each message header is one token; the one after a message takes that message's newline
    user, assistant = (tok.convert_tokens_to_ids(h) for h in ("<|im_start|>user\n", "\n<|im_start|>assistant\n"))
    assert ids[0] == user and ids[-2:] == [tok.eos_token_id, assistant]
    assert tok.decode(ids) == text
    convo = tok.apply_chat_template([*msgs, {"role": "assistant", "content": "3"}, {"role": "user", "content": "ok"}],
                                    tokenize=False)
    ids = tok.encode(convo)
    assert [tok.decode([i]) for i in ids].count("\n<|im_start|>user\n") == 1 and tok.decode(ids) == convo
    assert len(ids) < len(tok.encode(convo.replace("<|im_start|>", "<|im_start|> ")))  # headers spelled out: longer
    # an episode's text is decoded without its markup
    assert tok.decode(ids, skip_special_tokens=True) == "What is 1 + 2?3ok\n"


def test_tokenizer_learns_text_not_marker_pieces(model_dir: Path) -> None:
    """Every marker is one added token, so the BPE spends its merges on the text between them."""
    from transformers import AutoTokenizer

    from trainers.tiny_model import ROLE_HEADERS, SPECIAL_TOKENS

    tok = AutoTokenizer.from_pretrained(model_dir)
    added = {*SPECIAL_TOKENS, *ROLE_HEADERS}
    assert added <= set(tok.get_vocab())
    learned = [tok.convert_tokens_to_string([t]) for t in tok.get_vocab() if t not in added]
    assert not [t for t in learned if any(piece in t for piece in ("<|", "|>", "im_"))]
    assert "What" in learned or " What" in learned  # the corpus's words are merged


def test_ensure_builds_once_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    calls: list[int] = []

    def texts() -> Iterator[str]:
        calls.append(1)
        return corpus(100)

    first = ensure_tiny_model("unit", texts, hidden_size=64, num_layers=2)
    second = ensure_tiny_model("unit", texts, hidden_size=64, num_layers=2)
    assert first == second == tiny_model_dir("unit", hidden_size=64, num_layers=2)
    assert first.parent == tmp_path / "cache" / "models"
    assert calls == [1]
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dirs left
    third = ensure_tiny_model("unit", texts, hidden_size=64, num_layers=1)
    assert third != first and calls == [1, 1]
    with pytest.raises(TypeError, match="hiden_size"):
        tiny_model_dir("unit", hiden_size=3)


def test_readme_figures_of_the_default_model_are_the_code_s(tmp_path: Path) -> None:
    """The README's tokenizer size and parameter count are those of the model `run --env math` builds."""
    import dataclasses
    import re

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_agents.config.loader import load_config
    from areal_agents.data import load_dataset_rows
    from areal_agents.gym.registration import make_env

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    stated = re.search(r"tiny model \(([\d,]+) parameters, (\d+)-token byte-level BPE\)", readme)
    assert stated is not None
    cfg = load_config(overrides=["env.name=math"])  # the texts the warm start builds the base model from
    data = dataclasses.replace(cfg.data, train_size=max(cfg.data.train_size, cfg.sft.warm_start_steps * cfg.sft.batch_size))
    rows = load_dataset_rows(dataclasses.replace(cfg, data=data), "train")[:5000]
    env = make_env("math")
    path = build_tiny_model([f"{r['prompt']} {env.reference_completion(r) or ''}" for r in rows], tmp_path / "math")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert len(AutoTokenizer.from_pretrained(path)) == model.config.vocab_size == int(stated.group(2))
    assert sum(p.numel() for p in model.parameters()) == int(stated.group(1).replace(",", ""))
