"""Datasets: seeded synthetic arithmetic, local JSONL / GSM8K / Parquet files.

A dataset is a registered factory ``fn(split: str, **kwargs) -> list[dict]``; every row
has at least ``prompt`` and ``answer`` and is passed to ``env.reset(options=row)``.
"""

from __future__ import annotations

import inspect
import json
import operator
import os
import random
import threading
from typing import TYPE_CHECKING, Any

from areal_agents.failures import UserError
from areal_agents.registry import datasets, envs

if TYPE_CHECKING:
    from areal_agents.config import ExperimentConfig

__all__ = [
    "DatasetError",
    "arithmetic_dataset",
    "default_rows",
    "gsm8k_dataset",
    "jsonl_dataset",
    "load_dataset_rows",
    "read_records",
]

SPLITS = ("train", "test")
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class DatasetError(UserError, ValueError):
    """A dataset file or argument is unusable; the message names the file, line and field."""


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DatasetError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")


def _in_test_split(a: int, b: int, op: str, test_fraction: float) -> bool:
    # A fixed hash of the problem (not Python's salted hash): the split never depends on seed or size.
    h = (a * 1_000_003 + b * 7_919 + ord(op) * 104_729) % 1_000_000_007
    h = (h * 2_654_435_761) % 4_294_967_296
    return h / 4_294_967_296 < test_fraction


def arithmetic_dataset(
    split: str = "train",
    *,
    size: int | None = None,
    seed: int = 0,
    ops: tuple[str, ...] | list[str] = ("+",),
    low: int = 10,
    high: int = 99,
    test_fraction: float = 0.1,
    template: str = "{a}{op}{b}=",
    **kw: Any,
) -> list[dict[str, Any]]:
    """Seeded ``a op b`` problems with operands in ``[low, high]``.

    Each problem belongs to exactly one split (by a fixed hash, ``test_fraction`` of them to
    ``test``), so train and test never share a problem whatever ``size`` or ``seed`` is.
    ``size`` rows are drawn from the split's problems in a seeded order (repeating the
    order when ``size`` exceeds them); ``None`` returns each problem once. Rows:
    ``{"prompt": "37+45=", "answer": "82", "a": 37, "b": 45, "op": "+", "expression": "37+45"}``.
    """
    _check_split(split)
    if kw:
        raise DatasetError(f"arithmetic_dataset: unknown argument(s) {', '.join(sorted(kw))}")
    if not ops or not set(ops) <= _OPS.keys():
        raise DatasetError(f"arithmetic_dataset: ops must be a non-empty subset of {list(_OPS)} (got {list(ops)})")
    if low > high:
        raise DatasetError(f"arithmetic_dataset: low must be <= high (got {low} > {high})")
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"arithmetic_dataset: test_fraction must be in (0, 1) (got {test_fraction})")
    want_test = split == "test"
    pool = [
        (a, b, op)
        for op in ops
        for a in range(low, high + 1)
        for b in range(low, high + 1)
        if _in_test_split(a, b, op, test_fraction) == want_test
    ]
    if not pool:
        raise DatasetError(f"arithmetic_dataset: the {split} split is empty for low={low}, high={high}")
    random.Random(f"arithmetic:{split}:{seed}").shuffle(pool)
    n = len(pool) if size is None else int(size)
    return [
        {"prompt": template.format(a=a, b=b, op=op), "answer": str(_OPS[op](a, b)), "a": a, "b": b, "op": op,
         "expression": f"{a}{op}{b}"}
        for a, b, op in (pool[i % len(pool)] for i in range(n))
    ]


# -- files -------------------------------------------------------------------------------------


def _split_path(path: str | None, split: str, who: str, unknown: dict[str, Any]) -> str:
    """The file dataset ``who`` reads for ``split``, after checking its arguments."""
    _check_split(split)
    if unknown:
        raise DatasetError(f"{who}: unknown argument(s) {', '.join(sorted(unknown))}")
    if not path:
        raise DatasetError(f"{who}: needs path=<file> (set data.path)")
    path = os.path.expanduser(path.format(split=split) if "{split}" in path else path)
    if not os.path.isfile(path):
        raise DatasetError(f"{who}: no such file {path!r}")
    return path


