"""docs/config.md's default column is what a run with no settings uses: where the default algorithm
sets a key over the dataclass (as ``config show`` reports, source ``algorithm grpo``), the page shows
that value, marked, and says what the other built-in algorithms set."""

from __future__ import annotations

import functools
import re

from algorithms.specs import GRPO, AlgorithmSpec
from areal_agents.config.doc import builtin_algorithm_defaults, config_reference
from areal_agents.config.loader import explain_config
from areal_agents.registry import algorithms

ROW = re.compile(r"^\| `([a-z_.]+)` \| `[^`]*` \| (.*?) \| (.*) \|$", re.M)


def _rows() -> dict[str, tuple[str, str]]:
    """key -> (default cell, meaning) of the "Every key" tables."""
    every_key = config_reference().split("## Every key", 1)[1]
    return {key: (default, meaning) for key, default, meaning in ROW.findall(every_key)}


def test_keys_the_default_algorithm_sets_show_the_run_s_value_and_its_source() -> None:
    cfg, sources = explain_config()
    by_algorithm = {key: source for key, source in sources.items() if source.startswith("algorithm ")}
    assert {"algorithm.use_decoupled_loss", "algorithm.recompute_logprob", "algorithm.loss_agg_mode"} <= set(by_algorithm)
    rows = _rows()
    for key, source in by_algorithm.items():
        value = functools.reduce(getattr, key.split("."), cfg)
        assert rows[key][0] == f"`{value!r}` ({source})", key
    assert rows["algorithm.use_decoupled_loss"][0] == "`False` (algorithm grpo)"
    marked = {key for key, (default, _) in rows.items() if "(algorithm " in default}
    assert marked == set(by_algorithm)


def test_each_key_an_algorithm_sets_names_the_built_ins_that_set_it() -> None:
    rows = _rows()
    meaning = rows["algorithm.use_decoupled_loss"][1]
    assert "`True` by decoupled-ppo" in meaning and "`False` by dapo, dr-grpo, gigpo, grpo," in meaning
    assert "Set by the algorithm" not in rows["algorithm.credit"][1]  # no built-in sets it


def test_only_built_in_algorithms_are_listed() -> None:
    algorithms.add("doc-test-algo", AlgorithmSpec(name="doc-test-algo", advantage=GRPO.advantage,
                                                  defaults={"use_decoupled_loss": True}))
    try:
        listed = builtin_algorithm_defaults()
        assert "doc-test-algo" not in listed and "grpo" in listed and "decoupled-ppo" in listed
        assert listed["grpo"]["algorithm.use_decoupled_loss"] is False
    finally:
        algorithms.remove("doc-test-algo")
