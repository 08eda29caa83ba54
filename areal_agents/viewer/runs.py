"""What the viewer reads from one run directory: ``metrics.jsonl`` (incrementally, by byte offset),
``config.yaml`` (flattened to dotted keys) and the episode record (through :mod:`areal_agents.record`).

Filters and paging of the episode table run here, over the record's light summary with pyarrow
compute, so the page receives one page of rows however many episodes the run recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from areal_agents.record import episode, group, record_files, summary

__all__ = ["EpisodeQuery", "Run", "flatten_config", "read_metrics_from"]

SORTABLE = {"step", "reward", "n_turns", "n_tokens", "n_trained", "staleness", "version_min", "episode_id"}
MAX_PAGE = 500


def read_metrics_from(path: Path, offset: int, limit_bytes: int = 8 << 20) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``metrics.jsonl`` after byte ``offset`` and the offset to read from next time.
    Only whole lines are taken (a row being written stays for the next read); unreadable lines are skipped."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(limit_bytes)
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    rows = []
    for line in chunk[:end].splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, offset + end


def flatten_config(tree: Any, prefix: str = "") -> dict[str, str]:
    """``{"actor.lr": "1e-05", ...}``: every leaf of a resolved config, shown as one line of YAML."""
    if isinstance(tree, dict) and tree:
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten_config(value, f"{prefix}{key}."))
        return out
    shown = yaml.safe_dump(tree, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()
    return {prefix.removesuffix("."): shown}


@dataclass
class EpisodeQuery:
    """The filters of the episode table; ``None`` or ``""`` leaves a filter off."""

    step_min: int | None = None
    step_max: int | None = None
    version: int | None = None  # a version within [version_min, version_max]
    reward_min: float | None = None
    reward_max: float | None = None
    success: bool | None = None
    status: str = ""  # "failed" means any status but ok
    env: str = ""
    turns: int | None = None
    q: str = ""  # case-insensitive substring of the id, prompt, failure or whole text
    group: str = ""
    sort: str = "step"
    desc: bool = False
    page: int = 0
    size: int = 50


@dataclass
class Run:
    """One run directory as the viewer serves it; ``name`` is what the page and the links call it.
    Episodes are read through :mod:`areal_agents.record` (whose summary re-reads only changed step files)."""

    name: str
    path: Path
    _texts: dict[tuple[str, int, int], pa.Table] = field(default_factory=dict)

    def config(self) -> dict[str, str]:
        """The run's resolved config (``config.yaml``), flattened; empty when the run has none yet."""
        try:
            return flatten_config(yaml.safe_load((self.path / "config.yaml").read_text(encoding="utf-8")) or {})
        except (OSError, yaml.YAMLError):
            return {}

    def metrics(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        return read_metrics_from(self.path / "metrics.jsonl", offset)

    def _table(self) -> pa.Table:
        return summary(self.path)

    def text_hits(self, needle: str) -> pa.Array:
        """The ids of the episodes whose whole text holds ``needle`` (any case). The record's reader
        has no cached text column, so the viewer keeps one per step file (read on the first search)."""
        ids = []
        keep = {}
        for path in record_files(self.path):
            stat = path.stat()
            key = (str(path), stat.st_size, stat.st_mtime_ns)
            table = self._texts.get(key)
            if table is None:
                table = pq.read_table(path, columns=["episode_id", "text"])
            keep[key] = table
            hit = pc.fill_null(pc.match_substring(table.column("text"), needle, ignore_case=True), False)
            ids.append(table.column("episode_id").filter(hit).combine_chunks())
        self._texts = keep
        return pa.concat_arrays(ids) if ids else pa.array([], pa.string())

    def facets(self) -> dict[str, list[Any]]:
        """The values the filters offer: statuses, envs, the step range."""
        table = self._table()
        steps = table.column("step")
        return {"status": sorted(pc.unique(table.column("status")).to_pylist()),
                "env": sorted(pc.unique(table.column("env")).to_pylist()),
                "steps": [pc.min(steps).as_py(), pc.max(steps).as_py()] if len(table) else [None, None]}

    def episodes(self, query: EpisodeQuery) -> dict[str, Any]:
        """One page of the filtered table: ``{"total": N, "rows": [...], "page": P, "size": S}``."""
        table = self._table()
        mask = self._mask(table, query)
        if mask is not None:
            table = table.filter(mask)
        sort = query.sort if query.sort in SORTABLE else "step"
        if sort != "step" or query.desc:
            table = table.sort_by([(sort, "descending" if query.desc else "ascending")])
        size = max(1, min(query.size, MAX_PAGE))
        page = max(0, query.page)
        rows = table.slice(page * size, size).to_pylist()
        return {"total": len(table), "rows": rows, "page": page, "size": size}

    def _mask(self, table: pa.Table, q: EpisodeQuery) -> pa.ChunkedArray | None:
        conds: list[Any] = []
        col = table.column
        if q.step_min is not None:
            conds.append(pc.greater_equal(col("step"), q.step_min))
        if q.step_max is not None:
            conds.append(pc.less_equal(col("step"), q.step_max))
        if q.version is not None:
            conds.append(pc.and_(pc.less_equal(col("version_min"), q.version),
                                 pc.greater_equal(col("version_max"), q.version)))
        if q.reward_min is not None:
            conds.append(pc.greater_equal(col("reward"), q.reward_min))
        if q.reward_max is not None:
            conds.append(pc.less_equal(col("reward"), q.reward_max))
        if q.success is not None:
            conds.append(pc.equal(col("success"), q.success))
        if q.status == "failed":
            conds.append(pc.not_equal(col("status"), "ok"))
        elif q.status:
            conds.append(pc.equal(col("status"), q.status))
        if q.env:
            conds.append(pc.equal(col("env"), q.env))
        if q.turns is not None:
            conds.append(pc.equal(col("n_turns"), q.turns))
        if q.group:
            conds.append(pc.equal(col("group_id"), q.group))
        if q.q:
            hit = [pc.match_substring(col(c), q.q, ignore_case=True) for c in ("episode_id", "prompt", "failure")]
            hit.append(pc.is_in(col("episode_id"), value_set=self.text_hits(q.q)))
            conds.append(pc.or_(pc.or_(hit[0], hit[1]), pc.or_(hit[2], hit[3])))
        if not conds:
            return None
        mask = conds[0]
        for cond in conds[1:]:
            mask = pc.and_(mask, cond)
        return pc.fill_null(mask, False)

    def episode(self, episode_id: str) -> dict[str, Any] | None:
        """Every column of one episode (the JSON columns parsed), or None when the run has no such episode."""
        try:
            return _decoded(episode(self.path, episode_id))
        except KeyError:
            return None

    def group(self, step: int, group_id: str) -> list[dict[str, Any]]:
        """The samples of one group of one step, by their index in the group."""
        return [_decoded(r) for r in group(self.path, step, group_id)]


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    for key in ("messages", "info", "calls"):
        value = row.get(key)
        if isinstance(value, str):
            try:
                row[key] = json.loads(value)
            except ValueError:
                row[key] = value  # shown as the text it is
    row.pop("text", None)  # the page shows the messages and the tokens instead
    return row
