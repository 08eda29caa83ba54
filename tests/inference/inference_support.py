"""Shared helpers of the inference tests: a tiny model and real server subprocesses."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal_agents.config import ExperimentConfig
from areal_agents.inference.launcher import ServerGroup, launch_servers
from trainers.tiny_model import build_tiny_model


def corpus(n: int = 300, seed: int = 0) -> Iterator[str]:
    """Chat-formatted arithmetic text to train the tokenizer on."""
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\nThe answer is {a + b}.<|im_end|>\n"


def make_models(root: Path) -> tuple[Path, Path]:
    """Two tiny models with the same tokenizer and different weights (seeds 0 and 1)."""
    return build_tiny_model(corpus(), root / "m0", seed=0), build_tiny_model(corpus(), root / "m1", seed=1)


def start_servers(model: Path, n: int, log_dir: Path, **inference: Any) -> ServerGroup:
    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 120.0
    for key, value in inference.items():
        setattr(cfg.inference, key, value)
    return launch_servers(cfg, model, n, log_dir=log_dir, env={"OMP_NUM_THREADS": "1"})


def reforward_logprobs(model_dir: Path, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of ``output`` given ``prompt`` in one full forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    n = len(prompt)
    return logp[n - 1 : -1].gather(1, torch.tensor(output)[:, None]).squeeze(1).tolist()


def load_reference(model_dir: Path) -> tuple[Any, Any]:
    """The model (float32, eval) and tokenizer of ``model_dir``, for independent references."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def full_logprobs(model: Any, ids: list[int]) -> Any:
    """``[len(ids), V]`` temperature-1 logprobs of one full forward pass; row ``p`` predicts ``ids[p + 1]``."""
    import torch

    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def greedy_ids(model: Any, ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """Greedy continuation by full re-forwards, ending after an EOS token or ``max_new_tokens``."""
    out: list[int] = []
    while len(out) < max_new_tokens:
        out.append(int(full_logprobs(model, ids + out)[-1].argmax()))
        if out[-1] in eos_ids:
            break
    return out
