"""SGLang's HTTP protocol, both sides of the wire (no torch).

Server side: :func:`parse_generate` checks a ``/generate`` request (everything a client can
get wrong raises :class:`BadRequest` with one clear message, which the server answers with
HTTP 400 ``{"error": {"message": ...}}``) and :func:`response_body` builds the reply. Client
side: :func:`parse_generate_reply` checks a reply and returns it as a :class:`Generation`
(:class:`InferenceError` naming what is wrong), and the ``*_payload`` builders produce the exact bodies of the weight-update calls,
so the NCCL weight path can be driven (and tested) without a GPU (defined in
:mod:`~areal_agents.inference.weight_bodies`, re-exported here).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from areal_agents.failures import UserError
from areal_agents.inference.weight_bodies import (
    InitGroupBody,
    UpdateFromDiskBody,
    UpdateFromDistributedBody,
    init_weights_update_group_payload,
    update_weights_from_disk_payload,
    update_weights_from_distributed_payload,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["BadRequest", "GenerateReply", "GenerateSpec", "Generation", "InferenceError", "InitGroupBody", "LogprobRow",
           "MetaInfo", "Progress", "TopRow", "UpdateFromDiskBody", "UpdateFromDistributedBody", "flag",
           "init_weights_update_group_payload", "is_int", "parse_generate", "parse_generate_reply", "require",
           "response_body", "update_weights_from_disk_payload", "update_weights_from_distributed_payload"]

# Every field of SGLang's ``GenerateReqInput`` (0.5.x) is accepted. Those this server implements:
_TOP_LEVEL = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
              "return_text_in_logprobs", "rid", "stream", "lora_path"}  # fmt: skip
# Hints that never change a reply (logging, tracing, scheduling priority, cache keys): any value.
_HINTS_TOP = {"log_metrics", "no_logs", "custom_labels", "external_trace_header", "received_time", "routing_key",
              "conversation_id", "priority", "extra_key", "cache_salt", "http_worker_ipc"}  # fmt: skip
# Features the embedded server does not implement: accepted at their neutral value (null, empty or
# SGLang's default), refused with a 400 naming the field otherwise.
_NEUTRAL_TOP: dict[str, Any] = {
    **dict.fromkeys(("session_id", "input_embeds", "image_data", "video_data", "audio_data", "mm_hashes",
                     "mm_content_hashes", "video_config", "watermark", "token_ids_logprob", "return_sampling_mask",
                     "sampling_logprobs_mode", "modalities", "session_params", "lora_id",
                     "custom_logit_processor", "positional_embed_overrides", "bootstrap_host", "bootstrap_port",
                     "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank", "data_parallel_rank",
                     "disagg_prefill_dp_rank", "max_thinking_tokens", "need_wait_for_mm_inputs", "num_items_assigned",
                     "encoder_urls", "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch",
                     "video_max_dynamic_patch", "images_config", "mm_processor_kwargs", "multi_item_delimiter_indices",
                     "token_indices_to_pool", "kv_hints")),
    **dict.fromkeys(("use_audio_in_video", "return_flat_raw_top_logprobs", "return_flat_raw_output_top_logprobs",
                     "return_hidden_states", "return_routed_experts", "return_indexer_topk", "background",
                     "require_reasoning", "return_bytes", "return_entropy", "return_prompt_token_ids"), False),
    "routed_experts_start_len": 0,
}  # fmt: skip
_NEUTRAL_SAMPLING: dict[str, Any] = {
    "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "spaces_between_special_tokens": True, "ebnf_full_assistant": False,
    **dict.fromkeys(("stop_regex", "regex", "json_schema", "ebnf", "structural_tag", "beam_width",
                     "custom_params", "logit_bias", "watermark")),
}  # fmt: skip
_HINTS_SAMPLING = {"stream_interval"}  # how often a stream sends: this server sends every token
_SAMPLING = {"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids",
             "ignore_eos", "skip_special_tokens", "no_stop_trim", "n", "sampling_seed", *_NEUTRAL_SAMPLING, *_HINTS_SAMPLING}  # fmt: skip
_TOP_ALL = _TOP_LEVEL | _HINTS_TOP | set(_NEUTRAL_TOP)


_SAMPLING_EPS = 1e-6
_RID_PREFIX = uuid.uuid4().hex[:16]  # ids the server gives requests without one: a random prefix, then a count
_rid_count = itertools.count()


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400."""


