"""The episode record's writer: what a training step saw, written off the training thread (no torch).

The trainer calls :meth:`EpisodeRecorder.record` once per step with the trajectories it trained
(and the advantages its loss used) and the failed episodes the rollout dropped meanwhile. That
call only applies the retention rule and puts plain data on a bounded queue; a writer thread
decodes the token texts, builds the columns of :data:`~areal_agents.record.schema.SCHEMA` and
writes ``episodes/step-NNNNNN.parquet`` atomically (a temporary name, then a rename), zstd
compressed; every :data:`~areal_agents.record.schema.INDEX_EVERY` steps it writes the index file of
their light columns. A failed write costs one warning line and that step's file, never the run.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from areal_agents.failures import failure_cause
from areal_agents.record.schema import INDEX_EVERY, LIGHT_COLUMNS, SCHEMA, index_file, step_file
from areal_agents.types import Trajectory

__all__ = ["EpisodeRecorder", "Recorded", "build_table", "failure_text"]

log = logging.getLogger("areal_agents.record")

_STOP = object()
_STATISTICS = ["episode_id", "step", "group_id", "status"]  # what readers filter on; other statistics cost bytes
_DICTIONARY = ["env", "status", "token_text"]  # few distinct values: dictionary-encoded


@dataclass(frozen=True)
class Recorded:
    """One trajectory to record: its ``episode_id`` (unique in the run), its index in its group,
    and, for a trained one, the advantage of each token as the loss used it (``None``: all 0)."""

    episode_id: str
    group_index: int
    traj: Trajectory
    advantages: np.ndarray | Sequence[float] | None = None


@dataclass(frozen=True)
class _Step:
    step: int
    policy_version: int
    rows: list[Recorded]


def failure_text(traj: Trajectory) -> str:
    """``""`` for an ``ok`` trajectory, else ``component: cause`` with only the last line of the
    cause (the exception's own line, not its traceback)."""
    if traj.ok:
        return ""
    cause = failure_cause(traj)
    lines = [line for line in cause.splitlines() if line.strip()]
    head = cause.split(":", 1)[0]
    last = lines[-1].strip() if lines else traj.status
    return last if last.startswith(f"{head}:") else f"{head}: {last}"


class _Decoder:
    """Token texts, each id decoded once (the vocabulary is small next to the tokens of a run)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pieces: dict[int, str] = {}

    def piece(self, token: int) -> str:
        text = self.pieces.get(token)
        if text is None:
            text = (str(token) if self.tokenizer is None
                    else str(self.tokenizer.decode([token], skip_special_tokens=False)))
            self.pieces[token] = text
        return text

    def text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


def _messages(traj: Trajectory, pieces: list[str]) -> list[dict[str, Any]]:
    """The conversation: the agent's own ``info["messages"]`` when it kept them, else the token
    spans in order, each generated turn an ``assistant`` message and the tokens between turns
    (prompt, env replies, tool outputs, with the chat template's markup) a ``user`` message."""
    kept = traj.info.get("messages")
    if isinstance(kept, list):
        return [m for m in kept if isinstance(m, dict)]
    out: list[dict[str, Any]] = []
    at = 0
    for start, end in [*traj.turn_spans, (len(pieces), len(pieces))]:
        if start > at:
            out.append({"role": "user", "content": "".join(pieces[at:start])})
        if end > start:
            out.append({"role": "assistant", "content": "".join(pieces[start:end])})
        at = max(at, end)
    return out


def _row(item: Recorded, step: int, policy_version: int, env: str, decoder: _Decoder) -> dict[str, Any]:
    traj = item.traj
    n = len(traj.input_ids)
    pieces = [decoder.piece(int(t)) for t in traj.input_ids]
    generated = [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m and v >= 0]
    mask = np.asarray(traj.loss_mask, dtype=np.int8)
    if item.advantages is None:
        adv = np.zeros(n, dtype=np.float32)
    else:
        adv = np.asarray(item.advantages, dtype=np.float32)[:n] * (mask != 0)
    success = traj.info.get("success")
    messages = _messages(traj, pieces)
    first_user = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    info = {k: v for k, v in traj.info.items() if k != "messages"}
    calls = traj.info.get("calls")
    vmin = min(generated) if generated else -1
    return {
        "episode_id": item.episode_id, "step": step, "group_id": traj.group_id, "group_index": item.group_index,
        "env": env, "status": traj.status, "failure": failure_text(traj), "reward": float(traj.reward),
        "success": None if success is None else bool(success), "n_turns": len(traj.turn_spans), "n_tokens": n,
        "n_trained": int(mask.sum()), "version_min": vmin, "version_max": max(generated) if generated else -1,
        "staleness": policy_version - vmin if generated else 0,
        "prompt": traj.prompt_text or (first_user if isinstance(first_user, str) else ""),
        "text": decoder.text(traj.input_ids), "input_ids": traj.input_ids, "token_text": pieces, "loss_mask": mask,
        "logprobs": np.asarray(traj.logprobs, dtype=np.float32), "versions": traj.versions, "advantages": adv,
        "turn_spans": [list(s) for s in traj.turn_spans], "turn_rewards": traj.turn_rewards,
        "turn_returns": traj.turn_returns, "messages": json.dumps(messages, ensure_ascii=False, default=str),
        "info": json.dumps(info, ensure_ascii=False, default=str),
        "calls": json.dumps(calls if isinstance(calls, list) else [], ensure_ascii=False, default=str),
    }


def build_table(rows: Sequence[Recorded], step: int, policy_version: int, env: str = "",
                tokenizer: Any = None) -> pa.Table:
    """The record of one step as a table of :data:`SCHEMA` (``tokenizer`` decodes the token
    texts; without one they are the ids as text)."""
    decoder = _Decoder(tokenizer)
    built = [_row(item, step, policy_version, env, decoder) for item in rows]
    return pa.Table.from_pydict({name: [r[name] for r in built] for name in SCHEMA.names}, schema=SCHEMA)


class EpisodeRecorder:
    """Writes each training step's episodes to ``run_dir/episodes/`` on a thread of its own.

    ``keep``: the groups kept per step (``None``: all; 0 records nothing and starts no thread);
    failed episodes are kept up to ``keep`` groups' worth of them. ``env`` names the env in every
    row; ``tokenizer`` decodes the token texts (on the writer thread). At most ``queue_size``
    steps wait to be written: a step recorded while the queue is full waits for room, so memory
    stays bounded. :meth:`close` writes what is queued and stops the thread (idempotent).
    """

    def __init__(self, run_dir: str | Path, *, keep: int | None = None, env: str = "", tokenizer: Any = None,
                 queue_size: int = 4) -> None:
        if keep is not None and keep < 0:
            raise ValueError(f"keep must be >= 0 or None for all (got {keep})")
        self.run_dir, self.keep, self.env, self.tokenizer = Path(run_dir), keep, env, tokenizer
        self.written: list[int] = []  # steps whose file is on disk
        self.failed_writes = 0
        self._queue: queue.Queue[_Step | object] = queue.Queue(maxsize=max(1, queue_size))
        self._thread: threading.Thread | None = None
        self._light: dict[int, pa.Table] = {}  # light columns of the steps written since the last index file
        if keep != 0:
            self._thread = threading.Thread(target=self._work, name="episode-recorder", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._thread is not None

    def _first_groups(self, rows: Sequence[Recorded]) -> list[Recorded]:
        """The rows of the first ``keep`` groups (all rows when ``keep`` is None)."""
        if self.keep is None:
            return list(rows)
        groups: set[str] = set()
        out = []
        for r in rows:
            if r.traj.group_id not in groups:
                if len(groups) >= self.keep:
                    continue
                groups.add(r.traj.group_id)
            out.append(r)
        return out

    def record(self, step: int, trained: Sequence[Recorded], failed: Sequence[Recorded] = (), *,
               policy_version: int = 0) -> None:
        """Queue the record of training step ``step``: the ``trained`` trajectories (the first
        ``keep`` groups of them) and the ``failed`` ones dropped meanwhile; ``policy_version`` is
        the weight version the step trained (a row's staleness is it minus its oldest token's)."""
        if self._thread is None:
            return
        rows = self._first_groups(trained)
        if self.keep is None:
            rows += failed
        else:  # as many failed episodes as ``keep`` groups hold
            per_group = len(trained) // max(1, len({r.traj.group_id for r in trained})) or 1
            rows += failed[: self.keep * per_group]
        self._queue.put(_Step(step, policy_version, rows))

    def close(self, timeout: float = 120.0) -> None:
        """Write what is queued, then stop the writer thread (at most ``timeout`` seconds)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("episode record: the writer did not finish within %s s; the last steps may be missing",
                        timeout)

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writer thread
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, _Step)
            try:
                self._write(item)
            except Exception as exc:  # noqa: BLE001 - a full or broken disk must not stop training
                self.failed_writes += 1
                if self.failed_writes == 1:
                    log.warning("episode record: step %d not written (%s: %s); training goes on, later "
                                "failures are not reported", item.step, type(exc).__name__, exc)

    def _write(self, item: _Step) -> None:
        table = build_table(item.rows, item.step, item.policy_version, self.env, self.tokenizer)
        _write_atomically(table, step_file(self.run_dir, item.step))
        self.written.append(item.step)
        self._light[item.step] = table.select(list(LIGHT_COLUMNS))
        if item.step % INDEX_EVERY == 0:
            self._write_index(item.step)

    def _write_index(self, last: int) -> None:
        """The light columns of steps ``last - INDEX_EVERY + 1 .. last`` in one file: those written
        by this recorder from memory, the others (a resumed run's) from their step files."""
        parts = []
        for step in range(last - INDEX_EVERY + 1, last + 1):
            part = self._light.pop(step, None)
            path = step_file(self.run_dir, step)
            if part is None and path.is_file():
                part = pq.read_table(path, columns=list(LIGHT_COLUMNS), schema=SCHEMA)
            if part is not None:
                parts.append(part)
        self._light = {s: t for s, t in self._light.items() if s > last}
        if parts:
            _write_atomically(pa.concat_tables(parts), index_file(self.run_dir, last))


def _write_atomically(table: pa.Table, path: Path) -> None:
    """``table`` to ``path`` under a temporary name, then renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        stats = [c for c in _STATISTICS if c in table.column_names]
        pq.write_table(table, tmp, compression="zstd", write_statistics=stats,
                       use_dictionary=[c for c in _DICTIONARY if c in table.column_names])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
