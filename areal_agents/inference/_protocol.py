"""Parse and check SGLang ``/generate`` requests; build SGLang-shaped replies (no torch).

Everything a client can get wrong raises :class:`BadRequest` with one clear message,
which the server answers with HTTP 400 ``{"error": {"message": ...}}``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BadRequest", "GenerateSpec", "parse_generate", "require", "response_body"]

_TOP_LEVEL = {
    "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "return_text_in_logprobs", "rid", "stream", "lora_path", "image_data", "custom_logit_processor",
    "token_ids_logprob", "bootstrap_host", "bootstrap_port", "bootstrap_room", "data_parallel_rank",
}  # fmt: skip
# Accepted only at their neutral value: the embedded server does not implement them.
_NEUTRAL_TOP = {"lora_path": None, "image_data": None, "custom_logit_processor": None,
                "token_ids_logprob": None, "top_logprobs_num": 0, "bootstrap_host": None,
                "bootstrap_port": None, "bootstrap_room": None, "data_parallel_rank": None}  # fmt: skip
_NEUTRAL_SAMPLING = {"min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                     "sampling_seed": None, "regex": None, "json_schema": None, "ebnf": None,
                     "spaces_between_special_tokens": True, "custom_params": None, "stream_interval": None,
                     "logit_bias": None}  # fmt: skip
_SAMPLING = {"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids",
             "ignore_eos", "skip_special_tokens", "no_stop_trim", "n", *_NEUTRAL_SAMPLING}  # fmt: skip


_SAMPLING_EPS = 1e-6


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400."""


