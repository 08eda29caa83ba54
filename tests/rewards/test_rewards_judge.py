"""Judge rewards: the scales read replies or name them in the error; a judge asked through a real
endpoint (the embedded server's ``/v1``, serving a short math warm start that answers sums with
numbers, mostly wrong: ``math-numbers`` in tests/conftest.py) scores in the reward
workers, and every failure (an unreadable reply, an endpoint that is gone, a rubric field the row
lacks) is the call's ``reward_error``, never a silent 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal_agents.config.loader import load_config
from areal_agents.inference.launcher import ServerGroup, launch_servers
from areal_agents.rewards import (
    GroupJudge,
    Judge,
    JudgeError,
    RewardRunner,
    is_group_reward,
    parse_group_scores,
    parse_score,
)
from areal_agents.rewards.judge import check_scale
from envs.math import MathEnv


@pytest.mark.parametrize(("reply", "scale", "score"), [
    ("Yes.", "yes/no", 1.0), ("no, 2+2 is 4", "yes/no", 0.0), ("  YES", "yes/no", 1.0),
    ("7", "0-10", 0.7), ("Score: 3 of 4", "1-4", 2 / 3), ("-1", "-1-1", 0.0),
    ("B, mostly", "choice:A=1,B=0.5,C=0", 0.5), ("correct!", "choice:correct=1,incorrect=0", 1.0),
    ("incorrect", "choice:correct=1,incorrect=0", 0.0),
    ('verdict {"score": 0.25, "why": "x"}', "json:score", 0.25),
])
def test_scales_read_the_score(reply: str, scale: str, score: float) -> None:
    assert parse_score(reply, scale) == pytest.approx(score)


@pytest.mark.parametrize(("reply", "scale"), [
    ("maybe", "yes/no"), ("", "yes/no"), ("11", "0-10"), ("none", "0-10"), ("D", "choice:A=1,B=0"),
    ('{"score": "high"}', "json:score"), ("no json", "json:score"), ('{"other": 1}', "json:score"),
])
def test_a_reply_the_scale_cannot_read_is_named(reply: str, scale: str) -> None:
    with pytest.raises(JudgeError) as err:
        parse_score(reply, scale)
    assert repr(reply) in str(err.value)


@pytest.mark.parametrize(("reply", "score"), [
    ("82. Verdict: yes", 1.0), ("Verdict: no ... so, Verdict: yes", 1.0), ("yes, 81. Verdict: no", 0.0),
])
def test_a_verdict_after_the_reasoning_is_read_after_the_last_marker(reply: str, score: float) -> None:
    judge = Judge("{completion}", "http://127.0.0.1:1/v1", after="Verdict:")
    assert judge.score(reply) == score


@pytest.mark.parametrize("reply", ["82. yes", "Verdict maybe", "82. Verdict: perhaps"])
def test_a_reply_without_a_readable_verdict_is_named(reply: str) -> None:
    with pytest.raises(JudgeError) as err:
        Judge("{completion}", "http://127.0.0.1:1/v1", after="Verdict:").score(reply)
    assert repr(reply) in str(err.value) or repr(reply.rsplit("Verdict:", 1)[-1]) in str(err.value)


@pytest.mark.parametrize(("reply", "scale", "scores"), [
    ("b > a > c", "ranking", [2 / 3, 1.0, 1 / 3]), ("c, a", "ranking", [2 / 3, 0.0, 1.0]),
    ("a c", "picks", [1.0, 0.0, 1.0]), ("none", "picks", [0.0, 0.0, 0.0]), ("I pick: b", "picks", [0.0, 1.0, 0.0]),
    ("a yes b no c: yes", "verdicts", [1.0, 0.0, 1.0]), ("b) NO a) yes c no", "verdicts", [1.0, 0.0, 0.0]),
    ("7, 10 and 0", "scores:0-10", [0.7, 1.0, 0.0]), ('{"s": [1, 0.5, 0]}', "json:s", [1.0, 0.5, 0.0]),
    ('{"s": {"a": 0, "b": 1, "c": 0.25}}', "json:s", [0.0, 1.0, 0.25]),
])
def test_group_scales_read_one_score_per_reply(reply: str, scale: str, scores: list[float]) -> None:
    assert parse_group_scores(reply, scale, 3) == pytest.approx(scores)


@pytest.mark.parametrize(("reply", "scale"), [
    ("d > a", "ranking"), ("a > a > b", "ranking"), ("all good", "picks"), ("7 and 3", "scores:0-10"),
    ("7, 3, 11", "scores:0-10"), ('{"s": [1, 0]}', "json:s"), ("a yes b no", "verdicts"), ("a yes b no c no a no", "verdicts"),
])
def test_a_group_reply_that_cannot_be_read_is_named(reply: str, scale: str) -> None:
    with pytest.raises(JudgeError) as err:
        parse_group_scores(reply, scale, 3)
    assert repr(reply) in str(err.value)


def test_a_group_judge_labels_the_replies_in_its_rubric() -> None:
    judge = GroupJudge("Q: {prompt}\n{completions}\nBest first:", "http://127.0.0.1:1/v1")
    (message,) = judge.messages(["4", "five", "4.0"], {"prompt": "2+2?"})
    assert message == {"role": "user", "content": "Q: 2+2?\na) 4\nb) five\nc) 4.0\nBest first:"}
    assert is_group_reward(judge) and not is_group_reward(Judge("{completion}", "http://127.0.0.1:1/v1"))
    with pytest.raises(ValueError, match="unknown group judge scale"):
        GroupJudge("{completions}", "http://127.0.0.1:1/v1", scale="yes/no")


@pytest.mark.parametrize("scale", ["1..5", "choice:A", "json:", "stars", "choice:A=high"])
def test_unknown_scales_fail_when_the_judge_is_made(scale: str) -> None:
    with pytest.raises(ValueError):
        check_scale(scale)
    with pytest.raises(ValueError):
        Judge("{completion}", "http://127.0.0.1:1/v1", scale=scale)


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory: pytest.TempPathFactory, warm_caches: Any) -> Iterator[ServerGroup]:
    cache = warm_caches.get("math-numbers")
    model = next((cache / "warm").glob("math-*"))
    cfg = load_config(None, ["env.name=math"])
    cfg.inference.setup_timeout = 120.0
    with launch_servers(cfg, str(model), 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group


def base_url(group: ServerGroup) -> str:
    return "http://" + group.addresses[0].removeprefix("http://") + "/v1"


def test_a_judge_scores_in_the_reward_workers(judge_server: ServerGroup) -> None:
    # The math warm start "judges" a sum by answering it: its number (right or not), read on a 0-200 scale.
    judge = Judge("{prompt}", base_url(judge_server), scale="0-200", max_tokens=6)
    with RewardRunner(timeout=60, max_workers=2) as runner:
        results = [runner.compute(judge, "ignored", {"prompt": p}) for p in ("12+30=", "40+41=", "12+30=")]
        unreadable = runner.compute(Judge("{prompt}", base_url(judge_server), scale="yes/no", max_tokens=6),
                                    "ignored", {"prompt": "12+30="})
        missing = runner.compute(judge, "ignored", {"question": "12+30="})
        gone = runner.compute(Judge("{prompt}", "http://127.0.0.1:9/v1", retries=1, timeout=2), "x", {"prompt": "1"})
        counts = dict(runner.stats)
    assert all(r.ok for r in results), [r.error for r in results]
    assert results[0].value == results[2].value and 0.0 <= results[0].value <= 1.0
    assert {r.value for r in results} != {0.0}  # read from the model's replies, not defaulted
    assert unreadable.status == "reward_error" and "does not start with yes or no" in unreadable.error
    assert missing.status == "reward_error" and "{prompt}" in missing.error and "question" in missing.error
    assert gone.status == "reward_error" and "did not answer after 2 tries" in gone.error
    assert counts["reward_error"] == 3 and counts["ok"] == 3
    # every judge call is counted as one, answered or not, with its seconds; a Python reward is no judge call
    assert [r.judge_calls for r in (*results, unreadable, missing, gone)] == [1] * 6
    assert all(r.seconds > 0 for r in results) and gone.seconds >= 0.25  # gone: it waited between its tries
    with RewardRunner(timeout=60, max_workers=1) as runner:
        assert runner.compute(lambda_free_reward, "x", {}).judge_calls == 0


def test_a_judges_reply_is_kept_for_the_same_request(warm_caches: Any, tmp_path: Path) -> None:
    model = next((warm_caches.get("math-numbers") / "warm").glob("math-*"))
    cfg = load_config(None, ["env.name=math"])
    cfg.inference.setup_timeout = 120.0
    with launch_servers(cfg, str(model), 1, log_dir=tmp_path, env={"OMP_NUM_THREADS": "1"}) as group:
        judge = Judge("{prompt}", base_url(group), scale="0-200", max_tokens=6, retries=0, timeout=5)
        first = judge("ignored", prompt="33+21=")
    # the server is gone: the same request is answered from the cache, any other one fails
    assert judge("ignored", prompt="33+21=") == first
    with pytest.raises(JudgeError, match="did not answer"):
        judge("ignored", prompt="33+22=")


def test_an_env_scored_by_a_failing_judge_reports_a_reward_error(judge_server: ServerGroup) -> None:
    env = MathEnv(reward=Judge("{prompt} {completion}", base_url(judge_server), scale="yes/no", max_tokens=4))
    with RewardRunner(timeout=60, max_workers=1) as runner:
        env.reward_runner = runner
        env.reset(options={"prompt": "12+30=", "answer": "42"})
        _, reward, done, _, info = env.step("42")
    assert done and reward == 0.0 and info["reward_status"] == "reward_error"
    assert env.judge_calls == 1 and env.reward_seconds > 0  # what time/reward_s and perf/judge_calls_per_s sum
    assert "reward_s" not in info  # a step's info stays the same for the same action (Gymnasium's checker)
    assert "yes or no" in info["reward_error"]


def lambda_free_reward(completion: str, **row: Any) -> float:
    """A Python reward (module level: it is sent to a worker)."""
    return 0.5


def docs_block(start: str) -> str:
    """The python block of docs/rewards.md whose first line is ``start``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "rewards.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    (found,) = [b for b in blocks if b.startswith(start)]
    return found


