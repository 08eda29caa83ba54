"""The viewer in headless Chromium, clicked through as a user would: the dashboard's charts against
``metrics.jsonl`` (and growing while the run writes), the failed episodes filtered and one opened
(its tokens and trained marks equal the record's), a group, and hostile episode text that must stay
text. ``AREAL_VIEWER_SCREENSHOTS=docs/images`` also writes the docs' screenshots of the three views."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from viewer_support import (
    HOSTILE,
    append_metrics,
    browser,
    make_run,
    metric_row,
    rendered_tokens,
    start_view,
    stop,
    wait_for,
)

from areal_agents.record import episode

SHOTS = os.environ.get("AREAL_VIEWER_SCREENSHOTS", "")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, Path]]:
    base = tmp_path_factory.mktemp("runs")
    run = make_run(base / "guess-number" / "trial", steps=12)
    make_run(base / "guess-number-lr3e-5" / "trial", steps=12, lr=3e-5, run=1, hostile=False)
    proc, url = start_view([run, base / "guess-number-lr3e-5" / "trial"])
    try:
        for driver in browser(base / "profile"):
            yield driver, url, run
    finally:
        stop(proc)


def open_view(driver: Any, url: str, hash_: str) -> None:
    """Load the page afresh at ``hash_`` (from another page: a hash alone would not reload it)."""
    driver.get("about:blank")
    driver.get(url + "/" + hash_)
    wait_for(driver, "document.body.getAttribute('data-ready') === '1'")


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / name))


def points(driver: Any, run: str, key: str) -> int:
    found = driver.execute_script(
        "const l = [...document.querySelectorAll('#charts polyline')].find("
        "(p) => p.dataset.run === arguments[0] && p.dataset.key === arguments[1]);"
        "return l ? l.getAttribute('points').trim().split(/\\s+/).length : 0;", run, key)
    return int(found)


def rows_with(run_dir: Path, key: str) -> int:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return sum(1 for line in lines if key in json.loads(line))


def test_the_charts_have_every_row_and_grow_while_the_run_writes(page: tuple[Any, str, Path]) -> None:
    driver, url, run = page
    open_view(driver, url, "#dashboard")
    for key in ("rollout/reward", "eval/accuracy", "train/loss", "staleness/mean", "rollout/failed/env_error"):
        assert points(driver, "trial", key) == rows_with(run, key) > 0, key
    assert points(driver, "guess-number-lr3e-5-trial", "rollout/reward") == 12  # the second run, overlaid
    differs = driver.execute_script("return [...document.querySelectorAll('#config tr.differs td:first-child')]"
                                    ".map((td) => td.textContent)")
    assert differs == ["actor.lr"]
    shot(driver, "viewer-dashboard.png")
    append_metrics(run, [metric_row(s) for s in (13, 14, 15)])
    want = rows_with(run, "rollout/reward")
    wait_for(driver, f"document.querySelector('#charts polyline[data-run=\"trial\"][data-key=\"rollout/reward\"]')"
                     f".getAttribute('data-n') === '{want}'")
    assert points(driver, "trial", "rollout/reward") == want == 15


def test_a_failed_episode_shows_the_recorded_tokens_and_marks(page: tuple[Any, str, Path]) -> None:
    driver, url, run = page
    open_view(driver, url, "#episodes")
    wait_for(driver, "document.querySelectorAll('#episodes tbody tr').length === 50")
    Select(driver.find_element(By.ID, "f-status")).select_by_value("failed")
    wait_for(driver, "document.querySelectorAll('#episodes tbody tr').length === 12")
    statuses = driver.execute_script("return [...document.querySelectorAll('#episodes tbody tr')]"
                                     ".map((r) => r.dataset.status)")
    assert set(statuses) == {"env_error"}
    shot(driver, "viewer-episodes.png")
    row = driver.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")[4]
    episode_id = row.get_attribute("data-id")
    row.click()
    wait_for(driver, "document.querySelectorAll('#ep-tokens .tok').length > 0")
    recorded = episode(run, episode_id)
    want = [[t, m, bool(m)] for t, m in zip(recorded["token_text"], recorded["loss_mask"], strict=True)]
    assert rendered_tokens(driver) == want
    assert "env_error: RuntimeError" in driver.find_element(By.ID, "ep-facts").text
    assert driver.execute_script("return location.hash") == f"#episode=trial/{episode_id}"
    shot(driver, "viewer-episode.png")
    Select(driver.find_element(By.ID, "colour-by")).select_by_value("versions")
    assert rendered_tokens(driver) == want


def test_a_group_side_by_side(page: tuple[Any, str, Path]) -> None:
    driver, url, _ = page
    open_view(driver, url, "#group=trial/2/g2-0")
    wait_for(driver, "document.querySelectorAll('#group .card').length === 4")
    ids = driver.execute_script("return [...document.querySelectorAll('#group .card')].map((c) => c.dataset.id)")
    assert ids == [f"ep-2-0-{i}" for i in range(4)]
    assert driver.find_element(By.CSS_SELECTOR, "#group .card.best").get_attribute("data-id") == "ep-2-0-1"
    driver.find_element(By.LINK_TEXT, "ep-2-0-0").click()  # the OpenAI-path calls of its first sample
    wait_for(driver, "document.getElementById('ep-title').textContent === 'trial / ep-2-0-0'")
    assert driver.find_element(By.ID, "ep-calls-box").is_displayed()
    calls = driver.find_element(By.ID, "ep-calls").text
    assert '"completion_tokens": 6' in calls and '"call": 1' in calls


def test_hostile_text_is_shown_as_text_and_never_runs(page: tuple[Any, str, Path]) -> None:
    driver, url, _ = page
    open_view(driver, url, "#episode=trial/hostile")  # a shared link, opened in a fresh page
    wait_for(driver, "document.querySelectorAll('#ep-tokens .tok').length > 0")
    shown = driver.find_element(By.ID, "view-episode").text
    for text in HOSTILE:
        assert text in shown
    tokens = [t[0] for t in rendered_tokens(driver)]
    assert all(text in tokens for text in HOSTILE)
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    assert driver.execute_script("return document.querySelectorAll('main img, main script, "
                                 "a[href^=\"javascript\"]').length") == 0
    driver.find_elements(By.CSS_SELECTOR, "#ep-turns .msg")[2].click()
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