@dataclass
class GenerateSpec:
    """One sequence to generate, fully checked (``n`` is already expanded): the server's request
    type, as :func:`parse_generate` returns it and the engine decodes it."""

    rid: str
    prompt: list[int]
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output logprobs only; else prompt logprobs from this position on
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    lora_path: str | None = None  # the name of a loaded LoRA adapter (None: the base model)
    sampling_seed: int | None = None  # this request's own RNG seed (None: the server's shared generator)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise BadRequest(message)


def is_int(x: object) -> bool:
    """Whether ``x`` is a JSON integer (``bool`` is not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _neutral(value: object, default: object) -> bool:
    """Null, empty, SGLang's default, or a per-prompt list of those."""
    if value is None or (value == default and isinstance(value, bool) == isinstance(default, bool)):
        return True
    if isinstance(value, (str, list, tuple, dict)) and not value:
        return True
    return isinstance(value, list) and all(_neutral(v, default) for v in value)


def _token_list(x: Any, what: str, vocab: int) -> list[int]:
    require(isinstance(x, list) and all(is_int(t) for t in x), f"{what} must be a list of integers")
    bad = [t for t in x if not 0 <= t < vocab]
    require(not bad, f"{what} has token ids outside [0, {vocab}): {bad[:5]}")
    return list(x)


