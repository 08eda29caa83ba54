"""Continuous-batching decode engine of the embedded server (torch).

One background thread owns the model and the batch. Each iteration it runs queued
control commands (weight swaps, pauses, aborts) at a token boundary, admits waiting
requests (one left-padded prefill for all of them, then their KV rows join the running
batch), and decodes one token for every running sequence in a single forward pass.
Sequences leave the batch as soon as they finish, so requests join and leave at token
granularity. The event loop never blocks: results come back through callbacks.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from areal_agents.inference._kv import BatchKV
from areal_agents.inference._lora import LoraAdapter, LoraSet
from areal_agents.inference._sampling import prompt_logprobs, sample_next, scaled_logprobs, top_logprobs
from areal_agents.inference.protocol import GenerateSpec, TopRow

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Engine", "GenRequest"]

_T = TypeVar("_T")


@dataclass
class GenRequest:
    """One sequence to complete: the parsed request (``spec``, the wire type of
    :mod:`~areal_agents.inference.protocol`) and the engine's state for it. ``budget`` is how
    many tokens it may generate (default ``spec.max_new_tokens``; the server caps it by the context
    length); the engine fills the output fields and calls ``done``."""

    spec: GenerateSpec
    budget: int = -1
    generator: torch.Generator | None = field(default=None, repr=False)
    done: Callable[[GenRequest], object] | None = None
    on_token: Callable[[GenRequest], object] | None = None  # after each token but the last (streaming)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    output_top: list[TopRow] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top: list[TopRow] | None = None
    finish: dict[str, Any] | None = None
    matched_stop: str | None = None
    error: str | None = None
    stop_ids: frozenset[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.budget < 0:
            self.budget = self.spec.max_new_tokens
        self.stop_ids = frozenset(self.spec.stop_token_ids)


class Engine:
    """Owns ``model`` on one device and decodes all running requests together."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 64,
        weight_version: str = "0",
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.context_len = int(model.config.max_position_embeddings)
        self.weight_version = weight_version
        eos = model.generation_config.eos_token_id
        eos_list = eos if isinstance(eos, list) else [eos]
        self.eos_ids = frozenset(int(e) for e in [*eos_list, tokenizer.eos_token_id] if e is not None)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        self._cond = threading.Condition()
        self._waiting: deque[GenRequest] = deque()
        self._commands: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self.paused = False  # while paused, requests wait and nothing is decoded
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.rows: list[GenRequest] = []
        self._admitting: list[GenRequest] = []
        self.kv = BatchKV(model.config, self.device, torch.float32 if self.device.type == "cpu" else model.dtype,
                          max_rows=max_batch_size)
        self._last_tok = torch.empty(0, dtype=torch.long, device=self.device)
        self._params: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.lora = LoraSet(model)
        self.metrics = {"decode_steps": 0, "decode_seqs": 0, "max_batch": 0, "prefills": 0, "prefill_rows": 0,
                        "tokens": 0, "errors": 0}
        self.error: BaseException | None = None
        # transformers renamed the forward's ``past_key_values`` to ``cache`` (the old name warns, then goes)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # ----------------------------------------------------------------- thread-safe API
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def submit(self, req: GenRequest) -> None:
        with self._cond:
            self._waiting.append(req)
            self._cond.notify()

    def call(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Run ``fn()`` on the decode thread at the next token boundary."""
        fut: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._cond:
            if not self.alive:
                fut.set_exception(RuntimeError("decode loop is not running"))
                return fut
            self._commands.append((fn, fut))
            self._cond.notify()
        return fut

    def queue_sizes(self) -> tuple[int, int]:
        return sum(r.finish is None for r in self.rows), len(self._waiting)

    # --------------------------------------------------- commands (decode thread only)
    def abort_where(self, pred: Callable[[GenRequest], bool], message: str) -> int:
        """Finish matching running and waiting requests with ``abort``; returns the count."""
        with self._cond:
            hit: list[GenRequest] = []
            keep: deque[GenRequest] = deque()
            for req in self._waiting:  # pred once per request
                (hit if pred(req) else keep).append(req)
            self._waiting = keep
        hit += [r for r in self.rows if r.finish is None and pred(r)]
        for req in hit:
            self._finish(req, {"type": "abort", "message": message})
        self._drop_finished(force=True)  # no row may outlive its request (an unloaded adapter, say)
        return len(hit)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused

    def swap_weights(self, state: dict[str, torch.Tensor], version: str, abort_all: bool) -> int:
        """Copy ``state`` into the model; running requests are aborted or recomputed."""
        params = self.model.state_dict()  # detached tensors: no autograd in the copy
        for name, tensor in state.items():
            params[name].copy_(tensor)
        self.weight_version = version
        if abort_all:
            return self.abort_where(lambda r: True, "aborted by a weight update")
        return self.retract()

    def retract(self) -> int:
        """Retract running sequences: they are re-prefilled (prompt + output so far) under
        the new weights, so every later token and logprob is exact for its version."""
        retracted = [r for r in self.rows if r.finish is None]
        self._clear_batch()
        with self._cond:
            self._waiting.extendleft(reversed(retracted))
        return len(retracted)

    def load_lora(self, adapter: LoraAdapter) -> int:
        """Hold ``adapter`` (replacing one of its name: running requests that use it are
        retracted and re-prefilled with the new one); returns how many were retracted."""
        replaced = adapter.name in self.lora.adapters
        self.lora.add(adapter)
        return self.retract() if replaced and any(r.spec.lora_path == adapter.name for r in self.rows) else 0

    def unload_lora(self, name: str) -> int:
        """Drop adapter ``name``; requests that use it are aborted (clients resume them). Returns their count."""
        n = self.abort_where(lambda r: r.spec.lora_path == name, f"LoRA adapter {name!r} was unloaded")
        self.lora.remove(name)
        return n

    def set_version(self, version: str, abort_all: bool) -> int:
        """Tag later tokens with ``version`` (weights unchanged); with ``abort_all`` abort every request."""
        self.weight_version = version
        return self.abort_where(lambda r: True, "aborted by a weight version update") if abort_all else 0

    # ------------------------------------------------------------------- decode loop
    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._cond:
                        while not (
                            self._stopping or self._commands or (not self.paused and (self._waiting or self.rows))
                        ):
                            self._cond.wait()
                        if self._stopping:
                            break
                        commands = list(self._commands)
                        self._commands.clear()
                    for fn, fut in commands:
                        try:
                            fut.set_result(fn())
                        except Exception as exc:  # reported to the caller, the loop goes on
                            fut.set_exception(exc)
                    if self.paused:
                        continue
                    try:
                        self._admit()
                        if self.rows:
                            self._decode_step()
                    except Exception as exc:  # fail this batch's requests, keep serving
                        self._fail_batch(exc)
        except BaseException as exc:  # a dead loop must not leave requests hanging
            self.error = exc
            self.abort_where(lambda r: True, f"decode loop failed: {exc!r}")
            raise
        finally:
            with self._cond:
                for _fn, fut in self._commands:
                    fut.set_exception(RuntimeError("decode loop stopped"))
                self._commands.clear()

    def _admit(self) -> None:
        free = self.max_batch_size - len(self.rows)  # none: the group below is empty
        with self._cond:
            group = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        for req in [r for r in group if r.spec.lora_path is not None and r.spec.lora_path not in self.lora.adapters]:
            self._finish(req, {"type": "abort", "message": f"LoRA adapter {req.spec.lora_path!r} is not loaded"})
            group.remove(req)
        if not group:
            return
        self._admitting = group
        seqs = [r.spec.prompt + r.output_ids for r in group]
        # Requests with the same tokens and adapter (the samples of a group) share one prefill row.
        first: dict[tuple[str | None, tuple[int, ...]], int] = {}
        src = [first.setdefault((r.spec.lora_path, tuple(s)), len(first)) for r, s in zip(group, seqs, strict=True)]
        length = max(len(s) for s in seqs)
        ids = torch.full((len(first), length), self.pad_id, dtype=torch.long)
        valid = torch.zeros((len(first), length), dtype=torch.bool)
        for i, (_, s) in enumerate(first):
            ids[i, length - len(s) :] = torch.tensor(s, dtype=torch.long)
            valid[i, length - len(s) :] = True
        ids, valid = ids.to(self.device), valid.to(self.device)
        pos = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()
        mask = (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=self.device)[None]
        cache = self.kv.fresh_cache()
        scored = [i for i, r in enumerate(group) if r.spec.logprob_start_len >= 0 and r.input_logprobs is None]
        with self.lora.rows([lora for lora, _ in first]):
            out = self.model(input_ids=ids, attention_mask=mask[:, None], position_ids=pos, use_cache=True,
                             logits_to_keep=0 if scored else 1, **{self._cache_kw: cache})  # fmt: skip
        self.metrics["prefills"] += 1
        self.metrics["prefill_rows"] += len(first)
        for i in scored:  # a retracted request keeps the prompt logprobs of its first prefill
            req = group[i]
            rows = out.logits[src[i], length - len(seqs[i]) :]
            req.input_logprobs, req.input_top = prompt_logprobs(rows, req.spec.prompt, req.spec.logprob_start_len,
                                                                req.spec.top_logprobs_num)  # fmt: skip
        tokens, lps, tops = self._sample(out.logits[src, -1], group)
        keep = [i for i, req in enumerate(group) if not self._append(req, tokens[i], lps[i], tops[i])]
        if keep:
            self.kv.merge(cache, valid, [src[i] for i in keep])
            self.rows.extend(group[i] for i in keep)
            self._last_tok = torch.cat([self._last_tok, torch.tensor([tokens[i] for i in keep], device=self.device)])
            self._params = None
        self._admitting = []

    def _fail_batch(self, exc: Exception) -> None:
        """A forward pass failed: end every request in it with an error, start clean."""
        self.metrics["errors"] += 1
        for req in [*self.rows, *self._admitting]:
            if req.finish is None:
                req.error = f"{type(exc).__name__}: {exc}"
                self._finish(req, {"type": "abort", "message": f"server error: {req.error}"})
        self._clear_batch()

    def _clear_batch(self) -> None:
        self.rows, self._admitting, self._params = [], [], None
        self.kv.clear()
        self._last_tok = self._last_tok[:0]

    def _decode_step(self) -> None:
        mask, pos = self.kv.step_inputs()
        with self.lora.rows([r.spec.lora_path for r in self.rows]):
            out = self.model(
                input_ids=self._last_tok[:, None],
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: self.kv.cache},
            )
        batch = sum(r.finish is None for r in self.rows)
        self.metrics["decode_steps"] += 1
        self.metrics["decode_seqs"] += batch
        self.metrics["max_batch"] = max(self.metrics["max_batch"], batch)
        tokens, lps, tops = self._sample(out.logits[:, -1], self.rows)
        self._last_tok = torch.tensor(tokens, dtype=torch.long, device=self.device)
        finished = False
        for req, tok, lp, top in zip(self.rows, tokens, lps, tops, strict=True):
            if req.finish is None:  # a finished row waits, decoded and ignored, for the next compaction
                finished |= self._append(req, tok, lp, top)
        if finished:
            self._drop_finished()

    def _sample(self, logits: torch.Tensor, reqs: list[GenRequest]) -> tuple[list[int], list[float], list[TopRow]]:
        params = self._params if reqs is self.rows else None
        if params is None:
            params = (
                torch.tensor([r.spec.temperature for r in reqs], dtype=torch.float32, device=self.device),
                torch.tensor([r.spec.top_p for r in reqs], dtype=torch.float32, device=self.device),
                torch.tensor([r.spec.top_k for r in reqs], dtype=torch.long, device=self.device),
            )
            if reqs is self.rows:
                self._params = params
        for r in reqs:
            if r.spec.sampling_seed is not None and r.generator is None:
                r.generator = torch.Generator(device=self.device).manual_seed(r.spec.sampling_seed)
        own = [r.generator for r in reqs] if any(r.generator is not None for r in reqs) else None
        tokens, lps = sample_next(logits, *params, generator=self.generator, row_generators=own)
        nums = [r.spec.top_logprobs_num for r in reqs]
        tops: list[TopRow] = top_logprobs(scaled_logprobs(logits, params[0])[1], nums) if any(nums) else [None] * len(reqs)
        return tokens.tolist(), lps.tolist(), tops

    def _append(self, req: GenRequest, tok: int, lp: float, top: TopRow = None) -> bool:
        """Record one sampled token; finish the request when a stop rule fires."""
        if req.budget <= 0:  # prompt scoring only: the prefill was all it needed
            self._finish(req, {"type": "length", "length": 0})
            return True
        req.output_ids.append(tok)
        req.logprobs.append(lp)
        if req.spec.top_logprobs_num > 0:
            req.output_top.append(top)
        req.versions.append(self.weight_version)
        self.metrics["tokens"] += 1
        n = len(req.output_ids)
        if n >= req.spec.min_new_tokens:
            if tok in req.stop_ids or (not req.spec.ignore_eos and tok in self.eos_ids):
                self._finish(req, {"type": "stop", "matched": tok})
                return True
            if req.spec.stop:
                window = max(len(s) for s in req.spec.stop) + 2
                tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=True)
                for s in req.spec.stop:
                    if s in tail:
                        req.matched_stop = s
                        self._finish(req, {"type": "stop", "matched": s})
                        return True
        if n >= req.budget or len(req.spec.prompt) + n >= self.context_len:
            self._finish(req, {"type": "length", "length": n})
            return True
        if req.on_token is not None:
            req.on_token(req)
        return False

    def _finish(self, req: GenRequest, reason: dict[str, Any]) -> None:
        req.finish = reason
        if req.done is not None:
            req.done(req)

    def _drop_finished(self, force: bool = False) -> None:
        """Compact the batch: drop the rows of finished requests from it and from the KV cache.

        Compaction copies the whole cache, and every slot it frees costs a prefill forward pass
        to refill; so unless ``force``, finished rows stay (decoded, their tokens ignored) until
        they are a quarter of the batch, and then leave together and are refilled in one prefill.
        """
        keep = [i for i, r in enumerate(self.rows) if r.finish is None]
        if len(keep) == len(self.rows) or (not force and 4 * (len(self.rows) - len(keep)) < len(self.rows)):
            return
        self.rows = [self.rows[i] for i in keep]
        self._last_tok = self._last_tok[keep] if keep else self._last_tok[:0]
        self._params = None
        self.kv.select(keep)
