"""Reward models: a sequence-classification model served at ``/classify`` by the embedded server
(launched as a run launches it), scores that match the model's own forward pass however the
requests are batched, the :class:`RewardModel` reward (one reply or a whole group) in the reward
workers, every failure a ``JudgeError`` (never a silent 0); and preference training (Bradley-Terry)
that raises pairwise accuracy on held-out pairs."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from aiohttp import web

from areal_agents.config.loader import load_config
from areal_agents.inference.launcher import ServerGroup, launch_servers, sglang_command
from areal_agents.inference.scoring import is_reward_model
from areal_agents.rewards import JudgeError, RewardRunner, is_group_reward
from areal_agents.rewards.reward_model import RewardModel, check_model_scale
from trainers.reward_model import (
    PreferencePair,
    bradley_terry_loss,
    load_reward_model,
    pairwise_accuracy,
    preference_pairs,
    reward_head,
    train_reward_model,
)

TEXTS = ["What is 2 + 3? The answer is 5.", "Hi", "A longer text, so that the batch needs padding: 1 2 3 4 5 6 7 8 9."]


@pytest.fixture(scope="module")
def rm_dir(tiny_model: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    lm = tiny_model([f"What is {a} + {b}? The answer is {a + b}." for a in range(30) for b in range(30)], seed=0)
    return reward_head(lm, tmp_path_factory.mktemp("rm") / "rm", seed=3)


@pytest.fixture(scope="module")
def server(rm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    cfg = load_config(None, ["env.name=math"])
    cfg.inference.setup_timeout = 120.0
    with launch_servers(cfg, str(rm_dir), 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group


def root(server: ServerGroup) -> str:
    return f"http://{server.addresses[0].removeprefix('http://')}"


def direct_scores(rm_dir: Path, texts: list[str]) -> list[float]:
    """Each text scored alone by the model's own forward pass (no padding)."""
    model, tok = load_reward_model(rm_dir)
    with torch.no_grad():
        return [float(model(input_ids=torch.tensor([tok(t, add_special_tokens=False)["input_ids"]])).logits[0, 0])
                for t in texts]


def test_a_reward_model_dir_is_told_from_a_causal_lm(rm_dir: Path, tiny_model: Callable[..., Path]) -> None:
    assert is_reward_model(rm_dir) and not is_reward_model(tiny_model(["a b c"], seed=0))
    cfg = load_config(None, ["env.name=math"])
    assert "--is-embedding" in sglang_command(cfg, rm_dir, 30000)  # SGLang serves it for /classify too


def test_classify_scores_as_the_model_does_alone_however_batched(server: ServerGroup, rm_dir: Path) -> None:
    want = direct_scores(rm_dir, TEXTS)
    assert len(set(want)) == 3  # a fresh head still tells the texts apart
    url = root(server)
    many = httpx.post(f"{url}/classify", json={"text": TEXTS}, timeout=60).json()
    one = httpx.post(f"{url}/classify", json={"text": TEXTS[1]}, timeout=60).json()
    assert [m["embedding"][0] for m in many] == pytest.approx(want, abs=1e-4)
    assert one["embedding"][0] == pytest.approx(want[1], abs=1e-4) and one["meta_info"]["prompt_tokens"] > 0

    async def concurrent() -> list[float]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            got = await asyncio.gather(*(c.post("/classify", json={"text": TEXTS[i % 3]}) for i in range(12)))
        return [r.json()["embedding"][0] for r in got]

    assert asyncio.run(concurrent()) == pytest.approx([want[i % 3] for i in range(12)], abs=1e-4)
    info = httpx.get(f"{url}/get_server_info", timeout=10).json()
    assert info["scoring"]["sequences"] >= 16 and info["scoring"]["max_batch"] >= 3  # the list was one batch
    model_info = httpx.get(f"{url}/get_model_info", timeout=10).json()
    assert model_info["is_generation"] is False and model_info["num_labels"] == 1


@pytest.mark.parametrize(("body", "message"), [
    ({}, "needs 'text'"), ({"text": ""}, "needs 'text'"), ({"text": [1, 2]}, "needs 'text'"),
    ({"input_ids": [[1, "x"]]}, "input_ids must be"), ({"input_ids": [1] * 5000}, "longer than the model's context"),
])
def test_a_bad_classify_request_gets_400_and_the_server_keeps_serving(server: ServerGroup, body: dict[str, object],
                                                                      message: str) -> None:
    url = root(server)
    bad = httpx.post(f"{url}/classify", json=body, timeout=30)
    assert bad.status_code == 400 and message in bad.json()["error"]["message"]
    assert httpx.post(f"{url}/classify", json={"input_ids": [1, 2, 3]}, timeout=30).status_code == 200


def test_the_reward_model_reward_scores_the_conversation_in_the_reward_workers(server: ServerGroup, rm_dir: Path) -> None:
    url = f"{root(server)}/v1"  # the OpenAI base URL a run exports; the root works as well
    _, tok = load_reward_model(rm_dir)
    conv = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    (want,) = direct_scores(rm_dir, [tok.apply_chat_template(conv, tokenize=False)])
    logit, sigmoid = RewardModel(base_url=url), RewardModel(base_url=root(server), scale="sigmoid")
    assert logit("5", prompt="What is 2 + 3?") == pytest.approx(want, abs=1e-4)
    assert sigmoid("5", prompt="What is 2 + 3?") == pytest.approx(1 / (1 + math.exp(-want)), abs=1e-4)
    group = RewardModel(base_url=url, group=True)
    assert is_group_reward(group) and not is_group_reward(logit)
    scores = group(["5", "6", "The answer is 5."], prompt="What is 2 + 3?")
    assert len(scores) == 3 and scores[0] == pytest.approx(want, abs=1e-4) and len(set(scores)) == 3
    with RewardRunner(timeout=60, max_workers=1) as runner:  # in a worker process, as a run calls it
        result = runner.compute(logit, "5", {"prompt": "What is 2 + 3?"})
    assert result.ok and result.value == pytest.approx(want, abs=1e-4) and result.judge_calls == 1


