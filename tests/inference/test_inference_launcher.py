"""Launching servers (SGLang command line, version gate, process cleanup) and control payloads."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.config.loader import load_config
from areal_agents.inference import control, protocol
from areal_agents.inference.launcher import (
    LaunchError,
    check_sglang,
    embedded_command,
    free_port,
    judge_server,
    launch_servers,
    sglang_command,
    starting_servers,
)


def test_sglang_command_from_config() -> None:
    cfg = load_config(None, ["sglang.tp_size=2", "sglang.mem_fraction_static=0.7", "actor.dtype=bfloat16",
                             "sglang.random_seed=5", "sglang.extra_args=[--enable-metrics]"])  # fmt: skip
    cmd = sglang_command(cfg, "/models/qwen", 31000)
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    args = dict(zip(cmd[3:-1:2], cmd[4:-1:2], strict=True))
    assert args == {"--model-path": "/models/qwen", "--host": "127.0.0.1", "--port": "31000", "--tp-size": "2",
                    "--dtype": "bfloat16", "--mem-fraction-static": "0.7", "--random-seed": "5"}  # fmt: skip
    assert cmd[-1] == "--enable-metrics"
    second = sglang_command(cfg, "/models/qwen", 31001, server_index=1)
    assert second[second.index("--base-gpu-id") + 1] == "2" and second[second.index("--random-seed") + 1] == "6"
    emb = embedded_command(cfg, "/m", 0)
    assert emb[emb.index("--host") + 1] == "127.0.0.1" and emb[emb.index("--port") + 1] == "0"


@pytest.mark.parametrize(("found", "ok"), [("0.4.9", False), ("0.4.9.post1", False), ("0.4.9.post2", True),
                                           ("0.5.23", True)])  # fmt: skip
def test_sglang_version_gate(monkeypatch: pytest.MonkeyPatch, found: str, ok: bool) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: found if name == "sglang" else real(name))
    if ok:
        check_sglang()
    else:
        with pytest.raises(ConfigError, match=rf"0\.4\.9\.post2.*found {found}"):
            check_sglang()


def test_missing_sglang_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ConfigError, match="pip install"):
        load_config(None, ["inference.backend=sglang"])
    cfg = ExperimentConfig()
    cfg.inference.backend = "sglang"  # validated earlier; the launcher checks again before starting
    with pytest.raises(ConfigError, match="pip install"):
        launch_servers(cfg, "/nonexistent", 1)


def test_failed_launch_raises_with_log_and_leaves_no_process(tmp_path: Path) -> None:
    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 60.0
    with pytest.raises(LaunchError, match="config.json") as info:
        launch_servers(cfg, tmp_path / "no-model", 2, log_dir=tmp_path)
    assert "exited with code" in str(info.value)  # seen as the process exited, not at setup_timeout
    logs = sorted(tmp_path.glob("server-*.log"))
    assert len(logs) == 2


def test_starting_servers_yields_while_they_start_and_waiting_says_why_one_failed(tmp_path: Path) -> None:
    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 60.0
    with starting_servers(cfg, str(tmp_path / "no-model"), tmp_path) as ready:
        started = sorted(tmp_path.glob("server-*.log"))  # the processes run while the caller sets itself up
        with pytest.raises(LaunchError, match="config.json") as info:
            ready()
    assert len(started) == cfg.inference.num_servers
    assert "exited with code" in str(info.value)


def test_judge_server_exports_its_url_before_it_is_ready_and_waiting_says_why_it_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_AGENTS_JUDGE_URL", raising=False)
    with judge_server(ExperimentConfig()) as none:  # no judge.model_path: nothing started, nothing exported
        assert none() is None and "AREAL_AGENTS_JUDGE_URL" not in os.environ
    cfg = ExperimentConfig()
    cfg.judge.model_path = str(tmp_path / "no-model")
    cfg.inference.setup_timeout = 60.0
    with judge_server(cfg, tmp_path) as ready:
        url = os.environ["AREAL_AGENTS_JUDGE_URL"]  # set at once: a rollout built now finds its judge
        assert url.startswith(f"http://{cfg.inference.host}:") and url.endswith("/v1")
        assert int(url.split(":")[-1].removesuffix("/v1")) > 0  # the port chosen before the server is up
        assert sorted(tmp_path.glob("server-*.log"))  # its process runs while the caller sets itself up
        with pytest.raises(LaunchError, match="config.json"):
            ready()
    assert "AREAL_AGENTS_JUDGE_URL" not in os.environ


def test_control_payloads() -> None:
    assert protocol.update_weights_from_disk_payload("/ckpt/v3", 3) == {
        "model_path": "/ckpt/v3", "abort_all_requests": False, "flush_cache": True, "weight_version": "3"}  # fmt: skip
    assert "weight_version" not in protocol.update_weights_from_disk_payload("/p")
    assert protocol.init_weights_update_group_payload("10.0.0.1", 29500, 1, 3, group_name="g") == {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 3,
        "group_name": "g", "backend": "nccl"}  # fmt: skip
    with pytest.raises(ValueError, match="rank_offset"):
        protocol.init_weights_update_group_payload("h", 1, 0, 2)
    body = protocol.update_weights_from_distributed_payload(["a.w", "b.w"], ["torch.bfloat16", "float32"],
                                                           [(2, 3), [4]], version=7)  # fmt: skip
    assert body == {"names": ["a.w", "b.w"], "dtypes": ["bfloat16", "float32"], "shapes": [[2, 3], [4]],
                    "group_name": "weight_update_group", "flush_cache": True, "weight_version": "7"}  # fmt: skip
    with pytest.raises(ValueError, match="length"):
        protocol.update_weights_from_distributed_payload(["a"], [], [])
    with pytest.raises(ValueError, match="mode"):
        control.pause_generation("127.0.0.1:1", "sideways")


def test_wait_healthy_times_out_with_a_clear_error() -> None:
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(control.ControlError, match="not healthy"):
        control.wait_healthy(addr, timeout=0.5)
    with pytest.raises(control.ControlError, match=addr):
        control.continue_generation([addr], timeout=0.5)


def test_close_kills_the_whole_process_group(tmp_path: Path) -> None:
    from inference_support import make_models, start_servers

    model, _ = make_models(tmp_path)
    group = start_servers(model, 1, tmp_path)
    handle = group[0]
    control.wait_healthy(handle.address, timeout=5)
    pgid = os.getpgid(handle.process.pid)
    assert pgid == handle.process.pid  # its own group, so killpg reaches every child
    group.close()
    assert handle.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    with pytest.raises(control.ControlError):
        control.wait_healthy(handle.address, timeout=0.3)


def test_client_side_modules_do_not_import_torch() -> None:
    import subprocess

    code = ("import sys, areal_agents.inference.client, "
            "areal_agents.inference.control, areal_agents.inference.launcher; "
            "assert 'torch' not in sys.modules, 'torch imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_serve_command_line(tmp_path: Path) -> None:
    import signal
    import subprocess

    from inference_support import corpus

    from trainers.tiny_model import build_tiny_model

    no_model = subprocess.run([sys.executable, "-m", "areal_agents.cli", "serve", "--model", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert no_model.returncode == 2 and "config.json" in no_model.stderr
    model = build_tiny_model(corpus(50), tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    proc = subprocess.Popen([sys.executable, "-m", "areal_agents.cli", "serve", "--model", str(model), "--port", "0",
                             "--weight-version", "5"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("serving on http://127.0.0.1:"), line
        addr = line.strip().removeprefix("serving on http://")
        control.wait_healthy(addr, timeout=30)
        assert control.model_info(addr)["weight_version"] == "5"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
