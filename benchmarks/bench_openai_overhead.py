"""OpenAI-path overhead: episodes/s of an agent written against the OpenAI client vs the same
episodes played by ``ChatAgent`` over ``llm.chat``, in process and over HTTP.

Every path plays single-turn episodes of one env through
:func:`~areal_agents.rollout.episode.make_episode_fn` with the same
:class:`~areal_agents.inference.client.InferenceClient`, tokenizer (the tiny model's, built
here) and concurrency. Two settings, side by side in one run:

* ``instant``: an instant-reply SGLang-protocol endpoint (the one of
  ``bench_rollout_overhead.py``: one output token per request), so model time is removed and
  what is left is the cost of each path: chat template, tokenisation, client, and for the
  OpenAI paths also request checking, reply building and trajectory assembly;
* ``model``: the embedded server generating with the tiny model, every reply exactly
  ``--new-tokens`` tokens: the worst case for the HTTP paths, since the 64 episodes of a wave
  finish on the same decode step and the whole wave's client work then runs while the server
  waits for the next wave;
* ``varied``: the same server with replies of varying length, as a model's are (each sampled
  token ends the reply with probability 1/``--new-tokens``: a set of stop ids that large a
  share of the vocabulary, between 4 and twice ``--new-tokens`` tokens), so that episodes
  finish at different steps and one's client work overlaps the others' decoding: the ratio a
  user sees in a run. The client streams its batched POSTs, as a run's does with the embedded
  server (each request settled as it finishes); ``--whole-batches`` waits for a batch's whole
  reply instead, as with SGLang and before streamed batches.

Paths: ``native`` (``ChatAgent``), ``openai`` (the in-process client,
``client.chat.completions.create``), ``http`` (the official ``openai`` client over HTTP to the
episode's URL, ``await client.http_endpoint()``, on the loop's shared loopback server: one
``openai.AsyncOpenAI`` per process, bound to each episode with ``with_options(base_url=...,
api_key=...)``), ``http_aiohttp`` (the same with the client's own aiohttp transport,
``http_client=openai.DefaultAioHttpClient()``) and, in ``instant`` only, ``http_fresh`` (a new
client per episode, fewer episodes). The ``floor`` paths time the official client alone
(default and aiohttp transport) against a bare aiohttp handler that returns a canned reply on
the same loop, with no episode behind it: the least one HTTP call of that client costs here.
Each path is timed in wall time (episodes/s) and in this process's CPU time per episode (the
servers run in other processes), which shared machines disturb less (the ``*_cpu`` ratios). What is alive after the warm-up is
frozen (:func:`gc.freeze`), as the rollout process of a run freezes what its setup left alive,
so that full garbage collections, which the HTTP paths trigger most, skip the tokenizer's and
libraries' objects; ``--no-gc-freeze`` measures without.

    python benchmarks/bench_openai_overhead.py [--episodes 4000] [--model-episodes 512]

Writes ``benchmarks/results/openai_overhead.json``. Targets: the in-process OpenAI path ≥ 0.8 of
the native one, the HTTP path ≥ 0.7 of the in-process one. ``meets_target`` is the ``instant``
setting's (the paths' own cost, where the official client's call bounds the HTTP ratio near
0.3); ``varied_http_vs_openai`` and ``varied_http_aiohttp_vs_openai`` are the ratios with the
model generating.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollout_overhead import start_endpoint  # noqa: E402 - the instant endpoint, from its script

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.8
TARGET_HTTP = 0.7
INSTANT_PATHS = ["native", "openai", "http", "http_aiohttp", "http_fresh", "floor", "floor_aiohttp"]
MODEL_PATHS = ["native", "openai", "http", "http_aiohttp"]
MESSAGE = "What is {a} + {b}?"
CANNED = json.dumps({
    "id": "chatcmpl-floor", "object": "chat.completion", "created": 0, "model": "policy", "system_fingerprint": None,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "7", "refusal": None},
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 16, "completion_tokens": 1, "total_tokens": 17}}).encode()


@dataclass
class Setting:
    """Where the episodes generate: the server's address, its sampling, the client's batching."""

    name: str
    address: str
    tokenizer: Any
    new_tokens: int
    batch_window: float
    varied: bool = False  # replies of varying length (stop ids), else exactly new_tokens
    stream_batches: bool = True  # as a run with the embedded server does; False: a batch answers when all are done
    runs: dict[str, list[float]] = field(default_factory=dict)  # path -> episodes/s of each repeat
    cpu: dict[str, list[float]] = field(default_factory=dict)  # path -> CPU ms an episode of each repeat
    tokens: dict[str, list[float]] = field(default_factory=dict)  # path -> mean reply tokens of each repeat

    @property
    def lengths(self) -> tuple[int, int]:
        """The fewest and most tokens a reply may have."""
        n = self.new_tokens
        return (min(4, n), 2 * n) if self.varied else (n, n)

    @property
    def sampling(self) -> dict[str, Any]:
        low, high = self.lengths
        out: dict[str, Any] = {"max_new_tokens": high, "min_new_tokens": low, "temperature": 1.0}
        if self.varied:  # the last 1/new_tokens of the vocabulary stops a reply (none is a special token)
            vocab = len(self.tokenizer)
            out["stop_token_ids"] = list(range(vocab - max(1, vocab // self.new_tokens), vocab))
        return out


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


def official_client(transport: str) -> Any:
    """One ``openai.AsyncOpenAI`` for the process (``transport``: ``httpx``, its default, or ``aiohttp``)."""
    extra = {"http_client": openai.DefaultAioHttpClient()} if transport == "aiohttp" else {}
    return openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="-", max_retries=0, **extra)


async def openai_agent(client: Any, row: dict[str, Any]) -> None:
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])


class HttpAgent:
    """Over HTTP with the official client: one per process bound to the episode per call
    (``shared``), or a new one per episode (``fresh``)."""

    def __init__(self, transport: str, fresh: bool = False) -> None:
        self.transport, self.fresh = transport, fresh
        self.shared: Any = None

    async def __call__(self, client: Any, row: dict[str, Any]) -> None:
        messages = [{"role": "user", "content": row["prompt"]}]
        url = await client.http_endpoint()
        if self.fresh:
            async with openai.AsyncOpenAI(base_url=url, api_key=client.api_key, max_retries=0) as oc:
                await oc.chat.completions.create(model="policy", messages=messages)
            return
        if self.shared is None:
            self.shared = official_client(self.transport)
        oc = self.shared.with_options(base_url=url, api_key=client.api_key)
        await oc.chat.completions.create(model="policy", messages=messages)

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.close()


def make_agent(kind: str, sampling: dict[str, Any]) -> tuple[Any, Callable[[], Awaitable[None]] | None]:
    """The rollout agent of path ``kind``, and what closes its HTTP client."""
    from areal_agents.agent import ChatAgent
    from areal_agents.openai_compat.agent import OpenAIAgent

    if kind == "native":
        return ChatAgent(max_turns=1, sampling=sampling), None
    if kind == "openai":
        return OpenAIAgent(openai_agent, sampling=sampling), None
    fn = HttpAgent("aiohttp" if kind == "http_aiohttp" else "httpx", fresh=kind == "http_fresh")
    return OpenAIAgent(fn, sampling=sampling), fn.aclose


async def _timed(work: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    """Run ``work``: ``n`` items a second, and this process's CPU milliseconds an item."""
    wall, cpu = time.perf_counter(), time.process_time()
    await work()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, 1000 * cpu / n


