"""The README's "Write your own env" example runs verbatim through `imports=`, and CI runs the
README's test command, exactly."""

from __future__ import annotations

import re
from pathlib import Path

from areal_agents.config.loader import load_config
from areal_agents.gym.checker import check_env
from areal_agents.registry import envs, rewards

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_ci_runs_the_readme_test_command() -> None:
    """``.ci/run`` runs the README's "Run the tests" command, step for step (line continuations and
    spacing aside), so the command a newcomer copies is the one CI proves."""
    block = re.search(r"Run the tests:\n\n```bash\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    steps = [" ".join(step.split()) for step in block.group(1).replace("\\\n", " ").split("&&")]
    ci = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    ci_line = next(line for line in ci.splitlines() if "pytest" in line)
    ci_steps = [" ".join(step.split()) for step in ci_line.split("||")[0].split("&&")]
    assert ci_steps == steps, (ci_steps, steps)


def test_readme_env_example(tmp_path: Path) -> None:
    block = re.search(r"## Write your own env\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    path = tmp_path / "my_env_readme.py"
    path.write_text(block.group(1))
    try:
        cfg = load_config(overrides=[f"imports=[{path}]", "env.name=shout"])
        env = envs.get(cfg.env.name)()
        check_env(env)
        env.reset(options={})
        assert env.step("HELLO!")[1] == 1.0 and env.step("hello")[1] == 0.0
        assert env.reference_completion({}) == "HELLO!"
    finally:
        envs.remove("shout")
        rewards.remove("ends-with-bang")
