"""The built-in rewards (``math``, ``exact-match``, ``format``), :func:`fast_path` and :func:`group_reward`.

A reward is ``fn(completion: str, **row) -> float`` registered with ``@register_reward("name")``;
it runs in a :class:`~areal_agents.rewards.runner.RewardRunner` worker unless its fast path decides it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from areal_agents.registry import rewards as reward_registry

__all__ = ["RewardFn", "exact_match_reward", "extract_answer", "fast_path", "format_reward", "group_reward",
           "is_group_reward", "math_reward", "resolve_reward"]

RewardFn = Callable[..., float]

_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _last_boxed(text: str) -> str | None:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 1
    for i in range(start + len(_BOXED), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len(_BOXED) : i]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of ``text``: last ``\\boxed{..}``, else after ``####``, else the last number."""
    if (boxed := _last_boxed(text)) is not None:
        return boxed.strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().replace(",", "") or None
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _gold(answer: Any) -> str:
    text = str(answer)
    if "####" in text or _BOXED in text:
        return extract_answer(text) or text
    return text.strip()


_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def fast_path(fast: Callable[..., float | None]) -> Callable[[RewardFn], RewardFn]:
    """Give a reward a fast path: ``fast(completion, **row)`` runs in the caller's process
    before any worker is asked, and returns the reward, or ``None`` to leave the call to a
    worker. For the cheap, bounded part of a reward (a string compare, never a parser that can
    hang): for a reward of microseconds, the round trip to a worker process costs far more."""

    def wrap(fn: RewardFn) -> RewardFn:
        fn.fast_path = fast  # type: ignore[attr-defined]
        return fn

    return wrap


def group_reward(fn: Callable[..., Sequence[float]]) -> Callable[..., Sequence[float]]:
    """Mark ``fn(completions: list[str], **row) -> list[float]`` as a group reward: it scores the
    finished episodes of one row together (their final replies, in order), one score each, e.g. a
    judge ranking them in one call (:class:`~areal_agents.rewards.judge.GroupJudge`). Register it
    like any reward and name it in ``rollout.group_reward``: its scores replace each episode's
    last-turn reward before the group's advantages are computed."""
    fn.group = True  # type: ignore[attr-defined]
    return fn


def is_group_reward(fn: Any) -> bool:
    """Whether ``fn`` scores whole groups (:func:`group_reward`, or a ``group`` attribute that is true)."""
    return getattr(fn, "group", False) is True


def _plain_math(completion: str, answer: Any = None, **row: Any) -> float | None:
    """:func:`math_reward` where no parser is needed (equal strings, or two plain numbers); else None."""
    if answer is None:
        return None
    if (pred := extract_answer(completion)) is None:
        return 0.0
    pred, gold = pred.replace(" ", ""), _gold(answer).replace(" ", "")
    if pred == gold:
        return 1.0
    if _PLAIN_NUMBER.fullmatch(pred) and _PLAIN_NUMBER.fullmatch(gold):  # most answers
        return 1.0 if float(pred) == float(gold) else 0.0
    return None


@fast_path(_plain_math)
def math_reward(completion: str, answer: Any = None, **row: Any) -> float:
    """1.0 if the final answer of ``completion`` equals ``answer`` mathematically, else 0.0.

    The answer is taken from the last ``\\boxed{}``, a GSM8K ``#### 42`` line, or the last
    plain number; equivalence is decided by ``math-verify`` (so ``0.5`` = ``1/2``).
    """
    if answer is None:
        raise ValueError("math_reward needs the row field 'answer'")
    if (plain := _plain_math(completion, answer)) is not None:
        return plain
    pred, gold = str(extract_answer(completion)).replace(" ", ""), _gold(answer).replace(" ", "")
    from math_verify import parse, verify

    # math-verify's own timeouts use SIGALRM, which works only in the main thread (as in a
    # RewardRunner worker); elsewhere the runner's timeout is the guard.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    if limit is None:
        logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = parse(f"${gold}$", parsing_timeout=limit)
    pred_parsed = parse(f"${pred}$", parsing_timeout=limit)
    if not gold_parsed or not pred_parsed:
        return 0.0
    return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=limit) else 0.0


def exact_match_reward(completion: str, answer: Any = None, **row: Any) -> float:
    """1.0 if ``completion`` equals ``answer`` after stripping whitespace, else 0.0."""
    if answer is None:
        raise ValueError("exact_match_reward needs the row field 'answer'")
    return 1.0 if completion.strip() == str(answer).strip() else 0.0


def format_reward(completion: str, pattern: str | None = None, **row: Any) -> float:
    """1.0 if ``completion`` matches ``pattern`` (a regex; default: contains ``\\boxed{...}``)."""
    regex = pattern if pattern is not None else r"\\boxed\{[^{}]+\}"
    return 1.0 if re.search(regex, completion, flags=re.DOTALL) else 0.0


def resolve_reward(reward: str | RewardFn) -> RewardFn:
    """A reward function from a registered name or the function itself."""
    return reward if callable(reward) else reward_registry.get(reward)
