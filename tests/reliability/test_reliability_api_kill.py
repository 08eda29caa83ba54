"""A run started from a Python script without an ``if __name__ == "__main__":`` guard works, never
runs again inside worker processes, and leaves no process behind when it is killed (SIGKILL,
SIGTERM, Ctrl-C); a reward defined in such a script stops the run at once with what to do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from reliability_support import REPO, alive, record

SETTINGS = [
    "sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0", "trainer.total_steps=200", "trainer.save_every=0",
    "rollout.batch_size=2", "rollout.group_size=2", "eval.n=4", "eval.every=0",
    "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
]  # fmt: skip
# The killed run: long enough that the signal always comes first, and a reward without a fast
# path (the math reward decides most replies in process), so reward workers are always running.
KILLED_RUN = [*SETTINGS, "trainer.total_steps=5000", "env.kwargs.reward=exact-match"]

UNGUARDED = """\
import sys
from areal_agents.cli import main

print("script started", flush=True)
sys.exit(main(["run", "--env", "math", *sys.argv[1:]]))
"""

REWARD_IN_SCRIPT = """\
import sys
from areal_agents import DatasetMixin, Env, ReferenceMixin, RewardMixin, register_env
from areal_agents.cli import main


def my_reward(completion, answer="", **row):
    return float(completion.strip() == str(answer))


class ScriptEnv(DatasetMixin, RewardMixin, ReferenceMixin, Env):
    default_dataset = "arithmetic"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.row = options
        return f"{options['prompt']} (answer with a number)", {}

    def step(self, action):
        value, info = self.compute_reward(my_reward, action, self.row)
        return "", value, True, False, dict(info, success=value > 0)

    def reference_completion(self, row):
        return str(row["answer"])


register_env("api-script-env")(ScriptEnv)

RUN
"""


def _cmdlines(pid: int) -> list[tuple[int, str]]:
    out = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            out.append((child.pid, " ".join(child.cmdline())))
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api-kill-cache")  # the tiny model is built once for the three signals


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_unguarded_script_runs_once_and_leaves_nothing_behind(tmp_path: Path, cache: Path, sig: signal.Signals) -> None:
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen([sys.executable, str(script), *KILLED_RUN, f"output_dir={tmp_path / 'runs'}"], cwd=tmp_path,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 400
        seen: list[tuple[int, str]] = []
        while time.monotonic() < deadline and proc.poll() is None:  # training: a server and reward workers
            seen = _cmdlines(proc.pid)
            metrics = tmp_path / "runs" / "math" / "trial" / "metrics.jsonl"
            if (any("inference.server" in c for _, c in seen) and any("rewards.worker" in c for _, c in seen)
                    and metrics.exists() and metrics.read_text().count("train/loss") >= 1):
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        seen = _cmdlines(proc.pid)
        assert not any(str(script) in c for _, c in seen), seen  # the script was not run again anywhere
        pids = [pid for pid, _ in seen]
        proc.send_signal(sig)
        t_signal = time.monotonic()
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    deadline = time.monotonic() + 10
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(pids)
    gone_s = time.monotonic() - t_signal
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"outlived the run: {[c for p, c in seen if p in left]}"
    text = (tmp_path / "run.log").read_text()
    assert text.count("script started") == 1
    assert (tmp_path / "runs" / "math" / "trial" / "logs" / "server-0.log").read_text().count("serving on") == 1
    kinds = sorted({"server" if "inference.server" in c else "reward worker" if "rewards.worker" in c else c[:60]
                    for _, c in seen})
    record(f"api_script_{sig.name}", processes=len(pids), kinds=kinds,
           left_behind=0, all_gone_after_s=round(gone_s, 2))


def test_a_reward_in_an_unguarded_script_stops_at_once(tmp_path: Path) -> None:
    """A script that starts a run at import with a reward defined in it stops with one line, before
    a model is built."""
    script = tmp_path / "train.py"
    script.write_text(REWARD_IN_SCRIPT.replace("RUN", 'sys.exit(main(["run", "--env", "api-script-env", *sys.argv[1:]]))'))
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script), *SETTINGS, f"output_dir={tmp_path / 'runs'}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert "reward 'my_reward' could not be loaded in a worker" in lines[0]
    assert 'train.py starts a run when imported' in lines[0] and 'if __name__ == "__main__":' in lines[0]
    assert not (tmp_path / "cache").exists()  # stopped before a model was built


def test_a_reward_in_a_guarded_script_runs_in_the_workers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(REWARD_IN_SCRIPT.replace("RUN", (
        'if __name__ == "__main__":\n'
        "    from areal_agents.rewards import RewardRunner\n"
        "    with RewardRunner(timeout=30, max_workers=1) as runner:\n"
        '        print("reward", runner.compute(my_reward, " 42 ", {"answer": 42}).value)')))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "reward 1.0" in proc.stdout, proc.stdout + proc.stderr
