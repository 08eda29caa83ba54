"""A real run (embedded server, rollout in its own process, the tiny model) records what it
trained: each step file's rows hold the input ids, loss mask, behaviour logprobs, versions and
advantages of the batch rows the loss read, in the batch's order, and the failed episodes the
rollout dropped carry their status and the exception's line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.config.loader import load_config
from areal_agents.env import TurnLimitedEnv
from areal_agents.record import load, summary
from areal_agents.registry import register_dataset, register_env
from trainers import loop
from trainers.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

STEPS, BATCH, GROUP = 2, 2, 2
ROWS = [{"prompt": "What is 3 + 4?", "answer": "7"}, {"prompt": "What is 5 + 6?", "answer": "11"},
        {"prompt": "What is 1 + 1?", "answer": "fail"}, {"prompt": "What is 2 + 2?", "answer": "fail"}]


@register_dataset("record-test-rows")
def record_test_rows(split: str) -> list[dict[str, Any]]:
    return [dict(r) for r in ROWS]


@register_env("record-test-env")
class HalfBrokenEnv(TurnLimitedEnv):
    """A one-turn env registered only by this module whose rows answered ``fail`` raise in ``step``:
    their groups are dropped (``env_error``), the others trained; the reward is a hash of the reply,
    so that samples of one prompt differ and their advantages are not all 0."""

    default_dataset = "record-test-rows"
    required_fields = ("prompt", "answer")

    def __init__(self) -> None:
        super().__init__(max_turns=1)

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        if row["answer"] == "fail":
            raise ValueError("planted env failure")
        return "", sum(map(ord, action)) % 7 / 7, True, {}  # rewards that differ within a group: advantages


def test_the_record_holds_what_the_loss_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [f"What is {a} + {b}? {a + b}" for a in range(10) for b in range(10)]
    model = build_tiny_model(texts, tmp_path / "model")
    cfg = load_config(None, [
        "env.name=record-test-env", f"actor.path={model}", f"output_dir={tmp_path / 'runs'}",
        "experiment_name=record", f"trainer.total_steps={STEPS}", f"rollout.batch_size={BATCH}",
        f"rollout.group_size={GROUP}", "sampling.max_new_tokens=4", "eval.n=2", "eval.every=0",
        "trainer.save_every=0", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
        "logging.episodes=all", "rollout.group_filter=none"])
    seen: list[dict[str, torch.Tensor]] = []
    train_step = loop.train_step

    def watched_train_step(engine: Any, spec: Any, cfg: Any, trajs: Any, on_trained: Any = None) -> dict[str, float]:
        """The real step; the batch its loss read is kept for the comparison, then handed on as ever."""
        def both(batch: dict[str, torch.Tensor]) -> None:
            seen.append({k: batch[k].detach().cpu().clone() for k in
                         ("input_ids", "loss_mask", "logprobs", "versions", "advantages", "seq_lens")})
            if on_trained is not None:
                on_trained(batch)

        return train_step(engine, spec, cfg, trajs, both)

    monkeypatch.setattr(loop, "train_step", watched_train_step)
    summary_out = loop.run(cfg)
    assert summary_out["steps"] == STEPS and len(seen) == STEPS

    run_dir = Path(cfg.run_dir)
    assert sorted(p.name for p in (run_dir / "episodes").iterdir()) == [f"step-{s:06d}.parquet"
                                                                        for s in range(1, STEPS + 1)]
    table = load(run_dir)
    rows = table.to_pylist()
    for step, batch in enumerate(seen, start=1):
        trained = [r for r in rows if r["step"] == step and r["status"] == "ok"]
        assert len(trained) == BATCH * GROUP == batch["input_ids"].shape[0]
        for i, row in enumerate(trained):
            n = int(batch["seq_lens"][i])
            mask = batch["loss_mask"][i, :n]
            assert row["input_ids"] == batch["input_ids"][i, :n].tolist()
            assert row["loss_mask"] == mask.long().tolist() and row["n_trained"] == int(mask.sum()) > 0
            assert row["advantages"] == torch.where(mask, batch["advantages"][i, :n], 0.0).float().tolist()
            assert row["logprobs"] == batch["logprobs"][i, :n].tolist()
            assert [v for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m] == \
                batch["versions"][i, :n][mask].tolist()
            assert row["staleness"] == step - 1 - row["version_min"] >= 0  # trained weights: version step - 1
            assert row["env"] == "record-test-env" and row["group_index"] == int(row["episode_id"].rsplit("-", 1)[1])
            assert "".join(row["token_text"]) == row["text"] and row["prompt"]
        assert len({r["group_id"] for r in trained}) == BATCH
        assert batch["advantages"].abs().sum() > 0  # the comparison is not one of zeros
    failed = [r for r in rows if r["status"] != "ok"]
    assert failed, "the half-broken env's groups are recorded"
    for row in failed:
        assert row["status"] == "env_error" and "ValueError: planted env failure" in row["failure"], row["failure"]
        assert row["failure"].count("\n") == 0 and set(row["advantages"]) <= {0.0}
        assert row["loss_mask"] and row["n_trained"] == sum(row["loss_mask"]) and row["step"] in range(1, STEPS + 1)
        assert json.loads(row["info"])["error"]
    assert {r["episode_id"] for r in rows} == set(summary(run_dir)["episode_id"].to_pylist())
    assert len({r["episode_id"] for r in rows}) == len(rows)  # unique in the run
    run_the_docs_example(run_dir, rows[0])


def run_the_docs_example(run_dir: Path, first: dict[str, Any]) -> None:
    """docs/record.md's notebook example runs as written on this run (its run dir, and one episode
    and group of it, in place of the page's)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "record.md").read_text()
    block = page.split("## Read it from Python\n\n```python\n", 1)[1].split("```", 1)[0]
    code = block.replace("runs/math/trial", str(run_dir)).replace('"rollout-12-3"', repr(first["episode_id"])) \
        .replace('4, "rollout-12"', f'{first["step"]}, {first["group_id"]!r}')
    assert code != block and "rollout-12" not in code
    names: dict[str, Any] = {}
    exec(compile(code, "docs/record.md", "exec"), names)  # noqa: S102 - the page's own example
    assert len(names["df"]) == names["table"].num_rows and list(names["failed"].columns) == \
        ["step", "episode_id", "failure"]
