"""Shared helpers of the OpenAI-compatibility tests: the tiny model's tokenizer, tool specs."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal_agents.inference.tiny_model import build_tiny_model

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


def load_tokenizer(model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)
