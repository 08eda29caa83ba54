"""Reading a run's episode record back: a pyarrow table for notebooks, the light summary for tables,
one episode or one group for a closer look (no torch).

>>> from areal_agents.record import load
>>> df = load("runs/math/trial").to_pandas()          # doctest: +SKIP
>>> df[df.status != "ok"][["step", "episode_id", "failure"]]  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from areal_agents.record.schema import EPISODES_DIR, INDEX_EVERY, LIGHT_COLUMNS, SCHEMA, index_of, step_file, step_of

__all__ = ["episode", "group", "load", "record_files", "summary"]

_SUMMARY_SCHEMA = pa.schema([SCHEMA.field(name) for name in LIGHT_COLUMNS])
# (path, size, mtime_ns) -> the file's light columns: a live viewer re-reads only new or rewritten steps
_summary_cache: dict[tuple[str, int, int], pa.Table] = {}
_cache_lock = threading.Lock()


def record_files(run_dir: str | Path, steps: Iterable[int] | None = None) -> list[Path]:
    """The step files of ``run_dir``'s record, by step (only ``steps`` when given); a run without
    a record (yet) has none, a ``run_dir`` that does not exist is a ``FileNotFoundError``."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"no such run directory: {run_dir}")
    folder = Path(run_dir) / EPISODES_DIR
    if steps is not None:
        return [p for p in (step_file(run_dir, s) for s in sorted(set(steps))) if p.is_file()]
    if not folder.is_dir():
        return []
    found = [(s, p) for p in folder.iterdir() if (s := step_of(p)) is not None]
    return [p for _, p in sorted(found)]


def _schema(columns: Sequence[str] | None) -> pa.Schema:
    if columns is None:
        return SCHEMA
    unknown = [c for c in columns if c not in SCHEMA.names]
    if unknown:
        raise ValueError(f"unknown record column(s) {unknown}; the columns are {SCHEMA.names}")
    return pa.schema([SCHEMA.field(c) for c in columns])


def load(run_dir: str | Path, columns: Sequence[str] | None = None, steps: Iterable[int] | None = None) -> pa.Table:
    """The recorded episodes of ``run_dir`` as one pyarrow table (``.to_pandas()`` for a data
    frame), ordered by step: every column of :data:`~areal_agents.record.schema.SCHEMA`, or only
    ``columns``; every step, or only ``steps``. A run without a record gives an empty table."""
    schema = _schema(columns)
    files = record_files(run_dir, steps)
    if not files:
        return schema.empty_table()
    table = ds.dataset([str(p) for p in files], schema=SCHEMA, format="parquet").to_table(columns=schema.names)
    return table


def _key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return (str(path), stat.st_size, stat.st_mtime_ns)


def _light(path: Path, key: tuple[str, int, int] | None = None) -> pa.Table:
    """The light columns of one step or index file, cached by (path, size, mtime)."""
    key = key or _key(path)
    with _cache_lock:
        hit = _summary_cache.get(key)
    if hit is not None:
        return hit
    table = pq.read_table(path, columns=list(LIGHT_COLUMNS), schema=SCHEMA)
    with _cache_lock:
        for old in [k for k in _summary_cache if k[0] == key[0]]:
            del _summary_cache[old]
        _summary_cache[key] = table
    return table


def _indexed(folder: Path, steps: dict[int, tuple[str, int, int]]) -> tuple[list[pa.Table], set[int]]:
    """The index files that still hold their steps (none of those step files is newer than the index,
    none is gone), and the steps they cover."""
    parts: list[pa.Table] = []
    covered: set[int] = set()
    for path in sorted(folder.glob("index-*.parquet")):
        last = index_of(path)
        if last is None:
            continue
        key = _key(path)
        members = [s for s in range(last - INDEX_EVERY + 1, last + 1) if s in steps]
        if not members or any(steps[s][2] > key[2] for s in members):
            continue  # a step trained again (a resumed run) or written after the index: read the step files
        table = _light(path, key)
        if not set(pc.unique(table["step"]).to_pylist()) <= set(members):
            continue
        parts.append(table)
        covered.update(members)
    return parts, covered


def summary(run_dir: str | Path) -> pa.Table:
    """The light columns (:data:`~areal_agents.record.schema.LIGHT_COLUMNS`: no token lists, no
    whole text or JSON) of every recorded episode, ordered by step: from the index files where they
    are current, else from the step files. Files already read, unchanged since, are not read again."""
    files = record_files(run_dir)
    if not files:
        return _SUMMARY_SCHEMA.empty_table()
    steps = {step_of(p) or 0: _key(p) for p in files}
    parts, covered = _indexed(Path(run_dir) / EPISODES_DIR, steps)
    rest = [(p, steps[step_of(p) or 0]) for p in files if step_of(p) not in covered]
    with _cache_lock:
        missing = [p for p, key in rest if key not in _summary_cache]
    if len(missing) > 8:  # many files: one multi-threaded scan, cut into the files' steps for the cache
        _cache_scan(missing)
    parts += [_light(p, key) for p, key in rest]
    table = pa.concat_tables(parts)
    return table.sort_by([("step", "ascending")]) if covered else table


def _cache_scan(paths: list[Path]) -> None:
    """Read the light columns of ``paths`` in one scan and cache each file's part (a file holds one step)."""
    keys: dict[int, tuple[str, int, int]] = {}
    for path in paths:
        stat = path.stat()
        keys[step_of(path) or 0] = (str(path), stat.st_size, stat.st_mtime_ns)  # record_files: step files only
    fresh = ds.dataset([str(p) for p in paths], schema=SCHEMA, format="parquet").to_table(
        columns=list(LIGHT_COLUMNS)).sort_by([("step", "ascending")])
    steps = fresh["step"].to_numpy()
    with _cache_lock:
        for step, key in keys.items():
            lo, hi = int(np.searchsorted(steps, step, "left")), int(np.searchsorted(steps, step, "right"))
            for old in [k for k in _summary_cache if k[0] == key[0]]:
                del _summary_cache[old]
            _summary_cache[key] = fresh.slice(lo, hi - lo)


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()  # type: ignore[no-any-return]


def episode(run_dir: str | Path, episode_id: str) -> dict[str, Any]:
    """Every column of one recorded episode (the latest step's, should a resumed run have
    recorded it twice); ``KeyError`` when the record holds no such episode."""
    light = summary(run_dir).select(["episode_id", "step"])
    hits = light.filter(pc.equal(light["episode_id"], episode_id))
    if hits.num_rows == 0:
        raise KeyError(f"no episode {episode_id!r} in the record of {run_dir}")
    step = int(hits["step"][hits.num_rows - 1].as_py())
    table = pq.read_table(step_file(run_dir, step), schema=SCHEMA, filters=[("episode_id", "=", episode_id)])
    return _rows(table)[-1]


def group(run_dir: str | Path, step: int, group_id: str) -> list[dict[str, Any]]:
    """Every column of the episodes of group ``group_id`` recorded at ``step``, by their index in
    the group (empty when there are none)."""
    path = step_file(run_dir, step)
    if not path.is_file():
        return []
    table = pq.read_table(path, schema=SCHEMA, filters=[("group_id", "=", group_id)])
    return sorted(_rows(table), key=lambda r: (r["group_index"], r["episode_id"]))
