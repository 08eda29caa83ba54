"""The embedded server, as a real subprocess on loopback, speaking SGLang's protocol."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from inference_support import corpus, reforward_logprobs, start_servers

from areal_agents.inference import control
from areal_agents.inference.launcher import ServerHandle


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path]) -> tuple[Path, Path]:
    return tiny_model(corpus(), seed=0), tiny_model(corpus(), seed=1)


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with start_servers(models[0], 1, tmp_path_factory.mktemp("logs"), max_batch_size=32) as group:
        yield group[0]


def post(server: ServerHandle, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
    if content is not None:
        return httpx.post(server.url + path, content=content, timeout=60)
    return httpx.post(server.url + path, json=body, timeout=60)


def generate(server: ServerHandle, **body: Any) -> Any:
    resp = post(server, "/generate", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_single_request_fields(server: ServerHandle) -> None:
    out = generate(server, input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 6, "ignore_eos": True},
                   return_logprob=True, rid="req-1")  # fmt: skip
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["id"] == "req-1"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 6 == len(out["output_ids"])
    assert meta["weight_version"] == "0"
    lps = meta["output_token_logprobs"]
    assert [row[1] for row in lps] == out["output_ids"] and all(row[2] is None for row in lps)
    assert all(lp <= 0.0 for lp, _, _ in lps)
    assert isinstance(out["text"], str)


def test_text_batch_and_n(server: ServerHandle) -> None:
    out = generate(server, text=["What is 1 + 2?", "The answer"], sampling_params={"max_new_tokens": 3, "n": 2})
    assert isinstance(out, list) and len(out) == 4
    assert all(len(o["output_ids"]) == 3 and "output_token_logprobs" not in o["meta_info"] for o in out)
    assert len({o["meta_info"]["id"] for o in out}) == 4
    batch = generate(server, input_ids=[[1, 2], [3, 4, 5]], sampling_params={"max_new_tokens": 2}, rid=["a", "b"])
    assert [o["meta_info"]["id"] for o in batch] == ["a", "b"]
    assert [o["meta_info"]["prompt_tokens"] for o in batch] == [2, 3]


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.0},
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
    ],
)
def test_logprobs_equal_a_full_reforward(server: ServerHandle, models: tuple[Path, Path], sampling: dict) -> None:
    rng = random.Random(1)
    prompt = [rng.randrange(3, 250) for _ in range(11)]
    out = generate(server, input_ids=prompt, return_logprob=True,
                   sampling_params={"max_new_tokens": 40, "ignore_eos": True, **sampling})  # fmt: skip
    ids = out["output_ids"]
    got = [row[0] for row in out["meta_info"]["output_token_logprobs"]]
    temperature = sampling["temperature"] or 1.0  # greedy: logprobs at temperature 1
    want = reforward_logprobs(models[0], prompt, ids, temperature)
    assert len(ids) == 40
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    if sampling["temperature"] == 0.0:
        again = generate(server, input_ids=prompt, sampling_params={"max_new_tokens": 40, "ignore_eos": True,
                                                                    "temperature": 0.0})  # fmt: skip
        assert again["output_ids"] == ids


def test_logprobs_exact_when_sequences_join_a_running_batch(server: ServerHandle, models: tuple[Path, Path]) -> None:
    """Prompts of different lengths arrive while others decode: left padding must not leak."""
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(1, 30))] for _ in range(12)]

    async def run() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int, p: list[int]) -> Any:
                await asyncio.sleep(0.01 * i)
                body = {"input_ids": p, "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 8 + 3 * i, "ignore_eos": True}}  # fmt: skip
                async with session.post(server.url + "/generate", json=body) as r:
                    return await r.json()

            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    outs = asyncio.run(run())
    for p, o in zip(prompts, outs, strict=True):
        want = reforward_logprobs(models[0], p, o["output_ids"])
        got = [row[0] for row in o["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4


def test_stop_rules(server: ServerHandle, models: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models[0])
    greedy = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    free = generate(server, input_ids=[9, 10], sampling_params=greedy)
    ids = free["output_ids"]
    third = ids[2]
    out = generate(server, input_ids=[9, 10], sampling_params={**greedy, "ignore_eos": False, "stop_token_ids": [third]})
    assert out["output_ids"] == ids[: ids.index(third) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": third}
    top1 = generate(server, input_ids=[9, 10], return_logprob=True,
                    sampling_params={**greedy, "temperature": 1.0, "top_k": 1})  # fmt: skip
    assert top1["output_ids"] == ids  # top_k=1 is greedy, but logprobs are not 0: taken before filtering
    assert all(lp < 0 for lp, _, _ in top1["meta_info"]["output_token_logprobs"])
    zero = generate(server, input_ids=[9, 10], sampling_params={"max_new_tokens": 0})
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["type"] == "length"
    # a stop string: the text of a printable token in some greedy output
    def printable(piece: str) -> bool:
        return bool(piece.strip()) and piece.isprintable() and "\ufffd" not in piece

    for first in range(3, 60):
        free = generate(server, input_ids=[first, 10], sampling_params={**greedy, "max_new_tokens": 24})
        ids, pieces = free["output_ids"], [tok.decode([t]) for t in free["output_ids"]]
        if any(printable(p) for p in pieces):
            break
    stop = next(p for p in pieces if printable(p))
    text = free["text"]
    greedy["max_new_tokens"] = 24
    cut = generate(server, input_ids=[first, 10], sampling_params={**greedy, "stop": [stop]})
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["text"] == text[: text.index(stop)]
    assert ids[: len(cut["output_ids"])] == cut["output_ids"] and len(cut["output_ids"]) <= pieces.index(stop) + 1
    kept = generate(server, input_ids=[first, 10], sampling_params={**greedy, "stop": stop, "no_stop_trim": True})
    assert kept["text"].endswith(stop) and kept["output_ids"] == cut["output_ids"]


def test_concurrent_requests_share_forward_passes(server: ServerHandle) -> None:
    before = httpx.get(server.url + "/server_info").json()["batching"]

    async def waiting() -> int:
        info = await asyncio.to_thread(httpx.get, server.url + "/server_info")
        return int(info.json()["batching"]["num_waiting"])

    async def run() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> Any:
                body = {"input_ids": [3 + i, 4], "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
                async with session.post(server.url + "/generate", json=body) as r:
                    return await r.json()

            # paused, the server queues them: all 24 are there together however slowly they arrive
            await asyncio.to_thread(control.pause_generation, server.address, "in_place")
            try:
                calls = asyncio.gather(*(one(i) for i in range(24)))
                deadline = time.monotonic() + 60
                while await waiting() < 24 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert await waiting() == 24
            finally:
                await asyncio.to_thread(control.continue_generation, server.address)
            return await calls

    outs = asyncio.run(run())
    after = httpx.get(server.url + "/server_info").json()["batching"]
    assert all(len(o["output_ids"]) == 24 for o in outs)
    steps = after["decode_steps"] - before["decode_steps"]
    assert after["max_batch_size_seen"] >= 12
    assert steps < 24 * 23 / 4  # far fewer forwards than one per request-token
    metrics = httpx.get(server.url + "/metrics").text
    assert "embedded_mean_batch_size" in metrics


def _page_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/PID/stat``, field 10)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_steady_decoding_reuses_freed_memory(server: ServerHandle) -> None:
    """The server keeps freed memory for the next step's tensors (runtime.heap.keep_freed_memory):
    once warm, decoding costs next to no page faults. Without it each decode step's blocks were
    mapped afresh, ~0.65 faults per generated token here (0.03 with it)."""
    async def rounds(n: int) -> None:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> Any:
                body = {"input_ids": [3 + i % 50, 4, 5, 6], "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}}
                async with session.post(server.url + "/generate", json=body) as r:
                    return await r.json()

            for _ in range(n):
                outs = await asyncio.gather(*(one(i) for i in range(64)))
                assert all(len(o["output_ids"]) == 32 for o in outs)

    asyncio.run(rounds(1))  # warm: the batch's sizes seen once
    before = _page_faults(server.process.pid)
    asyncio.run(rounds(5))
    per_token = (_page_faults(server.process.pid) - before) / (5 * 64 * 32)
    assert per_token < 0.2, f"{per_token:.2f} page faults per generated token"


def test_model_info_health_and_control(server: ServerHandle) -> None:
    info = httpx.get(server.url + "/model_info").json()
    assert info["is_generation"] is True and info["weight_version"] == "0" and Path(info["model_path"]).is_dir()
    assert httpx.get(server.url + "/get_model_info").json() == info
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/health_generate", timeout=30).status_code == 200
    assert httpx.post(server.url + "/flush_cache").status_code == 200
    nccl = post(server, "/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1,
                                                        "rank_offset": 1, "world_size": 2})  # fmt: skip
    assert nccl.status_code == 400 and "must be gloo" in nccl.json()["error"]["message"]  # CPU: no NCCL


async def _batching_when(server: ServerHandle, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The server's batching counters once ``ready`` holds for them (polled, 60 s deadline)."""
    deadline = time.monotonic() + 60
    while True:
        batching = (await asyncio.to_thread(httpx.get, server.url + "/server_info")).json()["batching"]
        if ready(batching) or time.monotonic() >= deadline:
            return batching
        await asyncio.sleep(0.005)