@dataclass
class GenerateSpec:
    """One sequence to generate, fully checked (``n`` is already expanded)."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False


def require(ok: bool, message: str) -> None:
    if not ok:
        raise BadRequest(message)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _token_list(x: Any, what: str, vocab: int) -> list[int]:
    require(isinstance(x, list) and all(_is_int(t) for t in x), f"{what} must be a list of integers")
    bad = [t for t in x if not 0 <= t < vocab]
    require(not bad, f"{what} has token ids outside [0, {vocab}): {bad[:5]}")
    return list(x)


def _prompts(body: dict[str, Any], tokenizer: Any, vocab: int) -> tuple[list[list[int]], bool]:
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    require(has_text != has_ids, "exactly one of 'text' and 'input_ids' is required")
    if has_text:
        text = body["text"]
        if isinstance(text, str):
            return [tokenizer.encode(text, add_special_tokens=False)], False
        require(isinstance(text, list) and text and all(isinstance(t, str) for t in text),
                "'text' must be a string or a non-empty list of strings")  # fmt: skip
        return [tokenizer.encode(t, add_special_tokens=False) for t in text], True
    ids = body["input_ids"]
    require(isinstance(ids, list) and len(ids) > 0, "'input_ids' must be a non-empty list")
    if isinstance(ids[0], list):
        return [_token_list(x, f"input_ids[{i}]", vocab) for i, x in enumerate(ids)], True
    return [_token_list(ids, "input_ids", vocab)], False


def _sampling(sp: Any, vocab: int) -> dict[str, Any]:
    sp = {} if sp is None else sp
    require(isinstance(sp, dict), "'sampling_params' must be an object")
    unknown = sorted(set(sp) - _SAMPLING)
    require(not unknown, f"unknown sampling_params: {', '.join(unknown)}")
    for key, neutral in _NEUTRAL_SAMPLING.items():
        require(sp.get(key, neutral) == neutral, f"sampling_params.{key} is not supported by the embedded server")
    out: dict[str, Any] = {}
    for key, default in (("max_new_tokens", 128), ("min_new_tokens", 0), ("n", 1), ("top_k", -1)):
        v = sp.get(key, default)
        v = default if v is None else v
        require(_is_int(v), f"sampling_params.{key} must be an integer (got {v!r})")
        out[key] = v
    require(out["max_new_tokens"] >= 0, f"sampling_params.max_new_tokens must be >= 0 (got {out['max_new_tokens']})")
    require(out["min_new_tokens"] >= 0, "sampling_params.min_new_tokens must be >= 0")
    require(1 <= out["n"] <= 1024, "sampling_params.n must be in [1, 1024]")
    require(out["top_k"] == -1 or out["top_k"] >= 1, "sampling_params.top_k must be -1 or >= 1")
    for key, default in (("temperature", 1.0), ("top_p", 1.0)):
        v = sp.get(key, default)
        v = default if v is None else v
        require(_is_num(v) and v == v, f"sampling_params.{key} must be a number (got {v!r})")
        out[key] = float(v)
    require(0.0 <= out["temperature"] < float("inf"), "sampling_params.temperature must be >= 0")
    if out["temperature"] < _SAMPLING_EPS:  # as SGLang: near-zero means greedy (1/T would overflow)
        out["temperature"] = 0.0
    if out["top_k"] >= vocab:  # no filtering; also keeps huge values out of the batch's int64 tensor
        out["top_k"] = -1
    require(0.0 < out["top_p"] <= 1.0, "sampling_params.top_p must be in (0, 1]")
    stop = sp.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    require(isinstance(stop, list) and all(isinstance(s, str) and s for s in stop),
            "sampling_params.stop must be a string or a list of non-empty strings")  # fmt: skip
    out["stop"] = stop
    out["stop_token_ids"] = _token_list(sp.get("stop_token_ids") or [], "sampling_params.stop_token_ids", vocab)
    for key, default in (("ignore_eos", False), ("skip_special_tokens", True), ("no_stop_trim", False)):
        v = sp.get(key, default)
        require(isinstance(v, bool), f"sampling_params.{key} must be true or false")
        out[key] = v
    return out


def parse_generate(body: Any, tokenizer: Any, vocab: int, context_len: int) -> tuple[list[GenerateSpec], bool, bool]:
    """Check a ``/generate`` body; return (specs, reply_is_list, return_logprob)."""
    require(isinstance(body, dict), "the request body must be a JSON object")
    unknown = sorted(set(body) - _TOP_LEVEL)
    require(not unknown, f"unknown fields: {', '.join(unknown)}")
    for key, neutral in _NEUTRAL_TOP.items():
        require(body.get(key, neutral) in (neutral, None), f"'{key}' is not supported by the embedded server")
    prompts, batched = _prompts(body, tokenizer, vocab)
    for i, p in enumerate(prompts):
        require(len(p) > 0, f"prompt {i} is empty")
        require(len(p) < context_len, f"prompt {i} has {len(p)} tokens; the context length is {context_len}")
    sp = _sampling(body.get("sampling_params"), vocab)
    return_logprob = body.get("return_logprob", False)
    require(isinstance(return_logprob, bool), "'return_logprob' must be true or false")
    for key in ("logprob_start_len",):
        require(body.get(key) is None or _is_int(body[key]), f"'{key}' must be an integer")
    rid = body.get("rid")
    if batched:
        rids = rid if rid is not None else [None] * len(prompts)
        require(isinstance(rids, list) and len(rids) == len(prompts), "'rid' must be a list as long as the batch")
    else:
        rids = [rid]
    require(all(r is None or isinstance(r, str) for r in rids), "'rid' must be a string (or a list of strings)")
    n = sp.pop("n")
    specs = []
    for prompt, r in zip(prompts, rids, strict=True):
        base = r if r is not None else uuid.uuid4().hex
        for j in range(n):
            specs.append(GenerateSpec(rid=base if n == 1 else f"{base}-{j}", prompt=prompt, **sp))
    return specs, batched or n > 1, return_logprob


def response_body(
    spec: GenerateSpec,
    output_ids: list[int],
    logprobs: list[float],
    versions: list[str],
    finish: dict[str, Any] | None,
    matched_stop: str | None,
    weight_version: str,
    latency: float,
    return_logprob: bool,
    tokenizer: Any,
) -> dict[str, Any]:
    """The SGLang reply for one finished sequence (``output_token_weight_versions`` is an extension)."""
    text = tokenizer.decode(output_ids, skip_special_tokens=spec.skip_special_tokens)
    if matched_stop is not None and not spec.no_stop_trim:
        cut = text.find(matched_stop)
        text = text[:cut] if cut >= 0 else text
    meta: dict[str, Any] = {
        "id": spec.rid,
        "finish_reason": finish,
        "prompt_tokens": len(spec.prompt),
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
        "weight_version": versions[-1] if versions else weight_version,
        "output_token_weight_versions": versions,
        "e2e_latency": latency,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(logprobs, output_ids, strict=True)]
    return {"text": text, "output_ids": output_ids, "meta_info": meta}
