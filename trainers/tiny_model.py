"""Build the tiny default model offline: a byte-level BPE tokenizer trained on the task's
text and a tiny Qwen2-architecture causal LM (822,784 parameters with the 267-token vocabulary
of `math`; 128 more per extra token), saved as a normal HF model dir.

Nothing is downloaded: the tokenizer is trained here with the ``tokenizers`` library and
the model is randomly initialised from a seed, so the same texts and seed always give the
same files. ``ensure_tiny_model`` caches the result under :func:`cache_dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "ROLE_HEADERS",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "cache_dir",
    "ensure_tiny_model",
    "tiny_model_dir",
]

EOS_TOKEN = "<|im_end|>"
BOS_TOKEN = "<|im_start|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)

# Every message the chat template writes starts with a header, ``<|im_start|>user\n``, and every
# one after the first also with the newline that ends the message before it. Each header is one
# token, alone and with that newline (``\n<|im_start|>user\n``): spelled out it is 3-4 tokens, and
# a multi-turn episode has two headers a turn, each costing prefill on the server and a
# forward/backward in the trainer for every token the model writes. The rendered text is plain
# ChatML; only its tokenization is shorter (a tokenizer matches the longest added token).
_ROLES = ("user", "assistant", "system", "tool")
ROLE_HEADERS = tuple(f"{nl}{BOS_TOKEN}{role}\n" for nl in ("", "\n") for role in _ROLES)
_ADDED_TOKENS = (*SPECIAL_TOKENS, *ROLE_HEADERS)
# The text between markers is what the BPE learns from: the markers' pieces (``<|``, ``im``) would
# take merges that encoding never uses, since every marker is one added token.
_MARKERS = re.compile("|".join(re.escape(t) for t in sorted(_ADDED_TOKENS, key=len, reverse=True)))

# ChatML, as Qwen models use it: every message is "<|im_start|>role\ncontent<|im_end|>\n". With
# ``tools`` (OpenAI function specs) the tool format of Qwen2.5/Hermes models, with the specs
# written compactly: the system turn lists each function as a signature inside <tools></tools>
# (``convert(value: number, from: string, to: string)``: ~20 tokens where the JSON schema takes
# ~80, and every prompt token costs prefill and training), an assistant's calls are written after
# its content as <tool_call>{"name": ..., "arguments": {...}}</tool_call>, and ``tool`` messages
# are tool turns.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '<tools>' }}"
    "{% for tool in tools %}{% set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{{ '\n' + fn['name'] + '(' }}"
    "{% for pname, spec in ((fn['parameters'] or {})['properties'] or {}).items() %}"
    "{{ (', ' if not loop.first else '') + pname + ': ' + (spec['type'] if spec['type'] is defined else 'any') }}"
    "{% endfor %}{{ ')' }}{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
    "{{ '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Pre-tokenisation as Qwen2's tokenizer does it (transformers loads a qwen2 model dir with
# that class and rebuilds this pipeline): contractions, letter runs, single digits (so
# numbers are tokenised digit by digit), punctuation runs, newlines, whitespace.
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Bump when the builder's output changes, so cached models are rebuilt.
_BUILDER_VERSION = 5

_DEFAULTS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 384,
    "max_position_embeddings": 1024,
    "seed": 0,
}


def cache_dir() -> Path:
    """Root of cached artefacts: ``$AREAL_AGENTS_CACHE`` or ``~/.cache/areal-agents``."""
    root = os.environ.get("AREAL_AGENTS_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "areal-agents"


def _train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer (one token per digit) with ChatML's special tokens and one
    token per message header (:data:`ROLE_HEADERS`), learning merges from the text between them."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(_ADDED_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    pieces = (p for t in texts for p in _MARKERS.split(str(t)) if p)
    tok.train_from_iterator(pieces, trainer=trainer)
    return tok


def build_tiny_model(
    texts: Iterable[str],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int = _DEFAULTS["vocab_size"],
    hidden_size: int = _DEFAULTS["hidden_size"],
    num_layers: int = _DEFAULTS["num_layers"],
    num_heads: int = _DEFAULTS["num_heads"],
    num_kv_heads: int = _DEFAULTS["num_kv_heads"],
    intermediate_size: int = _DEFAULTS["intermediate_size"],
    max_position_embeddings: int = _DEFAULTS["max_position_embeddings"],
    seed: int = _DEFAULTS["seed"],
) -> Path:
    """Train a tokenizer on ``texts``, initialise a tiny Qwen2 LM, save both to ``out_dir``.

    ``vocab_size`` is an upper bound: the BPE vocabulary has at most that many entries
    (267 = 256 bytes + 3 specials + 8 message headers at least) and the model's embedding matches it exactly.
    Returns ``out_dir`` as a :class:`Path`; deterministic in ``texts`` and the keywords.
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if vocab_size < 256 + len(_ADDED_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(_ADDED_TOKENS)} (got {vocab_size})")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads and num_heads by num_kv_heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    raw = _train_tokenizer(texts, vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[BOS_TOKEN, *ROLE_HEADERS],
        model_max_length=max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"

    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=int(tokenizer.convert_tokens_to_ids(BOS_TOKEN)),  # type: ignore[arg-type]  # one token: an int
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
        use_cache=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    from transformers.utils import logging as hf_logging

    was_shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-shard write needs no bar (nor the bar library's monitor thread)
    try:
        model.save_pretrained(out)
    finally:
        if was_shown:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    return out


def tiny_model_dir(name: str, **kw: Any) -> Path:
    """Where :func:`ensure_tiny_model` keeps the model ``name`` built with ``kw``."""
    unknown = set(kw) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown tiny-model option(s): {', '.join(sorted(unknown))}")
    blob = json.dumps({"builder": _BUILDER_VERSION, **_DEFAULTS, **kw}, sort_keys=True)  # the cache key
    return cache_dir() / "models" / f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def ensure_tiny_model(name: str, texts_fn: Callable[[], Iterable[str]], **kw: Any) -> Path:
    """Return the cached tiny model ``name``, building it from ``texts_fn()`` if missing.

    ``name`` should identify the text corpus (e.g. the env name); ``kw`` are the
    :func:`build_tiny_model` keywords and are part of the cache key. The build goes to a
    temporary sibling directory that is renamed into place, so a crash never leaves a
    half-written model and concurrent builders do not clash.
    """
    target = tiny_model_dir(name, **kw)
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_tiny_model(texts_fn(), tmp, **kw)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # lost a race only if the winner finished
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