def play(kind: str, setting: Setting, n: int, concurrency: int) -> tuple[float, float, float]:
    """Episodes/s, CPU ms an episode and mean reply tokens of ``n`` episodes of path ``kind`` in ``setting``."""
    from areal_agents.inference.client import InferenceClient
    from areal_agents.llm import ClientLLM
    from areal_agents.rollout.episode import make_episode_fn

    sampling = setting.sampling
    agent, close_agent = make_agent(kind, sampling)

    async def main() -> tuple[float, float, float]:
        client = InferenceClient([setting.address], batch_window=setting.batch_window,
                                 stream_batches=setting.stream_batches)
        fn = make_episode_fn(make_env_cls(), agent, lambda rid: ClientLLM(setting.tokenizer, client, rid=rid,
                                                                           default_sampling=sampling))
        counter = iter(range(n))
        failed, last_error, generated = 0, "", 0
        low, high = setting.lengths

        async def worker() -> None:
            nonlocal failed, last_error, generated
            for i in counter:
                traj = await fn({"prompt": MESSAGE.format(a=i % 97, b=i % 89)}, i, f"ep-{i}")
                generated += traj.num_generated
                if traj.status != "ok" or not low <= traj.num_generated <= high:
                    failed += 1
                    last_error = f"{traj.status} ({traj.num_generated} tokens): {traj.info.get('error', '')}"

        try:
            eps, cpu = await _timed(lambda: asyncio.gather(*(worker() for _ in range(concurrency))), n)
            return eps, cpu, generated / n
        finally:
            await client.aclose()
            if close_agent is not None:
                await close_agent()
            if failed:
                raise RuntimeError(f"{kind}: {failed} episodes failed (the last: {last_error})")

    return asyncio.run(main())


