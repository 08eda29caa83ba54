"""``math-grading``: grade an answer to a sum; the task a tiny judge for ``math`` is trained on.

A judge for ``math`` is asked :data:`RUBRIC` (the sum, then the answer being graded) and replies
the way :func:`grading_reply` writes it: the sum worked out first, then the verdict
(``"82. Verdict: yes"``). :data:`MATH_JUDGE` (the reward ``math-judge``) asks that question of the
run's judge model and reads the verdict after ``Verdict:``; :data:`MATH_GROUP_JUDGE` (the group
reward ``math-group-judge``, for ``rollout.group_reward``) asks about a whole group at once
(:data:`GROUP_RUBRIC`) and reads its yes or no to each answer after ``Right:``.

Making the judge is making a tiny model: ``areal-agents sft --env math-grading`` trains one on
:func:`math_grading_dataset` (its recipe says how long), and ``areal-agents eval --env math-grading
actor.path=JUDGE`` measures its grading accuracy on held-out pairs (sums of the ``test`` split:
the verdict alone is scored, :func:`verdict_reward`).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from areal_agents.data import arithmetic_dataset
from areal_agents.rewards import GroupJudge, Judge, JudgeError, RewardModel, parse_group_scores
from envs.math import MathEnv

__all__ = ["GROUP_RUBRIC", "MATH_GROUP_JUDGE", "MATH_JUDGE", "MATH_REWARD_MODEL", "RUBRIC", "MathGradingEnv", "grading_reply", "math_grading_dataset",
           "math_preference_dataset", "verdict_reward", "wrong_answer"]

RUBRIC = "Check: {prompt}{completion}"
"""The question a ``math`` judge is asked: the row's prompt (``"37+45="``) and the completion graded."""

MATH_JUDGE = Judge(RUBRIC, scale="yes/no", after="Verdict:", max_tokens=12)
"""The reward ``math-judge``: 1.0 when the run's judge model (``judge.model_path``) says yes."""

GROUP_RUBRIC = "Check: {prompt}{completions}"
"""The question a group judge for ``math`` is asked: the row's prompt, then the group's answers
labelled (``"Check: 37+45= a) 82 b) 81 c) 79"``): the sum where the one-answer rubric has it, so a
judge fine-tuned from the one-answer judge works it out as before (asked last, among the answers,
a tiny judge got the sum right in 0.68 of 200 groups of up to 4; asked first, 0.92)."""

MATH_GROUP_JUDGE = GroupJudge(GROUP_RUBRIC, scale="verdicts", after="Right:", item=" {label}) {completion}",
                              separator="", distinct=True, max_tokens=160)
"""The group reward ``math-group-judge``: one call for a group's answers, the judge's yes (1.0) or no
(0.0) to each, after quoting it (``"82. Right: a 82 yes b 81 no c 79 no"``): quoting each answer
beside its label is what lets a tiny judge compare it with the sum (without the quote, a tiny
judge's verdicts on 8 answers were barely better than saying no to all)."""


MATH_REWARD_MODEL = RewardModel(scale="sigmoid")
"""The reward ``math-reward-model``: the run's reward model (``judge.model_path``, e.g. one trained by
``areal-agents rm --env math data.name=math-preference``) scores the sum and the reply, in (0, 1)."""


def grading_reply(answer: str, candidate: str) -> str:
    """What the judge is taught to reply: the right answer, then whether ``candidate`` is it."""
    return f"{answer}. Verdict: {'yes' if candidate.strip() == answer else 'no'}"


