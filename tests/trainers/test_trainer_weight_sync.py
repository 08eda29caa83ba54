"""Weight sync: trained weights reach a real embedded server; NCCL request building."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from trainer_helpers import make_cfg, make_trajs, nll_loss_fn

from areal_agents.config import ExperimentConfig
from areal_agents.inference import control
from areal_agents.inference.launcher import ServerGroup, launch_servers
from areal_agents.inference.tiny_model import build_tiny_model
from trainers.engine import TrainEngine
from trainers.weight_sync import DiskWeightSync, NcclWeightSync

PROMPT = [5, 9, 12, 40, 33]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [f"{a}+{b}={a + b}" for a in range(40) for b in range(10)]
    return build_tiny_model(texts, tmp_path_factory.mktemp("m") / "tiny", hidden_size=32, num_layers=2,
                            intermediate_size=64)


@pytest.fixture(scope="module")
def servers(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    cfg = ExperimentConfig()
    with launch_servers(cfg, model_dir, 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group


def _generate(addr: str) -> tuple[list[int], list[float], str]:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
            "return_logprob": True}
    res = httpx.post(f"http://{addr}/generate", json=body, timeout=60).json()
    logps = [lp for lp, _, _ in res["meta_info"]["output_token_logprobs"]]
    return res["output_ids"], logps, res["meta_info"]["weight_version"]


def test_disk_sync_puts_trained_weights_on_the_server(model_dir: Path, servers: ServerGroup, tmp_path: Path) -> None:
    addr = servers[0].address
    engine = TrainEngine(make_cfg(lr=5e-2), model_dir)
    sync = DiskWeightSync([addr], tmp_path / "weights", keep=2)
    before_ids, before_lp, _ = _generate(addr)
    trajs = make_trajs(8, seed=2)
    for version in (1, 2, 3):
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, version)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v000002", "v000003"]
    assert control.model_info(addr)["weight_version"] == "3"
    ids, logps, version = _generate(addr)
    assert version == "3"
    # The server's logprobs for its own greedy output equal the trainer's at temperature 1.
    want = engine.compute_logprobs({"input_ids": torch.tensor([PROMPT + ids]),
                                    "attention_mask": torch.ones(1, len(PROMPT) + len(ids), dtype=torch.long),
                                    "loss_mask": torch.tensor([[False] * len(PROMPT) + [True] * len(ids)])},
                                   temperature=1.0)[0, len(PROMPT):]
    torch.testing.assert_close(torch.tensor(logps), want, atol=1e-4, rtol=1e-4)
    assert (ids, logps) != (before_ids, before_lp)


def test_nccl_requests(model_dir: Path) -> None:
    sync = NcclWeightSync(["h1:30000", "h2:30000"], master_address="10.0.0.1", master_port=29555, server_world=2)
    assert sync.world_size == 5
    p = sync.init_group_payloads()
    assert [x["rank_offset"] for x in p] == [1, 3]
    assert all(x["world_size"] == 5 and x["master_address"] == "10.0.0.1" and x["master_port"] == 29555
               and x["backend"] == "nccl" and x["group_name"] == sync.group_name for x in p)
    state = {"a.weight": torch.zeros(3, 4, dtype=torch.bfloat16), "b.bias": torch.zeros(7)}
    body = sync.update_payload(state, 12)
    assert body["names"] == ["a.weight", "b.bias"]
    assert body["dtypes"] == ["bfloat16", "float32"]
    assert body["shapes"] == [[3, 4], [7]]
    assert body["weight_version"] == "12" and body["group_name"] == sync.group_name