def read_records(path: str, what: str = "records") -> list[tuple[int, dict[str, Any]]]:
    """``(line_number, record)`` pairs of a JSONL or Parquet file; errors name file and line
    (a file without records: ``the file has no <what>``)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # a dependency; imported where Parquet is read
        try:
            records = list(enumerate(pq.read_table(path).to_pylist(), 1))
        except Exception as exc:  # pyarrow's errors for a truncated or foreign file
            raise DatasetError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    else:
        records = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise DatasetError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
                records.append((lineno, record))
    if not records:
        raise DatasetError(f"{path}: the file has no {what}")
    return records


def _field(path: str, lineno: int, record: dict[str, Any], name: str) -> Any:
    if name not in record:
        raise DatasetError(f"{path}:{lineno}: missing field {name!r} (fields: {', '.join(sorted(record))})")
    value = record[name]
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DatasetError(f"{path}:{lineno}: field {name!r} is empty")
    return value


def jsonl_dataset(
    split: str = "train",
    *,
    path: str | None = None,
    size: int | None = None,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    **kw: Any,
) -> list[dict[str, Any]]:
    """Rows of a local JSONL (or Parquet) file; ``{split}`` in ``path`` selects the file per split.

    Each record needs ``prompt_field`` and ``answer_field`` (renamed to ``prompt``/``answer``;
    other fields are kept). ``size`` keeps the first rows.
    """
    file = _split_path(path, split, "jsonl_dataset", kw)
    rows = [{**record, "prompt": str(_field(file, lineno, record, prompt_field)),
             "answer": str(_field(file, lineno, record, answer_field))} for lineno, record in read_records(file)]
    return rows[:size]


def gsm8k_dataset(
    split: str = "train", *, path: str | None = None, size: int | None = None, **kw: Any
) -> list[dict[str, Any]]:
    """GSM8K records (``question``, ``answer`` ending in ``#### N``) from a local JSONL/Parquet file.

    Rows: ``{"prompt": question, "answer": "N", "solution": original answer}``.
    """
    file = _split_path(path, split, "gsm8k_dataset", kw)
    rows = []
    for lineno, record in read_records(file):
        question = str(_field(file, lineno, record, "question"))
        solution = str(_field(file, lineno, record, "answer"))
        if "####" not in solution:
            raise DatasetError(f"{file}:{lineno}: field 'answer' has no '#### <number>' final line")
        final = solution.rsplit("####", 1)[1].strip().replace(",", "")
        if not final:
            raise DatasetError(f"{file}:{lineno}: field 'answer' has nothing after '####'")
        rows.append({"prompt": question, "answer": final, "solution": solution})
    return rows[:size]


# -- config glue -------------------------------------------------------------------------------


def load_dataset_rows(cfg: ExperimentConfig, split: str) -> list[dict[str, Any]]:
    """Rows for ``split`` as ``cfg`` describes them.

    The dataset is ``cfg.data.name`` or else the env's ``default_dataset`` (with the keyword
    arguments its ``dataset_kwargs_for(cfg.env.kwargs)`` gives, by default its
    ``default_dataset_kwargs``); ``cfg.data.kwargs`` are added, ``cfg.data.path`` is passed
    as ``path`` when set, and ``size`` is ``cfg.data.train_size`` / ``test_size`` when the
    factory accepts it (file datasets keep their first rows).
    """
    _check_split(split)
    kwargs: dict[str, Any] = {}
    name = cfg.data.name
    if name is None:
        env_cls = envs.get(cfg.env.name)
        name = getattr(env_cls, "default_dataset", None)
        if not name:
            raise DatasetError(f"env {cfg.env.name!r} has no default_dataset: set data.name")
        kwargs_for = getattr(env_cls, "dataset_kwargs_for", None)  # a DatasetMixin env's; other envs may lack it
        kwargs.update(kwargs_for(dict(cfg.env.kwargs)) if callable(kwargs_for)
                      else getattr(env_cls, "default_dataset_kwargs", {}) or {})
    kwargs.update(cfg.data.kwargs)
    if cfg.data.path is not None:
        kwargs["path"] = cfg.data.path
    return _call_dataset(name, datasets.get(name), split, kwargs,
                         cfg.data.train_size if split == "train" else cfg.data.test_size)


def _call_dataset(name: str, factory: Any, split: str, kwargs: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """``factory(split, **kwargs)`` (with ``size`` when it takes one and ``kwargs`` set none), checked
    to be a list of dict rows."""
    if "size" in inspect.signature(factory).parameters and "size" not in kwargs:
        kwargs = {**kwargs, "size": size}
    try:
        rows = factory(split, **kwargs)
    except TypeError as exc:
        raise DatasetError(f"dataset {name!r}: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DatasetError(f"dataset {name!r} must return a list of dict rows (got {type(rows).__name__})")
    return rows


_ROWS: dict[tuple[str, str], tuple[Any, list[dict[str, Any]]]] = {}  # (dataset, kwargs) -> (factory, rows)
_ROWS_LOCK = threading.Lock()


def default_rows(name: str, dataset_kwargs: dict[str, Any], size: int = 256) -> list[dict[str, Any]]:
    """The ``train`` rows of dataset ``name`` called with ``dataset_kwargs`` (and ``size`` when the
    factory takes it and the kwargs do not set it), which an env without a reset row draws from.
    They are loaded once, and again only when ``name`` is registered to another factory."""
    factory = datasets.get(name)
    key = (name, repr(sorted(dataset_kwargs.items())))
    with _ROWS_LOCK:
        cached = _ROWS.get(key)
        if cached is not None and cached[0] is factory:
            return cached[1]
        rows = _call_dataset(name, factory, "train", dict(dataset_kwargs), size)
        if not rows:
            raise DatasetError(f"dataset {name!r} ({dataset_kwargs}) gave no rows to draw from")
        _ROWS[key] = (factory, rows)
        return rows