def test_reward_model_failures_are_judge_errors(rm_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown reward model scale 'yes/no'"):
        RewardModel(scale="yes/no")
    assert check_model_scale("softmax:2") == "softmax:2"
    assert RewardModel(base_url="http://127.0.0.1:1", scale="softmax:1").value([0.0, math.log(3.0)]) == pytest.approx(0.75)
    with pytest.raises(JudgeError, match="did not answer after 1 tries"):
        RewardModel(base_url="http://127.0.0.1:9", retries=0, tokenizer=str(rm_dir))("5", prompt="2+3")
    with pytest.raises(JudgeError, match="uses {question}, which the row does not have"):
        RewardModel("{question}", base_url="http://127.0.0.1:9")("5", prompt="2+3")

    # fault injection: a server that answers /classify with something else than scores
    async def wrong(request: web.Request) -> web.Response:
        return web.json_response([{"embedding": "high"}])

    app = web.Application()
    app.router.add_post("/classify", wrong)
    started, stop = threading.Event(), threading.Event()
    port: list[int] = []

    def serve() -> None:
        async def main() -> None:
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port.append(runner.addresses[0][1])
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await runner.cleanup()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(30)
    try:
        with pytest.raises(JudgeError, match="not one 'embedding'"):
            RewardModel(base_url=f"http://127.0.0.1:{port[0]}", tokenizer=str(rm_dir))("5", prompt="2+3")
    finally:
        stop.set()
        thread.join(10)


def test_preference_rows_are_checked() -> None:
    (pair,) = preference_pairs([{"prompt": "2+3=", "chosen": "5", "rejected": "6"}])
    assert pair.messages == ({"role": "user", "content": "2+3="},) and (pair.chosen, pair.rejected) == ("5", "6")
    with pytest.raises(ValueError, match=r"preference row 0 needs 'prompt'.*it has \['answer', 'prompt'\]"):
        preference_pairs([{"prompt": "2+3=", "answer": "5"}])
    assert float(bradley_terry_loss(torch.tensor([2.0]), torch.tensor([2.0]))) == pytest.approx(math.log(2.0))


def test_bradley_terry_training_raises_held_out_pairwise_accuracy(rm_dir: Path, tmp_path: Path) -> None:
    # the preference: the reply that says the number asked for, over one that says another
    def pairs(seed: int, n: int) -> list[PreferencePair]:
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            asked = rng.randrange(10)
            other = rng.choice([x for x in range(10) if x != asked])
            out.append(PreferencePair(({"role": "user", "content": f"Say {asked}."},), f"{asked}", f"{other}"))
        return out

    held_out = pairs(1, 100)
    model, tok = load_reward_model(rm_dir)
    before = pairwise_accuracy(model, tok, held_out)
    report = train_reward_model(rm_dir, pairs(0, 400), tmp_path / "trained", steps=200, batch_size=16, lr=1e-3,
                                eval_pairs=held_out, eval_every=100, progress=False)
    after = report["evals"][-1]["accuracy"]
    assert [e["step"] for e in report["evals"]] == [100, 200]
    assert after >= before + 0.25 and after >= 0.8, (before, report["evals"])
    assert is_reward_model(tmp_path / "trained") and json.loads((tmp_path / "trained" / "config.json").read_text())
    trained, tok = load_reward_model(tmp_path / "trained")
    assert pairwise_accuracy(trained, tok, held_out) == pytest.approx(after)  # what was written is what was measured


def test_the_docs_reward_models_register_and_score(server: ServerGroup, tmp_path: Path) -> None:
    """The docs' reward models, registered from their file as written, score one reply and a whole
    group through the run's judge URL, in a reward worker as a run calls them."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "rewards.md").read_text()
    (found,) = [b.split("```", 1)[0] for b in text.split("```python\n")[1:] if b.startswith("# my_reward_models.py")]
    (tmp_path / "my_reward_models.py").write_text(found)
    code = ("import json\n"
            "from areal_agents.config.loader import load_config\n"
            "cfg = load_config(None, ['imports=[my_reward_models.py]', 'rollout.group_reward=preferred-group'])\n"
            "from areal_agents.rewards import RewardRunner\n"
            "with RewardRunner(timeout=60, max_workers=1) as r:\n"
            "    one = r.compute('preferred', '5', {'prompt': 'What is 2 + 3?'})\n"
            "    many = r.compute('preferred-group', ['5', '6', '7'], {'prompt': 'What is 2 + 3?'})\n"
            "print(json.dumps([one.value, one.judge_calls, many.values, many.judge_calls]))\n")
    env = {**os.environ, "AREAL_AGENTS_JUDGE_URL": f"{root(server)}/v1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    one, calls, many, group_calls = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0.0 < one < 1.0 and calls == 1 and group_calls == 1
    assert len(many) == 3 and many[0] == pytest.approx(one, abs=1e-6) and all(0.0 < v < 1.0 for v in many)
