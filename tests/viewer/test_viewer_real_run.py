"""The path a newcomer takes, on a real run: ``areal-agents run`` of a user's env (from its file,
with failing rows), then ``areal-agents view`` of its run dir in headless Chromium: the dashboard
charts the run's own metrics, a failed episode is found by the status filter, and an episode's
rendered tokens and trained marks are the ones the run recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from viewer_support import browser, rendered_tokens, start_view, stop, wait_for

from areal_agents.record import episode, summary

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def test_a_real_run_viewed_in_the_browser(tmp_path: Path, tiny_model: Callable[..., Path]) -> None:
    model = tiny_model([f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n"
                        for a in range(10) for b in range(10)])
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "half-broken", f"imports=[{HERE / 'half_broken_env.py'}]",
           f"actor.path={model}", f"output_dir={tmp_path / 'runs'}", "trainer.total_steps=3",
           "rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=4", "eval.n=4", "eval.every=0",
           "trainer.save_every=0", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
           "logging.episodes=all", "rollout.group_filter=none"]
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "half-broken" / "trial"
    light = summary(run_dir).to_pylist()
    failed = [r["episode_id"] for r in light if r["status"] != "ok"]
    assert failed and len(failed) < len(light), "the run has failed and trained episodes"
    losses = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    n_loss = sum(1 for row in losses if "train/loss" in row)
    assert n_loss == 3

    view, url = start_view([run_dir])
    try:
        for driver in browser(tmp_path / "profile"):
            driver.get(url + "/#dashboard")
            wait_for(driver, "document.body.getAttribute('data-ready') === '1'")
            points = wait_for(driver, "(() => { const l = [...document.querySelectorAll('#charts polyline')]"
                                      ".find((p) => p.dataset.key === 'train/loss');"
                                      " return l && l.getAttribute('points').trim().split(/\\s+/).length; })()")
            assert points == n_loss
            driver.get("about:blank")
            driver.get(url + "/#episodes")
            wait_for(driver, "document.querySelectorAll('#episodes tbody tr').length > 0")
            Select(driver.find_element(By.ID, "f-status")).select_by_value("failed")
            wait_for(driver, f"document.querySelectorAll('#episodes tbody tr').length === {len(failed)}")
            shown = driver.execute_script("return [...document.querySelectorAll('#episodes tbody tr')]"
                                          ".map((r) => r.dataset.id)")
            assert sorted(shown) == sorted(failed)
            driver.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")[0].click()
            wait_for(driver, "document.querySelectorAll('#ep-tokens .tok').length > 0")
            assert "planted env failure" in driver.find_element(By.ID, "ep-facts").text
            trained = next(r["episode_id"] for r in light if r["status"] == "ok")
            driver.get("about:blank")
            driver.get(f"{url}/#episode=trial/{trained}")
            wait_for(driver, "document.querySelectorAll('#ep-tokens .tok').length > 0")
            recorded = episode(run_dir, trained)
            assert sum(recorded["loss_mask"]) > 0
            assert rendered_tokens(driver) == [[t, m, bool(m)] for t, m in
                                               zip(recorded["token_text"], recorded["loss_mask"], strict=True)]
    finally:
        stop(view)
