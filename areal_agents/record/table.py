"""The episode record's rows: what one recorded trajectory holds, as a table of the schema (no torch).

:func:`build_table` turns a step's :class:`Recorded` trajectories into a table of
:data:`~areal_agents.record.schema.SCHEMA`: token texts (each id decoded once by
:class:`TokenTexts`), the conversation by role, the advantages at trained tokens, the failure's
last line. The writer process (:mod:`~areal_agents.record.writer`) calls it once per step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from areal_agents.failures import failure_cause
from areal_agents.record.schema import SCHEMA
from areal_agents.types import Trajectory

__all__ = ["Recorded", "TokenTexts", "build_table", "failure_text", "table_of"]


@dataclass(frozen=True)
class Recorded:
    """One trajectory to record: its ``episode_id`` (unique in the run), its index in its group,
    and, for a trained one, the advantage of each token as the loss used it (``None``: all 0)."""

    episode_id: str
    group_index: int
    traj: Trajectory
    advantages: np.ndarray | Sequence[float] | None = None


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


class TokenTexts:
    """Token texts: each id decoded once into a table indexed by id (the vocabulary is small next
    to the tokens of a run), so a row's pieces are one gather; whole texts decoded a step at a time."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.table = np.empty(0, dtype=object)  # table[i]: the text of id i, or None while not decoded
        backend = getattr(tokenizer, "backend_tokenizer", None)
        plain = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._batch = backend.decode_batch if backend is not None and plain else None

    def _decode_one(self, token: int) -> str:
        if self.tokenizer is None:
            return str(token)
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def pieces(self, ids: Sequence[int]) -> np.ndarray:
        """The text of each token of ``ids`` (an array of ``str``)."""
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size == 0:
            return np.empty(0, dtype=object)
        if int(arr.max()) >= len(self.table):
            grown = np.full(int(arr.max()) + 1, None, dtype=object)
            grown[: len(self.table)] = self.table
            self.table = grown
        got = self.table[arr]
        missing = got == None  # noqa: E711 - elementwise, on an object array
        if missing.any():
            for token in set(arr[missing].tolist()):
                self.table[token] = self._decode_one(token)
            got = self.table[arr]
        return got

    def texts(self, rows: Sequence[Sequence[int]]) -> list[str]:
        if self.tokenizer is None:
            return [" ".join(map(str, ids)) for ids in rows]
        if self._batch is not None:  # one call for the step: the fast tokenizer's own decode
            return [str(t) for t in self._batch([list(ids) for ids in rows], skip_special_tokens=False)]
        return [str(self.tokenizer.decode(list(ids), skip_special_tokens=False)) for ids in rows]


def _messages(traj: Trajectory, pieces: np.ndarray) -> list[dict[str, Any]]:
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


_TOKEN_DTYPES = {"input_ids": np.int32, "token_text": object, "loss_mask": np.int8, "logprobs": np.float32,
                 "versions": np.int32, "advantages": np.float32}  # the token-aligned columns, built as arrays


def _row(item: Recorded, step: int, policy_version: int, env: str, decoder: TokenTexts, text: str) -> dict[str, Any]:
    """One row: its plain columns as values, its token-aligned columns as arrays."""
    traj = item.traj
    n = len(traj.input_ids)
    pieces = decoder.pieces(traj.input_ids)
    mask = np.asarray(traj.loss_mask, dtype=np.int8)
    versions = np.asarray(traj.versions, dtype=np.int32)
    generated = versions[(mask != 0) & (versions >= 0)]
    if item.advantages is None:
        adv = np.zeros(n, dtype=np.float32)
    else:
        adv = np.asarray(item.advantages, dtype=np.float32)[:n] * (mask != 0)
    success = traj.info.get("success")
    messages = _messages(traj, pieces)
    first_user = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    info = {k: v for k, v in traj.info.items() if k != "messages"}
    calls = traj.info.get("calls")
    vmin = int(generated.min()) if generated.size else -1
    return {
        "episode_id": item.episode_id, "step": step, "group_id": traj.group_id, "group_index": item.group_index,
        "env": env, "status": traj.status, "failure": failure_text(traj), "reward": float(traj.reward),
        "success": None if success is None else bool(success), "n_turns": len(traj.turn_spans), "n_tokens": n,
        "n_trained": int(mask.sum()), "version_min": vmin,
        "version_max": int(generated.max()) if generated.size else -1,
        "staleness": policy_version - vmin if generated.size else 0,
        "prompt": traj.prompt_text or (first_user if isinstance(first_user, str) else ""),
        "text": text, "input_ids": np.asarray(traj.input_ids, dtype=np.int32), "token_text": pieces,
        "loss_mask": mask, "logprobs": np.asarray(traj.logprobs, dtype=np.float32), "versions": versions,
        "advantages": adv, "turn_spans": [list(s) for s in traj.turn_spans], "turn_rewards": traj.turn_rewards,
        "turn_returns": traj.turn_returns, "messages": json.dumps(messages, ensure_ascii=False, default=str),
        "info": json.dumps(info, ensure_ascii=False, default=str),
        "calls": json.dumps(calls if isinstance(calls, list) else [], ensure_ascii=False, default=str),
    }


def _token_column(parts: list[np.ndarray], offsets: pa.Array, kind: pa.DataType) -> pa.Array:
    """One token-aligned column: the rows' arrays end to end, cut at ``offsets``."""
    values = np.concatenate(parts) if parts else np.empty(0)
    return pa.ListArray.from_arrays(offsets, pa.array(values, type=kind.value_type), type=kind)


def build_table(rows: Sequence[Recorded], step: int, policy_version: int, env: str = "",
                tokenizer: Any = None) -> pa.Table:
    """The record of one step as a table of :data:`SCHEMA` (``tokenizer`` decodes the token
    texts; without one they are the ids as text)."""
    return table_of(rows, step, policy_version, env, TokenTexts(tokenizer))


def table_of(rows: Sequence[Recorded], step: int, policy_version: int, env: str, decoder: TokenTexts) -> pa.Table:
    """:func:`build_table` with ``decoder``'s cache of token texts."""
    texts = decoder.texts([item.traj.input_ids for item in rows])
    built = [_row(item, step, policy_version, env, decoder, text) for item, text in zip(rows, texts, strict=True)]
    offsets = pa.array(np.concatenate([[0], np.cumsum([r["n_tokens"] for r in built])]), type=pa.int32())
    columns = [_token_column([r[f.name] for r in built], offsets, f.type) if f.name in _TOKEN_DTYPES
               else pa.array([r[f.name] for r in built], type=f.type) for f in SCHEMA]
    return pa.Table.from_arrays(columns, schema=SCHEMA)
