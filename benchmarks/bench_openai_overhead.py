"""OpenAI-path overhead: episodes/s of an agent written against the OpenAI client vs the same
episodes played by ``ChatAgent`` over ``llm.chat``.

Both play single-turn episodes of one env through :func:`~areal_agents.rollout.episode.make_episode_fn`
with the same :class:`~areal_agents.inference.client.InferenceClient`, tokenizer (the tiny
model's, built here) and concurrency, against an instant-reply SGLang-protocol endpoint (the one
of ``bench_rollout_overhead.py``: one output token per request), so model time is removed and
what is left is the cost of each path: chat template, tokenisation, client, and for the OpenAI
path also request checking, reply building (the official ``openai`` types where installed) and
trajectory assembly. The OpenAI agent returns None, so the env scores its reply as it does the
native agent's.

A third path, ``http``, is the same agent speaking HTTP with the official client to its
episode's URL (``await client.http_endpoint()``) on the loop's shared loopback server; the
agent keeps one ``openai.AsyncOpenAI`` per process and binds it to each episode with
``with_options(base_url=..., api_key=...)`` (the HTTP connection pool is shared). ``http_fresh``
(fewer episodes) builds a new client per episode, as many agents do, for comparison.

    python benchmarks/bench_openai_overhead.py [--episodes 4000] [--concurrency 64]

Writes ``benchmarks/results/openai_overhead.json``. Targets: the in-process OpenAI path ≥ 0.8 of
the native one, the HTTP path ≥ 0.7 of the in-process one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollout_overhead import start_endpoint  # noqa: E402 - the instant endpoint, from its script

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLING = {"max_new_tokens": 1, "temperature": 1.0}
TARGET = 0.8
TARGET_HTTP = 0.7


def make_env_cls() -> type:
    from areal_agents.env import Env

    class Echo(Env):
        """One turn: the prompt is the row's; any reply ends the episode with reward 0."""

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
            super().reset(seed=seed)
            return str((options or {}).get("prompt", "")), {}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "", 0.0, True, False, {"success": False}

    return Echo


async def openai_agent(client: Any, row: dict[str, Any]) -> None:
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])


_SHARED: dict[str, Any] = {}


async def http_agent(client: Any, row: dict[str, Any]) -> None:
    """Over HTTP with one official client per process, bound to the episode per call."""
    import openai

    shared = _SHARED.get("client")
    if shared is None:
        shared = _SHARED["client"] = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="-", max_retries=0)
    oc = shared.with_options(base_url=await client.http_endpoint(), api_key=client.api_key)
    await oc.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])


async def http_fresh_agent(client: Any, row: dict[str, Any]) -> None:
    """Over HTTP with a new official client per episode."""
    import openai

    async with openai.AsyncOpenAI(base_url=await client.http_endpoint(), api_key=client.api_key, max_retries=0) as oc:
        await oc.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])


AGENTS = {"openai": openai_agent, "http": http_agent, "http_fresh": http_fresh_agent}


def measure(kind: str, address: str, tokenizer: Any, n: int, concurrency: int) -> float:
    """Episodes/s of ``n`` episodes of ``kind`` (``native`` or ``openai``)."""
    from areal_agents.agent import ChatAgent
    from areal_agents.inference.client import InferenceClient
    from areal_agents.llm import ClientLLM
    from areal_agents.openai_compat.agent import OpenAIAgent
    from areal_agents.rollout.episode import make_episode_fn

    agent = ChatAgent(max_turns=1, sampling=SAMPLING) if kind == "native" else OpenAIAgent(AGENTS[kind],
                                                                                           sampling=SAMPLING)

    async def main() -> float:
        client = InferenceClient([address], batch_window=0)  # the instant endpoint answers one request per POST
        fn = make_episode_fn(make_env_cls(), agent, lambda rid: ClientLLM(tokenizer, client, rid=rid,
                                                                           default_sampling=SAMPLING))
        counter = iter(range(n))
        failed, last_error = 0, ""

        async def worker() -> None:
            nonlocal failed, last_error
            for i in counter:
                traj = await fn({"prompt": f"What is {i % 97} + {i % 89}?"}, i, f"ep-{i}")
                if traj.status != "ok" or traj.num_generated != 1:
                    failed += 1
                    last_error = f"{traj.status}: {traj.info.get('error', '')}"
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        await client.aclose()
        shared = _SHARED.pop("client", None)
        if shared is not None:
            await shared.close()
        if failed:
            raise RuntimeError(f"{kind}: {failed} episodes failed (the last: {last_error})")
        return n / elapsed

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "openai_overhead.json"))
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from trainers.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        texts = [f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n" for a in range(50) for b in range(20)]
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(texts, Path(tmp) / "m"))
    proc, address = start_endpoint()
    runs: dict[str, list[float]] = {"native": [], "openai": [], "http": [], "http_fresh": []}
    try:
        for _ in range(args.repeats):  # interleaved, so drifting load hits all alike
            for kind in runs:
                n = args.episodes if kind != "http_fresh" else max(64, args.episodes // 20)
                runs[kind].append(measure(kind, address, tokenizer, n, args.concurrency))
    finally:
        proc.kill()
        proc.wait()
    best = {kind: max(values) for kind, values in runs.items()}
    ratios = {"openai_vs_native": best["openai"] / best["native"], "http_vs_openai": best["http"] / best["openai"],
              "http_fresh_vs_openai": best["http_fresh"] / best["openai"]}
    result = {"benchmark": "openai_overhead", "episodes": args.episodes, "concurrency": args.concurrency,
              "native_eps_per_s": best["native"], "openai_eps_per_s": best["openai"], "http_eps_per_s": best["http"],
              "http_fresh_eps_per_s": best["http_fresh"], "ratio": ratios["openai_vs_native"], **ratios,
              "runs": runs, "target_ratio": TARGET, "target_http_ratio": TARGET_HTTP,
              "meets_target": ratios["openai_vs_native"] >= TARGET and ratios["http_vs_openai"] >= TARGET_HTTP}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
