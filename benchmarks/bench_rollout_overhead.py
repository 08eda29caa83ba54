"""Rollout executor overhead: single-turn episodes/s through the executor vs a bare client loop.

An instant-reply SGLang-protocol endpoint (aiohttp, its own process, one output token per
request) removes model time, so what is left is the cost of the HTTP client and, for the
executor, of scheduling episodes, groups, accounting and batches. Both sides use the same
:class:`~areal_agents.inference.client.InferenceClient` and the same concurrency.

    python benchmarks/bench_rollout_overhead.py [--episodes 20000] [--concurrency 64]

Writes ``benchmarks/results/rollout_overhead.json``. Targets: executor ≥ 0.7 of the bare
loop and ≥ 2,000 episodes/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------- the endpoint
def serve_instant(port: int) -> None:
    """An SGLang-protocol ``/generate`` that answers at once with one token (benchmark fixture)."""
    from aiohttp import web

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        n_prompt = len(body.get("input_ids") or [])
        return web.json_response({
            "text": "7", "output_ids": [42],
            "meta_info": {"id": body.get("rid") or "r", "finish_reason": {"type": "stop", "matched": 2},
                          "prompt_tokens": n_prompt, "completion_tokens": 1, "cached_tokens": 0,
                          "weight_version": "0", "e2e_latency": 0.0,
                          "output_token_logprobs": [[-0.25, 42, None]]},
        })

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *_: print("ready", flush=True),
                access_log=None, backlog=1024)


def start_endpoint() -> tuple[subprocess.Popen[str], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError("instant endpoint did not start")
    return proc, f"127.0.0.1:{port}"


# --------------------------------------------------------------------------- the two loops
PROMPT = list(range(3, 35))  # 32 prompt tokens
SAMPLING = {"max_new_tokens": 1, "temperature": 1.0}


def bare_loop(address: str, n: int, concurrency: int) -> float:
    """Episodes/s of ``concurrency`` workers calling ``client.generate`` back to back."""
    from areal_agents.inference.client import InferenceClient

    async def main() -> float:
        client = InferenceClient([address])
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                gen = await client.generate(PROMPT, SAMPLING, rid=f"bare-{i}")
                assert gen.output_ids == [42]

        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up connections
        counter = iter(range(n))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        dt = time.perf_counter() - t0
        await client.aclose()
        return n / dt

    return _run(main())


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def executor_loop(address: str, n: int, concurrency: int, group_size: int = 4) -> tuple[float, dict[str, float]]:
    """Episodes/s through RolloutExecutor: one generate per episode, batches taken as they fill."""
    from areal_agents.config import RolloutConfig
    from areal_agents.inference.client import InferenceClient
    from areal_agents.rollout import RolloutExecutor
    from areal_agents.types import Trajectory

    client = InferenceClient([address])

    async def episode(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        gen = await client.generate(PROMPT, SAMPLING, rid=episode_id)
        n_out = len(gen.output_ids)
        traj = Trajectory(input_ids=PROMPT + gen.output_ids, loss_mask=[0] * len(PROMPT) + [1] * n_out,
                          logprobs=[0.0] * len(PROMPT) + gen.logprobs, versions=[-1] * len(PROMPT) + gen.versions,
                          turn_spans=[(len(PROMPT), len(PROMPT) + n_out)])
        traj.set_rewards([float(seed % 2)])
        return traj

    batch_groups = 16
    cfg = RolloutConfig(batch_size=batch_groups, group_size=group_size, max_concurrent_rollouts=concurrency,
                        max_head_offpolicyness=4)
    rows = [{"question": str(i)} for i in range(1000)]
    ex = RolloutExecutor(cfg, episode_fn=episode, rows=rows, seed=0, on_shutdown=[client.aclose])
    ex.start()
    per_batch = batch_groups * group_size
    version = 0
    for _ in range(4):  # warm-up
        ex.prepare_batch(timeout=60)
        version += 1
        ex.set_version(version)
    done = 0
    t0 = time.perf_counter()
    while done < n:
        batch = ex.prepare_batch(timeout=60)
        done += sum(len(g) for g in batch)
        version += 1
        ex.pause()
        ex.set_version(version)
        ex.resume()
    dt = time.perf_counter() - t0
    stats = ex.stats()
    ex.shutdown()
    assert done % per_batch == 0
    counts = {k: stats[k] for k in ("rollout/submitted", "rollout/accepted", "rollout/failed", "rollout/dropped",
                                    "rollout/in_flight")}
    return done / dt, counts


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each loop; the best is kept")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve_instant(args.serve)
        return {}
    proc, address = start_endpoint()
    try:
        bare, execu = [], []
        for _ in range(args.repeats):  # alternate so background load hits both alike
            bare.append(bare_loop(address, args.episodes, args.concurrency))
            eps, counts = executor_loop(address, args.episodes, args.concurrency)
            execu.append(eps)
    finally:
        proc.terminate()
        proc.wait(10)
    try:
        import uvloop  # noqa: F401

        loop_impl = "uvloop"
    except ImportError:
        loop_impl = "asyncio"
    result = {
        "benchmark": "rollout_overhead",
        "episodes": args.episodes, "concurrency": args.concurrency, "event_loop": loop_impl,
        "bare_client_eps_per_s": max(bare), "executor_eps_per_s": max(execu),
        "ratio": max(execu) / max(bare),
        "runs": {"bare": bare, "executor": execu},
        "last_executor_counts": counts,
        "targets": {"ratio": 0.7, "executor_eps_per_s": 2000},
    }
    result["meets_targets"] = result["ratio"] >= 0.7 and result["executor_eps_per_s"] >= 2000
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rollout_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    return result


if __name__ == "__main__":
    main()
