"""The run display: a run without learning signal says so once, with what to check, and in its summary."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from areal_agents.config.loader import load_config
from trainers.progress import RunDisplay


def _display(*overrides: str) -> tuple[RunDisplay, io.StringIO]:
    out = io.StringIO()
    cfg = load_config(overrides=list(overrides))
    return RunDisplay(cfg, enabled=False, console=Console(file=out, width=400)), out


def _step(reward_std: float, signal: float) -> dict[str, float]:
    return {"rollout/reward": 0.0, "rollout/reward_std": reward_std, "rollout/signal_groups": signal}


def test_no_signal_is_said_once_and_shown_in_the_summary(caplog: pytest.LogCaptureFixture) -> None:
    display, out = _display("rollout.no_signal_warn_steps=3")
    with caplog.at_level(logging.WARNING, logger="areal_agents.run"):
        for step in range(1, 3):
            display.update(step, _step(0.0, 0.0))
        assert not caplog.records  # two flat steps: not yet
        for step in range(3, 8):
            display.update(step, _step(0.0, 0.0))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    text = warnings[0]
    assert "no learning signal" in text and "steps 1-3" in text and "same reward" in text
    for hint in ("reward constant", "too hard or too easy", "sampling.max_new_tokens"):
        assert hint in text
    display.update(8, _step(0.5, 0.25))
    display.summary({"steps": 8})
    summary = out.getvalue()
    assert "learning signal" in summary and "1 of 8 steps had groups with different rewards" in summary
    assert "NONE for 3+ steps in a row from step 1" in summary


def test_signal_present_or_check_disabled_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="areal_agents.run"):
        display, out = _display("rollout.no_signal_warn_steps=2")
        for step in range(1, 10):  # some groups differ at every other step: the streak never reaches 2
            display.update(step, _step(0.3, 0.0 if step % 2 else 0.5))
        off, _ = _display("rollout.no_signal_warn_steps=0")
        for step in range(1, 10):
            off.update(step, _step(0.0, 0.0))
    assert not caplog.records
    display.summary({})
    assert "4 of 9 steps had groups with different rewards" in out.getvalue() and "NONE" not in out.getvalue()
