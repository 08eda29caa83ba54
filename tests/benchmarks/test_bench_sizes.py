"""The real-sizes benchmark's CPU parts: the Qwen2.5 shapes and their parameter counts, the FLOP
formula, MFU and the peak table; and its dry run on the 2-layer miniature."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_sizes as bs  # noqa: E402

sys.path.pop(0)
ROOT = Path(__file__).resolve().parents[2]
TOY = bs.Arch(hidden=8, layers=1, heads=2, kv_heads=1, intermediate=16, vocab=10)


def _meta_model(arch: bs.Arch) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):  # shapes only: no memory for the weights
        return Qwen2ForCausalLM(bs.qwen2_config(arch))


@pytest.mark.parametrize("name", ["0.5b", "1.5b", "mini"])
def test_the_configs_have_the_published_parameter_counts(name: str) -> None:
    arch = bs.SIZES[name]
    model = _meta_model(arch)
    counted = sum(p.numel() for p in model.parameters())  # tied embeddings once
    assert counted == bs.param_count(arch)
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert bs.matmul_params(arch) == linear + arch.vocab * arch.hidden  # the layers' matmuls and the (tied) head
    if name != "mini":
        assert counted == bs.EXPECTED_PARAMS[name]
        assert model.config.tie_word_embeddings and model.config.vocab_size == 151936
        non_embedding = counted - arch.vocab * arch.hidden  # published: 0.36B and 1.31B
        assert round(non_embedding / 1e9, 2) == {"0.5b": 0.36, "1.5b": 1.31}[name]
    assert round(bs.EXPECTED_PARAMS["0.5b"] / 1e9, 2) == 0.49 and round(bs.EXPECTED_PARAMS["1.5b"] / 1e9, 2) == 1.54


def test_the_flop_formula_on_a_hand_checked_case() -> None:
    # head_dim 4, d_q 8, d_kv 4; matmul weights: q 64 + k 32 + v 32 + o 64 + MLP 3*8*16 = 576, head 10*8 = 80
    assert bs.matmul_params(TOY) == 656
    # forward: 2*656 = 1312, attention over 3 causal tokens: keys 1 + 2 + 3 = 6, 2 (QK) * 2 (AV) * 8 FLOPs each,
    # 192 / 3 tokens = 64 per token; training is 3 forwards: 3 * 1376
    assert bs.train_flops_per_token(TOY, 3) == 4128
    # checkpointing runs the layers' forward again (2 * 576 + 64), not the head
    assert bs.train_flops_per_token(TOY, 3, recompute=True) == 4128 + 1216
    arch = bs.SIZES["1.5b"]  # the usual 6 N plus the causal attention term
    assert bs.train_flops_per_token(arch, 4096) == 6 * bs.matmul_params(arch) + 6 * 28 * 1536 * 4097
    assert 10.3e9 < bs.train_flops_per_token(arch, 4096) < 10.4e9


def test_mfu_is_model_flops_over_the_peak() -> None:
    assert bs.mfu(10_000, 39.56e9, 989e12) == pytest.approx(0.4)
    assert bs.mfu(10_000, 39.56e9, None) is None
    flops = bs.train_flops_per_token(bs.SIZES["1.5b"], 4096)
    assert bs.mfu(38_400, flops, 989e12) == pytest.approx(38_400 * flops / 989e12)


@pytest.mark.parametrize(("name", "peak", "entry"), [
    ("NVIDIA H100 80GB HBM3", 989e12, "H100 SXM"), ("NVIDIA H100 PCIe", 756e12, "H100 PCIe"),
    ("NVIDIA H100 NVL", 835e12, "H100 NVL"), ("NVIDIA H200", 989e12, "H200 SXM"),
    ("NVIDIA H200 NVL", 835e12, "H200 NVL"), ("NVIDIA GH200 480GB", 989e12, "H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", 312e12, "A100"), ("NVIDIA A100 80GB PCIe", 312e12, "A100"),
    ("NVIDIA L4", 121e12, "L4"), ("NVIDIA L40S", 362e12, "L40S"),
])  # fmt: skip
def test_the_peak_table_by_device_name(name: str, peak: float, entry: str) -> None:
    assert bs.peak_flops(name) == (peak, entry)


def test_an_unknown_device_has_no_peak_and_says_why() -> None:
    peak, why = bs.peak_flops("NVIDIA GeForce RTX 4090")
    assert peak is None and "RTX 4090" in why and "PEAK_BF16_FLOPS" in why
    peak, why = bs.peak_flops("cpu")
    assert peak is None and why.startswith("cpu")


def test_the_summary_line_and_the_target() -> None:
    res = {**bs.size_header("1.5b", 4096), "train": {
        "ckpt_off": {"tokens_per_s": 40_000.0, "mfu": 0.42, "peak_mem_mb": 50_000.0},
        "ckpt_on": {"tokens_per_s": 30_000.0, "mfu": 0.31, "peak_mem_mb": 30_000.0}},
        "weight_sync": {"disk_s": 4.0, "gloo_s": 2.0}, "skipped": {"decode": "out of time"}}  # fmt: skip
    report = {"target": {**bs.MFU_TARGET, "met": None}, "sizes": {"1.5b": res, "0.5b": bs.size_header("0.5b", 4096)}}
    bs._finish(report)
    assert report["target"]["met"] is True and report["ok"]  # the better of the two settings meets 40 %
    assert report["lines"][0] == ("1.5b (1,543.7M params); ckpt off: 40,000 tok/s, MFU 42.0%, peak 48.8 GiB; "
                                  "ckpt on: 30,000 tok/s, MFU 31.0%, peak 29.3 GiB; sync disk 4.00 s, gloo 2.00 s; "
                                  "skipped: decode (out of time)")  # fmt: skip
    assert report["lines"][1] == "0.5b (494.0M params)"
    res["train"]["ckpt_off"]["mfu"] = None  # an unknown GPU: no verdict
    res["train"]["ckpt_on"]["mfu"] = None
    res["errors"] = {"sync": "RuntimeError: x"}
    bs._finish(report)
    assert report["target"]["met"] is None and not report["ok"] and "MFU n/a" in report["lines"][0]


def _dry_run(tmp_path: Path, parts: list[str]) -> dict:
    out = tmp_path / "sizes.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sizes.py"), "--sizes", "mini",
                           "--device", "cpu", "--seq-len", "128", "--batch", "2", "--steps", "1", "--requests", "4",
                           "--new-tokens", "4", "--parts", *parts, "--output", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["peak_bf16_flops"] is None and report["target"]["met"] is None
    assert report["ok"] and list(report["sizes"]) == ["mini"] and report["lines"][0].startswith("mini (0.2M params)")
    mini = report["sizes"]["mini"]
    assert mini["params"] == bs.param_count(bs.SIZES["mini"]) and mini["flops_per_token"] > 0
    assert set(mini["train"]) == {"ckpt_off", "ckpt_on"} and "errors" not in mini and "skipped" not in mini
    for run in mini["train"].values():
        assert run["tokens_per_s"] > 0 and run["mfu"] is None and run["peak_mem_mb"] > 0
        assert run["tokens_per_step"] == 256 and len(run["step_s"]) == 1
    return mini


def test_the_cpu_dry_run_trains_the_miniature(tmp_path: Path) -> None:
    mini = _dry_run(tmp_path, ["train"])
    assert "weight_sync" not in mini and "decode" not in mini


@pytest.mark.slow
def test_the_cpu_dry_run_syncs_and_decodes(tmp_path: Path) -> None:
    mini = _dry_run(tmp_path, ["train", "sync", "decode"])
    sync, decode = mini["weight_sync"], mini["decode"]
    assert sync["parameters"] == mini["params"] and sync["disk_s"] > 0 and sync["gloo_s"] > 0
    assert len(sync["raw"]["disk"]) == len(sync["raw"]["gloo"]) == 1
    assert decode["server_tokens_per_s"] > 0 and decode["generate_tokens_per_s"] > 0 and decode["requests"] == 4
