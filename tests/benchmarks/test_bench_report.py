"""benchmarks/report.py builds the README performance table and chart from the results JSON."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "report.py"
README = "# x\n\nintro text\n\n## Performance\n\n<!-- bench:start -->\nold table\n<!-- bench:end -->\n\ntail text\n"


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPORT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def _write_results(results: Path) -> None:
    results.mkdir()
    (results / "inference_server.json").write_text(json.dumps({
        "requests": 64, "new_tokens": 64, "server_tokens_per_s": 7000.0, "generate_tokens_per_s": 10000.0,
        "ratio": 0.7, "target_ratio": 0.7, "meets_target": True}))
    (results / "inference_client.json").write_text(json.dumps({
        "requests": 5000, "concurrency": 64, "client_req_per_s": 3000.0, "bare_aiohttp_req_per_s": 4000.0,
        "ratio": 0.75, "target_ratio": 0.8, "meets_target": False}))
    run = {"eta": 0, "wall_s": 30.0}
    (results / "rollout_async.json").write_text(json.dumps({
        "workload": {"steps": 12}, "sync": run, "async": {"eta": 4, "wall_s": 20.0}, "bound": 1.8, "speedup": 1.5,
        "target_fraction_of_bound": 0.8, "meets_target": True}))
    (results / "reliability.json").write_text(json.dumps({"not": "a benchmark"}))
    (results / "machine.json").write_text(json.dumps({
        "platform": "Linux-test", "cpu_count": 3, "python": "3.11.0", "torch": "2.13.0",
        "measured_at": "2026-01-02 03:04 UTC", "loadavg_before": [1.5, 1.0, 1.0]}))


def _write_envs(results: Path) -> None:
    run = {"env": "math", "seed": 1, "ok": True, "evals": [[0, 0.5], [50, 0.8]]}
    (results / "envs.json").write_text(json.dumps({"envs": {
        "countdown": {"date": "2026-01-02", "runs": [{**run, "env": "countdown"}, {"seed": 2, "ok": False}]},
        "math": {"date": "2026-01-01", "runs": [run, {**run, "seed": 2, "evals": [[0, 0.5], [50, 0.1]]}]}}}))


def test_report_writes_the_table_between_the_markers_only(tmp_path: Path) -> None:
    results, readme = tmp_path / "results", tmp_path / "README.md"
    _write_results(results)
    _write_envs(results)
    readme.write_text(README)
    proc = _report("--results", str(results), "--readme", str(readme))
    assert proc.returncode == 0, proc.stderr
    text = readme.read_text()
    head, rest = text.split("<!-- bench:start -->\n")
    block, tail = rest.split("\n<!-- bench:end -->")
    assert head == README.split("<!-- bench:start -->")[0] and tail == "\n\ntail text\n"
    assert "old table" not in block
    assert "Measured 2026-01-02 03:04 UTC on Linux-test, 3 CPUs, Python 3.11.0, torch 2.13.0, load average 1.5" in block
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| figure | value | baseline (same run) | ratio | target | met |")
    assert len(rows) == 4  # header + three benchmarks; reliability.json and machine.json are not rows
    assert "| 7,000 tokens/s | batched `model.generate`: 10,000 tokens/s | 0.70× | ≥ 0.7 | yes |" in rows[1]
    assert "| 3,000 req/s | bare aiohttp loop: 4,000 req/s | 0.75× | ≥ 0.8 | **no** |" in rows[2]
    assert "| 20.0 s wall | synchronous: 30.0 s | 1.50× | ≥ 0.8 of bound 1.80× | yes |" in rows[3]
    assert "![async vs sync wall time](results/async_vs_sync.png)" in block
    assert (results / "async_vs_sync.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (results / "envs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # every env's eval curves
    assert "chart " + str(results / "envs.png") in proc.stdout
    # idempotent, and --check agrees; a hand edit inside the block makes --check fail
    assert _report("--results", str(results), "--readme", str(readme)).returncode == 0
    assert readme.read_text() == text
    assert _report("--results", str(results), "--readme", str(readme), "--check").returncode == 0
    readme.write_text(text.replace("0.70×", "0.99×"))
    stale = _report("--results", str(results), "--readme", str(readme), "--check")
    assert stale.returncode == 1 and "stale" in stale.stderr


def _best_of_runs(d: dict, value: str, baseline: str, runs: tuple[str, str]) -> None:
    """Value and baseline are each the best of their own recorded runs, equally many of each."""
    mine, base = d["runs"][runs[0]], d["runs"][runs[1]]
    assert len(mine) == len(base) >= 1 and d[value] == max(mine) and d[baseline] == max(base)


def _inference_server(d: dict) -> None:
    _best_of_runs(d, "server_tokens_per_s", "generate_tokens_per_s", ("server", "generate"))
    batching = d["server_batching"]  # the server generated every requested token, in real batches
    assert batching["step_errors"] == 0 and batching["generated_tokens"] >= d["requests"] * d["new_tokens"] * len(
        d["runs"]["server"]) and batching["max_batch_size_seen"] == d["requests"]


def _inference_client(d: dict) -> None:
    _best_of_runs(d, "client_req_per_s", "bare_aiohttp_req_per_s", ("client", "bare"))


def _rollout_overhead(d: dict) -> None:
    _best_of_runs(d, "executor_eps_per_s", "bare_client_eps_per_s", ("executor", "bare"))
    counts = d["last_executor_counts"]  # the executor finished every episode the bare loop ran, none failed
    assert counts["rollout/accepted"] >= d["episodes"] and counts["rollout/failed"] == 0


def _rollout_async(d: dict) -> None:
    steps = d["workload"]["steps"]  # one workload, every step run by both; sync is synchronous, async within eta
    for side in ("sync", "async"):
        assert len(d[side]["step_end_s"]) == steps and abs(d[side]["step_end_s"][-1] - d[side]["wall_s"]) < 0.01
    assert d["sync"]["eta"] == 0 and d["sync"]["staleness_max"] == 0 and d["async"]["staleness_max"] <= d["async"]["eta"]
    assert abs(d["speedup"] - d["sync"]["wall_s"] / d["async"]["wall_s"]) < 1e-9


def _trainer(d: dict) -> None:
    raw = d["raw"]  # both trainers took the same batches
    assert raw["plain"]["tokens_per_step"] == raw["engine"]["tokens_per_step"] and len(raw["engine"]["step_s"]) == d["steps"]


def _weight_sync(d: dict) -> None:
    import statistics

    raw = d["raw"]  # each figure is the median of as many timed syncs as the other
    assert len(raw["disk"]) == len(raw["gloo"]) == d["repeats"]
    assert d["disk_s"] == statistics.median(raw["disk"]) and d["gloo_s"] == statistics.median(raw["gloo"])
    for kind in ("disk", "gloo") if "checks" in d else ():  # results from before the weight checks lack them
        assert all(c["max_abs_logprob_diff"] <= d["checks"]["tolerance"] for c in d["checks"][kind])


def _learning(d: dict) -> None:
    runs = d["runs"]  # both systems ran every seed, from the same warm start, for the same training budget
    assert [r["seed"] for r in runs["areal"]] == [r["seed"] for r in runs["plain"]] == d["seeds"]
    for a, p in zip(runs["areal"], runs["plain"], strict=True):
        assert abs(a["curve"][0][1] - p["curve"][0][1]) <= 0.02  # greedy, same model, same rows: same start
        assert min(a["train_s"], p["train_s"]) >= 0.9 * d["budget_s"]
        for r in (a, p):
            assert 0.9 * r["steps"] * 128 <= r["samples"] <= r["steps"] * 128 and [t for t, _ in r["curve"]] == sorted(t for t, _ in r["curve"])
    mean = {k: statistics.fmean(r["samples"] / r["train_s"] for r in rs) for k, rs in runs.items()}
    assert abs(d["samples_per_s_ratio"] - mean["areal"] / mean["plain"]) < 1e-9
    defaults = [r["default"] for r in runs["areal"]]  # the default command, timed whole, from the same warm start
    for r in defaults:
        assert r["steps"] == 200 and r["samples"] <= 200 * 128 and abs(r["eval_share"] - r["eval_s"] / r["wall_s"]) < 1e-9
    default_rate = statistics.fmean(r["samples"] / r["train_s"] for r in defaults)
    assert abs(d["ratio"] - default_rate / mean["plain"]) < 1e-9  # the table's ratio: the target's, the default steps'


MEANING = {"inference_server": _inference_server, "inference_client": _inference_client,
           "rollout_overhead": _rollout_overhead, "rollout_async": _rollout_async,
           "rollout_async_embedded": _rollout_async, "trainer": _trainer, "weight_sync": _weight_sync,
           "learning": _learning}


def test_report_on_the_repository_results(tmp_path: Path) -> None:
    """Each recorded result compares like with like, and the table shows what the result holds."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results, ignore=shutil.ignore_patterns("*.png"))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    proc = _report("--results", str(results), "--readme", str(readme))
    assert proc.returncode == 0, proc.stderr
    present = [k for k in MEANING if (results / f"{k}.json").is_file()]
    table = [line for line in readme.read_text().splitlines() if line.startswith("| ") and "---" not in line]
    assert present and len(table) == 1 + len(present)
    for stem, line in zip(present, table[1:], strict=True):
        data = json.loads((results / f"{stem}.json").read_text())
        MEANING[stem](data)
        cells = line.split(" | ")
        ratio = data.get("ratio", data.get("speedup", data.get("speedup_train_only_vs_plain")))
        assert cells[3] == f"{ratio:.2f}×", (stem, line)
        met = data.get("meets_target", data.get("meets_targets"))
        assert cells[5] == ("yes" if met else "**no**"), (stem, line)
        if "target_ratio" in data:  # "met" is the ratio against the target, not a copied flag
            assert met == (data["ratio"] >= data["target_ratio"]), stem


