"""The tiny default model of an env: its tokenizer learns the env's own text.

:func:`ensure_env_tiny_model` is the first half of the warm start (:func:`trainers.sft.ensure_warm_model`):
it builds (once, cached) the tiny model of :mod:`trainers.tiny_model` on the text of the env's
training rows (:func:`corpus_text`: prompts and reference replies, a reference conversation as the
chat template renders it) and what the env answers to wrong replies (:func:`probe_replies`).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents.config import ExperimentConfig
from areal_agents.env import reference_completion, reference_conversation

if TYPE_CHECKING:
    from areal_agents.env import Env

__all__ = ["CORPUS_ROWS", "corpus_text", "ensure_env_tiny_model", "probe_replies"]

CORPUS_ROWS = 5000  # training rows whose text the tokenizer learns from


def corpus_text(env: Env, row: dict[str, Any]) -> str:
    """The text of a row the tiny model's tokenizer learns from: its prompt and reference (a
    reference conversation as the tiny model's chat template renders it, tool specs included)."""
    conv = reference_conversation(env, row)
    if conv is None:
        return str(row["prompt"]) + " " + str(reference_completion(env, row) or "")
    import jinja2.sandbox

    from trainers.tiny_model import CHAT_TEMPLATE

    jinja = jinja2.sandbox.ImmutableSandboxedEnvironment()
    jinja.filters["tojson"] = json.dumps
    return jinja.from_string(CHAT_TEMPLATE).render(messages=conv, tools=getattr(env, "tools", None),
                                                   add_generation_prompt=False)


def probe_replies(env: Env, rows: Sequence[dict[str, Any]], n: int = 64, budget_s: float = 60.0) -> list[str]:
    """What ``env`` answers to wrong first replies, for the tokenizer to learn: an empty reply
    and another row's reference, on each of the first ``n`` rows (an env that fails is skipped).
    A reference conversation shows only the answers a methodical player gets, but a policy also
    reads ``Invalid expression.`` and the like, which a tokenizer that never saw them spells out
    byte by byte. A single-turn env answers nothing. The built-in envs take under 5 s (python-tool,
    one sandbox run a probe); an env slower than ``budget_s`` in all is cut short with a warning,
    as the tokenizer then depends on the machine's speed."""
    out: list[str] = []
    deadline = time.monotonic() + budget_s
    rows = list(rows[:n])
    for i, row in enumerate(rows):
        other = reference_completion(env, rows[(i + 1) % len(rows)]) or ""
        for action in dict.fromkeys(("", other)):
            if time.monotonic() > deadline:
                warnings.warn(f"{type(env).__name__}: probing its replies for the tiny tokenizer took over {budget_s:g} s; "
                              f"kept the first {len(out)}", RuntimeWarning, stacklevel=2)
                return out
            try:
                env.reset(seed=0, options=dict(row))
                obs = env.step(action)[0]
            except Exception:  # noqa: BLE001  (a probe only: the env checker reports failing envs)
                continue
            if isinstance(obs, list):  # messages
                out.extend(str(m.get("content") or "") for m in obs if isinstance(m, dict))
            elif obs:
                out.append(str(obs))
    return out


def ensure_env_tiny_model(cfg: ExperimentConfig, env: Env, rows: Sequence[dict[str, Any]]) -> Path:
    """The tiny model of ``cfg.env`` (:func:`~trainers.tiny_model.ensure_tiny_model`, cached under the
    env's name): built on first use from the :func:`corpus_text` of ``env`` on the first
    :data:`CORPUS_ROWS` of ``rows`` and the :func:`probe_replies` of another env of the same kind."""
    from areal_agents.gym.registration import make_env
    from trainers.tiny_model import ensure_tiny_model

    def corpus() -> list[str]:
        probe = make_env(cfg.env.name, **cfg.env.kwargs)
        try:
            return [*(corpus_text(env, r) for r in rows[:CORPUS_ROWS]), *probe_replies(probe, rows)]
        finally:
            probe.close()

    return ensure_tiny_model(cfg.env.name, corpus)
