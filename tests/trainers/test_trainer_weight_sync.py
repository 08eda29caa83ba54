"""Weight sync: trained weights reach real embedded servers from disk and over a gloo broadcast;
dead servers are skipped and caught up; NCCL request building."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from trainer_helpers import make_cfg, make_trajs, nll_loss_fn

from areal_agents.config import ExperimentConfig
from areal_agents.inference import control
from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import ServerGroup, ServerHandle, embedded_command, free_port, launch_servers
from areal_agents.inference.weight_group import drop_weight_group, master_store, new_weight_group
from trainers.engine import TrainEngine
from trainers.tiny_model import build_tiny_model
from trainers.weight_sync import DiskWeightSync, DistributedWeightSync, WeightSync

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


def _assert_server_matches_trainer(addr: str, engine: TrainEngine, version: str) -> tuple[list[int], list[float]]:
    """The server's logprobs for its own greedy output equal the trainer's at temperature 1."""
    assert control.model_info(addr)["weight_version"] == version
    ids, logps, got = _generate(addr)
    assert got == version
    want = engine.compute_logprobs({"input_ids": torch.tensor([PROMPT + ids]),
                                    "attention_mask": torch.ones(1, len(PROMPT) + len(ids), dtype=torch.long),
                                    "loss_mask": torch.tensor([[False] * len(PROMPT) + [True] * len(ids)])},
                                   temperature=1.0)[0, len(PROMPT):]
    torch.testing.assert_close(torch.tensor(logps), want, atol=1e-4, rtol=1e-4)
    return ids, logps


@pytest.mark.parametrize("kind", ["disk", "gloo"])
def test_sync_puts_trained_weights_on_the_server(kind: str, model_dir: Path, servers: ServerGroup,
                                                 tmp_path: Path) -> None:
    addr = servers[0].address
    engine = TrainEngine(make_cfg(lr=5e-2), model_dir)
    disk = DiskWeightSync([addr], tmp_path / "weights", keep=2)
    sync: WeightSync = disk if kind == "disk" else DistributedWeightSync([addr], backend="gloo", timeout_s=60)
    before = _generate(addr)[:2]
    trajs = make_trajs(8, seed=2 if kind == "disk" else 5)  # the server is shared: each test its own weights
    for version in (1, 2, 3):
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, version)
    if kind == "disk":
        assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v000002", "v000003"]
    else:
        assert not (tmp_path / "weights").exists() and sync.last_error is None  # nothing went through disk
        assert sync.members == [addr]  # one group, made once, reused for every version
    assert _assert_server_matches_trainer(addr, engine, "3") != before
    sync.close()


@pytest.mark.parametrize("pause", [True, False])
def test_a_request_decoding_through_a_sync_is_not_resent(pause: bool, model_dir: Path, servers: ServerGroup,
                                                         tmp_path: Path) -> None:
    """Paused (``retract``) or not (the embedded server swaps at a token boundary on its own), a
    request decoding while the weights change replies once; its tokens carry the version that made them."""
    addr = servers[0].address
    engine = TrainEngine(make_cfg(lr=5e-2), model_dir)
    sync = DiskWeightSync([addr], tmp_path / "weights", pause=pause)
    start = int(control.model_info(addr)["weight_version"])
    engine.train_batch(make_trajs(8, seed=7), nll_loss_fn)

    def progressed(tokens: int) -> None:
        first = control.server_info(addr)["batching"]["generated_tokens"]
        deadline = time.monotonic() + 30
        while control.server_info(addr)["batching"]["generated_tokens"] - first < tokens:
            assert time.monotonic() < deadline, "the server made no progress"
            time.sleep(0.002)

    async def run() -> object:
        client = InferenceClient([addr], abort_wait=0.01)
        try:
            task = asyncio.ensure_future(client.generate(PROMPT, {"max_new_tokens": 900, "ignore_eos": True}))
            await asyncio.to_thread(progressed, 20)
            await asyncio.to_thread(sync.sync, engine, start + 1)
            return await task
        finally:
            await client.aclose()

    gen = asyncio.run(run())
    assert len(gen.output_ids) == 900 and gen.info["resumes"] == 0
    k = gen.versions.index(start + 1)
    assert 20 <= k < 900 and set(gen.versions[:k]) == {start} and set(gen.versions[k:]) == {start + 1}
    _assert_server_matches_trainer(addr, engine, str(start + 1))


def _restart(handle: ServerHandle, model_dir: Path) -> subprocess.Popen[bytes]:
    """A fresh server process on the dead one's port (with the untrained model)."""
    port = handle.address.rsplit(":", 1)[1]
    cmd = [*embedded_command(ExperimentConfig(), model_dir, int(port))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    control.wait_healthy(handle.address, timeout=60)
    return proc


@pytest.mark.parametrize("kind", ["disk", "gloo"])
def test_dead_server_is_skipped_then_caught_up(kind: str, model_dir: Path, tmp_path: Path) -> None:
    cfg = ExperimentConfig()
    engine = TrainEngine(make_cfg(lr=5e-2), model_dir)
    trajs = make_trajs(8, seed=3)
    with launch_servers(cfg, model_dir, 2, log_dir=tmp_path / "logs", env={"OMP_NUM_THREADS": "1"}) as group:
        addrs = group.addresses
        disk = DiskWeightSync(addrs, tmp_path / "weights")
        sync = disk if kind == "disk" else DistributedWeightSync(addrs, backend="gloo", timeout_s=60, fallback=disk)
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, 1)
        os.killpg(group[1].process.pid, signal.SIGKILL)
        group[1].process.wait(10)
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, 2)  # no exception: the live server gets version 2
        assert list(sync.down) == [addrs[1]] and "unreachable" in sync.events[-1]
        _assert_server_matches_trainer(addrs[0], engine, "2")
        restarted = _restart(group[1], model_dir)
        try:
            assert control.model_info(addrs[1])["weight_version"] == "0"
            engine.train_batch(trajs, nll_loss_fn)
            sync.sync(engine, 3)
            assert sync.down == {} and "is back" in sync.events[-1]
            for addr in addrs:  # the restarted server caught up with the newest version
                _assert_server_matches_trainer(addr, engine, "3")
            if kind == "gloo":
                assert sync.members == addrs and sync.last_error is None  # the group was made anew, with both
        finally:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait(10)
        sync.close()