def test_pause_in_place_holds_requests_until_continue(server: ServerHandle) -> None:
    assert post(server, "/pause_generation", {"mode": "in_place"}).json()["status"] == "ok"
    before = httpx.get(server.url + "/server_info").json()["batching"]["generated_tokens"]

    async def run() -> tuple[bool, dict[str, Any], Any]:
        async with aiohttp.ClientSession() as session:
            body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
            task = asyncio.ensure_future(session.post(server.url + "/generate", json=body))
            queued = await _batching_when(server, lambda b: b["num_waiting"] == 1)  # the request is at the server
            held = not task.done()
            await asyncio.to_thread(post, server, "/continue_generation", {})
            resp = await task
            return held, queued, await resp.json()

    held, queued, out = asyncio.run(run())
    assert queued["num_waiting"] == 1 and queued["generated_tokens"] == before and held  # queued, nothing decoded
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_request_returns_partial_output(server: ServerHandle) -> None:
    async def run() -> Any:
        async with aiohttp.ClientSession() as session:
            body = {"input_ids": [5, 6], "rid": "to-abort", "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}  # fmt: skip
            before = (await asyncio.to_thread(httpx.get, server.url + "/server_info")).json()["batching"]
            task = asyncio.ensure_future(session.post(server.url + "/generate", json=body))
            await _batching_when(server, lambda b: b["generated_tokens"] > before["generated_tokens"])  # decoding
            ack = await asyncio.to_thread(post, server, "/abort_request", {"rid": "to-abort"})
            resp = await task
            return ack.json(), await resp.json()

    ack, out = asyncio.run(run())
    assert ack["num_aborted"] == 1
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(out["output_ids"]) < 900
    assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])


