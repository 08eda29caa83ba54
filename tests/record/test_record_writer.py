"""The episode record's writer and reader on real files: every column round-trips exactly, the
retention knob keeps N groups, failed episodes carry their reason, and a failing disk costs one
warning line, never the caller."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from areal_agents.config.fields import ConfigError
from areal_agents.config.loader import load_config
from areal_agents.record import (
    INDEX_EVERY,
    LIGHT_COLUMNS,
    SCHEMA,
    EpisodeRecorder,
    Recorded,
    episode,
    group,
    load,
    step_file,
    summary,
)
from areal_agents.record.table import failure_text
from areal_agents.types import Trajectory


class PieceTokenizer:
    """A tokenizer whose token ``i`` reads ``<i>``: enough to see which text belongs to which id."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)


def traj(group_id: str, k: int, n_prompt: int = 3, n_gen: int = 4, version: int = 2) -> Trajectory:
    """A two-turn episode: prompt, a generated turn, an env reply, a generated turn."""
    t = Trajectory(group_id=group_id, info={"episode_id": f"{group_id}-{k}", "success": k % 2 == 0, "tool": "x"})
    t.append_tokens(range(100 + k, 100 + k + n_prompt), generated=False)
    a = t.num_tokens
    t.append_tokens([7, 8][: n_gen // 2], generated=True, logprobs=[-0.3, -1.7][: n_gen // 2],
                    versions=[version] * (n_gen // 2))
    t.turn_spans.append((a, t.num_tokens))
    t.append_tokens([42], generated=False)
    b = t.num_tokens
    t.append_tokens([9, 10][: n_gen - n_gen // 2], generated=True, logprobs=[-0.013, -3.1][: n_gen - n_gen // 2],
                    versions=[version + 1] * (n_gen - n_gen // 2))
    t.turn_spans.append((b, t.num_tokens))
    t.turn_rewards, t.turn_returns, t.reward = [0.5, 1.0], [1.45, 1.0], 1.45
    return t


def batch(n_groups: int, size: int = 3) -> list[Recorded]:
    rows = []
    for g in range(n_groups):
        for k in range(size):
            t = traj(f"rollout-{g}", k)
            adv = np.where(np.asarray(t.loss_mask) == 1, np.float32(0.3 * (k - 1) + 0.011 * g), np.float32(0))
            rows.append(Recorded(f"rollout-{g}-{k}", k, t, adv.astype(np.float32)))
    return rows


def test_every_column_round_trips_exactly(tmp_path: Path) -> None:
    rows = batch(2)
    with EpisodeRecorder(tmp_path, env="math", tokenizer=PieceTokenizer()) as rec:
        rec.record(3, rows, policy_version=4)
    assert sorted(p.name for p in (tmp_path / "episodes").iterdir()) == ["step-000003.parquet"]
    table = load(tmp_path)
    assert table.schema.equals(SCHEMA)
    got = table.to_pylist()
    assert [g["episode_id"] for g in got] == [r.episode_id for r in rows]
    for row, item in zip(got, rows, strict=True):
        t = item.traj
        assert row["input_ids"] == t.input_ids and row["loss_mask"] == t.loss_mask
        assert row["logprobs"] == np.asarray(t.logprobs, np.float32).tolist() and row["versions"] == t.versions
        assert row["advantages"] == item.advantages.tolist()
        assert row["turn_spans"] == [list(s) for s in t.turn_spans]
        assert row["turn_rewards"] == t.turn_rewards and row["turn_returns"] == t.turn_returns
        assert row["token_text"] == [f"<{i}>" for i in t.input_ids]
        assert row["text"] == "".join(row["token_text"])
        assert (row["step"], row["group_id"], row["group_index"], row["env"]) == (3, t.group_id, item.group_index,
                                                                                   "math")
        assert (row["status"], row["failure"], row["reward"], row["success"]) == ("ok", "", 1.45, t.info["success"])
        assert (row["n_turns"], row["n_tokens"], row["n_trained"]) == (2, len(t.input_ids), 4)
        assert (row["version_min"], row["version_max"], row["staleness"]) == (2, 3, 4 - 2)
        assert json.loads(row["info"]) == t.info and json.loads(row["calls"]) == []
        messages = json.loads(row["messages"])
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        assert messages[1]["content"] == "<7><8>" and messages[2]["content"] == "<42>"
    # the reader's other ways in agree with load
    assert summary(tmp_path).column_names == [c for c in SCHEMA.names if c in summary(tmp_path).column_names]
    assert "input_ids" not in summary(tmp_path).column_names and summary(tmp_path).num_rows == 6
    assert episode(tmp_path, "rollout-1-2") == got[5]
    assert group(tmp_path, 3, "rollout-0") == got[:3]
    assert group(tmp_path, 4, "rollout-0") == [] and load(tmp_path, steps=[4]).num_rows == 0
    assert load(tmp_path, columns=["episode_id", "advantages"]).column_names == ["episode_id", "advantages"]
    with pytest.raises(KeyError, match="rollout-9-0"):
        episode(tmp_path, "rollout-9-0")
    with pytest.raises(ValueError, match="unknown record column"):
        load(tmp_path, columns=["nope"])
    assert pq.ParquetFile(step_file(tmp_path, 3)).metadata.row_group(0).column(0).compression == "ZSTD"


def test_a_rewritten_step_replaces_its_file_and_the_summary_sees_it(tmp_path: Path) -> None:
    """A run resumed from a checkpoint trains a step again: its file is replaced whole."""
    with EpisodeRecorder(tmp_path) as rec:
        for step in (1, 2):
            rec.record(step, batch(2))
    assert summary(tmp_path).num_rows == 12
    with EpisodeRecorder(tmp_path) as rec:
        rec.record(2, batch(1))
    assert summary(tmp_path)["step"].to_pylist() == [1] * 6 + [2] * 3
    assert not [p for p in (tmp_path / "episodes").iterdir() if not p.name.startswith("step-")]


@pytest.mark.parametrize(("keep", "groups"), [(None, 5), (2, 2), (0, 0)])
def test_the_retention_knob_keeps_the_first_n_groups(tmp_path: Path, keep: int | None, groups: int) -> None:
    failed = [Recorded(f"rollout-9-{k}", k, Trajectory(status="timeout", group_id="rollout-9",
                                                        info={"error": "episode exceeded 1.0 s"})) for k in range(9)]
    with EpisodeRecorder(tmp_path, keep=keep) as rec:
        rec.record(1, batch(5), failed)
    table = summary(tmp_path)
    ok = [g for g, s in zip(table["group_id"].to_pylist(), table["status"].to_pylist(), strict=True) if s == "ok"]
    assert sorted(set(ok)) == [f"rollout-{g}" for g in range(groups)] and len(ok) == 3 * groups
    n_failed = table.num_rows - len(ok)
    assert n_failed == (9 if keep is None else 3 * groups)  # failed episodes: as many as `keep` groups hold
    assert (tmp_path / "episodes").exists() == (keep != 0)


def test_failed_episodes_keep_their_status_and_the_exceptions_last_line(tmp_path: Path) -> None:
    failed = Trajectory(status="env_error", group_id="rollout-4", info={
        "error": "Traceback (most recent call last):\n  File \"env.py\", line 3\nValueError: bad board (env.py:3)"})
    failed.append_tokens([1, 2], generated=False)
    failed.append_tokens([3], generated=True, logprobs=[-0.5], versions=[0])
    failed.turn_spans.append((2, 3))
    assert failure_text(failed) == "env: ValueError: bad board (env.py:3)"
    with EpisodeRecorder(tmp_path) as rec:
        rec.record(2, batch(1), [Recorded("rollout-4-1", 1, failed)], policy_version=1)
    row = episode(tmp_path, "rollout-4-1")
    assert (row["status"], row["failure"], row["group_index"]) == ("env_error", "env: ValueError: bad board (env.py:3)",
                                                                   1)
    assert row["advantages"] == [0.0, 0.0, 0.0] and row["loss_mask"] == [0, 0, 1] and row["n_trained"] == 1


def test_a_failing_disk_costs_one_warning_line_and_never_the_caller(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Fault injection: ``episodes`` is a regular file, so no step file can be written until it goes."""
    (tmp_path / "episodes").write_text("in the way")
    with caplog.at_level(logging.WARNING, logger="areal_agents.record"), EpisodeRecorder(tmp_path) as rec:
        for step in (1, 2, 3):
            rec.record(step, batch(1))  # never raises
        rec.close()
        assert rec.failed_writes == 3 and rec.written == []
    warnings = [r for r in caplog.records if r.name == "areal_agents.record"]
    assert len(warnings) == 1 and "step 1 not written" in warnings[0].getMessage()
    (tmp_path / "episodes").unlink()
    with EpisodeRecorder(tmp_path) as rec:
        rec.record(4, batch(1))
    assert summary(tmp_path)["step"].to_pylist() == [4] * 3


def test_logging_episodes_is_all_or_a_whole_number() -> None:
    assert load_config(overrides=["logging.episodes=all"]).logging.episodes_kept is None
    assert load_config(overrides=["logging.episodes=0"]).logging.episodes_kept == 0
    assert load_config(overrides=["logging.episodes=12"]).logging.episodes_kept == 12
    with pytest.raises(ConfigError, match="logging.episodes"):
        load_config(overrides=["logging.episodes=some"])


def test_the_summary_of_many_steps_is_the_light_columns_of_load(tmp_path: Path) -> None:
    """Past a few files the summary reads them in one scan and caches each step's part: the same
    rows as reading each file, and a step rewritten afterwards is read again."""
    with EpisodeRecorder(tmp_path, queue_size=2) as rec:
        for step in range(1, 13):
            rec.record(step, batch(1 + step % 3))
    expected = load(tmp_path, columns=list(LIGHT_COLUMNS))
    assert summary(tmp_path).equals(expected) and summary(tmp_path).equals(expected)  # scanned, then cached
    with EpisodeRecorder(tmp_path) as rec:
        rec.record(5, batch(4))
    again = summary(tmp_path)
    assert again.equals(load(tmp_path, columns=list(LIGHT_COLUMNS)))
    assert again["step"].to_pylist().count(5) == 12


def test_index_files_hold_the_light_columns_while_they_are_current(tmp_path: Path) -> None:
    """Every INDEX_EVERY steps an index file gathers the steps' light columns; a step file written
    again later (a resumed run) makes its index stale, and the summary reads that step's file."""
    with EpisodeRecorder(tmp_path, queue_size=64) as rec:
        for step in range(1, 2 * INDEX_EVERY + 31):
            rec.record(step, batch(1 + step % 2))
    names = sorted(p.name for p in (tmp_path / "episodes").iterdir() if p.name.startswith("index-"))
    assert names == [f"index-{INDEX_EVERY:06d}.parquet", f"index-{2 * INDEX_EVERY:06d}.parquet"]
    assert pq.read_table(tmp_path / "episodes" / names[1])["step"].to_pylist()[0] == INDEX_EVERY + 1
    assert summary(tmp_path).equals(load(tmp_path, columns=list(LIGHT_COLUMNS)))
    with EpisodeRecorder(tmp_path) as rec:  # a resumed run trains step 150 again, with other rows
        rec.record(INDEX_EVERY + 50, batch(4))
    again = summary(tmp_path)
    assert again.equals(load(tmp_path, columns=list(LIGHT_COLUMNS)))
    assert again["step"].to_pylist().count(INDEX_EVERY + 50) == 12


def test_a_run_dir_that_does_not_exist_is_an_error_not_an_empty_record(tmp_path: Path) -> None:
    assert load(tmp_path).num_rows == 0 and summary(tmp_path).num_rows == 0  # a run with no record yet
    for read in (load, summary):
        with pytest.raises(FileNotFoundError, match="no such run directory"):
            read(tmp_path / "runs" / "typo")


def test_a_tokenizer_that_cannot_pickle_is_refused_at_once(tmp_path: Path) -> None:
    """The writer process gets a copy of the tokenizer: one that cannot travel fails at the start, in one line."""

    class Local(PieceTokenizer):  # a class inside a function does not pickle
        pass

    with pytest.raises(TypeError, match="tokenizer must pickle; Local does not"):
        EpisodeRecorder(tmp_path, tokenizer=Local())
    assert not (tmp_path / "episodes").exists()


_TRAINER = """
import os, sys
from pathlib import Path
from typing import Any
sys.path.insert(0, sys.argv[2])
from test_record_writer import batch
from areal_agents.record import EpisodeRecorder
rec = EpisodeRecorder(Path(sys.argv[1]))
for line in sys.stdin:  # "N": record step N, wait until it is written, say so
    step = int(line)
    rec.record(step, batch(1))
    rec.flush()
    print(step in rec.written, flush=True)
"""


def test_the_writer_process_is_out_of_ctrl_c_s_reach_and_ends_with_its_trainer(tmp_path: Path) -> None:
    """A Ctrl-C reaches the terminal's process group: the writer is in a session of its own (the
    trainer closes it after the queued steps are written); it is a ``python -c`` that never runs
    the trainer's script, and a trainer killed outright leaves no writer behind."""
    with subprocess.Popen([sys.executable, "-c", _TRAINER, str(tmp_path), str(Path(__file__).parent)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          start_new_session=True) as proc:
        _check_the_writer(proc)
    assert summary(tmp_path)["step"].to_pylist() == [1] * 3


def _check_the_writer(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def step(n: int) -> str:
        stdin.write(f"{n}\n")
        stdin.flush()
        return stdout.readline().strip()

    try:
        assert step(1) == "True"
        writers = psutil.Process(proc.pid).children()
        assert [w.cmdline()[:2] for w in writers] == [[sys.executable, "-c"]]
        assert "writer_main" in writers[0].cmdline()[2]
        assert os.getsid(writers[0].pid) == writers[0].pid != os.getsid(proc.pid)
        proc.kill()  # (a Ctrl-C reaches the trainer's process group, which the writer is not in)
        proc.wait()
        writers[0].wait(timeout=60)  # its trainer is gone: it ends by itself
    finally:
        proc.kill()


def test_a_writer_that_cannot_start_costs_one_warning_and_is_not_restarted(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Fault injection: a tokenizer that pickles here but cannot load in the writer process."""
    with caplog.at_level(logging.WARNING, logger="areal_agents.record"), \
            EpisodeRecorder(tmp_path, tokenizer=_Unloadable()) as rec:
        for step in (1, 2, 3):
            rec.record(step, batch(1))
        rec.flush()
        assert rec.failed_writes == 3 and rec.written == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "areal_agents.record"]
    assert len(warnings) == 1 and "writer process could not start: RuntimeError: no vocabulary" in warnings[0]


class _Unloadable(PieceTokenizer):
    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())


def _refuse() -> None:
    raise RuntimeError("no vocabulary")