def _prompts(body: dict[str, Any], tokenizer: PreTrainedTokenizerBase, vocab: int) -> tuple[list[list[int]], bool]:
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    require(has_text != has_ids, "exactly one of 'text' and 'input_ids' is required")
    if has_text:
        text = body["text"]
        if isinstance(text, str):
            return [tokenizer.encode(text, add_special_tokens=False)], False
        require(isinstance(text, list) and bool(text) and all(isinstance(t, str) for t in text),
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
        if not _neutral(sp.get(key), neutral):
            raise BadRequest(f"sampling_params.{key} is not supported by the embedded server "
                             f"(only {json.dumps(neutral)} or null; got {json.dumps(sp[key])[:80]})")  # fmt: skip
    out: dict[str, Any] = {}
    v: Any
    for key, default in (("max_new_tokens", 128), ("min_new_tokens", 0), ("n", 1), ("top_k", -1)):
        v = default if sp.get(key) is None else sp[key]
        require(is_int(v), f"sampling_params.{key} must be an integer (got {v!r})")
        out[key] = v
    require(out["max_new_tokens"] >= 0, f"sampling_params.max_new_tokens must be >= 0 (got {out['max_new_tokens']})")
    require(out["min_new_tokens"] >= 0, "sampling_params.min_new_tokens must be >= 0")
    require(1 <= out["n"] <= 1024, "sampling_params.n must be in [1, 1024]")
    require(out["top_k"] == -1 or out["top_k"] >= 1, "sampling_params.top_k must be -1 or >= 1")
    for key, unset in (("temperature", 1.0), ("top_p", 1.0)):
        v = unset if sp.get(key) is None else sp[key]
        require(isinstance(v, (int, float)) and not isinstance(v, bool) and v == v,
                f"sampling_params.{key} must be a number (got {v!r})")
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
        out[key] = flag(sp.get(key), default, f"sampling_params.{key}")
    seed = sp.get("sampling_seed")
    require(seed is None or (is_int(seed) and 0 <= seed < 2**63),
            f"sampling_params.sampling_seed must be an integer in [0, 2^63) (got {seed!r})")  # fmt: skip
    out["sampling_seed"] = seed
    return out


def flag(v: object, default: bool, what: str) -> bool:
    """A JSON boolean field ``what``: ``default`` when null, else it must be true or false (:class:`BadRequest`)."""
    require(v is None or isinstance(v, bool), f"{what} must be true or false")
    return default if v is None else bool(v)


def _per_prompt(body: dict[str, Any], key: str, n: int, batched: bool) -> list[Any]:
    """``body[key]`` for each of the ``n`` prompts: one value for all, or (batched) a list of ``n``."""
    value = body.get(key)
    if batched and isinstance(value, list) and (key != "sampling_params" or all(isinstance(v, dict) for v in value)):
        require(len(value) == n, f"'{key}' must be one value or a list as long as the batch ({n})")
        return list(value)
    return [value] * n


def _logprob_args(body: dict[str, Any], n: int, batched: bool, vocab: int) -> list[dict[str, Any]]:
    """The logprob fields of each of the ``n`` prompts (``logprob_start_len`` still unchecked against length)."""
    columns = [_per_prompt(body, k, n, batched) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num")]
    with_text = flag(body.get("return_text_in_logprobs"), False, "'return_text_in_logprobs'")
    out = []
    for ret, start, top in zip(*columns, strict=True):
        ret = flag(ret, False, "'return_logprob'")
        start = -1 if start is None else start
        require(is_int(start) and start >= -1, f"'logprob_start_len' must be an integer >= -1 (got {start!r})")
        top = 0 if top is None else top
        require(is_int(top) and top >= 0, f"'top_logprobs_num' must be an integer >= 0 (got {top!r})")
        out.append({"return_logprob": ret, "logprob_start_len": start if ret else -1,
                    "top_logprobs_num": min(top, vocab) if ret else 0, "return_text_in_logprobs": with_text})
    return out


def _lora_paths(value: Any, n: int) -> list[str | None]:
    """``lora_path`` for each of the ``n`` prompts: one adapter name (or null) for all, or a list of
    ``n`` (SGLang's frontend sends a one-element list for one prompt)."""
    values = value if isinstance(value, list) else [value]
    require(len(values) in (1, n), f"'lora_path' must be one adapter name or a list as long as the batch ({n})")
    require(all(v is None or isinstance(v, str) for v in values), "'lora_path' must be an adapter name (a string)")
    names = [v or None for v in values]
    return names * n if len(names) == 1 else names


def parse_generate(body: dict[str, Any], tokenizer: PreTrainedTokenizerBase, vocab: int,
                   context_len: int) -> tuple[list[GenerateSpec], bool]:
    """Check a ``/generate`` body (a JSON object); return (specs, reply_is_list)."""
    unknown = sorted(set(body) - _TOP_ALL)
    require(not unknown, f"unknown fields: {', '.join(unknown)}")
    for key, neutral in _NEUTRAL_TOP.items():
        require(_neutral(body.get(key), neutral), f"'{key}' is not supported by the embedded server")
    prompts, batched = _prompts(body, tokenizer, vocab)
    for i, p in enumerate(prompts):
        require(len(p) > 0, f"prompt {i} is empty")
        require(len(p) < context_len, f"prompt {i} has {len(p)} tokens; the context length is {context_len}")
    sps = [_sampling(sp, vocab) for sp in _per_prompt(body, "sampling_params", len(prompts), batched)]
    logprob_args = _logprob_args(body, len(prompts), batched, vocab)
    rid = body.get("rid")
    if batched:
        rids = rid if rid is not None else [None] * len(prompts)
        require(isinstance(rids, list) and len(rids) == len(prompts), "'rid' must be a list as long as the batch")
    else:
        rids = [rid]
    require(all(r is None or isinstance(r, str) for r in rids), "'rid' must be a string (or a list of strings)")
    loras = _lora_paths(body.get("lora_path"), len(prompts))
    specs = []
    for i, (prompt, r, sp, lp, lora) in enumerate(zip(prompts, rids, sps, logprob_args, loras, strict=True)):
        start = lp["logprob_start_len"]
        require(start <= len(prompt), f"'logprob_start_len' ({start}) is larger than prompt {i}'s {len(prompt)} tokens")
        base = r if r is not None else f"{_RID_PREFIX}{next(_rid_count):016x}"  # unique as uuid4's, no syscall
        n, seed = sp.pop("n"), sp.pop("sampling_seed")
        for j in range(n):  # n samples of one seeded request: seeds seed, seed + 1, ...
            specs.append(GenerateSpec(rid=base if n == 1 else f"{base}-{j}", prompt=prompt, lora_path=lora,
                                      sampling_seed=None if seed is None else (seed + j) % 2**63, **sp, **lp))
    return specs, batched or len(specs) > len(prompts)


TopRow = tuple[list[float], list[int]] | None
"""One position's top logprobs, ``(logprobs, token ids)`` best first; None where there are none."""


LogprobRow = list[float | int | str | None]
"""SGLang's ``[logprob, token_id, text]`` (``text`` None unless ``return_text_in_logprobs``)."""


class Progress(Protocol):
    """What :func:`response_body` reads of a request being generated (the engine's ``GenRequest``):
    the tokens so far with their logprobs, weight versions and top logprobs, and the prompt's."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[str]
    output_top: list[TopRow]
    input_logprobs: list[float | None] | None
    input_top: list[TopRow] | None
    matched_stop: str | None


def _triples(tokenizer: PreTrainedTokenizerBase, with_text: bool, logprobs: Sequence[float | None],
             ids: Sequence[int]) -> list[LogprobRow]:
    """SGLang's ``[logprob, token_id, text]`` rows (text only with ``return_text_in_logprobs``)."""
    texts = tokenizer.batch_decode([[t] for t in ids]) if with_text and ids else [None] * len(ids)
    return [[lp, t, x] for lp, t, x in zip(logprobs, ids, texts, strict=True)]


def _top_rows(tokenizer: PreTrainedTokenizerBase, with_text: bool,
              tops: Sequence[TopRow]) -> list[list[LogprobRow] | None]:
    return [None if t is None else _triples(tokenizer, with_text, t[0], t[1]) for t in tops]


class _Meta(TypedDict):
    id: str
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str
    output_token_weight_versions: list[str]
    e2e_latency: float


class MetaInfo(_Meta, total=False):
    """A reply's ``meta_info``: SGLang's fields, the per-token weight versions (an extension),
    and with ``return_logprob`` the logprob rows of the prompt window and the output (with
    ``top_logprobs_num`` also their top rows)."""

    input_token_logprobs: list[LogprobRow]
    output_token_logprobs: list[LogprobRow]
    input_top_logprobs: list[list[LogprobRow] | None]
    output_top_logprobs: list[list[LogprobRow] | None]


class GenerateReply(TypedDict):
    """The server's reply to one prompt of ``POST /generate`` (and each streamed event)."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo


def response_body(
    spec: GenerateSpec,
    req: Progress,
    n: int,
    finish: dict[str, Any] | None,
    weight_version: str,
    latency: float,
    tokenizer: PreTrainedTokenizerBase,
) -> GenerateReply:
    """The SGLang reply for ``req``'s first ``n`` tokens (all of them once finished).

    ``req`` carries ``output_ids``, ``logprobs``, ``versions``, ``output_top``,
    ``input_logprobs``, ``input_top`` and ``matched_stop`` (an engine ``GenRequest``);
    ``output_token_weight_versions`` is an extension of SGLang's reply.
    """
    output_ids, versions = req.output_ids[:n], req.versions[:n]
    text = tokenizer.decode(output_ids, skip_special_tokens=spec.skip_special_tokens)
    assert isinstance(text, str)  # one id list decodes to one string
    matched_stop = req.matched_stop if finish is not None else None
    if matched_stop is not None and not spec.no_stop_trim:
        cut = text.find(matched_stop)
        text = text[:cut] if cut >= 0 else text
    meta: MetaInfo = {
        "id": spec.rid,
        "finish_reason": finish,
        "prompt_tokens": len(spec.prompt),
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
        "weight_version": versions[-1] if versions else weight_version,
        "output_token_weight_versions": versions,
        "e2e_latency": latency,
    }
    if spec.return_logprob:
        with_text, start = spec.return_text_in_logprobs, spec.logprob_start_len
        prompt_window = spec.prompt[start:] if start >= 0 and req.input_logprobs is not None else []
        meta["input_token_logprobs"] = _triples(tokenizer, with_text, req.input_logprobs or [], prompt_window)
        meta["output_token_logprobs"] = _triples(tokenizer, with_text, req.logprobs[:n], output_ids)
        if spec.top_logprobs_num > 0:
            meta["input_top_logprobs"] = _top_rows(tokenizer, with_text, req.input_top or [])
            meta["output_top_logprobs"] = _top_rows(tokenizer, with_text, req.output_top[:n])
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


# -- client side --------------------------------------------------------------------------------


class InferenceError(UserError, RuntimeError):
    """A request failed for good: bad reply, 4xx, or retries exhausted."""


def _version(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1  # e.g. SGLang's "default" before the first update


@dataclass
class Generation:
    """One completion of ``input_ids`` as the server returned it (the reply's wire type).

    ``logprobs[i]`` is ``log_softmax(logits / temperature)`` of ``output_ids[i]``;
    ``versions[i]`` is the weight version that produced it (they differ when the request
    was interrupted by a weight update and resumed). ``finish_reason`` is ``stop``,
    ``length`` or ``abort``.
    """

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str = "stop"
    text: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def parse_generate_reply(body: object, where: str = "server") -> Generation:
    """Check one ``/generate`` reply and return it as a :class:`Generation`: ``info["finish"]``
    holds the reply's whole ``finish_reason`` object, ``info["top_logprobs"]`` its
    ``output_top_logprobs`` when the server sent them (one row per output token).

    Raises :class:`InferenceError` naming what is wrong instead of a ``KeyError``.
    """
    def bad(what: str) -> InferenceError:
        return InferenceError(f"malformed /generate reply from {where}: {what} (got {str(body)[:200]})")

    if not isinstance(body, dict):
        raise bad("expected a JSON object")
    ids, meta = body.get("output_ids"), body.get("meta_info")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad("'output_ids' is not a list of integers")
    if not isinstance(meta, dict):
        raise bad("'meta_info' is missing")
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict) or finish.get("type") not in ("stop", "length", "abort"):
        raise bad("'meta_info.finish_reason.type' is not stop, length or abort")
    lp_rows = meta.get("output_token_logprobs")
    if not isinstance(lp_rows, list) or len(lp_rows) != len(ids):
        raise bad("'meta_info.output_token_logprobs' is missing or does not match output_ids")
    try:
        logprobs = [float(row[0]) for row in lp_rows]
    except (TypeError, ValueError, IndexError):
        raise bad("'output_token_logprobs' rows are not [logprob, token_id, ...]") from None
    per_token = meta.get("output_token_weight_versions")
    if isinstance(per_token, list) and len(per_token) == len(ids):
        versions = [_version(v) for v in per_token]
    else:
        versions = [_version(meta.get("weight_version"))] * len(ids)
    text = body.get("text", "")
    info: dict[str, Any] = {"finish": finish}
    tops = meta.get("output_top_logprobs")
    if isinstance(tops, list) and len(tops) == len(ids):
        info["top_logprobs"] = tops
    return Generation(ids, logprobs, versions, finish["type"], text if isinstance(text, str) else "", info)
