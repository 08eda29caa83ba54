"""Shared helpers of the OpenAI-compatibility tests: the tiny model's tokenizer, tool specs."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainers.tiny_model import build_tiny_model

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}


def corpus(n: int = 300, seed: int = 0) -> Iterator[str]:
    """Chat-formatted arithmetic text, with tool calls, to train the tokenizer on."""
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield (f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"
               f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call><|im_end|>\n'
               f"<|im_start|>tool\n{a + b}<|im_end|>\n<|im_start|>assistant\nThe answer is {a + b}.<|im_end|>\n")


def build_model(root: Path, seed: int = 0) -> Path:
    return build_tiny_model(corpus(), root / f"m{seed}", seed=seed)


@contextlib.contextmanager
def served(model: Path, log_dir: Path) -> Iterator[Any]:
    """One embedded inference server on ``model`` (a :class:`ServerGroup`), stopped on exit."""
    from areal_agents.config import ExperimentConfig
    from areal_agents.inference.launcher import launch_servers

    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 120.0
    with launch_servers(cfg, model, 1, log_dir=log_dir, env={"OMP_NUM_THREADS": "1"}) as group:
        yield group


def load_tokenizer(model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def reforward(model_dir: Path, prompt: list[int], output: list[int], temperature: float = 1.0) -> tuple[list[float], list[int]]:
    """log_softmax(logits / T) of ``output`` after ``prompt`` in one full forward pass, and the
    greedy (argmax) token at each of those positions."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1: -1]
    return logp.gather(1, torch.tensor(output)[:, None]).squeeze(1).tolist(), logp.argmax(-1).tolist()
