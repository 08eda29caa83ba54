"""The episode record's columns, in one place: names, pyarrow types, and where the files live (no torch).

A run keeps ``RUN_DIR/episodes/step-000123.parquet``, one file per training step (1-based, as in
``metrics.jsonl``), one row per recorded trajectory: the trajectories that step trained and the
failed episodes the rollout dropped while that step's batch was gathered. Every
:data:`INDEX_EVERY` steps the writer also puts the light columns of those steps into one
``index-000100.parquet`` (steps 1-100), so that a summary reads a few files instead of thousands.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

__all__ = [
    "EPISODES_DIR",
    "INDEX_EVERY",
    "LIGHT_COLUMNS",
    "SCHEMA",
    "TOKEN_COLUMNS",
    "index_file",
    "index_of",
    "step_file",
    "step_of",
]

EPISODES_DIR = "episodes"
"""The record's folder inside a run directory."""

SCHEMA = pa.schema([
    ("episode_id", pa.string()),
    ("step", pa.int32()),
    ("group_id", pa.string()),
    ("group_index", pa.int32()),
    ("env", pa.string()),
    ("status", pa.string()),
    ("failure", pa.string()),
    ("reward", pa.float64()),
    ("success", pa.bool_()),
    ("n_turns", pa.int32()),
    ("n_tokens", pa.int32()),
    ("n_trained", pa.int32()),
    ("version_min", pa.int32()),
    ("version_max", pa.int32()),
    ("staleness", pa.int32()),
    ("prompt", pa.string()),
    ("text", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("token_text", pa.list_(pa.string())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),
    ("versions", pa.list_(pa.int32())),
    ("advantages", pa.list_(pa.float32())),
    ("turn_spans", pa.list_(pa.list_(pa.int32()))),
    ("turn_rewards", pa.list_(pa.float64())),
    ("turn_returns", pa.list_(pa.float64())),
    ("messages", pa.string()),
    ("info", pa.string()),
    ("calls", pa.string()),
])
"""One row per recorded trajectory; the meaning of each column is in ``docs/record.md``."""

TOKEN_COLUMNS = ("input_ids", "token_text", "loss_mask", "logprobs", "versions", "advantages")
"""The token-aligned columns: each holds ``n_tokens`` entries."""

LIGHT_COLUMNS = ("episode_id", "step", "group_id", "group_index", "env", "status", "failure", "reward", "success",
                 "n_turns", "n_tokens", "n_trained", "version_min", "version_max", "staleness", "prompt")
"""What :func:`areal_agents.record.summary` reads: no token lists, no whole text or JSON."""

INDEX_EVERY = 100
"""Steps per index file: ``index-000200.parquet`` holds the light columns of steps 101-200."""

_STEP_FILE = re.compile(r"^step-(\d{6,})\.parquet$")
_INDEX_FILE = re.compile(r"^index-(\d{6,})\.parquet$")


def step_file(run_dir: str | Path, step: int) -> Path:
    """The file of training step ``step`` in ``run_dir``."""
    return Path(run_dir) / EPISODES_DIR / f"step-{step:06d}.parquet"


def step_of(path: str | Path) -> int | None:
    """The step a record file's name holds, or None for any other name (a temporary file)."""
    match = _STEP_FILE.match(Path(path).name)
    return int(match.group(1)) if match else None


def index_file(run_dir: str | Path, last_step: int) -> Path:
    """The index file of the :data:`INDEX_EVERY` steps ending at ``last_step``."""
    return Path(run_dir) / EPISODES_DIR / f"index-{last_step:06d}.parquet"


def index_of(path: str | Path) -> int | None:
    """The last step an index file's name holds, or None for any other name."""
    match = _INDEX_FILE.match(Path(path).name)
    return int(match.group(1)) if match else None
