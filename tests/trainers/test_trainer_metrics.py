"""The run's metrics logger: TensorBoard events when the package is there, and one line saying so,
with the rest written as usual, when ``logging.tensorboard`` is on and the package is missing."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from areal_agents.config import LoggingConfig
from trainers.metrics import NO_TENSORBOARD, MetricsLogger


def _one_step(run_dir: Path, tensorboard: bool) -> None:
    logger = MetricsLogger(run_dir, LoggingConfig(tensorboard=tensorboard))
    logger.log(1, {"train/loss": 0.5})
    logger.close()


def test_missing_tensorboard_is_one_line_and_the_rest_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # importing it raises ImportError
    with caplog.at_level(logging.WARNING, logger="areal_agents.run"):
        _one_step(tmp_path, tensorboard=True)
    assert [r.getMessage() for r in caplog.records] == [NO_TENSORBOARD]
    assert "\n" not in NO_TENSORBOARD and "pip install tensorboard" in NO_TENSORBOARD
    assert "logging.tensorboard" in NO_TENSORBOARD
    assert not (tmp_path / "tensorboard").exists()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["train/loss"] == 0.5


@pytest.mark.parametrize("tensorboard", [True, False])
def test_installed_or_switched_off_it_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                   tensorboard: bool) -> None:
    with caplog.at_level(logging.WARNING, logger="areal_agents.run"):
        _one_step(tmp_path, tensorboard=tensorboard)
    assert caplog.records == []
    assert any((tmp_path / "tensorboard").glob("events.*")) == tensorboard
