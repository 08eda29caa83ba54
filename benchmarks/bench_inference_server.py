"""Embedded-server decode throughput vs a plain batched ``model.generate``.

64 concurrent ``/generate`` requests of 64 new tokens each (``ignore_eos``) go to a real
embedded server subprocess on loopback; then the same 64 prompts run as one left-padded
batch through ``model.generate`` (sampling, 64 new tokens each) in this process. Both
figures are new tokens per second of wall time, best of ``--repeats`` interleaved rounds
after a warm-up, with ``--threads`` torch threads on both sides (1 by default: on a small
shared machine two busy-waiting OpenMP threads per process make both figures erratic).

    python benchmarks/bench_inference_server.py [--requests 64] [--new-tokens 64] [--repeats 3] [--threads 1]
        [--device cpu|cuda] [--output FILE]

Writes ``benchmarks/results/inference_server.json`` (or ``--output``). Target: ratio >= 0.7.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def corpus(n: int = 500) -> list[str]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append(f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n")
    return rows


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    rng = random.Random(1)
    msgs = [[{"role": "user", "content": f"What is {rng.randint(0, 99)} + {rng.randint(0, 99)}?"}] for _ in range(n)]
    return [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in msgs]


async def server_round(url: str, ids: list[list[int]], new_tokens: int) -> float:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(p: list[int]) -> int:
            body = {"input_ids": p, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0}}
            async with session.post(url + "/generate", json=body) as resp:
                out = await resp.json()
            if "output_ids" not in out:
                raise RuntimeError(f"/generate answered {resp.status}: {json.dumps(out)[:500]}")
            return len(out["output_ids"])

        start = time.perf_counter()
        counts = await asyncio.gather(*(one(p) for p in ids))
        elapsed = time.perf_counter() - start
    assert sum(counts) == len(ids) * new_tokens
    return sum(counts) / elapsed


def generate_round(model: Any, tokenizer: Any, ids: list[list[int]], new_tokens: int) -> float:
    import torch

    pad = tokenizer.pad_token_id
    width = max(len(p) for p in ids)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = (input_ids != pad).long()
    for i, p in enumerate(ids):
        mask[i, width - len(p):] = 1
    input_ids, mask = input_ids.to(model.device), mask.to(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=pad, top_k=0, top_p=1.0)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert out.shape[1] - width == new_tokens
    return len(ids) * new_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads on both sides (1 is steadiest on a shared 2-core machine)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="server and model.generate device")
    parser.add_argument("--output", default=str(RESULTS / "inference_server.json"))
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from areal_agents.config import ExperimentConfig
    from areal_agents.inference.control import server_info
    from areal_agents.inference.launcher import launch_servers
    from trainers.tiny_model import build_tiny_model

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(corpus(), Path(tmp) / "model", seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        ids = [tokenizer.encode(t) for t in prompts(tokenizer, args.requests)]
        cfg = ExperimentConfig()
        cfg.inference.max_batch_size = args.requests
        cfg.inference.device = args.device
        dtype = torch.float32 if args.device == "cpu" else "auto"  # as the embedded server loads it
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
        server_runs: list[float] = []
        gen_runs: list[float] = []
        env = {"OMP_NUM_THREADS": str(args.threads)}
        with launch_servers(cfg, model_dir, 1, log_dir=Path(tmp) / "logs", env=env) as group:
            url = group[0].url
            asyncio.run(server_round(url, ids[:8], 8))  # warm-up
            generate_round(model, tokenizer, ids[:8], 8)
            for _ in range(args.repeats):  # interleaved, so load from elsewhere hits both alike
                server_runs.append(asyncio.run(server_round(url, ids, args.new_tokens)))
                gen_runs.append(generate_round(model, tokenizer, ids, args.new_tokens))
            batching = server_info(group[0].address)["batching"]

    result = {
        "benchmark": "inference_server",
        "requests": args.requests,
        "new_tokens": args.new_tokens,
        "torch_threads": torch.get_num_threads(),
        "device": args.device,
        "server_tokens_per_s": max(server_runs),
        "generate_tokens_per_s": max(gen_runs),
        "ratio": max(server_runs) / max(gen_runs),
        "median_pair_ratio": sorted(a / b for a, b in zip(server_runs, gen_runs, strict=True))[len(gen_runs) // 2],
        "runs": {"server": server_runs, "generate": gen_runs},
        "server_batching": batching,
        "target_ratio": 0.7,
    }
    result["meets_target"] = result["ratio"] >= 0.7
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"embedded server: {result['server_tokens_per_s']:,.0f} new tokens/s  "
          f"batched generate: {result['generate_tokens_per_s']:,.0f}  ratio {result['ratio']:.2f} (target >= 0.7)")
    print(f"mean sequences per decode forward: {batching['mean_batch_size']:.1f}")


if __name__ == "__main__":
    main()
