"""Malformed model output through the real built-in envs (math, python-tool, guess-number),
ChatAgent and RolloutExecutor: every case ends ``ok`` with a defined reward and exact tokens.

The model is :class:`TokenLLM`, a fault-injection LLM that returns chosen token ids of the
real tiny byte-level BPE tokenizer (so invalid UTF-8 is real: lone byte tokens), as a
server would: empty completions, completions cut at ``max_new_tokens``, partial UTF-8
sequences, a 5,000-digit number, and broken tool calls (bad syntax, unclosed tag, broken
JSON, NUL bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_support import corpus, record

from areal_agents.agent import ChatAgent
from areal_agents.config import RolloutConfig
from areal_agents.gym.registration import make_env
from areal_agents.llm import LLM, Generation
from areal_agents.rewards import RewardRunner, default_runner
from areal_agents.rollout import RolloutExecutor, make_episode_fn


class TokenLLM(LLM):
    """Fault injection: replies with scripted token ids (turn by turn, the last one repeating)."""

    def __init__(self, tokenizer: Any, turns: list[list[int]]) -> None:
        super().__init__(tokenizer)
        self.turns = turns
        self.calls = 0
        self.replies: list[list[int]] = []  # the ids each call returned: what the trajectory must hold

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        ids = list(self.turns[min(self.calls, len(self.turns) - 1)])
        self.calls += 1
        limit = int(sampling.get("max_new_tokens", len(ids)))
        eos = self.tokenizer.eos_token_id
        finish = "stop" if ids and ids[-1] == eos else "length"
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        self.replies.append(ids)
        return Generation(output_ids=ids, logprobs=[-1.0] * len(ids), versions=[0] * len(ids), finish_reason=finish,
                          text=self.tokenizer.decode(ids, skip_special_tokens=True))


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Callable[..., Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model(corpus(), seed=0))


@pytest.fixture
def reward_runner() -> Iterator[RewardRunner]:
    with default_runner(RewardRunner(timeout=15.0, max_workers=2)) as runner:
        yield runner


def cases(tok: Any) -> list[tuple[str, str, list[list[int]], float]]:
    """``(name, env, turns, expected_reward)``."""
    eos = tok.eos_token_id
    bad = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i])]  # lone UTF-8 bytes

    def enc(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    answers = {"math": enc("42") + [eos], "python-tool": enc("42") + [eos], "guess-number": enc("42") + [eos]}
    common = {
        "empty_eos": [[eos]], "empty_zero_tokens": [[]], "never_stops": [enc("1 " * 200)],
        "invalid_utf8": [bad[:7]], "invalid_utf8_mixed": [enc("The answer is ") + bad[:3] + enc("4") + bad[5:6] + [eos]],
        "huge_number": [enc("9" * 5000) + [eos]], "special_tokens_only": [[eos, 0, 1, eos]],
    }  # fmt: skip
    tool = {
        "tool_bad_syntax": [enc("<python>print(1</python>") + [eos], enc("0") + [eos]],
        "tool_unclosed": [enc("<python>print(1") + [eos], enc("0") + [eos]],
        "tool_broken_json": [enc('<python>{"code": "print(1)", </python>') + [eos], enc("0") + [eos]],
        "tool_nul_bytes": [enc("<python>\x00print(2)\x00</python>") + [eos], enc("0") + [eos]],
        "tool_invalid_utf8": [enc("<python>print('") + bad[:3] + enc("')</python>") + [eos], enc("0") + [eos]],
        "tool_then_answer": [enc("<python>print(6*7)</python>") + [eos], answers["python-tool"]],
    }  # fmt: skip
    out = []
    for env in ("math", "python-tool", "guess-number"):
        for name, turns in common.items():
            out.append((name, env, turns, 0.0))
        out.append(("correct", env, [answers[env]], 1.0))
    out += [(name, "python-tool", turns, 1.0 if name == "tool_then_answer" else 0.0) for name, turns in tool.items()]
    return out


ROWS = {"math": {"prompt": "What is 6 * 7?", "answer": "42"},
        "python-tool": {"prompt": "What is 6 * 7?", "answer": "42"},
        "guess-number": {"target": 42, "low": 1, "high": 100}}  # fmt: skip


def test_malformed_output_gets_defined_rewards(tokenizer: Any, reward_runner: RewardRunner) -> None:
    all_cases = cases(tokenizer)
    agent = ChatAgent(max_turns=3, max_tokens=6000, sampling={"max_new_tokens": 6000})
    llms: dict[int, TokenLLM] = {}  # one episode per case

    def episode_fn_for(row: dict[str, Any], seed: int, episode_id: str) -> Any:
        case = all_cases[row["case"]]
        fn = make_episode_fn(lambda: make_env(case[1]), agent,
                             lambda rid: llms.setdefault(row["case"], TokenLLM(tokenizer, case[2])), episode_timeout=60)
        return fn({k: v for k, v in row.items() if k != "case"}, seed, episode_id)

    cfg = RolloutConfig(batch_size=1, group_size=1, max_concurrent_rollouts=8, episode_timeout=90,
                        failure_policy="zero")
    with RolloutExecutor(cfg, episode_fn=episode_fn_for, bounded_staleness=False) as ex:
        ids = [ex.submit({**ROWS[env], "case": i}) for i, (_, env, _, _) in enumerate(all_cases)]
        done = {g[0].group_id: g[0] for g in ex.wait(len(all_cases), timeout=300)}
        counts = ex.counts()
    problems = []
    for i, (gid, (name, env, _turns, want)) in enumerate(zip(ids, all_cases, strict=True)):
        traj = done[gid]
        if traj.status != "ok" or traj.reward != want:
            problems.append((env, name, traj.status, traj.reward, traj.info.get("error") or traj.info.get("reward_error")))
            continue
        traj.validate()
        replies = llms[i].replies  # exactly the returned ids, turn by turn, even invalid UTF-8 or empty
        assert len(traj.turn_spans) == len(replies) >= 1, (env, name, traj.turn_spans, len(replies))
        for k, (a, b) in enumerate(traj.turn_spans):
            assert traj.input_ids[a:b] == replies[k], (env, name, k)
    assert problems == []
    assert counts["accepted"] == len(all_cases) and counts["failed"] == 0
    record("malformed_model_output", episodes_submitted=counts["submitted"], accepted=counts["accepted"],
           failed=counts["failed"], cases=len(all_cases), envs=["math", "python-tool", "guess-number"])
