"""InferenceClient overhead: requests/s vs a bare aiohttp loop, both at 64 concurrency.

An instant-reply SGLang-protocol endpoint (aiohttp, its own process, a fixed 4-token reply
with logprobs) removes model time, so the figures measure only the client: the bare loop
posts and decodes JSON; the client also chooses a server, tracks load, parses and checks
the reply and builds a ``Generation``. Rounds alternate between the two; best of each.

    python benchmarks/bench_inference_client.py [--requests 5000] [--concurrency 64] [--repeats 3]

Writes ``benchmarks/results/inference_client.json``. Target: client >= 0.8 of the bare loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_REPLY = {
    "text": "1234", "output_ids": [5, 6, 7, 8],
    "meta_info": {"id": "r", "finish_reason": {"type": "length", "length": 4}, "prompt_tokens": 8,
                  "completion_tokens": 4, "cached_tokens": 0, "weight_version": "0", "e2e_latency": 0.0,
                  "output_token_logprobs": [[-0.5, 5, None], [-0.5, 6, None], [-0.5, 7, None], [-0.5, 8, None]]},
}  # fmt: skip
_BODY = json.dumps(_REPLY).encode()


def serve(port: int) -> None:
    """The instant endpoint (a benchmark fixture, not a model server)."""
    from aiohttp import web

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=_BODY, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


async def bare_loop(url: str, requests: int, concurrency: int) -> float:
    import aiohttp

    payload = {"input_ids": list(range(8)), "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                async with session.post(url + "/generate", json=payload) as resp:
                    await resp.json()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return requests / (time.perf_counter() - start)


async def client_loop(addr: str, requests: int, concurrency: int) -> float:
    from areal_agents.inference.client import InferenceClient

    client = InferenceClient([addr])
    remaining = requests

    async def worker(w: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            gen = await client.generate(list(range(8)), {"max_new_tokens": 4}, rid=f"ep-{w}")
            assert len(gen.output_ids) == 4

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return requests / (time.perf_counter() - start)
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return

    from areal_agents.inference.control import wait_healthy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    addr = f"127.0.0.1:{port}"
    try:
        wait_healthy(addr, timeout=30)
        asyncio.run(bare_loop("http://" + addr, 500, args.concurrency))  # warm-up
        bare, client = [], []
        for _ in range(args.repeats):
            bare.append(asyncio.run(bare_loop("http://" + addr, args.requests, args.concurrency)))
            client.append(asyncio.run(client_loop(addr, args.requests, args.concurrency)))
    finally:
        proc.terminate()
        proc.wait(10)
    result = {
        "benchmark": "inference_client", "requests": args.requests, "concurrency": args.concurrency,
        "bare_aiohttp_req_per_s": max(bare), "client_req_per_s": max(client), "ratio": max(client) / max(bare),
        "runs": {"bare": bare, "client": client}, "target_ratio": 0.8,
    }  # fmt: skip
    result["meets_target"] = result["ratio"] >= 0.8
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "inference_client.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"bare aiohttp: {max(bare):,.0f} req/s  InferenceClient: {max(client):,.0f} req/s  "
          f"ratio {result['ratio']:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
