"""Built-in rewards and the RewardRunner's failure handling (real worker processes)."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest

from areal_agents.registry import rewards
from areal_agents.rewards import (
    RewardRunner,
    default_reward_workers,
    default_runner,
    exact_match_reward,
    extract_answer,
    fast_path,
    format_reward,
    math_reward,
)


# Reward functions for the runner live at module level so worker processes can import them.
def hang_reward(completion: str, **row) -> float:
    while True:
        time.sleep(0.01)


def crash_reward(completion: str, **row) -> float:
    os._exit(7)


def nan_reward(completion: str, **row) -> float:
    return math.nan


def text_reward(completion: str, **row) -> float:
    return "high"  # type: ignore[return-value]


def raising_reward(completion: str, **row) -> float:
    raise KeyError("missing gold")


def length_reward(completion: str, **row) -> float:
    return float(len(completion))


def sleep_reward(completion: str, seconds: float = 1.0, **row) -> float:
    time.sleep(seconds)
    return seconds


def marked_hang_reward(completion: str, folder: str = ".", **row) -> float:
    """Fault injection: writes its pid to ``folder/started``, then never returns."""
    Path(folder, "started.tmp").write_text(str(os.getpid()))
    os.replace(Path(folder, "started.tmp"), Path(folder, "started"))
    while True:
        time.sleep(0.01)


def barrier_reward(completion: str, folder: str = ".", n: int = 1, **row) -> float:
    """Marks itself in ``folder`` and returns once ``n`` calls have (or after 60 s): its value is
    the number of calls that were running at once."""
    Path(folder, f"{os.getpid()}-{completion}").touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return float(len(os.listdir(folder)))


def pid_reward(completion: str, **row) -> float:
    return float(os.getpid())


def _short_only(completion: str, **row) -> float | None:
    if completion == "boom":
        raise RuntimeError("fast path failed")
    return 2.0 if len(completion) < 3 else None  # differs from the full reward: shows which one ran


@fast_path(_short_only)
def fast_length_reward(completion: str, **row) -> float:
    return float(len(completion))


def numpy_reward(completion: str, **row) -> float:
    import numpy as np

    return np.float32(0.5)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("The answer is \\boxed{82}.", "82", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("so we get #### 1,234", "1234", 1.0),
        ("Janet has 18 dollars left. #### 18", "#### 18", 1.0),
        ("82", "82", 1.0),
        ("first 3 then 41", "41", 1.0),
        ("41", "42", 0.0),
        ("no number here", "42", 0.0),
        ("\\boxed{x+1}", "1+x", 1.0),
        ("\\boxed{-7}", "-7", 1.0),
    ],
)
def test_math_reward(completion: str, answer: str, expected: float) -> None:
    assert math_reward(completion, answer=answer) == expected


def test_extract_answer_and_other_builtins() -> None:
    assert extract_answer("a \\boxed{\\frac{3}{4}} b") == "\\frac{3}{4}"
    assert extract_answer("x #### 72") == "72"
    assert extract_answer("nothing") is None
    assert exact_match_reward(" yes\n", answer="yes") == 1.0 and exact_match_reward("no", answer="yes") == 0.0
    assert format_reward("so \\boxed{3}") == 1.0 and format_reward("3") == 0.0
    assert format_reward("<a>x</a>", pattern=r"<a>.*</a>") == 1.0
    with pytest.raises(ValueError, match="'answer'"):
        math_reward("1")


def test_builtin_rewards_are_registered() -> None:
    assert rewards.get("math") is math_reward
    assert rewards.get("exact-match") is exact_match_reward
    assert rewards.get("format") is format_reward


def test_runner_computes_by_name_and_function() -> None:
    with RewardRunner(timeout=20, max_workers=2) as runner:
        assert runner.compute("math", "\\boxed{82}", {"answer": "82"}).value == 1.0
        assert runner(length_reward, "abcd").value == 4.0
        assert runner(numpy_reward, "x").value == 0.5
        assert runner.stats["ok"] == 3


def test_a_fast_path_decides_in_process_and_leaves_the_rest_to_a_worker() -> None:
    with RewardRunner(timeout=20, max_workers=1) as runner:
        assert runner(fast_length_reward, "ab").value == 2.0  # the fast path decided
        assert runner.compute("math", "so 82", {"answer": "82"}).value == 1.0  # plain numbers: no parser
        assert runner.compute("math", "41", {"answer": "42"}).value == 0.0
        assert not runner._idle  # ... and no worker process was started for any of them
        assert runner(fast_length_reward, "abcd").value == 4.0  # None: a worker ran the reward
        assert runner(fast_length_reward, "boom").value == 4.0  # a failing fast path: the worker decides
        assert runner.compute("math", "\\boxed{\\frac{1}{2}}", {"answer": "0.5"}).value == 1.0  # needs the parser
        assert len(runner._idle) == 1 and runner.stats["ok"] == 6
    assert math_reward.fast_path("\\boxed{\\frac{1}{2}}", answer="0.5") is None  # type: ignore[attr-defined]


def test_a_hanging_reward_costs_one_timeout_not_the_run() -> None:
    with RewardRunner(timeout=1.0, max_workers=1) as runner:
        runner(length_reward, "warm")  # start the worker
        result = runner(hang_reward, "x")
        assert result.status == "timeout" and result.value == 0.0
        # The hung worker was killed and replaced: the next call works at once.
        after = runner(length_reward, "abc")
        assert after.ok and after.value == 3.0
        assert runner.stats == {"ok": 2, "reward_error": 0, "timeout": 1}


def test_crash_nan_non_number_and_exception_are_counted_failures() -> None:
    with RewardRunner(timeout=20, max_workers=2) as runner:
        crashed = runner(crash_reward, "x")
        assert crashed.status == "reward_error" and "exit code 7" in crashed.error
        nan = runner(nan_reward, "x")
        assert nan.status == "reward_error" and "not a finite number" in nan.error
        text = runner(text_reward, "x")
        assert text.status == "reward_error" and "str 'high', not a number" in text.error
        raised = runner(raising_reward, "x")
        assert raised.status == "reward_error" and "KeyError" in raised.error
        unpicklable = runner(lambda c: 1.0, "x")
        assert unpicklable.status == "reward_error" and "cannot send" in unpicklable.error
        assert runner(length_reward, "ok").value == 2.0
        assert runner.stats == {"ok": 1, "reward_error": 5, "timeout": 0}


def test_runner_is_thread_safe_and_bounded() -> None:
    with RewardRunner(timeout=20, max_workers=2) as runner:
        results: list[float] = []
        lock = threading.Lock()

        def work(i: int) -> None:
            value = runner.compute("math", f"\\boxed{{{i}}}", {"answer": str(i)}).value
            with lock:
                results.append(value)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [1.0] * 12 and len(runner._idle) <= 2


def test_runner_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        RewardRunner(timeout=0)
    with pytest.raises(ValueError, match="max_workers must be >= 1"):
        RewardRunner(max_workers=0)


def test_acompute_from_asyncio() -> None:
    import asyncio

    async def main() -> list[float]:
        with RewardRunner(timeout=20, max_workers=2) as runner:
            results = await asyncio.gather(*[runner.acompute(length_reward, "x" * i) for i in range(6)])
        return [r.value for r in results]

    assert asyncio.run(main()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_acompute_waits_in_the_event_loop_times_out_and_survives_cancellation(tmp_path: Path) -> None:
    """With a started worker free, ``acompute`` waits on its socket in the event loop (no
    thread); a hang times out and its worker is replaced; a cancelled call's worker, whose
    reply may still come, is killed, so the next call cannot read a stale reply."""
    import asyncio

    async def wait_for_file(path: Path) -> None:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def main() -> None:
        with RewardRunner(timeout=1.0, max_workers=1) as runner:
            assert (await runner.acompute(length_reward, "warm")).value == 4.0  # starts the worker (thread)
            threads = threading.active_count()
            first = runner._idle[0]
            assert (await runner.acompute(length_reward, "abc")).value == 3.0
            assert threading.active_count() == threads and runner._idle == [first]  # same worker, no thread
            hung = await runner.acompute(hang_reward, "x")
            assert hung.status == "timeout" and not first.alive()
            assert (await runner.acompute(length_reward, "ab")).value == 2.0  # a fresh worker
            assert runner.stats == {"ok": 3, "reward_error": 0, "timeout": 1}
        with RewardRunner(timeout=120.0, max_workers=1) as runner:  # the cancel, not the timeout, ends the call
            assert (await runner.acompute(length_reward, "warm")).value == 4.0
            second = runner._idle[0]
            task = asyncio.ensure_future(runner.acompute(marked_hang_reward, "x", {"folder": str(tmp_path)}))
            await wait_for_file(tmp_path / "started")  # the call is running in the worker
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not second.alive() and runner._idle == []
            assert (await runner.acompute(length_reward, "abcde")).value == 5.0
            assert runner.stats == {"ok": 2, "reward_error": 0, "timeout": 0}

    asyncio.run(main())


def test_default_runner_is_set_inside_then_restored_and_closed() -> None:
    from areal_agents.rewards import get_default_runner

    before = get_default_runner()
    with default_runner(RewardRunner(timeout=5.0, max_workers=1)) as runner:
        assert get_default_runner() is runner is not before
        assert runner.compute("exact-match", "42", {"answer": "42"}).value == 1.0
    assert get_default_runner() is before
    with pytest.raises(RuntimeError, match="closed"):
        runner.compute("exact-match", "42", {"answer": "42"})


def _together(runner: RewardRunner, calls: list[tuple[object, str, dict]]) -> list:
    """Start every call at once from its own thread (as envs stepping on threads do); the results, in order."""
    out: list = [None] * len(calls)

    def one(i: int) -> None:
        out[i] = runner.compute(calls[i][0], calls[i][1], calls[i][2])  # type: ignore[arg-type]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _wait_for_file(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return path.read_text()


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _running(pid)


def test_n_workers_run_n_rewards_at_once_and_one_worker_runs_them_one_by_one(tmp_path: Path) -> None:
    """With n workers, n calls meet inside their rewards (each waits until all n are running);
    with one worker, one process serves every call. How much faster n workers are is a figure
    of ``benchmarks/bench_reward_runner.py``."""
    n = 4
    with RewardRunner(timeout=120, max_workers=n) as runner:
        results = _together(runner, [(barrier_reward, str(i), {"folder": str(tmp_path), "n": n}) for i in range(n)])
    assert [r.value for r in results] == [float(n)] * n, results  # all n were running at once
    assert len(os.listdir(tmp_path)) == n and len({name.split("-")[0] for name in os.listdir(tmp_path)}) == n
    with RewardRunner(timeout=30, max_workers=1) as runner:
        pids = _together(runner, [(pid_reward, "x", {})] * n)
    assert all(r.ok for r in pids) and len({r.value for r in pids}) == 1, pids


def test_a_hung_reward_is_cut_without_stalling_the_others(tmp_path: Path) -> None:
    """While a reward hangs in one worker, the other workers answer; then the hung call ends as a
    counted timeout and its process is gone."""
    with RewardRunner(timeout=20.0, max_workers=4) as runner:
        assert all(r.ok for r in _together(runner, [(length_reward, "warm", {})] * 4))  # four workers started
        done: list[int] = []
        hung: list = []

        def hang() -> None:
            hung.append(runner.compute(marked_hang_reward, "x", {"folder": str(tmp_path)}))
            done.append(0)

        thread = threading.Thread(target=hang)
        thread.start()
        pid = int(_wait_for_file(tmp_path / "started"))  # the reward is hanging in its worker
        for i, result in enumerate(_together(runner, [(length_reward, "ab" * i, {}) for i in range(1, 4)]), 1):
            assert result.ok and result.value == 2.0 * i
            done.append(i)
        thread.join()
        assert done == [1, 2, 3, 0]  # the others answered while the hung call was still running
        assert hung[0].status == "timeout" and hung[0].value == 0.0
        assert _gone(pid), "the hung worker outlived its timeout"
        assert runner(length_reward, "abc").value == 3.0  # the hung worker was replaced
        assert runner.stats == {"ok": 8, "reward_error": 0, "timeout": 1}


def test_reward_workers_config_reaches_the_runner() -> None:
    from areal_agents.config import ConfigError
    from areal_agents.config.loader import load_config  # here: reward workers import this module, keep it light

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert default_reward_workers() == max(1, min(cpus or 1, 8))
    default = RewardRunner.for_rollout(load_config(None, []).rollout)
    three = RewardRunner.for_rollout(load_config(None, ["rollout.reward_workers=3", "rollout.reward_timeout=4"]).rollout)
    assert default.max_workers == default_reward_workers() and (three.max_workers, three.timeout) == (3, 4.0)
    assert three._slots._value == 3  # noqa: SLF001 - the bound on calls at once
    default.close(), three.close()
    with pytest.raises(ConfigError, match=r"rollout.reward_workers: must be >= 1"):
        load_config(None, ["rollout.reward_workers=0"])


def test_a_reward_in_a_file_from_imports_runs_in_the_workers(tmp_path) -> None:
    from areal_agents.config.loader import load_config
    from areal_agents.registry import rewards as registry

    path = tmp_path / "file_reward_for_workers.py"  # a directory no worker has on sys.path
    path.write_text("from areal_agents import register_reward\n\n"
                    "@register_reward('file-reward-for-workers')\n"
                    "def count_a(completion, **row):\n"
                    "    return float(completion.count('a'))\n")
    try:
        load_config(overrides=[f"imports={path}"])
        with RewardRunner(timeout=20, max_workers=1) as runner:
            result = runner.compute("file-reward-for-workers", "banana")
        assert result.ok and result.value == 3.0, result
    finally:
        registry.remove("file-reward-for-workers")


def test_a_runner_dropped_without_close_leaves_no_worker() -> None:
    import gc

    runner = RewardRunner(timeout=20, max_workers=1)
    assert runner(length_reward, "abc").value == 3.0
    (worker,) = runner._idle
    proc = worker.proc
    del runner, worker
    gc.collect()  # no ResourceWarning for a still-running subprocess (warnings are errors here)
    assert proc.returncode is not None and proc.poll() is not None


def test_envs_built_for_a_run_get_their_reward_runner_handed_over() -> None:
    """``make_env(..., reward_runner=r)`` and the rollout's ``env_factory(cfg, r)`` hand ``r`` to the
    env: its rewards are counted there, and the process default sees none of them."""
    from areal_agents.config import ExperimentConfig
    from areal_agents.gym.registration import make_env
    from areal_agents.rewards import get_default_runner
    from areal_agents.rollout.wiring import env_factory

    default = get_default_runner()
    before = dict(default.stats)
    row = {"prompt": "1+1=", "answer": "2"}
    with RewardRunner(timeout=5.0, max_workers=1) as runner:
        cfg = ExperimentConfig()
        cfg.env.name = "math"
        for env in (make_env("math", reward_runner=runner), env_factory(cfg, runner)()):
            assert env.reward_runner is runner
            env.reset(options=row)
            assert env.step("\\boxed{2}")[1] == 1.0
        assert runner.stats["ok"] == 2
    assert default.stats == before
    assert env_factory(cfg)().reward_runner is None  # built by hand: the default runner serves it


def test_no_production_code_sets_the_process_wide_runner() -> None:
    """Runs hand their runners to the envs they build: nothing in the four packages replaces the
    process-wide default (``set_default_runner`` / ``default_runner``), which only hand-built envs use."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setters = {"set_default_runner", "default_runner"}
    calls = []
    for pkg in ("areal_agents", "trainers", "algorithms", "envs"):
        for path in (root / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in setters and path.relative_to(root).as_posix() != "areal_agents/rewards/runner.py":
                        calls.append(f"{path.relative_to(root)}:{node.lineno}")
    assert calls == []
