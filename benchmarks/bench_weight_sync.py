"""Weight sync: a gloo broadcast to the embedded server vs the disk path, same model, same run.

A Qwen2 model of ``--hidden`` × ``--layers`` (≈ 150M parameters, 600 MB in float32, by
default) is loaded by a real :class:`~trainers.engine.TrainEngine`; then its weights go to one real
embedded server subprocess ``--repeats`` times each way, interleaved: :class:`DiskWeightSync`
(safetensors export, fsync, rename, ``/update_weights_from_disk``) and
:class:`DistributedWeightSync` over gloo (``/update_weights_from_distributed`` plus a broadcast
of every tensor). Figures are seconds per sync (median). Both sides carry the same work: before
every sync the trainer's weights get a fresh perturbation (untimed), and after it the server's
weight version is checked and its greedy continuation of a fixed prompt is scored by the
trainer: the server's logprobs must equal the trainer's for the weights just sent (``checks``
in the JSON), so a path that skipped or garbled tensors fails the benchmark. The same probe
before the sync (``stale_logprob_diff``) shows it tells the old weights from the new.

    python benchmarks/bench_weight_sync.py [--hidden 1024] [--layers 12] [--repeats 3]

Writes ``benchmarks/results/weight_sync.json``. Target: the broadcast is no slower (ratio ≥ 1.0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
TOLERANCE = 1e-3  # max |server - trainer| logprob; float32 on both sides differs by ~1e-6


def perturb(engine: object, version: int) -> None:
    """Add seeded noise to every trainer parameter, so each sync sends weights never sent before."""
    import torch

    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for param in engine.model.parameters():  # type: ignore[attr-defined]
            local = param.to_local() if hasattr(param, "to_local") else param  # one rank: the whole tensor
            local.add_(torch.randn(local.shape, generator=gen).to(local.dtype) * 0.05)


def probe(engine: object, addr: str) -> dict[str, object]:
    """The server's greedy continuation of ``PROMPT`` and the largest gap between its logprobs
    and the trainer's for the same tokens."""
    import httpx
    import torch

    from areal_agents.inference.client import normalize_address

    body = httpx.post(normalize_address(addr) + "/generate", timeout=120, json={
        "input_ids": PROMPT, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}}).json()
    out = body["output_ids"]
    server = torch.tensor([float(x[0]) for x in body["meta_info"]["output_token_logprobs"]])
    ids = torch.tensor([PROMPT + out])
    mine = engine.compute_logprobs({"input_ids": ids, "attention_mask": torch.ones_like(ids)},  # type: ignore[attr-defined]
                                   temperature=1.0)[0, len(PROMPT):]
    return {"output_ids": out, "max_abs_logprob_diff": float((server - mine).abs().max())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", default=str(RESULTS / "weight_sync.json"))
    args = p.parse_args(argv)

    import torch

    from areal_agents.config import ExperimentConfig
    from areal_agents.inference import control
    from areal_agents.inference.launcher import launch_servers
    from trainers.engine import TrainEngine
    from trainers.tiny_model import build_tiny_model
    from trainers.weight_sync import DiskWeightSync, DistributedWeightSync

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    texts = [f"{a}+{b}={a + b}" for a in range(50) for b in range(50)]
    model = build_tiny_model(texts, tmp / "model", hidden_size=args.hidden, num_layers=args.layers,
                             num_heads=8, num_kv_heads=4, intermediate_size=args.hidden * 3)
    cfg = ExperimentConfig()
    cfg.actor.path = str(model)
    engine = TrainEngine(cfg, model)
    params = sum(t.numel() for t in engine.full_state_dict().values())
    times: dict[str, list[float]] = {"disk": [], "gloo": []}
    with launch_servers(cfg, model, 1, log_dir=tmp / "logs", env={"OMP_NUM_THREADS": "1"}) as group:
        addr = group.addresses[0]
        syncs = {"disk": DiskWeightSync([addr], tmp / "weights"),
                 "gloo": DistributedWeightSync([addr], backend="gloo", timeout_s=300)}
        version = 0
        checks: dict[str, list[dict[str, object]]] = {"disk": [], "gloo": []}
        for round_ in range(args.repeats + 1):  # round 0 warms up (the gloo group is made there)
            for kind, sync in syncs.items():
                version += 1
                perturb(engine, version)
                stale = probe(engine, addr)["max_abs_logprob_diff"]  # the server still has the previous weights
                start = time.perf_counter()
                sync.sync(engine, version)
                elapsed = time.perf_counter() - start
                assert control.model_info(addr)["weight_version"] == str(version)
                check = {"version": version, "stale_logprob_diff": stale, **probe(engine, addr)}
                if not check["max_abs_logprob_diff"] <= TOLERANCE:  # type: ignore[operator]
                    raise SystemExit(f"{kind} sync of version {version}: the server's weights are not the "
                                     f"trainer's (logprobs differ by {check['max_abs_logprob_diff']:.3g})")
                checks[kind].append(check)
                if round_:
                    times[kind].append(elapsed)
        syncs["gloo"].close()
    disk, gloo = statistics.median(times["disk"]), statistics.median(times["gloo"])
    report = {
        "benchmark": "weight sync to one embedded server", "parameters": params,
        "megabytes": params * 4 / 2**20, "repeats": args.repeats, "disk_s": disk, "gloo_s": gloo,
        "ratio": disk / gloo, "target_ratio": 1.0, "meets_target": disk / gloo >= 1.0, "raw": times,
        "checks": {"prompt": PROMPT, "tolerance": TOLERANCE, **checks},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"{params / 1e6:.1f}M parameters: disk {disk:.2f} s, gloo broadcast {gloo:.2f} s per sync "
          f"-> {disk / gloo:.2f}x ({out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