class _KillsAfterPause(DistributedWeightSync):
    """Fault injection: SIGKILLs the server process ``victim`` (and waits until it is gone) once
    the sync's pause has found it up and the group with it is in place, right before the broadcast."""

    victim: subprocess.Popen[bytes] | None = None

    def update_payload(self, state: dict[str, torch.Tensor], version: int,
                       lora: tuple[str, dict[str, Any]] | None = None) -> Any:
        if self.victim is not None:
            assert self.members == self.addresses  # the group formed with both servers is reused
            os.killpg(self.victim.pid, signal.SIGKILL)
            self.victim.wait(60)
            self.victim = None
        return super().update_payload(state, version, lora)


@pytest.mark.timeout(240)  # the group's timeout is an hour: a sync that waited for it is ended here
def test_a_server_dying_after_the_pause_ends_the_broadcast_at_once(model_dir: Path, tmp_path: Path) -> None:
    """The surviving server, already waiting in the broadcast, fails as soon as the trainer
    tears the group down; the version goes through disk; the next sync forms the group anew."""
    engine = TrainEngine(make_cfg(lr=5e-2), model_dir)
    trajs = make_trajs(8, seed=4)
    with launch_servers(ExperimentConfig(), model_dir, 2, log_dir=tmp_path / "logs",
                        env={"OMP_NUM_THREADS": "1"}) as group:  # fmt: skip
        addrs = group.addresses
        sync = _KillsAfterPause(addrs, backend="gloo", timeout_s=3600,
                                fallback=DiskWeightSync(addrs, tmp_path / "weights"))
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, 1)
        assert sync.members == addrs and sync.last_error is None
        sync.victim = group[1].process
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, 2)
        assert sync.torn_down == 1 and sync.last_error is not None and "goes through disk" in sync.events[-1]
        assert (tmp_path / "weights" / "v000002").is_dir() and list(sync.down) == addrs[1:]
        _assert_server_matches_trainer(addrs[0], engine, "2")
        engine.train_batch(trajs, nll_loss_fn)
        sync.sync(engine, 3)  # the survivor left the broken group: it joins a new one, without the dead server
        assert sync.last_error is None and sync.members == addrs[:1] and sync.torn_down == 1
        assert not (tmp_path / "weights" / "v000003").exists()
        _assert_server_matches_trainer(addrs[0], engine, "3")
        sync.close()


