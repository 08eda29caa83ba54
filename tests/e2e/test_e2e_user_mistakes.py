"""Mistakes in user code stop `areal-agents run` within seconds, with one line naming the file and the cause.

Each case is a real user file loaded with ``imports=`` into the real CLI, with a private model
cache: the check must fail before any model is built or any server starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BAD_RESET = '''\
from areal_agents import DatasetMixin, Env, register_env


@register_env("mistake-reset")
class BadReset(DatasetMixin, Env):
    default_dataset = "arithmetic"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return options["question"], {}

    def step(self, action):
        return "", 0.0, True, False, {"success": False}
'''

STRING_REWARD = '''\
from areal_agents import DatasetMixin, Env, ReferenceMixin, RewardMixin, register_env, register_reward


@register_reward("mistake-str")
def str_reward(completion, answer="", **row):
    return "1.0" if completion.strip() == str(answer) else "0.0"


@register_env("mistake-reward")
class StrRewardEnv(DatasetMixin, RewardMixin, ReferenceMixin, Env):
    default_dataset = "arithmetic"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.row = options
        return options["prompt"], {}

    def step(self, action):
        reward, info = self.compute_reward("mistake-str", action, self.row)
        return "", reward, True, False, {**info, "success": reward == 1.0}

    def reference_completion(self, row):
        return str(row["answer"])
'''

BROKEN_AGENT = '''\
from areal_agents import Agent, checked_step, register_agent


@register_agent("mistake-agent")
class MyAgent(Agent):
    def __init__(self, max_turns=4, max_tokens=1024, system_prompt=None,
                 sampling=None, **my_kwargs): ...

    async def run(self, env, llm, row=None, *, seed=None):
        obs, info = await env.areset(seed=seed, options=row)
        text = await llm.chat([{"role": "user", "content": obs}], **self.sampling)
        step = await checked_step(env, text)
        traj = llm.to_trajectory(info={"success": step.info.get("success", False)})
        traj.set_rewards([step.reward])
        return traj
'''

RAISING_INIT = '''\
from areal_agents import ChatAgent, register_agent


@register_agent("mistake-init")
class InitAgent(ChatAgent):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tools = load_tools()
'''

CASES = {  # file name, contents, overrides, what the one line must say
    "reset": ("my_env.py", BAD_RESET, ["--env", "mistake-reset"],
              ["env 'mistake-reset': reset raised KeyError: 'question'", "(my_env.py:10)"]),
    "reward": ("my_rewards.py", STRING_REWARD, ["--env", "mistake-reward"],
               ["reward 'mistake-str' returned str '1.0', not a number", "(my_rewards.py:5)"]),
    "agent": ("my_agent.py", BROKEN_AGENT, ["--env", "math", "agent.name=mistake-agent"],
              ["agent 'mistake-agent'", "AttributeError: 'MyAgent' object has no attribute 'sampling'",
               "(my_agent.py:11)"]),
    "agent-init": ("init_agent.py", RAISING_INIT, ["--env", "math", "agent.name=mistake-init"],
                   ["agent 'mistake-init': constructing it raised NameError", "(init_agent.py:8)"]),
}


def _run(tmp_path: Path, case: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    name, code, args, _ = CASES[case]
    (tmp_path / name).write_text(code)
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", *args, f"imports={name}",
           f"output_dir={tmp_path / 'runs'}", "logging.progress=false"]
    env = {k: v for k, v in os.environ.items() if k != "AREAL_AGENTS_TRACEBACK"}
    env.update(AREAL_AGENTS_CACHE=str(tmp_path / "cache"), **(extra_env or {}))
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_mistake_fails_fast_with_one_line(tmp_path: Path, case: str) -> None:
    proc = _run(tmp_path, case)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    for part in CASES[case][3]:
        assert part in lines[0], lines[0]
    # nothing was built, trained or served before the failure
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("config.json"))
    assert not (tmp_path / "runs").exists()


def test_traceback_on_request(tmp_path: Path) -> None:
    proc = _run(tmp_path, "reward", {"AREAL_AGENTS_TRACEBACK": "1"})
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr and "PreflightError" in proc.stderr
    assert "returned str '1.0', not a number" in proc.stderr
