"""Serving a reward model: a sequence-classification model's scores at SGLang's ``/classify``.

A reward model is a Hugging Face ``AutoModelForSequenceClassification`` directory (its
``config.json`` names a ``...ForSequenceClassification`` architecture; one label for a scalar
reward). ``areal-agents serve --model RM_DIR`` (and a run's ``judge.model_path``) serves it with the
protocol SGLang speaks for reward models (``--is-embedding``)::

    POST /classify {"text": "..." | ["...", ...]}          (or "input_ids": [...] | [[...], ...])
    -> {"embedding": [score, ...], "meta_info": {...}}       (a list of them for a list)

The texts are scored as they are sent (the client renders the conversation with the model's chat
template: :class:`~areal_agents.rewards.reward_model.RewardModel`). Requests that arrive together
are scored together: a background thread takes whatever is waiting (up to ``max_batch_size``
texts), pads it into one batch and runs one forward pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from areal_agents.inference._http import error_middleware, read_json
from areal_agents.inference.protocol import BadRequest, require

__all__ = ["Scorer", "create_scoring_app", "is_reward_model", "load_reward_model"]

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_SCORER: web.AppKey[Scorer] = web.AppKey("scorer")
_PATH = web.AppKey("model_path", str)


def is_reward_model(path: str | os.PathLike[str]) -> bool:
    """Whether the model directory ``path`` holds a sequence-classification (reward) model."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith(("ForSequenceClassification", "ForRewardModel")) for a in config.get("architectures") or ())


def load_reward_model(path: str | Path, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` of the reward model at ``path`` (float32 on CPU), in eval mode."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32 if device == "cpu" else "auto")
    if model.config.pad_token_id is None:  # batches are padded: the model finds each text's last token by it
        model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]


@dataclass
class _Job:
    ids: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[list[float]]]


@dataclass
class Scorer:
    """Scores token sequences with a sequence-classification model on a background thread, the
    requests waiting at each moment batched together (at most ``max_batch_size`` sequences)."""

    model: Any
    tokenizer: Any
    max_batch_size: int = 64
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "sequences": 0, "forwards": 0, "max_batch": 0})
    _jobs: queue.Queue[_Job | None] = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scorer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def score(self, ids: list[list[int]]) -> list[list[float]]:
        """The model's outputs (one list of ``num_labels`` floats) for each token sequence of ``ids``."""
        loop = asyncio.get_running_loop()
        job = _Job(ids, loop, loop.create_future())
        self._jobs.put(job)
        return await job.future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            batch = [job]
            while sum(len(j.ids) for j in batch) < self.max_batch_size:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)
                    break
                batch.append(more)
            try:
                outs = self._forward([seq for j in batch for seq in j.ids])
            except Exception as exc:  # answer every waiting request with the error, keep serving
                for j in batch:
                    j.loop.call_soon_threadsafe(_settle, j.future, exc)
                continue
            at = 0
            for j in batch:
                j.loop.call_soon_threadsafe(_settle, j.future, outs[at:at + len(j.ids)])
                at += len(j.ids)

    def _forward(self, seqs: list[list[int]]) -> list[list[float]]:
        import torch

        out: list[list[float]] = []
        pad = int(self.model.config.pad_token_id)
        for start in range(0, len(seqs), self.max_batch_size):
            chunk = seqs[start:start + self.max_batch_size]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, seq in enumerate(chunk):
                ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[i, :len(seq)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.model.device), attention_mask=mask.to(self.model.device)).logits
            out += logits.float().cpu().tolist()
            self.stats["forwards"] += 1
            self.stats["max_batch"] = max(self.stats["max_batch"], len(chunk))
        self.stats["sequences"] += len(seqs)
        return out


def _settle(future: asyncio.Future[list[list[float]]], result: list[list[float]] | Exception) -> None:
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)


def _sequences(body: dict[str, Any], tokenizer: Any) -> tuple[list[list[int]], bool]:
    """The token sequences a ``/classify`` body asks about, and whether it sent a list."""
    if "input_ids" in body:
        ids = body["input_ids"]
        single = bool(ids) and all(isinstance(t, int) for t in ids)
        seqs = [ids] if single else ids
        require(isinstance(seqs, list) and bool(seqs) and all(
            isinstance(s, list) and s and all(isinstance(t, int) and not isinstance(t, bool) for t in s) for s in seqs),
            "input_ids must be a non-empty list of token ids, or a list of them")
        return seqs, not single
    text = body.get("text")
    texts: list[Any] = [text] if isinstance(text, str) else text if isinstance(text, list) else []
    require(bool(texts) and all(isinstance(t, str) and t for t in texts),
            "the body needs 'text' (a non-empty string or list of them) or 'input_ids'")
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts], isinstance(text, list)


async def _classify(request: web.Request) -> web.Response:
    scorer = request.app[_SCORER]
    seqs, many = _sequences(await read_json(request), scorer.tokenizer)
    limit = int(getattr(scorer.model.config, "max_position_embeddings", 0) or 0)
    if limit and (longest := max(map(len, seqs))) > limit:
        raise BadRequest(f"a sequence of {longest} tokens is longer than the model's context ({limit})")
    scorer.stats["requests"] += 1
    scores = await scorer.score(seqs)
    out = [{"embedding": s, "meta_info": {"id": f"classify-{scorer.stats['requests']}-{i}", "prompt_tokens": len(q)}}
           for i, (s, q) in enumerate(zip(scores, seqs, strict=True))]
    return web.json_response(out if many else out[0])


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[_SCORER].alive else 503)


async def _model_info(request: web.Request) -> web.Response:
    scorer, path = request.app[_SCORER], request.app[_PATH]
    return web.json_response({"model_path": path, "tokenizer_path": path, "is_generation": False,
                              "num_labels": int(scorer.model.config.num_labels),
                              "max_context_length": int(getattr(scorer.model.config, "max_position_embeddings", 0) or 0)})


async def _server_info(request: web.Request) -> web.Response:
    scorer, path = request.app[_SCORER], request.app[_PATH]
    return web.json_response({"backend": "embedded", "model_path": path, "is_generation": False,
                              "max_batch_size": scorer.max_batch_size, "scoring": dict(scorer.stats)})


def create_scoring_app(scorer: Scorer, model_path: str) -> web.Application:
    """The aiohttp application serving ``scorer`` (started and stopped with the app)."""
    app = web.Application(middlewares=[error_middleware], client_max_size=64 * 1024**2)
    app[_SCORER], app[_PATH] = scorer, model_path
    app.router.add_post("/classify", _classify)
    for path, handler in (("/health", _health), ("/ready", _health), ("/health_generate", _health),
                          ("/model_info", _model_info), ("/get_model_info", _model_info),
                          ("/server_info", _server_info), ("/get_server_info", _server_info)):
        app.router.add_get(path, handler)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if not scorer.alive:
            scorer.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, scorer.stop)

    app.cleanup_ctx.append(lifecycle)
    return app