BAD_BODIES: list[Any] = [
    {}, [], "x", 3, None, {"input_ids": []}, {"input_ids": "abc"}, {"input_ids": [1, "2"]}, {"input_ids": [1.5]},
    {"input_ids": [-1]}, {"input_ids": [10**9]}, {"input_ids": [True]}, {"input_ids": [[1], []]},
    {"input_ids": [[1], 2]}, {"text": 5}, {"text": []}, {"text": "hi", "input_ids": [1]},
    {"input_ids": [1], "sampling_params": []}, {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
    {"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}}, {"input_ids": [1], "sampling_params": {"temperature": -1}},
    {"input_ids": [1], "sampling_params": {"top_p": 0}}, {"input_ids": [1], "sampling_params": {"top_k": 0}},
    {"input_ids": [1], "sampling_params": {"n": 0}}, {"input_ids": [1], "sampling_params": {"stop": [1]}},
    {"input_ids": [1], "sampling_params": {"stop_token_ids": [99999]}}, {"input_ids": [1], "sampling_params": {"bogus": 1}},
    {"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}, {"input_ids": [1], "return_logprob": "yes"},
    {"input_ids": [1], "rid": 5}, {"input_ids": [[1], [2]], "rid": ["a"]}, {"input_ids": [1], "stream": "yes"},
    {"input_ids": [1], "unknown_field": 1}, {"input_ids": [1] * 5000},
    {"input_ids": [1], "sampling_params": {"temperature": float("nan")}},
]  # fmt: skip


def test_bad_requests_get_400_json_and_the_server_keeps_serving(server: ServerHandle) -> None:
    rng = random.Random(0)
    raw: list[bytes] = [b"{", b"", b"\xff\xfe", b"null", b'{"input_ids": [1,', b"[[[[", b'{"input_ids": NaN}']
    for _ in range(40):  # random byte strings and random JSON values
        raw.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))))
        key = rng.choice(["input_ids", "text", "sampling_params", "rid"])
        value = rng.choice([None, 1, -5, [1, [2]], {"a": 1}, [0.5], [[]], "s" if key != "text" else 7])
        raw.append(json.dumps({key: value}).encode())
    bodies = [json.dumps(b, allow_nan=True).encode() for b in BAD_BODIES] + raw
    for content in bodies:
        resp = post(server, "/generate", content=content)
        assert resp.status_code == 400, (content, resp.status_code, resp.text)
        err = resp.json()["error"]["message"]
        assert isinstance(err, str) and err
    for path, body in (("/update_weights_from_disk", {}), ("/update_weights_from_disk", {"model_path": 3}),
                       ("/pause_generation", {"mode": "sideways"}), ("/abort_request", {"rid": 3})):  # fmt: skip
        assert post(server, path, body).status_code == 400
    assert httpx.get(server.url + "/nowhere").status_code == 404
    assert httpx.get(server.url + "/health").status_code == 200
    ok = generate(server, input_ids=[1, 2], sampling_params={"max_new_tokens": 2})
    assert len(ok["output_ids"]) == 2


