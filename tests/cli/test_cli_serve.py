"""``areal-agents serve`` without ``--model``: it warm-starts the env's tiny default model with the
progress the run shows (``trainers.sft`` says what it builds and where it caches it, then shows the
SFT bar; tests/trainers/test_trainer_sft.py), then says which model it serves."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import trainers.sft
from areal_agents.cli import main
from areal_agents.config import ExperimentConfig
from areal_agents.inference import server


def test_serve_without_a_model_warm_starts_with_progress_and_says_what_it_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, bool, bool]] = []
    served: list[str] = []

    def warm(cfg: ExperimentConfig, *, progress: bool = True, warm_start: bool = False) -> Path:
        calls.append((cfg.env.name, progress, warm_start))
        return tmp_path / "warm" / "countdown-abc"

    def serve(args: argparse.Namespace) -> int:
        served.append(args.model)
        return 0

    monkeypatch.setattr(trainers.sft, "ensure_warm_model", warm)
    monkeypatch.setattr(server, "cli_serve", serve)
    assert main(["serve", "--env", "countdown", "--port", "0"]) == 0
    model = str(tmp_path / "warm" / "countdown-abc")
    assert calls == [("countdown", True, False)] and served == [model]  # progress on, as logging.progress says
    out = capsys.readouterr().out
    assert out == f"no --model: serving the tiny default model of env 'countdown' from {model}\n"
