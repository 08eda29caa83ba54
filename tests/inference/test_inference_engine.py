"""The decode engine in-process: batching, sampling semantics, recovery from a failed step."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from inference_support import corpus

from areal_agents.inference._engine import Engine, GenRequest
from areal_agents.inference._sampling import sample_next
from areal_agents.inference.protocol import GenerateSpec
from areal_agents.inference.server import load_model


@pytest.fixture(scope="module")
def engine(tiny_model: Callable[..., Path]) -> Iterator[Engine]:
    model_dir = tiny_model(corpus(), seed=0)
    model, tok = load_model(model_dir)
    eng = Engine(model, tok, max_batch_size=8)
    eng.start()
    yield eng
    eng.stop()


def request(**spec: Any) -> GenRequest:
    """An engine request for a parsed ``/generate`` spec with these fields."""
    return GenRequest(GenerateSpec(**spec))


def run_all(engine: Engine, reqs: list[GenRequest], timeout: float = 60) -> list[GenRequest]:
    done = threading.Semaphore(0)
    for r in reqs:
        r.done = lambda _r: done.release()
        engine.submit(r)
    for _ in reqs:
        assert done.acquire(timeout=timeout)
    return reqs


def test_more_requests_than_slots_all_finish(engine: Engine) -> None:
    reqs = [request(rid=str(i), prompt=[3 + i, 4], max_new_tokens=5 + i, ignore_eos=True) for i in range(20)]
    run_all(engine, reqs)
    assert [len(r.output_ids) for r in reqs] == [5 + i for i in range(20)]
    assert engine.metrics["max_batch"] <= 8
    rows, batch = engine.call(lambda: (list(engine.rows), engine.kv.batch)).result(10)  # at a token boundary
    assert rows == [] and batch == 0


class _FailOnce:
    """Fault injection: the next model call raises, later ones run the real model."""

    def __init__(self, model: Any) -> None:
        self.model, self.armed = model, True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.armed = False
            raise RuntimeError("injected failure")
        return self.model(*args, **kwargs)


def test_a_failed_step_fails_its_requests_and_the_engine_keeps_serving(engine: Engine) -> None:
    real = engine.model
    engine.call(lambda: setattr(engine, "model", _FailOnce(real))).result(10)
    try:
        failed = run_all(engine, [request(rid="f", prompt=[5, 6], max_new_tokens=4)])[0]
        assert failed.error is not None and "injected failure" in failed.error
        assert failed.finish is not None and failed.finish["type"] == "abort"
        ok = run_all(engine, [request(rid="ok", prompt=[5, 6], max_new_tokens=4, ignore_eos=True)])[0]
        assert ok.error is None and len(ok.output_ids) == 4 and engine.alive
        assert engine.metrics["errors"] == 1
    finally:
        engine.call(lambda: setattr(engine, "model", real)).result(10)


def test_sampling_filters_do_not_change_logprobs() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=gen)
    temp = torch.tensor([0.0, 1.0, 0.5, 0.5])
    top_p = torch.tensor([1.0, 1.0, 0.3, 1.0])
    top_k = torch.tensor([-1, 1, -1, 3])
    tokens, lps = sample_next(logits, temp, top_p, top_k, generator=gen)
    assert tokens[0] == logits[0].argmax() and tokens[1] == logits[1].argmax()  # greedy and top_k=1
    scale = torch.tensor([1.0, 1.0, 0.5, 0.5])
    want = torch.log_softmax(logits / scale[:, None], dim=-1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(lps, want)
    assert tokens[3] in logits[3].topk(3).indices
    probs = torch.softmax(logits[2] / 0.5, dim=-1)
    order = probs.argsort(descending=True)
    nucleus = order[: int((probs[order].cumsum(0) < 0.3).sum()) + 1]
    assert tokens[2] in nucleus


def test_identical_requests_share_one_prefill_row_and_sample_independently(engine: Engine) -> None:
    """A group's samples (same prompt) are prefilled once, then each samples on its own: the
    greedy ones agree with a lone request token for token, the sampled ones differ."""
    lone = run_all(engine, [request(rid="lone", prompt=[5, 6, 7, 8], max_new_tokens=6, temperature=0.0,
                                       ignore_eos=True)])[0]
    engine.call(lambda: engine.set_paused(True)).result(10)
    before = dict(engine.metrics)
    greedy = [request(rid=f"g{i}", prompt=[5, 6, 7, 8], max_new_tokens=6, temperature=0.0, ignore_eos=True)
              for i in range(3)]
    sampled = [request(rid=f"s{i}", prompt=[5, 6, 7, 8], max_new_tokens=6, ignore_eos=True) for i in range(5)]
    done = threading.Semaphore(0)
    for r in greedy + sampled:
        r.done = lambda _r: done.release()
        engine.submit(r)
    engine.call(lambda: engine.set_paused(False)).result(10)
    for _ in range(8):
        assert done.acquire(timeout=60)
    assert engine.metrics["prefills"] - before["prefills"] == 1  # all eight admitted together...
    assert engine.metrics["prefill_rows"] - before["prefill_rows"] == 1  # ...on one prefill row
    for r in greedy:
        assert r.output_ids == lone.output_ids
        assert r.logprobs == pytest.approx(lone.logprobs, abs=1e-5)
    assert len({tuple(r.output_ids) for r in sampled}) > 1


def test_finished_rows_leave_in_waves_and_change_no_request(engine: Engine) -> None:
    """A full batch whose requests finish one per step compacts and refills once per wave (a
    quarter of its rows), not once per finish; every request's tokens and logprobs are still
    those it gets alone."""
    def reqs() -> list[GenRequest]:
        return [request(rid=f"w{i}", prompt=[3 + i % 7, 4 + i % 5, 9], max_new_tokens=1 + i, temperature=0.0,
                           ignore_eos=True) for i in range(32)]

    alone = [run_all(engine, [r])[0] for r in reqs()]
    engine.call(lambda: engine.set_paused(True)).result(10)
    before = dict(engine.metrics)
    together = reqs()
    done = threading.Semaphore(0)
    for r in together:
        r.done = lambda _r: done.release()
        engine.submit(r)
    engine.call(lambda: engine.set_paused(False)).result(10)
    for _ in together:
        assert done.acquire(timeout=60)
    # 8 admitted at once, then the other 24 refill the slots of finished rows: a prefill per
    # finish takes 24 prefills here, a wave of two finishes at a time 14
    assert engine.metrics["prefills"] - before["prefills"] <= 16
    assert engine.metrics["max_batch"] <= 8
    for a, t in zip(alone, together, strict=True):
        assert t.output_ids == a.output_ids and len(t.output_ids) == t.spec.max_new_tokens
        assert t.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    rows, batch = engine.call(lambda: (list(engine.rows), engine.kv.batch)).result(10)
    assert rows == [] and batch == 0  # the last wave left the batch empty


class _OldCacheName(torch.nn.Module):
    """The model behind a forward that names its cache ``past_key_values`` (transformers before
    the rename to ``cache``, e.g. 5.17); an unknown ``cache`` keyword would be dropped silently."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner = model
        self.config, self.generation_config = model.config, model.generation_config

    def forward(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                past_key_values: Any = None, use_cache: bool = True, logits_to_keep: int = 0, **kwargs: Any) -> Any:
        assert "cache" not in kwargs, "the engine passed the cache under a name this forward does not take"
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep)


def test_the_cache_goes_by_the_name_the_models_forward_takes(engine: Engine) -> None:
    """Greedy decodes agree token for token whether the forward calls its cache ``cache`` or
    ``past_key_values``: with the wrong name every step would re-read only its last token."""
    prompt = [5, 6, 7, 8, 9]
    want = run_all(engine, [request(rid="new", prompt=prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)])
    old = Engine(_OldCacheName(engine.model), engine.tokenizer, max_batch_size=4)
    assert old._cache_kw == "past_key_values" and engine._cache_kw in ("cache", "past_key_values")
    old.start()
    try:
        got = run_all(old, [request(rid="old", prompt=prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)])
    finally:
        old.stop()
    assert got[0].output_ids == want[0].output_ids and len(got[0].output_ids) == 8
    assert got[0].logprobs == pytest.approx(want[0].logprobs, abs=1e-5)