def _events(raw: bytes) -> list[Any]:
    chunks = [c for c in raw.split(b"\n\n") if c]
    assert all(c.startswith(b"data: ") for c in chunks), raw[:300]
    return [c[6:].decode() if c == b"data: [DONE]" else json.loads(c[6:]) for c in chunks]


def test_stream_sends_the_reply_token_by_token(server: ServerHandle, models: tuple[Path, Path]) -> None:
    body = {"input_ids": [5, 9, 12], "sampling_params": {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True},
            "return_logprob": True}
    whole = generate(server, **body)
    resp = post(server, "/generate", {**body, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = _events(resp.content)
    assert events[-1] == "[DONE]"
    replies = events[:-1]
    sizes = [len(r["output_ids"]) for r in replies]  # cumulative; tokens made between two sends share an event
    assert len(sizes) >= 2 and sizes == sorted(set(sizes)) and sizes[-1] == 48
    assert all(r["meta_info"]["finish_reason"] is None for r in replies[:-1])
    last = replies[-1]
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 48}
    got = [lp for lp, _, _ in last["meta_info"]["output_token_logprobs"]]
    want = [lp for lp, _, _ in whole["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(want, abs=1e-5)
    for a, b in zip(replies[:-1], replies[1:], strict=True):  # every event extends the one before
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]


def test_a_streamed_batch_sends_each_reply_when_it_finishes(server: ServerHandle) -> None:
    """A batch with ``stream``: one event per request, its whole reply and its ``index``, in the
    order they finish (the short one first), each the reply the batch gives without streaming."""
    body = {"input_ids": [[5, 9, 12], [5, 9, 13], [7]], "return_logprob": True,
            "sampling_params": [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in (300, 3, 40)]}
    whole = generate(server, **body)
    resp = post(server, "/generate", {**body, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = _events(resp.content)
    assert events[-1] == "[DONE]" and [e["index"] for e in events[:-1]] == [1, 2, 0]
    for event in events[:-1]:
        want = whole[event.pop("index")]
        assert event["output_ids"] == want["output_ids"] and event["meta_info"]["finish_reason"]["type"] == "length"
        got = [lp for lp, _, _ in event["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx([lp for lp, _, _ in want["meta_info"]["output_token_logprobs"]], abs=1e-5)
    samples = _events(post(server, "/generate", {"input_ids": [5], "stream": True,
                                                 "sampling_params": {"n": 2, "max_new_tokens": 4}}).content)
    assert sorted(e["index"] for e in samples[:-1]) == [0, 1] and samples[-1] == "[DONE]"


def test_a_stream_reader_that_goes_away_frees_its_batch_slot(server: ServerHandle) -> None:
    before = httpx.get(server.url + "/server_info").json()["batching"]["generated_tokens"]
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as resp:
        first = next(resp.iter_lines())
        assert first.startswith("data: ") and json.loads(first[6:])["output_ids"]
    deadline = time.monotonic() + 30
    while httpx.get(server.url + "/server_info").json()["batching"]["num_running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    batching = httpx.get(server.url + "/server_info").json()["batching"]
    assert batching["num_running"] == 0
    assert batching["generated_tokens"] - before < 1000  # stopped early, not run to the end


def test_a_client_that_goes_away_frees_its_batch_slot(server: ServerHandle) -> None:
    def batching() -> dict:
        return httpx.get(server.url + "/server_info").json()["batching"]

    before = batching()["generated_tokens"]
    body = json.dumps({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}).encode()
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:  # a client that sends, then goes away
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while batching()["generated_tokens"] == before and time.monotonic() < deadline:  # until it is decoding
            time.sleep(0.005)
        assert batching()["num_running"] == 1
    deadline = time.monotonic() + 30
    while batching()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert batching()["num_running"] == 0
    assert batching()["generated_tokens"] - before < 1000  # stopped early, not run to the end


def test_requests_a_decode_step_finishes_wake_the_event_loop_once() -> None:
    """The decode thread hands finished requests to the event loop in one wake-up per burst (all
    that finish before the loop runs), each future resolved with its own request; the next burst
    wakes it again."""
    import threading

    from areal_agents.inference.server import _Finished

    loop = asyncio.new_event_loop()
    wakeups: list[object] = []
    schedule = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any) -> Any:
        wakeups.append(callback)
        return schedule(callback, *args)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
    finished = _Finished(loop)
    try:
        for burst in (1, 2):
            futures = [loop.create_future() for _ in range(40)]
            requests = [object() for _ in futures]
            callbacks = [(finished.callback(f), r) for f, r in zip(futures, requests, strict=True)]
            thread = threading.Thread(target=lambda calls=callbacks: [done(r) for done, r in calls])
            thread.start()
            thread.join()
            loop.run_until_complete(asyncio.wait_for(asyncio.gather(*futures), 10))
            assert [f.result() for f in futures] == requests
            assert len(wakeups) == burst  # one a burst, not one a request
    finally:
        loop.close()


def test_requests_without_an_rid_get_distinct_ones_and_an_rid_is_kept() -> None:
    from areal_agents.inference.protocol import parse_generate

    body = {"input_ids": [[1, 2], [3, 4], [5]], "sampling_params": {"max_new_tokens": 2}}
    rids = [s.rid for _ in range(3) for s in parse_generate(body, None, 100, 64)[0]]
    assert len(set(rids)) == len(rids) == 9
    kept, _ = parse_generate({"input_ids": [1, 2], "rid": "mine", "sampling_params": {"n": 2}}, None, 100, 64)
    assert [s.rid for s in kept] == ["mine-0", "mine-1"]
