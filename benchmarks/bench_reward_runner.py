"""The reward runner's timings: parallel workers and the cut of a hung reward.

Two figures the tests check only as outcomes (tests/rewards/test_rewards_runner.py):

* ``parallel``: ``--calls`` rewards that each sleep ``--seconds``, started together from threads,
  with ``--calls`` workers and with one; the wall time of each and the speedup (ideal: ``--calls``).
* ``hang``: a reward that never returns, with ``rollout.reward_timeout`` = ``--timeout``: seconds
  until its call ends as a timeout (ideal: the timeout), and the seconds a call already running
  in another worker takes meanwhile (ideal: its own ``--seconds``).

Workers are started before anything is timed. Writes ``benchmarks/results/reward_runner.json``.

    python benchmarks/bench_reward_runner.py [--calls 4] [--seconds 1.0] [--timeout 3.0] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_agents.rewards import RewardResult, RewardRunner

HERE = Path(__file__).resolve().parent

__all__ = ["main"]


def sleep_reward(completion: str, seconds: float = 1.0, **row: Any) -> float:
    time.sleep(seconds)
    return seconds


def hang_reward(completion: str, **row: Any) -> float:
    while True:
        time.sleep(0.01)


Call = tuple[Callable[..., float], dict[str, Any]]


def together(runner: RewardRunner, calls: list[Call]) -> tuple[list[RewardResult], list[float]]:
    """Every call at once, each from its own thread; the results and each call's seconds."""
    results: list[Any] = [None] * len(calls)
    seconds = [0.0] * len(calls)

    def one(i: int) -> None:
        t0 = time.perf_counter()
        results[i] = runner.compute(calls[i][0], "x", calls[i][1])
        seconds[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, seconds


def parallel(calls: int, seconds: float) -> dict[str, Any]:
    walls = {}
    for workers in (calls, 1):
        with RewardRunner(timeout=60 + calls * seconds, max_workers=workers) as runner:
            together(runner, [(sleep_reward, {"seconds": 0.0})] * workers)  # start the workers
            t0 = time.perf_counter()
            results, _ = together(runner, [(sleep_reward, {"seconds": seconds})] * calls)
            walls[workers] = time.perf_counter() - t0
            if not all(r.ok for r in results):
                raise SystemExit(f"a reward failed: {results}")
    return {"calls": calls, "reward_s": seconds, "wall_s_n_workers": round(walls[calls], 3),
            "wall_s_one_worker": round(walls[1], 3), "speedup": round(walls[1] / walls[calls], 2)}


def hang(timeout: float, seconds: float) -> dict[str, Any]:
    with RewardRunner(timeout=timeout, max_workers=2) as runner:
        together(runner, [(sleep_reward, {"seconds": 0.0})] * 2)
        results, took = together(runner, [(hang_reward, {}), (sleep_reward, {"seconds": seconds})])
    if results[0].status != "timeout" or not results[1].ok:
        raise SystemExit(f"unexpected results: {results}")
    return {"timeout_s": timeout, "hung_call_ended_after_s": round(took[0], 3),
            "other_call_s": round(took[1], 3), "other_reward_s": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=4, help="calls at once (and workers) in the parallel figure")
    p.add_argument("--seconds", type=float, default=1.0, help="seconds each sleeping reward takes")
    p.add_argument("--timeout", type=float, default=3.0, help="the reward timeout of the hang figure")
    p.add_argument("--output", type=Path, default=HERE / "results" / "reward_runner.json")
    args = p.parse_args(argv)
    report = {"parallel": parallel(args.calls, args.seconds), "hang": hang(args.timeout, args.seconds)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
