"""InferenceClient against real embedded servers (and a fault-injecting fake for bad replies)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from inference_support import corpus, start_servers

from areal_agents.inference.client import InferenceClient, InferenceError
from areal_agents.inference.launcher import ServerGroup, free_port
from areal_agents.inference.protocol import parse_generate_reply
from areal_agents.llm import ClientLLM, Generation


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path]) -> tuple[Path, Path]:
    return tiny_model(corpus(), seed=0), tiny_model(corpus(), seed=1)


@pytest.fixture(scope="module")
def pair(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    with start_servers(models[0], 2, tmp_path_factory.mktemp("logs")) as group:
        yield group


def run(coro_fn: Callable[[InferenceClient], Any], client: InferenceClient) -> Any:
    async def main() -> Any:
        try:
            return await coro_fn(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


SAMPLING = {"max_new_tokens": 4, "ignore_eos": True}


def test_round_robin_sticky_and_least_loaded(pair: ServerGroup) -> None:
    async def spread(client: InferenceClient) -> tuple[Counter, Counter]:
        free = [await client.generate([1, 2, 3], SAMPLING) for _ in range(6)]
        sticky = [await client.generate([1, 2, 3], SAMPLING, rid="episode-7") for _ in range(5)]
        return Counter(g.info["server"] for g in free), Counter(g.info["server"] for g in sticky)

    free, sticky = run(spread, InferenceClient(pair.addresses))
    assert sorted(free.values()) == [3, 3]
    assert len(sticky) == 1 and sum(sticky.values()) == 5

    async def concurrent(client: InferenceClient) -> Counter:
        gens = await asyncio.gather(*(client.generate([1, 2], {"max_new_tokens": 30, "ignore_eos": True})
                                      for _ in range(16)))  # fmt: skip
        assert all(len(g.output_ids) == 30 and len(g.logprobs) == 30 and g.versions == [0] * 30 for g in gens)
        return Counter(g.info["server"] for g in gens)

    loaded = run(concurrent, InferenceClient(pair.addresses, schedule="least_loaded"))
    assert sorted(loaded.values()) == [8, 8]


def test_client_llm_records_tokens(pair: ServerGroup, models: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models[0])

    async def episode(client: InferenceClient) -> ClientLLM:
        llm = ClientLLM(tok, client, rid="ep-1", default_sampling={"max_new_tokens": 5, "ignore_eos": True})
        gen = await llm.generate([1, 5, 6])
        assert len(gen.output_ids) == 5
        await llm.generate(llm.input_ids + [7], max_new_tokens=3)
        return llm

    llm = run(episode, InferenceClient(pair.addresses))
    assert len(llm.input_ids) == 3 + 5 + 1 + 3
    assert llm.loss_mask == [0, 0, 0] + [1] * 5 + [0] + [1] * 3
    assert llm.versions.count(0) == 8 and all(lp <= 0 for lp in llm.logprobs)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_concurrent_requests_share_batched_posts_with_the_same_results(pair: ServerGroup, stream: bool) -> None:
    """Requests bound for one server within the batch window travel in one POST (streamed or
    not); each gets the reply it gets alone (greedy decoding, per-request token budgets)."""
    prompts = [[1, 2, 3 + i] for i in range(12)]

    async def together(client: InferenceClient) -> list[Generation]:
        return await asyncio.gather(*(client.generate(p, {"max_new_tokens": 2 + i % 5, "temperature": 0.0})
                                      for i, p in enumerate(prompts)))  # fmt: skip

    batched = InferenceClient(pair.addresses[:1], stream_batches=stream)
    alone = InferenceClient(pair.addresses[:1], batch_window=0)
    got, want = run(together, batched), run(together, alone)
    assert batched.stats["requests"] == 12 and batched.stats["posts"] <= 2
    assert alone.stats["posts"] == 12
    assert [g.output_ids for g in got] == [g.output_ids for g in want]
    assert [len(g.output_ids) for g in got] == [2 + i % 5 for i in range(12)]
    assert all(g.logprobs == pytest.approx(w.logprobs, abs=1e-4) for g, w in zip(got, want, strict=True))


def test_a_streamed_batch_answers_each_request_when_it_finishes(pair: ServerGroup) -> None:
    """In a streamed batch a short request gets its reply while a long one in the same POST is
    still decoding (a whole batch answers when its longest request is done)."""

    async def main(client: InferenceClient) -> tuple[Generation, bool, Generation]:
        short = asyncio.ensure_future(client.generate([1, 2, 3], {"max_new_tokens": 2, "ignore_eos": True}))
        long = asyncio.ensure_future(client.generate([1, 2, 4], {"max_new_tokens": 900, "ignore_eos": True}))
        first = await short
        return first, long.done(), await long

    for stream in (True, False):
        client = InferenceClient(pair.addresses[:1], stream_batches=stream)
        first, long_done, second = run(main, client)
        assert client.stats["posts"] == 1 and len(first.output_ids) == 2 and len(second.output_ids) == 900
        assert long_done is not stream, "streamed: the short reply comes first; whole: both together"


def test_a_streamed_batch_whose_last_waiter_is_cancelled_stops(pair: ServerGroup) -> None:
    """Once one request of a streamed batch has its reply and the other is cancelled, nobody
    waits for the POST: it is cancelled and the server stops decoding the long request."""
    import httpx

    def generated() -> int:
        return int(httpx.get(pair[0].url + "/server_info").json()["batching"]["generated_tokens"])

    async def main(client: InferenceClient) -> None:
        short = asyncio.ensure_future(client.generate([1, 2, 3], {"max_new_tokens": 2, "ignore_eos": True}))
        long = asyncio.ensure_future(client.generate([1, 2, 4], {"max_new_tokens": 1000, "ignore_eos": True}))
        await short
        long.cancel()
        await asyncio.gather(long, return_exceptions=True)
        await asyncio.sleep(0)  # the POST's task sees its cancellation
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()], "the POST is still running"

    before = generated()
    run(main, InferenceClient(pair.addresses[:1], stream_batches=True))
    deadline = time.monotonic() + 30
    while httpx.get(pair[0].url + "/server_info").json()["batching"]["num_running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert generated() - before < 1000


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_bad_request_fails_alone_and_a_cancelled_one_leaves_its_batch_going(pair: ServerGroup, stream: bool) -> None:
    """The server refuses a batch holding a too-long prompt (HTTP 400): the client re-sends its
    requests one at a time, so only the bad one fails. A request cancelled while its batch is
    on the way ends alone; the others get their replies."""

    async def main(client: InferenceClient) -> tuple[list[Any], list[Any]]:
        good = [client.generate([1, 2, i + 3], SAMPLING) for i in range(3)]
        bad = client.generate([1] * 2000, SAMPLING)  # the tiny model has 1,024 positions
        first = await asyncio.gather(*good, bad, return_exceptions=True)
        tasks = [asyncio.ensure_future(client.generate([1, 2, i + 3], {"max_new_tokens": 200, "ignore_eos": True}))
                 for i in range(3)]
        deadline = time.monotonic() + 30
        while client.inflight[0] < 3 and time.monotonic() < deadline:  # until the batch is on its way
            await asyncio.sleep(0.002)
        assert client.inflight[0] == 3
        tasks[1].cancel()
        second = await asyncio.gather(*tasks, return_exceptions=True)
        return first, second

    client = InferenceClient(pair.addresses[:1], stream_batches=stream)
    first, second = run(main, client)
    assert [len(g.output_ids) for g in first[:3]] == [4, 4, 4]
    assert isinstance(first[3], InferenceError) and "context length" in str(first[3])
    assert client.stats["posts"] == 1 + 4 + 1  # the refused batch, each request alone, then one batch
    assert isinstance(second[1], asyncio.CancelledError)
    assert [len(second[i].output_ids) for i in (0, 2)] == [200, 200]


N_NEW = 1000  # within the tiny model's 1,024 positions


@pytest.mark.timeout(180)
def test_killed_server_requests_finish_on_the_other(models: tuple[Path, Path], tmp_path: Path) -> None:
    group = start_servers(models[0], 2, tmp_path)
    victim = group[1]

    async def main(client: InferenceClient) -> list[Any]:
        # long generations, so that every request is still running when the victim dies (on an
        # idle machine 24 x 300 tokens finish in about half a second)
        tasks = [asyncio.ensure_future(client.generate([3, 4, 5], {"max_new_tokens": N_NEW, "ignore_eos": True},
                                                       rid=f"ep-{i}")) for i in range(24)]  # fmt: skip
        deadline = time.monotonic() + 30
        while min(client.inflight) < 1 and time.monotonic() < deadline:  # posts on their way to both servers
            await asyncio.sleep(0.002)
        assert min(client.inflight) >= 1, client.inflight
        assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
        os.killpg(victim.process.pid, signal.SIGKILL)
        return await asyncio.gather(*tasks)

    try:
        client = InferenceClient(group.addresses, retries=3, reprobe_after=60.0)
        gens = run(main, client)
    finally:
        group.close()
    assert len(gens) == 24 and all(len(g.output_ids) == N_NEW and g.finish_reason == "length" for g in gens)
    assert all(g.info["server"] == group[0].url for g in gens)
    assert client.stats["failovers"] >= 1 and victim.process.poll() is not None


# ---- fault injection: a fake server (not a model) that answers with chosen bad replies ----
@pytest.fixture
def faulty() -> Iterator[tuple[str, list[Any], Counter]]:
    replies: list[Any] = []  # (status, body-bytes) pairs consumed in order; the last one repeats
    hits: Counter = Counter()

    async def handler(request: web.Request) -> web.Response:
        hits["generate"] += 1
        status, body = replies[0] if len(replies) == 1 else replies.pop(0)
        return web.Response(status=status, body=body, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        hits["health"] += 1
        return web.Response(status=200)

    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/generate", handler)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{port}", replies, hits
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


GOOD = b'{"text": "ab", "output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "length", "length": 2}, ' \
       b'"weight_version": "4", "output_token_logprobs": [[-0.5, 5, null], [-0.25, 6, null]]}}'  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"output_ids": "x"}', b'{"output_ids": [1]}', b'{"output_ids": [1], "meta_info": {}}',
     b'{"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop"}}}',
     b'{"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [["a"]]}}'],
)  # fmt: skip
def test_malformed_replies_raise_inference_error(faulty: tuple[str, list, Counter], body: bytes) -> None:
    addr, replies, _ = faulty
    replies.append((200, body))
    with pytest.raises(InferenceError, match="reply"):
        run(lambda c: c.generate([1], SAMPLING), InferenceClient([addr]))


def test_4xx_fails_at_once_5xx_is_retried(faulty: tuple[str, list, Counter]) -> None:
    addr, replies, hits = faulty
    replies.append((400, b'{"error": {"message": "prompt too long"}}'))
    with pytest.raises(InferenceError, match="prompt too long"):
        run(lambda c: c.generate([1], SAMPLING), InferenceClient([addr], retries=3))
    assert hits["generate"] == 1
    replies.clear()
    replies.extend([(503, b"{}"), (500, b"oops"), (200, GOOD)])
    gen = run(lambda c: c.generate([1], SAMPLING), InferenceClient([addr], retries=3, backoff=0.01, reprobe_after=0.0))
    assert gen.output_ids == [5, 6] and gen.logprobs == [-0.5, -0.25] and gen.versions == [4, 4]
    assert hits["generate"] == 4


def test_one_5xx_from_the_only_server_waits_for_its_reprobe_instead_of_failing(
    faulty: tuple[str, list, Counter],
) -> None:
    """A server's one transient error must not fail the requests that arrive while it is marked
    down, even when its re-probe comes later than the whole retry backoff (0.1 + 0.2 + 0.4 s):
    they wait for the ``/health`` re-probe."""
    addr, replies, hits = faulty
    replies.extend([(503, b"{}"), (200, GOOD)])
    client = InferenceClient([addr], reprobe_after=1.0, batch_window=0)  # one POST per request (counted)

    async def main(c: InferenceClient) -> list[Generation]:
        first = asyncio.ensure_future(c.generate([1], SAMPLING))
        while not c.dead_until and not first.done():  # until the 503 has marked the server down
            await asyncio.sleep(0.001)
        assert c.dead_until  # these start while it is down
        return [await first, *await asyncio.gather(*(c.generate([1], SAMPLING) for _ in range(3)))]

    gens = run(main, client)
    assert [g.output_ids for g in gens] == [[5, 6]] * 4 and hits["generate"] == 5
    assert hits["health"] >= 1 and client.stats["failovers"] == 1  # they waited for a /health re-probe


def _events(*bodies: bytes, done: bool = True) -> bytes:
    return b"".join(b"data: " + body + b"\n\n" for body in bodies) + (b"data: [DONE]\n\n" if done else b"")


def _indexed(i: int, body: bytes = GOOD) -> bytes:
    return body[:-1] + b', "index": ' + str(i).encode() + b"}"


def test_streamed_batch_faults(faulty: tuple[str, list, Counter]) -> None:
    """A streamed batch whose events come in any order settles each request; one that ends
    before ``[DONE]`` or misses a request is retried; an event without a valid ``index`` fails
    the batch in one line; an ``error`` event is retried for its request alone."""
    addr, replies, hits = faulty

    def both() -> list[Any]:
        client = InferenceClient([addr], stream_batches=True, retries=2, backoff=0.0, reprobe_after=0.0)
        return run(lambda c: asyncio.gather(c.generate([1], SAMPLING), c.generate([2], SAMPLING),
                                            return_exceptions=True), client)  # fmt: skip

    replies.append((200, _events(_indexed(1), _indexed(0, GOOD.replace(b'"4"', b'"7"')))))
    got = both()
    assert [g.versions for g in got] == [[7, 7], [4, 4]] and hits["generate"] == 1
    replies[:] = [(200, _events(_indexed(0), done=False)), (200, GOOD)]
    got = both()  # the cut stream settled request 0; request 1 is sent again, alone
    assert all(isinstance(g, Generation) for g in got) and hits["generate"] == 3
    replies[:] = [(200, _events(_indexed(0), b'{"error": {"message": "boom"}, "index": 1}')), (200, GOOD)]
    assert all(isinstance(g, Generation) for g in both()) and hits["generate"] == 5
    replies[:] = [(200, _events(GOOD))]
    got = both()
    assert all(isinstance(g, InferenceError) and "no valid 'index'" in str(g) for g in got)
    assert hits["generate"] == 6


def test_abort_replies_are_resumed_with_the_remaining_budget(faulty: tuple[str, list, Counter]) -> None:
    addr, replies, hits = faulty
    aborted = GOOD.replace(b'"type": "length", "length": 2', b'"type": "abort", "message": "update"')
    replies.extend([(200, aborted), (200, GOOD.replace(b'"4"', b'"5"'))])
    gen = run(lambda c: c.generate([1], {"max_new_tokens": 4}), InferenceClient([addr], abort_wait=0.0))
    assert gen.output_ids == [5, 6, 5, 6] and gen.versions == [4, 4, 5, 5] and gen.finish_reason == "length"
    assert gen.info["resumes"] == 1 and hits["generate"] == 2


def test_one_client_serves_several_event_loops(faulty: tuple[str, list, Counter]) -> None:
    addr, replies, hits = faulty
    replies.append((200, GOOD))
    client = InferenceClient([addr])
    for _ in range(3):  # e.g. a rollout thread's loop, then the main thread's
        gen = run(lambda c: c.generate([1], SAMPLING), client)
        assert gen.output_ids == [5, 6]
    assert hits["generate"] == 3 and client._sessions == {}
    with pytest.raises(ValueError, match="n times"):
        asyncio.run(client.generate([1], {"n": 2}))


def test_no_server_reachable_raises_after_retries() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(InferenceError, match="attempts"):
        run(lambda c: c.generate([1], SAMPLING), InferenceClient([dead], retries=2, backoff=0.01, reprobe_after=0.05))


def test_parse_reply_uses_per_token_versions() -> None:
    body = {"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "stop", "matched": 2}, "weight_version": "3",
            "output_token_logprobs": [[-1.0, 1, None], [-2.0, 2, None]], "output_token_weight_versions": ["2", "3"]}}
    gen = parse_generate_reply(body)
    assert (gen.output_ids, gen.logprobs, gen.versions, gen.finish_reason) == ([1, 2], [-1.0, -2.0], [2, 3], "stop")
    assert gen.info["finish"] == {"type": "stop", "matched": 2} and "top_logprobs" not in gen.info