def floor(transport: str, n: int, concurrency: int) -> tuple[float, float]:
    """Calls/s and CPU ms a call of the official client alone against a canned aiohttp handler."""
    from aiohttp import web

    async def canned(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=CANNED, content_type="application/json")

    async def main() -> tuple[float, float]:
        app = web.Application()
        app.router.add_post("/{key}/v1/chat/completions", canned)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        shared = official_client(transport)
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:  # bound per call, as the http paths bind per episode
                oc = shared.with_options(base_url=f"{url}/key{i}/v1", api_key=f"key{i}")
                await oc.chat.completions.create(model="policy", messages=[
                    {"role": "user", "content": MESSAGE.format(a=i % 97, b=i % 89)}])

        try:
            return await _timed(lambda: asyncio.gather(*(worker() for _ in range(concurrency))), n)
        finally:
            await shared.close()
            await runner.cleanup()

    return asyncio.run(main())


def measure(setting: Setting, paths: list[str], args: argparse.Namespace, warm_up: bool = False) -> None:
    """One repeat of every path in ``setting``, appended to its runs (``warm_up``: a short one, not kept)."""
    for kind in paths:
        n = args.episodes if setting.name == "instant" or kind.startswith("floor") else args.model_episodes
        n = max(64, n // 20) if kind == "http_fresh" or warm_up else n
        if kind.startswith("floor"):
            (eps, cpu), tokens = floor("aiohttp" if kind == "floor_aiohttp" else "httpx", n, args.concurrency), 1.0
        else:
            eps, cpu, tokens = play(kind, setting, n, args.concurrency)
        if warm_up:
            continue
        setting.runs.setdefault(kind, []).append(eps)
        setting.cpu.setdefault(kind, []).append(cpu)
        setting.tokens.setdefault(kind, []).append(tokens)
        print(f"{setting.name:8s} {kind:13s} {eps:8.1f} episodes/s  {cpu:6.3f} CPU ms/episode  "
              f"{tokens:5.1f} tokens/reply", flush=True)


def summary(setting: Setting) -> dict[str, Any]:
    """Best episodes/s (and least CPU ms) of each path, and the ratios between paths."""
    best = {k: max(v) for k, v in setting.runs.items()}
    cpu = {k: min(v) for k, v in setting.cpu.items()}
    out: dict[str, Any] = {"new_tokens": setting.new_tokens, "varied_lengths": setting.varied, "eps_per_s": best, "cpu_ms_per_episode": cpu,
                           "openai_vs_native": best["openai"] / best["native"]}
    for kind in ("http", "http_aiohttp", "http_fresh"):
        if kind in best:
            out[f"{kind}_vs_openai"] = best[kind] / best["openai"]
            out[f"{kind}_vs_openai_cpu"] = cpu["openai"] / cpu[kind]  # the same, by this process's CPU time
    if "floor" in cpu:  # the HTTP path's best case: the episode's own work, plus one call at the floor
        work = cpu["openai"]
        out["http_bound_vs_openai"] = work / (work + cpu["floor"])
        out["http_aiohttp_bound_vs_openai"] = work / (work + cpu["floor_aiohttp"])
    out["runs"], out["cpu_runs"], out["tokens_per_reply_runs"] = setting.runs, setting.cpu, setting.tokens
    out["reply_tokens"] = list(setting.lengths)
    return out


def start_model_server(model: Path, log_dir: Path) -> Any:
    """The embedded server on the tiny model, as a run starts it (one OpenMP thread)."""
    from areal_agents.config import ExperimentConfig
    from areal_agents.inference.launcher import launch_servers

    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 180.0
    return launch_servers(cfg, model, 1, log_dir=log_dir, env={"OMP_NUM_THREADS": "1"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=4000, help="episodes a path, instant endpoint")
    parser.add_argument("--model-episodes", type=int, default=512, help="episodes a path, tiny model (0: skip)")
    parser.add_argument("--new-tokens", type=int, default=24, help="tokens a reply, tiny model")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                        help="no gc.freeze() after the warm-up (a run's rollout process freezes what its setup left alive)")
    parser.add_argument("--whole-batches", action="store_true",
                        help="the client waits for a batched POST's whole reply (as with SGLang), not each request's")
    parser.add_argument("--out", default=str(RESULTS / "openai_overhead.json"))
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from trainers.tiny_model import build_tiny_model

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        texts = [f"<|im_start|>user\n{MESSAGE.format(a=a, b=b)}<|im_end|>\n" for a in range(50) for b in range(20)]
        model = build_tiny_model(texts, Path(tmp) / "m")
        tokenizer = AutoTokenizer.from_pretrained(model)
        proc, address = start_endpoint()
        # the instant endpoint answers one request per POST: no batching window
        instant = Setting("instant", address, tokenizer, new_tokens=1, batch_window=0.0)
        server = start_model_server(model, Path(tmp) / "logs") if args.model_episodes else None
        at = server.addresses[0] if server else ""
        streamed = not args.whole_batches
        real = Setting("model", at, tokenizer, args.new_tokens, batch_window=0.002, stream_batches=streamed)
        varied = Setting("varied", at, tokenizer, args.new_tokens, batch_window=0.002, varied=True,
                         stream_batches=streamed)
        try:
            for rep in range(-1, args.repeats):  # a warm-up, then interleaved repeats: drifting load hits all alike
                measure(instant, INSTANT_PATHS, args, warm_up=rep < 0)
                if server is not None:
                    measure(real, MODEL_PATHS, args, warm_up=rep < 0)
                    measure(varied, MODEL_PATHS, args, warm_up=rep < 0)
                if rep < 0 and args.gc_freeze:  # what is alive after the warm-up is never scanned again
                    gc.collect()
                    gc.freeze()
        finally:
            proc.kill()
            proc.wait()
            if server is not None:
                server.close()
    fast = summary(instant)
    slow, mixed = (summary(real), summary(varied)) if server is not None else (None, None)
    result = {"benchmark": "openai_overhead", "episodes": args.episodes, "model_episodes": args.model_episodes,
              "concurrency": args.concurrency, "repeats": args.repeats, "gc_freeze": args.gc_freeze,
              "streamed_batches": not args.whole_batches,
              "load_avg_before": load_before[0], "load_avg_after": os.getloadavg()[0],
              "native_eps_per_s": fast["eps_per_s"]["native"], "openai_eps_per_s": fast["eps_per_s"]["openai"],
              "http_eps_per_s": fast["eps_per_s"]["http"], "ratio": fast["openai_vs_native"],
              "http_vs_openai": fast["http_vs_openai"],
              "model_http_vs_openai": slow["http_vs_openai"] if slow else None,
              "varied_http_vs_openai": mixed["http_vs_openai"] if mixed else None,
              "varied_http_aiohttp_vs_openai": mixed["http_aiohttp_vs_openai"] if mixed else None,
              "target_ratio": TARGET, "target_http_ratio": TARGET_HTTP,
              "meets_target": fast["openai_vs_native"] >= TARGET and fast["http_vs_openai"] >= TARGET_HTTP,
              "instant": fast, "model": slow, "varied": mixed}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("instant", "model", "varied")}, indent=2))
    for name, part in (("instant", fast), ("model", slow), ("varied", mixed)):
        if part is not None:
            print(name, json.dumps({k: v for k, v in part.items() if not k.endswith("runs")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
