"""Run directories for the viewer's tests: a real ``metrics.jsonl``, ``config.yaml`` and episode
record (Parquet in the record's schema, written with pyarrow as the trainer's recorder writes it),
the real ``areal-agents view`` server in a subprocess, and headless Chromium driven by Selenium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from areal_agents.record.schema import SCHEMA, step_file

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "headless Chromium is missing: install it with `apt-get install -y chromium chromium-driver` (and pip install selenium)"
HOSTILE = ['<script>window.__pwned=1</script>', '<img src=x onerror="window.__pwned=1">',
           '<a href="javascript:window.__pwned=1">click me</a>']


def metric_row(step: int, run: int = 0) -> dict[str, Any]:
    """One training step's metrics (a few of the keys the trainer writes)."""
    wiggle = ((step * 7 + run * 3) % 5 - 2) / 40
    return {"step": step, "time/elapsed_s": 2.0 * step, "rollout/reward": min(1.0, 0.06 * step + 0.1 * run + wiggle),
            "train/loss": (1.0 + 0.4 * run) / step + wiggle / 4, "train/approx_kl": 0.001 * step * (1 + run),
            "train/entropy": 0.7 - (0.01 + 0.01 * run) * step,
            "train/clip_frac": 0.01 * (step % 3), "staleness/mean": step % 2, "staleness/max": 1,
            "perf/episodes_per_s": 40.0 + step, "perf/gen_tokens_per_s": 900.0 + 10 * step,
            "rollout/failed": float(step % 2), "rollout/failed/env_error": float(step % 2), "version": step}


def append_metrics(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def episode_row(step: int, group: int, index: int, *, status: str = "ok", hostile: bool = False) -> dict[str, Any]:
    """One recorded two-turn tool-using episode; its tokens are words, the generated turns trained."""
    words = HOSTILE if hostile else [f"w{step}.{group}.{index}.{k}" for k in range(3)]
    prompt = ["<|user|>", "Guess", " the", " number", "\n"]
    turn1 = ["I", " call", " guess", "(", "5", ")", *words]
    tool = ["<|tool|>", " higher", "\n"]
    turn2 = ["The", " answer", " is", " 7"]
    pieces = prompt + turn1 + tool + turn2
    spans = [[len(prompt), len(prompt) + len(turn1)], [len(prompt) + len(turn1) + len(tool), len(pieces)]]
    mask = [0] * len(pieces)
    for s, e in spans:
        mask[s:e] = [1] * (e - s)
    reward = float(index % 2) if status == "ok" else 0.0
    adv = reward - 0.5
    messages = [{"role": "system", "content": "You guess numbers."}, {"role": "user", "content": "Guess the number"},
                {"role": "assistant", "content": "I call guess(5) " + " ".join(words),
                 "tool_calls": [{"function": {"name": "guess", "arguments": '{"n": 5}'}}]},
                {"role": "tool", "name": "guess", "content": "higher " + " ".join(words)},
                {"role": "assistant", "content": "The answer is 7"}]
    return {
        "episode_id": f"ep-{step}-{group}-{index}", "step": step, "group_id": f"g{step}-{group}", "group_index": index,
        "env": "guess-number", "status": status,
        "failure": "" if status == "ok" else f"{status}: RuntimeError: the env broke at turn 2 ({step}.{group}.{index})",
        "reward": reward, "success": None if status != "ok" else bool(reward), "n_turns": 2,
        "n_tokens": len(pieces), "n_trained": sum(mask), "version_min": step - 1, "version_max": step,
        "staleness": 1, "prompt": "Guess the number", "text": "".join(pieces),
        "input_ids": list(range(100, 100 + len(pieces))), "token_text": pieces, "loss_mask": mask,
        "logprobs": [-0.3 * m for m in mask], "versions": [(step - 1 if i < spans[1][0] else step) if m else -1
                                                          for i, m in enumerate(mask)],
        "advantages": [adv * m for m in mask], "turn_spans": spans, "turn_rewards": [0.0, reward],
        "turn_returns": [reward, reward], "messages": json.dumps(messages),
        "info": json.dumps({"success": bool(reward), "note": words[0]}), "calls": "[]",
    }


def write_step(run_dir: Path, step: int, rows: list[dict[str, Any]]) -> None:
    path = step_file(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, compression="zstd")


def make_run(run_dir: Path, *, steps: int = 3, lr: float = 1e-5, run: int = 0, hostile: bool = True) -> Path:
    """A finished tiny run: ``steps`` metric rows plus two eval rows, two groups of four per step (the
    last sample of each second group failed), and one hostile-text episode at step 1."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"env": {"name": "guess-number"}, "actor": {"lr": lr},
                                                          "seed": 1}))
    append_metrics(run_dir, [{"step": 0, "eval/accuracy": 0.2, "eval/n": 20}])
    append_metrics(run_dir, [metric_row(s, run) for s in range(1, steps + 1)])
    append_metrics(run_dir, [{"step": steps, "eval/accuracy": 0.5, "eval/n": 20}])
    for step in range(1, steps + 1):
        rows = [episode_row(step, g, i, status="env_error" if (g, i) == (1, 3) else "ok")
                for g in range(2) for i in range(4)]
        rows[0]["calls"] = json.dumps([{"call": 0, "messages": 2, "completion_tokens": 6, "trajectory": 0},
                                       {"call": 1, "messages": 4, "completion_tokens": 4, "trajectory": 0}])
        if step == 1 and hostile:
            rows.append(episode_row(1, 9, 0, hostile=True) | {"episode_id": "hostile"})
        write_step(run_dir, step, rows)
    return run_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_view(run_dirs: list[Path], *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``areal-agents view RUN_DIR ...`` in a subprocess; returns it and its URL once it listens."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "areal_agents.cli", "view", *map(str, run_dirs), "--port",
                             str(port), *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the server prints its URL once it listens
        seen.append(line)
        if "http://" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, f"http://127.0.0.1:{port}"
    proc.wait(timeout=10)
    raise AssertionError("the viewer did not start:\n" + "".join(seen))


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def browser(profile: Path) -> Iterator[Any]:
    """Headless Chromium (Debian's, with its chromedriver); fails (never skips) when it is missing."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail(INSTALL, pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def rendered_tokens(driver: Any) -> list[list[Any]]:
    """The open episode's tokens as the page shows them: ``[text, trained (0/1), marked trained]``."""
    return driver.execute_script(  # type: ignore[no-any-return]
        "return [...document.querySelectorAll('#ep-tokens .tok')].map((t) => "
        "[t.textContent, Number(t.dataset.trained), t.classList.contains('trained')])")


def wait_for(driver: Any, script: str, timeout: float = 15.0) -> Any:
    """Poll ``return <script>`` in the page until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    value = driver.execute_script("return " + script)
    while not value:
        assert time.monotonic() < deadline, f"timed out waiting for: {script}"
        time.sleep(0.05)
        value = driver.execute_script("return " + script)
    return value