def test_report_errors_are_one_line(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _write_results(results)
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    proc = _report("--results", str(results), "--readme", str(readme))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "bench:start" in proc.stderr
    assert not (results / "envs.png").exists()  # no envs.json, no chart of it
    assert readme.read_text() == "# no markers\n"
    (results / "inference_client.json").write_text("{broken")
    readme.write_text(README)
    proc = _report("--results", str(results), "--readme", str(readme))
    assert proc.returncode == 0 and "warning: inference_client.json: unreadable" in proc.stderr
    assert "bare aiohttp" not in readme.read_text() and "batched `model.generate`" in readme.read_text()
    assert _report("--results", str(tmp_path / "missing"), "--readme", str(readme)).returncode == 2


def test_run_all_discovers_every_bench_script() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run_all
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
    runs = run_all.discover()
    assert sorted({name for name, _ in runs}) == scripts
    assert ("bench_rollout_async.py", ["--backend", "embedded"]) in runs
    assert run_all.discover(["rollout_async"]) == [("bench_rollout_async.py", []),
                                                  ("bench_rollout_async.py", ["--backend", "embedded"])]
    assert all(name != "bench_inference_client.py" for name, _ in run_all.discover(skip=["bench_inference_client.py"]))
    info = run_all.machine_info()
    assert info["cpu_count"] and info["platform"]
