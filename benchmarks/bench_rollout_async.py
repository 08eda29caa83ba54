"""Asynchronous vs synchronous RL: the same rollout + train workload with η = 0 and η = 4.

Generation runs on a simulated continuous-batching engine inside the executor's event loop:
``--slots`` sequences decode together, one token each per ``--step-ms`` (a decode step costs
the same whatever the batch, as on a GPU); response lengths are lognormal (long tail). A
training step is a sleep calibrated to the mean time a synchronous step waits for its batch,
so generation and training take comparable time. The bound on the speed-up of overlapping
them is ``(T_gen + T_train) / max(T_gen, T_train)``, with ``T_gen``/``T_train`` measured in
the synchronous run of the same invocation.

    python benchmarks/bench_rollout_async.py [--steps 12] [--backend embedded]

``--backend embedded`` generates with the tiny model on a real embedded server subprocess
instead (``ignore_eos`` with lognormal ``max_new_tokens``). Writes
``benchmarks/results/rollout_async[_embedded].json`` and ``.png``. Target: the measured
speed-up is ≥ 0.8 of the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


class SimEngine:
    """Continuous batching, simulated: ``slots`` sequences advance one token per ``step_s``."""

    def __init__(self, slots: int, step_s: float) -> None:
        self.slots, self.step_s = slots, step_s
        self.waiting: list[tuple[int, asyncio.Future[int]]] = []
        self.active: list[list[Any]] = []  # [remaining tokens, future, generated]
        self.task: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None
        self.tokens = 0

    async def generate(self, n_tokens: int) -> int:
        if self.task is None:
            self.wake = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._run())
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiting.append((n_tokens, fut))
        assert self.wake is not None
        self.wake.set()
        return await fut

    async def _run(self) -> None:
        assert self.wake is not None
        while True:
            self.active = [a for a in self.active if not a[1].done()]  # cancelled episodes leave
            self.waiting = [w for w in self.waiting if not w[1].done()]
            while self.waiting and len(self.active) < self.slots:
                n, fut = self.waiting.pop(0)
                self.active.append([n, fut, 0])
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
                continue
            await asyncio.sleep(self.step_s)
            for a in self.active:
                a[0] -= 1
                a[2] += 1
                self.tokens += 1
                if a[0] <= 0 and not a[1].done():
                    a[1].set_result(a[2])

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


def response_length(seed: int, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, int(random.Random(seed).lognormvariate(math.log(median), sigma))))


def run_mode(eta: int, steps: int, train_s: float, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``steps`` RL steps; returns wall time, time waiting for batches, time training, timeline."""
    from areal_agents.config import RolloutConfig
    from areal_agents.inference.client import InferenceClient
    from areal_agents.rollout import RolloutExecutor
    from areal_agents.types import Trajectory

    engine = SimEngine(args.slots, args.step_ms / 1000)
    client = InferenceClient([args.address]) if args.address else None

    async def generate(seed: int) -> int:
        n = response_length(seed, args.median_tokens, args.sigma, args.max_tokens)
        if client is None:
            return await engine.generate(n)
        gen = await client.generate([5, 6, 7, 8], {"max_new_tokens": n, "ignore_eos": True}, rid=f"{eta}-{seed}")
        engine.tokens += len(gen.output_ids)
        return len(gen.output_ids)

    async def episode(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        n = await generate(seed)
        traj = Trajectory(input_ids=[1] * (4 + n), loss_mask=[0] * 4 + [1] * n, logprobs=[0.0] * (4 + n),
                          versions=[-1] * 4 + [0] * n, turn_spans=[(4, 4 + n)])
        traj.set_rewards([float(seed % 2)])
        return traj

    async def close() -> None:
        await engine.aclose()
        if client is not None:
            await client.aclose()

    cfg = RolloutConfig(batch_size=args.batch_size, group_size=args.group_size, max_concurrent_rollouts=args.slots,
                        max_head_offpolicyness=eta, episode_timeout=600.0)
    rows = [{"question": str(i)} for i in range(512)]
    ex = RolloutExecutor(cfg, episode_fn=episode, rows=rows, seed=args.seed, on_shutdown=[close])
    t_gen = t_train = 0.0
    timeline: list[float] = []
    staleness: list[float] = []
    t0 = time.monotonic()
    ex.start()
    for version in range(steps):
        a = time.monotonic()
        ex.prepare_batch(timeout=600)
        b = time.monotonic()
        time.sleep(train_s)  # the simulated training step
        c = time.monotonic()
        ex.pause()
        ex.set_version(version + 1)
        ex.resume()
        t_gen, t_train = t_gen + (b - a), t_train + (c - b)
        timeline.append(time.monotonic() - t0)
        staleness.append(ex.stats()["staleness/mean"])
    wall = time.monotonic() - t0
    stats = ex.stats()
    ex.shutdown()
    return {"eta": eta, "wall_s": wall, "gen_wait_s": t_gen, "train_s": t_train, "step_end_s": timeline,
            "staleness_mean": sum(staleness) / len(staleness), "staleness_max": stats["staleness/max"],
            "dropped_groups": stats["rollout/dropped_groups"], "gen_tokens": engine.tokens}


def plot(sync: dict[str, Any], asyn: dict[str, Any], bound: float, path: Path, backend: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [2, 1]})
    for run, label in ((sync, "synchronous (η = 0)"), (asyn, f"asynchronous (η = {asyn['eta']})")):
        ends = [0.0, *run["step_end_s"]]
        ax1.step(ends, range(len(ends)), where="post", label=label)
    ax1.set_xlabel("wall time (s)")
    ax1.set_ylabel("training steps done")
    engine = "simulated engine" if backend == "sim" else "embedded server, tiny model"
    ax1.set_title(f"RL steps over time (same workload, {engine})")
    ax1.legend()
    speedup = sync["wall_s"] / asyn["wall_s"]
    ax2.bar(["measured", "bound"], [speedup, bound], color=["tab:orange", "tab:gray"])
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_title(f"speed-up: {speedup:.2f}× of {bound:.2f}×")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@contextlib.contextmanager
def embedded_server(max_batch: int) -> Iterator[str]:
    """The tiny model on a real embedded server subprocess (built into a temp dir)."""
    from areal_agents.config import ExperimentConfig
    from areal_agents.inference.launcher import launch_servers
    from trainers.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        texts = [f"What is {a} + {b}? {a + b}" for a in range(30) for b in range(30)]
        model = build_tiny_model(texts, Path(tmp) / "model")
        cfg = ExperimentConfig()
        cfg.inference.max_batch_size = max_batch
        with launch_servers(cfg, model, 1, log_dir=Path(tmp) / "logs") as group:
            yield group[0].address


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--eta", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8, help="groups per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--slots", type=int, default=64, help="sequences the simulated engine decodes together")
    p.add_argument("--step-ms", type=float, default=2.0, help="one decode step")
    p.add_argument("--median-tokens", type=float, default=64)
    p.add_argument("--sigma", type=float, default=0.9, help="lognormal sigma of response lengths")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--backend", choices=["sim", "embedded"], default="sim",
                   help="sim: simulated engine; embedded: the tiny model on a real embedded server subprocess")
    args = p.parse_args(argv)
    args.address = None
    with contextlib.ExitStack() as stack:
        if args.backend == "embedded":
            args.address = stack.enter_context(embedded_server(args.slots))
        calib = run_mode(0, 3, 0.0, args)  # how long a synchronous step waits for its batch
        train_s = calib["gen_wait_s"] / 3
        sync = run_mode(0, args.steps, train_s, args)
        asyn = run_mode(args.eta, args.steps, train_s, args)
    t_gen, t_train = sync["gen_wait_s"], sync["train_s"]
    bound = (t_gen + t_train) / max(t_gen, t_train)
    speedup = sync["wall_s"] / asyn["wall_s"]
    result = {
        "benchmark": "rollout_async",
        "backend": args.backend,
        "workload": {k: getattr(args, k) for k in ("steps", "batch_size", "group_size", "slots", "step_ms",
                                                    "median_tokens", "sigma", "max_tokens", "seed")},
        "train_step_s": train_s,
        "sync": sync, "async": asyn,
        "T_gen_s": t_gen, "T_train_s": t_train,
        "bound": bound, "speedup": speedup, "fraction_of_bound": speedup / bound,
        "target_fraction_of_bound": 0.8,
    }
    result["meets_target"] = result["fraction_of_bound"] >= 0.8
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "rollout_async" if args.backend == "sim" else "rollout_async_embedded"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(sync, asyn, bound, RESULTS / f"{stem}.png", args.backend)
    print(json.dumps({k: result[k] for k in ("T_gen_s", "T_train_s", "bound", "speedup", "fraction_of_bound",
                                             "meets_target")}, indent=2))
    print(f"sync wall {sync['wall_s']:.2f} s, async wall {asyn['wall_s']:.2f} s, "
          f"async staleness mean {asyn['staleness_mean']:.2f} max {asyn['staleness_max']:.0f}, "
          f"dropped groups {asyn['dropped_groups']:.0f}")
    return result


if __name__ == "__main__":
    main()
