"""The ecosystem adapters (envs/ecosystem): reasoning-gym tasks by name with their own scoring,
TextArena and GEM games keyed by a seed row, each episode with its own random state.
(check_env and Gymnasium's checker run on them in tests/envs/test_envs_builtin.py / tests/gym/test_gym_registration.py.)"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from areal_agents import make_env
from areal_agents.config.loader import load_config
from areal_agents.data import load_dataset_rows
from areal_agents.registry import datasets, rewards
from envs.ecosystem.reasoning_gym_env import extract_reply


def test_env_kwargs_task_chooses_the_rows_of_a_run() -> None:
    cfg = load_config(overrides=["env.name=reasoning-gym", "env.kwargs.task=letter_counting",
                                 "data.train_size=20", "data.test_size=10"])
    train, test = load_dataset_rows(cfg, "train"), load_dataset_rows(cfg, "test")
    assert len(train) == 20 and len(test) == 10
    assert {r["task"] for r in train + test} == {"letter_counting"}
    assert all("letter" in r["prompt"] for r in train)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert load_dataset_rows(cfg, "train") == train  # seeded
    two_terms = load_config(overrides=["env.name=reasoning-gym", "env.kwargs.task=chain_sum", "data.train_size=20",
                                       "env.kwargs.task_config={min_terms: 2, max_terms: 2}"])
    rows = load_dataset_rows(two_terms, "train")
    assert all(r["task_config"] == {"min_terms": 2, "max_terms": 2} for r in rows)
    assert all(len(re.findall(r" [-+] ", r["prompt"])) == 1 for r in rows)  # "a + b =": the config reached the task


def test_reset_without_a_row_draws_from_the_envs_own_task() -> None:
    env, other = make_env("reasoning-gym", task="letter_counting"), make_env("reasoning-gym", task="letter_counting")
    env.reset(seed=4)
    other.reset(seed=4)
    assert env.row is not None and env.row["task"] == "letter_counting" and env.row == other.row
    assert make_env("reasoning-gym").reset(seed=4)[0] != env.reset(seed=4)[0]  # chain_sum by default


def test_reasoning_gym_scores_with_the_tasks_own_score_answer() -> None:
    env = make_env("reasoning-gym", task="chain_sum")
    env.reset(seed=1)
    answer = env.row["answer"]
    assert env.step(f"thinking... <answer> {answer} </answer>")[1:3] == (1.0, True)
    env.reset(seed=1)
    _, reward, _, _, info = env.step(f"<answer>{int(answer) + 1}</answer>")
    assert (reward, info["success"], info["reward_status"]) == (0.0, False, "ok")
    assert env.reset(seed=1)[0] == env.row["prompt"]
    score = rewards.get("reasoning-gym")
    assert score(f"<answer>{float(answer)}</answer>", **env.row) == 1.0  # chain_sum's own score_answer: 4.0 == 4
    counting = make_env("reasoning-gym", task="letter_counting")
    counting.reset(seed=2)
    gold = counting.row["answer"]
    # letter_counting keeps reasoning-gym's base score_answer: partial credit for an answer that contains the gold one
    assert score(f"<answer>{gold}00</answer>", **counting.row) == pytest.approx(len(gold) / (len(gold) + 2))


def test_answer_extraction() -> None:
    assert extract_reply("a <answer>1</answer> b <answer> 2 </answer>") == "2"
    assert extract_reply("so \\boxed{7}.") == "7"
    assert extract_reply("  yes  ") == "yes"
    assert extract_reply("no tag", "answer-tag") == ""
    assert extract_reply("it is 12, not 13", "math") == "13"
    assert extract_reply("<answer>3</answer>", "raw") == "<answer>3</answer>"
    with pytest.raises(ValueError, match="extract must be one of"):
        extract_reply("x", "xml")


def test_bad_names_fail_in_one_line() -> None:
    with pytest.raises(ValueError, match="reasoning-gym task 'no_such_task'"):
        make_env("reasoning-gym", task="no_such_task")
    with pytest.raises(ValueError, match="textarena: .*NoSuchGame-v0"):
        make_env("textarena", game="NoSuchGame-v0")
    with pytest.raises(ValueError, match="cannot be played by one player"):
        make_env("textarena", game="TicTacToe-v0").reset(options={"seed": 1})
    with pytest.raises(ValueError, match="gem: .*no:such"):
        make_env("gem", env_id="no:such")


def test_game_seed_rows() -> None:
    factory = datasets.get("game-seeds")
    train, test = factory("train", size=200), factory("test", size=200)
    assert factory("train", size=200) == train
    assert not {r["seed"] for r in train} & {r["seed"] for r in test}
    assert len({r["seed"] for r in train}) > 190


@pytest.mark.parametrize("name", ["textarena", "gem"])
def test_the_rows_seed_sets_up_the_game_and_episodes_do_not_share_random_state(name: str) -> None:
    moves = ["[7] \\boxed{7}", "[3] \\boxed{3}", "[9] \\boxed{9}", "[5] \\boxed{5}"]

    async def episode(seed: int) -> list[object]:
        env = make_env(name)
        trace: list[object] = [(await env.areset(options={"seed": seed}))[0]]
        for move in moves:
            out = await env.astep(move)
            trace.append(out[:4])
            if out[2] or out[3]:
                break
        return trace

    async def many() -> list[list[object]]:
        return await asyncio.gather(*(episode(seed % 4) for seed in range(16)))

    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    traces = asyncio.run(many())
    assert [random.random() for _ in range(3)] == expected  # the process's random state is untouched
    for i, trace in enumerate(traces):
        assert trace == traces[i % 4]  # the same seed and moves: the same game, whatever ran beside it
    assert len({repr(t) for t in traces[:4]}) > 1
    assert max(len(t) for t in traces) > 2  # games of more than one move


def test_textarena_observations_are_the_new_messages_and_the_game_scores_the_end() -> None:
    env = make_env("textarena", game="GuessTheNumber-v0")
    first, _ = env.reset(options={"seed": 2})
    assert "Guess The Number" in first
    obs, reward, terminated, _, info = env.step("[1]")
    assert "Guess The Number" not in obs and "[1]" not in obs and ("higher" in obs or "lower" in obs)
    assert (reward, terminated, info["success"]) == (0.0, False, False)
    for n in range(2, 21):  # walk up until the game ends with its reward
        obs, reward, terminated, truncated, info = env.step(f"[{n}]")
        if terminated or truncated:
            break
    assert terminated and info["success"] == (reward >= 1.0) and isinstance(info.get("reason"), str)


def test_importing_gem_leaves_the_root_logger_alone() -> None:
    code = ("import logging; from areal_agents import make_env; make_env('gem'); root = logging.getLogger(); "
            "print(len(root.handlers), root.level)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["0", str(logging.WARNING)]


def test_the_docs_example_runs_verbatim(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "ecosystem.md").read_text(), flags=re.DOTALL)
    assert len(blocks) == 1
    (tmp_path / "example.py").write_text(blocks[0])
    out = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                         timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1.0"