def test_the_docs_judge_registers_and_fails_in_one_line(judge_server: ServerGroup, tmp_path: Path) -> None:
    (tmp_path / "my_judges.py").write_text(docs_block("# my_judges.py"))
    code = ("import json, sys\n"
            "from areal_agents.config.loader import load_config; load_config(None, ['imports=[my_judges.py]'])\n"
            "from areal_agents.rewards import RewardRunner\n"
            "with RewardRunner(timeout=60, max_workers=1) as r:\n"
            "    got = r.compute('helpful', 'Paris.', {'prompt': 'Capital of France?'})\n"
            "print(json.dumps([got.status, got.error]))\n")
    env = {k: v for k, v in os.environ.items() if k != "AREAL_AGENTS_JUDGE_URL"}
    unserved = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=180)
    status, error = json.loads(unserved.stdout.strip().splitlines()[-1])
    assert status == "reward_error" and "no judge endpoint: $AREAL_AGENTS_JUDGE_URL is unset" in error
    served = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                            env={**env, "AREAL_AGENTS_JUDGE_URL": base_url(judge_server)})
    status, error = json.loads(served.stdout.strip().splitlines()[-1])
    # the math warm start is no judge of capitals: its reply is quoted in the one-line error
    assert status == "reward_error" and "the judge's reply '" in error and "0-10" in error, error


