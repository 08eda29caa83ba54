"""Online gateway overhead: a call through an online run's gateway against the same call through
the per-episode endpoint of a dataset run, side by side in one process.

Both paths use the official ``openai`` client (one per process, bound per session or episode with
``with_options``), the same :class:`~areal_agents.inference.client.InferenceClient` settings, the
tiny model's tokenizer and ``--concurrency`` calls in flight, against the instant SGLang-protocol
endpoint of ``bench_rollout_overhead.py`` (one output token per request), so that model time is
removed and what is left is each path's own cost:

* ``episode``: ``OpenAIAgent`` episodes whose agent makes one call to the loop's loopback endpoint
  (``await client.http_endpoint()``), as a dataset run plays an OpenAI-style agent;
* ``gateway_call``: one call per session through the gateway (:class:`~areal_agents.online.rollout.OnlineRollout`
  on its own event loop thread, as in a run's rollout process), the sessions opened before the
  clock starts and rewarded after it stops: the cost of the call itself;
* ``gateway_session``: a whole session per item: ``POST /rl/sessions``, the call, ``POST .../reward``
  (three requests), as an external app plays one.

Each path is timed in wall time (items/s) and this process's CPU ms per item, over ``--repeats``
interleaved repeats after a warm-up; the ratios take each path's best.

    python benchmarks/bench_online.py [--calls 2000] [--concurrency 64] [--repeats 3]

Writes ``benchmarks/results/online.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_openai_overhead import MESSAGE, Setting, official_client, play  # noqa: E402 - sibling scripts
from bench_rollout_overhead import start_endpoint  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN = "sk-admin-bench-0123456789abcdef"
PATHS = ["episode", "gateway_call", "gateway_session"]


def gateway(setting: Setting, run_dir: Path) -> Any:
    """An online run's gateway over the instant endpoint (any port, no trainer behind it)."""
    from areal_agents.config.loader import load_config
    from areal_agents.inference.client import InferenceClient
    from areal_agents.online.rollout import OnlineRollout

    os.environ["AREAL_AGENTS_ADMIN_KEY"] = ADMIN
    cfg = load_config(None, ["env.name=math", "mode=online", "online.port=0", f"output_dir={run_dir}",
                             "online.max_open_sessions=100000", "online.session_ttl=3600"])
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    client = InferenceClient([setting.address], batch_window=setting.batch_window, stream_batches=True)
    return OnlineRollout(cfg, client=client, tokenizer=setting.tokenizer, sampling=setting.sampling).start()


def through_gateway(rollout: Any, n: int, concurrency: int, whole_sessions: bool) -> tuple[float, float]:
    """Items/s and CPU ms an item: calls through open sessions, or whole sessions."""
    async def main() -> tuple[float, float]:
        limits = httpx.Limits(max_connections=concurrency * 2)
        admin = httpx.AsyncClient(base_url=rollout.url, headers={"Authorization": f"Bearer {ADMIN}"}, limits=limits,
                                  timeout=120)
        shared = official_client("httpx").with_options(base_url=f"{rollout.url}/v1")

        async def open_() -> dict[str, Any]:
            return dict((await admin.post("/rl/sessions")).json())

        async def call(s: dict[str, Any], i: int) -> None:
            reply = await shared.with_options(api_key=s["key"]).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": MESSAGE.format(a=i % 97, b=i % 89)}])
            assert reply.choices[0].message is not None

        async def reward(s: dict[str, Any]) -> None:
            got = await admin.post(f"/rl/sessions/{s['key']}/reward", json={"reward": 1.0})
            assert got.status_code == 200, got.text

        opened: list[dict[str, Any]] = []
        if not whole_sessions:  # opened before the clock starts, ``concurrency`` at a time
            for start in range(0, n, concurrency):
                opened += await asyncio.gather(*(open_() for _ in range(min(concurrency, n - start))))
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                if whole_sessions:
                    s = await open_()
                    await call(s, i)
                    await reward(s)
                else:
                    await call(opened[i], i)

        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for start in range(0, len(opened), concurrency):
            await asyncio.gather(*(reward(s) for s in opened[start:start + concurrency]))
        await admin.aclose()
        await shared.close()
        while rollout.book.take_batch(1) is not None:  # what was rewarded leaves the book
            pass
        return n / wall, 1000 * cpu / n

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls (or sessions) a path and repeat")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "online.json"))
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from trainers.tiny_model import build_tiny_model

    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {p: [] for p in PATHS}
    cpu: dict[str, list[float]] = {p: [] for p in PATHS}
    with tempfile.TemporaryDirectory() as tmp:
        texts = [f"<|im_start|>user\n{MESSAGE.format(a=a, b=b)}<|im_end|>\n" for a in range(50) for b in range(20)]
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(texts, Path(tmp) / "m"))
        proc, address = start_endpoint()
        setting = Setting("instant", address, tokenizer, new_tokens=1, batch_window=0.0)
        rollout = gateway(setting, Path(tmp) / "runs")
        try:
            for rep in range(-1, args.repeats):  # a warm-up, then interleaved repeats
                n = max(64, args.calls // 10) if rep < 0 else args.calls
                for path in PATHS:
                    if path == "episode":
                        per_s, ms, _ = play("http", setting, n, args.concurrency)
                    else:
                        per_s, ms = through_gateway(rollout, n, args.concurrency, path == "gateway_session")
                    if rep >= 0:
                        runs[path].append(per_s)
                        cpu[path].append(ms)
                        print(f"{path:16s} {per_s:8.1f} items/s  {ms:6.3f} CPU ms/item", flush=True)
            ledger = rollout.counts()
        finally:
            rollout.shutdown()
            proc.kill()
            proc.wait()
    best = {p: max(v) for p, v in runs.items()}
    least = {p: min(v) for p, v in cpu.items()}
    result = {
        "benchmark": "online", "calls": args.calls, "concurrency": args.concurrency, "repeats": args.repeats,
        "load_avg_before": load_before[0], "load_avg_after": os.getloadavg()[0], "per_s": best, "cpu_ms": least,
        "gateway_call_vs_episode": best["gateway_call"] / best["episode"],
        "gateway_call_vs_episode_cpu": least["episode"] / least["gateway_call"],
        "gateway_session_vs_episode": best["gateway_session"] / best["episode"],
        "gateway_call_overhead_ms": 1000 / best["gateway_call"] - 1000 / best["episode"],
        "ledger_after": ledger, "runs": runs, "cpu_runs": cpu,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("runs")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
