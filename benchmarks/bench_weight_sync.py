"""Weight sync: a gloo broadcast to the embedded server vs the disk path, same model, same run.

A Qwen2 model of ``--hidden`` × ``--layers`` (≈ 150M parameters, 600 MB in float32, by
default) is loaded by a real :class:`~trainers.engine.TrainEngine`; then its weights go to one real
embedded server subprocess ``--repeats`` times each way, interleaved: :class:`DiskWeightSync`
(safetensors export, fsync, rename, ``/update_weights_from_disk``) and
:class:`DistributedWeightSync` over gloo (``/update_weights_from_distributed`` plus a broadcast
of every tensor). Figures are seconds per sync (median); after each sync the server's weight
version is checked.

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
    from areal_agents.inference.tiny_model import build_tiny_model
    from trainers.engine import TrainEngine
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
        for round_ in range(args.repeats + 1):  # round 0 warms up (the gloo group is made there)
            for kind, sync in syncs.items():
                version += 1
                start = time.perf_counter()
                sync.sync(engine, version)
                elapsed = time.perf_counter() - start
                assert control.model_info(addr)["weight_version"] == str(version)
                if round_:
                    times[kind].append(elapsed)
        syncs["gloo"].close()
    disk, gloo = statistics.median(times["disk"]), statistics.median(times["gloo"])
    report = {
        "benchmark": "weight sync to one embedded server", "parameters": params,
        "megabytes": params * 4 / 2**20, "repeats": args.repeats, "disk_s": disk, "gloo_s": gloo,
        "ratio": disk / gloo, "target_ratio": 1.0, "meets_target": disk / gloo >= 1.0, "raw": times,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"{params / 1e6:.1f}M parameters: disk {disk:.2f} s, gloo broadcast {gloo:.2f} s per sync "
          f"-> {disk / gloo:.2f}x ({out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