def test_the_docs_group_judge_ranks_a_group_in_one_call(judge_server: ServerGroup, tmp_path: Path) -> None:
    """The docs' group judge, registered from its file as written, is a group reward; asked of a
    real endpoint (the math warm start, which cannot rank), its one call fails the whole group
    with the reply quoted, as a run would count it."""
    (tmp_path / "my_group_judges.py").write_text(docs_block("# my_group_judges.py"))
    code = ("import json\n"
            "from areal_agents.config.loader import load_config\n"
            "cfg = load_config(None, ['imports=[my_group_judges.py]', 'rollout.group_reward=best-first'])\n"
            "from areal_agents.registry import rewards\n"
            "from areal_agents.rewards import RewardRunner, is_group_reward\n"
            "judge = rewards.get('best-first')\n"
            "with RewardRunner(timeout=60, max_workers=1) as r:\n"
            "    got = r.compute('best-first', ['Paris.', 'Lyon.', 'I do not know.'], {'prompt': 'Capital of France?'})\n"
            "print(json.dumps([is_group_reward(judge), judge.messages(['x', 'y'], {'prompt': 'P'})[-1]['content'],\n"
            "                  got.status, got.error, got.judge_calls]))\n")
    env = {**os.environ, "AREAL_AGENTS_JUDGE_URL": base_url(judge_server)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    group, rubric, status, error, calls = json.loads(done.stdout.strip().splitlines()[-1])
    assert group and rubric.endswith("Request: P\na) x\nb) y") and calls == 1
    assert status == "reward_error" and "the judge's reply" in error and "names none of the replies" in error


def test_a_distinct_group_judge_asks_each_reply_once_and_scores_every_copy(judge_server: ServerGroup) -> None:
    # The math warm start answers the sum with one number: read as one score (0-200), it is a
    # group judge's answer for a group of one different reply, not for three copies of it.
    distinct = GroupJudge("{prompt}{completions}", base_url(judge_server), scale="scores:0-200", item="",
                          separator="", distinct=True, max_tokens=6)
    (only,) = distinct(["42"], prompt="12+30=")
    assert 0.0 <= only <= 1.0 and distinct(["42", "42", "42"], prompt="12+30=") == [only] * 3
    with pytest.raises(JudgeError, match="does not give 3 numbers"):
        GroupJudge("{prompt}{completions}", base_url(judge_server), scale="scores:0-200", item="", separator="",
                   max_tokens=6)(["42", "42", "42"], prompt="12+30=")
