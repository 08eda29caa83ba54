"""``math-grading``: the pairs a tiny judge for ``math`` learns from, and the verdict that scores it.

The rows must teach the rubric the ``math-judge`` reward asks (rendered the same way), be right
and wrong about as often as asked, never call a wrong answer right, and keep the ``test`` split's
sums out of training; the verdict reward reads only the verdict."""

from __future__ import annotations

import random

import pytest

from areal_agents.data import arithmetic_dataset
from areal_agents.registry import datasets, envs, rewards
from envs.math_grading import MATH_JUDGE, RUBRIC, math_grading_dataset, verdict_reward, wrong_answer


def test_the_names_are_registered() -> None:
    assert rewards.get("math-judge") is MATH_JUDGE
    assert datasets.get("math-grading") is math_grading_dataset
    assert envs.get("math-grading").default_dataset == "math-grading"


@pytest.mark.parametrize("split", ["train", "test"])
def test_rows_ask_what_the_judge_is_asked_and_teach_the_right_verdict(split: str) -> None:
    rows = math_grading_dataset(split, size=2000, seed=3)
    sums = {r["prompt"]: r["answer"] for r in arithmetic_dataset(split)}
    right = 0
    for row in rows:
        truth = sums[row["question"]]  # a sum of this split
        assert MATH_JUDGE.messages(row["candidate"], {"prompt": row["question"]})[-1]["content"] == row["prompt"]
        assert row["prompt"] == RUBRIC.format(prompt=row["question"], completion=row["candidate"])
        assert row["answer"] == f"{truth}. Verdict: {row['verdict']}"
        assert (row["verdict"] == "yes") == (row["candidate"] == truth)
        right += row["verdict"] == "yes"
    assert 0.35 < right / len(rows) < 0.45  # right 4 times in 10: copying the graded answer does not pay
    assert math_grading_dataset(split, size=50, seed=3) == rows[:50]  # seeded


def test_wrong_answers_are_never_right_and_of_every_kind() -> None:
    rng = random.Random(0)
    seen = set()
    for a in range(10, 200, 7):
        for _ in range(30):
            out = wrong_answer(str(a), rng)
            assert out != str(a) and out.isdigit()
            seen.add(len(out) - len(str(a)))
    assert seen >= {-1, 0, 1}  # shorter, same length and longer answers are all among them


@pytest.mark.parametrize(("reply", "verdict", "score"), [
    ("82. Verdict: yes", "yes", 1.0), ("81. Verdict: yes", "yes", 1.0), ("82. Verdict: yes", "no", 0.0),
    ("82. Verdict: no", "no", 1.0), ("82", "no", 0.0), ("Verdict: maybe", "yes", 0.0),
])
def test_the_verdict_alone_is_scored(reply: str, verdict: str, score: float) -> None:
    assert verdict_reward(reply, verdict=verdict) == score


def test_group_rows_teach_a_verdict_for_each_answer_as_the_group_judge_asks() -> None:
    from envs.math_grading import MATH_GROUP_JUDGE

    sums = {r["prompt"]: r["answer"] for r in arithmetic_dataset("test")}
    with_right, sizes = 0, set()
    for row in math_grading_dataset("test", size=200, seed=1, candidates=8):
        truth = sums[row["question"]]
        assert all(f"{label} {c} " in row["answer"] + " " for label, c in zip("abcdefgh", row["candidates"], strict=False))
        assert len(set(row["candidates"])) == len(row["candidates"])  # each answer once, as the judge is asked
        with_right += truth in row["candidates"]
        sizes.add(len(row["candidates"]))
        assert row["prompt"] == MATH_GROUP_JUDGE.messages(row["candidates"], {"prompt": row["question"]})[-1]["content"]
        assert MATH_GROUP_JUDGE.scores(row["answer"], len(row["candidates"])) == [float(c == truth) for c in row["candidates"]]
        assert verdict_reward(row["answer"], **{k: v for k, v in row.items() if k != "answer"}) == 1.0
        wrong = row["answer"].replace(" yes", " y_s").replace(" no", " yes").replace(" y_s", " no")
        assert verdict_reward(wrong, **{k: v for k, v in row.items() if k != "answer"}) == 0.0
    assert 60 <= with_right <= 140 and sizes == set(range(1, 9))  # a judge must work the sum out to tell