_KINDS = (0, 0, 0, 1, 1, 2, 2, 3, 4, 5)  # mostly near misses: a judge that copies the answer it grades fails them


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A wrong answer of the kinds a model learning sums writes, near misses most often: off by a
    little (3 in 10), a carry missed (2 in 10), a digit changed (2 in 10), a digit dropped or
    doubled, the digits swapped."""
    value = int(answer)
    digits = list(answer)
    for _ in range(20):
        kind = rng.choice(_KINDS)
        if kind == 0:
            out = str(value + rng.choice([-3, -2, -1, 1, 2, 3]))
        elif kind == 1:
            out = str(value + rng.choice([-10, 10, -100, 100]))
        elif kind == 2:
            i = rng.randrange(len(digits))
            out = "".join(digits[:i] + [str(rng.randrange(10))] + digits[i + 1:])
        elif kind == 3:
            out = answer[:-1] or "0"
        elif kind == 4:
            i = rng.randrange(len(digits))
            out = "".join(digits[:i + 1] + digits[i:])
        else:
            out = answer[::-1]
        if out != answer and not out.startswith("-"):
            return out
    return str(value + 1)


def math_grading_dataset(split: str = "train", *, size: int | None = None, seed: int = 0,
                         right_fraction: float = 0.4, candidates: int = 1, **arithmetic: Any) -> list[dict[str, Any]]:
    """Grading pairs over the ``arithmetic`` sums of ``split`` (its keywords pass through): the
    candidate is the right answer with probability ``right_fraction``, else :func:`wrong_answer`.
    A group (``candidates`` > 1) is drawn as a policy's group looks: the right answer in a share of
    it drawn uniformly, the rest from one to three wrong answers, so that repeats are common and
    the most common answer is often wrong (a judge that goes with the majority fails them).
    Rows: ``{"prompt": "Check: 37+45=82", "answer": "82. Verdict: yes", "verdict": "yes",
    "question": "37+45=", "candidate": "82"}``. With ``candidates`` > 1, a group to grade at once,
    as :data:`MATH_GROUP_JUDGE` asks: ``{"prompt": "Check: 37+45= a) 82 b) 81", "answer":
    "82. Right: a 82 yes b 81 no", "verdict": "a 82 yes b 81 no", "candidates": ["82", "81"], ...}``."""
    if not 0.0 <= right_fraction <= 1.0:
        raise ValueError(f"math_grading_dataset: right_fraction must be in [0, 1] (got {right_fraction})")
    if not 1 <= candidates <= 26:
        raise ValueError(f"math_grading_dataset: candidates must be in [1, 26] (got {candidates})")
    rng = random.Random(f"math-grading:{split}:{seed}")
    rows = []
    for row in arithmetic_dataset(split, size=size, seed=seed, **arithmetic):
        answer = row["answer"]
        if candidates == 1:
            graded = [answer if rng.random() < right_fraction else wrong_answer(answer, rng)]
        else:  # as a policy's group, each answer once (the judge sees distinct answers): right or not, 1 to n
            count = rng.randint(1, candidates)
            graded = ([answer] if rng.random() < 0.5 else []) + [wrong_answer(answer, rng) for _ in range(count)]
            graded = list(dict.fromkeys(graded))[:count]
            rng.shuffle(graded)
        if candidates == 1:
            reply = grading_reply(answer, graded[0])
            rows.append({"prompt": RUBRIC.format(prompt=row["prompt"], completion=graded[0]), "answer": reply,
                         "verdict": reply.rsplit(" ", 1)[1], "question": row["prompt"], "candidate": graded[0]})
            continue
        verdicts = " ".join(f"{chr(ord('a') + i)} {c} {'yes' if c == answer else 'no'}" for i, c in enumerate(graded))
        rows.append({"prompt": MATH_GROUP_JUDGE.messages(graded, {"prompt": row["prompt"]})[-1]["content"],
                     "answer": f"{answer}. Right: {verdicts}", "verdict": verdicts, "question": row["prompt"],
                     "candidates": graded})
    return rows


def math_preference_dataset(split: str = "train", *, size: int | None = None, seed: int = 0,
                            **arithmetic: Any) -> list[dict[str, Any]]:
    """Preference pairs over the ``arithmetic`` sums of ``split`` (its keywords pass through), for
    a reward model of ``math`` (``areal-agents rm --env math data.name=math-preference``): the
    right answer is chosen over a :func:`wrong_answer` (near misses most often).
    Rows: ``{"prompt": "37+45=", "chosen": "82", "rejected": "81", "answer": "82"}``."""
    rng = random.Random(f"math-preference:{split}:{seed}")
    return [{"prompt": row["prompt"], "chosen": row["answer"], "rejected": wrong_answer(row["answer"], rng),
             "answer": row["answer"]} for row in arithmetic_dataset(split, size=size, seed=seed, **arithmetic)]


def verdict_reward(completion: str, verdict: str | None = None, **row: Any) -> float:
    """1.0 if the verdict ``completion`` gives (after ``Verdict:``) is ``verdict``, else 0.0:
    a judge's grading accuracy, whatever sum it wrote first."""
    if verdict is None:
        raise ValueError("verdict_reward needs the row field 'verdict'")
    graded = row.get("candidates")
    try:
        if isinstance(graded, list):  # a group: the picks must be exactly the right answers
            return 1.0 if MATH_GROUP_JUDGE.scores(completion, len(graded)) == \
                parse_group_scores(verdict, "verdicts", len(graded)) else 0.0
        said = MATH_JUDGE.score(completion)
    except JudgeError:
        return 0.0
    return 1.0 if said == (1.0 if verdict == "yes" else 0.0) else 0.0


class MathGradingEnv(MathEnv):
    """Single turn: the observation is a grading question (``row["prompt"]``); the reply is scored
    by its verdict alone (:func:`verdict_reward`); its reference is the taught reply. A run's
    settings (how long the judge's SFT is): ``envs/recipes/math-grading.yaml``. Replies get up to 96
    tokens (``default_config``): a group's verdicts, each answer quoted, run past the default 32."""

    default_config: ClassVar[dict[str, Any]] = {"sampling": {"max_new_tokens": 96}}
    default_dataset = "math-grading"

    def __init__(self, reward: str = "math-grading-verdict") -> None:
        super().__init__(reward=reward)