@pytest.mark.timeout(150)  # the server's own default wait is 300 s: one that ignored timeout_s is ended here
def test_a_server_waits_for_a_broadcast_no_longer_than_the_groups_timeout(servers: ServerGroup) -> None:
    """A trainer that forms the group and announces a version but never broadcasts it (hung,
    not dead): the server gives up after the ``timeout_s`` the join carried, and says so."""
    addr = servers[0].address
    store = master_store("127.0.0.1", 0, 2, 60)
    port = store.port
    sync = DistributedWeightSync([addr], backend="gloo")
    (body,) = sync.init_group_payloads([addr], port, timeout_s=2)
    assert body["timeout_s"] == 2.0
    made: list[Any] = []  # the ProcessGroup rank 0 makes
    joining = threading.Thread(target=lambda: made.append(
        new_weight_group("gloo", "127.0.0.1", port, 2, 0, sync.current_name, 60, store)))
    joining.start()
    control.init_weights_update_group([addr], [body], timeout=60)
    joining.join()
    announced = sync.update_payload({"model.norm.weight": torch.zeros(32)}, 31)
    with pytest.raises(control.ControlError, match="broadcast failed"):
        control.update_weights_from_distributed([addr], announced, timeout=120)
    (group,) = made
    drop_weight_group(group)
    assert control.model_info(addr)["weight_version"] != "31"


def test_no_reachable_server_is_an_error(model_dir: Path, tmp_path: Path) -> None:
    engine = TrainEngine(make_cfg(), model_dir)
    sync = DiskWeightSync([f"127.0.0.1:{free_port()}"], tmp_path / "weights")
    with pytest.raises(control.ControlError, match="no inference server is reachable"):
        sync.sync(engine, 1)


def test_nccl_requests(model_dir: Path) -> None:
    sync = DistributedWeightSync(["h1:30000", "h2:30000"], master_address="10.0.0.1", master_port=29555,
                                 server_world=2)
    assert sync.world_size() == 5
    p = sync.init_group_payloads()
    assert [x["rank_offset"] for x in p] == [1, 3]
    assert all(x["world_size"] == 5 and x["master_address"] == "10.0.0.1" and x["master_port"] == 29555
               and x["backend"] == "nccl" and x["group_name"] == sync.current_name for x in p)
    state = {"a.weight": torch.zeros(3, 4, dtype=torch.bfloat16), "b.bias": torch.zeros(7)}
    body = sync.update_payload(state, 12)
    assert body["names"] == ["a.weight", "b.bias"]
    assert body["dtypes"] == ["bfloat16", "float32"]
    assert body["shapes"] == [[3, 4], [7]]
    assert body["weight_version"] == "12" and body["group_name"] == sync.current_name
    assert sync.current_name.startswith("areal_agents_weights-") and sync.current_name.endswith("-1")


class _MislabelledBroadcast(DistributedWeightSync):
    """Fault injection: announces one tensor under a name the model does not have."""

    def update_payload(self, state: dict[str, torch.Tensor], version: int) -> dict[str, object]:
        body = super().update_payload(state, version)
        body["names"] = ["no.such.weight", *body["names"][1:]]
        return body


def test_refused_broadcast_falls_back_to_disk(model_dir: Path, servers: ServerGroup, tmp_path: Path) -> None:
    addr = servers[0].address
    engine = TrainEngine(make_cfg(lr=5e-2), model_dir)
    engine.train_batch(make_trajs(8, seed=7), nll_loss_fn)
    sync = _MislabelledBroadcast([addr], backend="gloo", timeout_s=60,
                                 fallback=DiskWeightSync([addr], tmp_path / "weights"))
    sync.sync(engine, 11)
    assert "no.such.weight" in (sync.last_error or "") and "goes through disk" in sync.events[0]
    assert (tmp_path / "weights" / "v000011").is_dir()
    _assert_server_matches_trainer(addr, engine, "11")  # the server drained the broadcast and still serves
    sync.sync(engine, 12)  # the group is made anew and refused again: the run goes on through disk
    _assert_server_matches_trainer(addr, engine, "12")
    sync.close()


class _FixedName(DistributedWeightSync):
    """Fault injection: every instance asks for the same group name."""

    @property
    def current_name(self) -> str:
        return "fixed-name"


def test_a_refused_group_falls_back_at_once(model_dir: Path, servers: ServerGroup, tmp_path: Path) -> None:
    addr = servers[0].address
    engine = TrainEngine(make_cfg(), model_dir)
    first = _FixedName([addr], backend="gloo", timeout_s=60, fallback=DiskWeightSync([addr], tmp_path / "w1"))
    first.sync(engine, 21)
    assert first.last_error is None
    first.close()  # this process forgets the name (its own side would refuse it too): the server still holds it
    second = _FixedName([addr], backend="gloo", timeout_s=600, fallback=DiskWeightSync([addr], tmp_path / "w2"))
    syncing = threading.Thread(target=second.sync, args=(engine, 22))  # the server holds that name already
    syncing.start()
    syncing.join(120)  # a generous deadline, far below the group's 600 s timeout: the refusal ended it
    assert not syncing.is_alive(), "the refused group was waited for until its timeout"
    assert "exists already" in (second.last_error or "")
    assert control.model_info(addr)["weight_version"] == "22"  # through disk
