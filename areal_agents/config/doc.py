"""The ``docs/config.md`` reference: every key, the keys to tune first, and each built-in env's defaults.

:func:`config_reference` is what ``areal-agents config markdown`` prints; the rows come
from the loader's one walk over the fields (``config_fields``, which also gives the keys a YAML file
may set) and the envs' ``default_config`` and recipes, so the page cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

from areal_agents.config.loader import config_fields, env_presets

__all__ = ["TUNE_FIRST", "builtin_algorithm_defaults", "builtin_env_defaults", "config_reference"]

# key -> why a user changes it first (the default shown next to it comes from the dataclass)
TUNE_FIRST: dict[str, str] = {
    "actor.path": "Your model (a Hugging Face directory or Hub id). Unset, the run builds and warm-starts the "
                  "tiny default model; set, there is no warm start ([gpu.md](gpu.md)).",
    "actor.lr": "Tuned for the tiny model. Billion-parameter models want about 1e-6.",
    "sampling.max_new_tokens": "Tokens per turn. 32 fits 2-digit sums; chain-of-thought math wants 512-1024.",
    "agent.max_tokens": "Tokens per episode over all turns; raise it with `sampling.max_new_tokens`.",
    "agent.system_prompt": "Instruct models follow one (e.g. the answer format your reward reads).",
    "rollout.batch_size": "Prompts per step; each gives `rollout.group_size` episodes (the batch is the product).",
    "rollout.group_size": "Samples per prompt for the group baseline: more gives a better baseline and "
                          "more groups with a learning signal.",
    "rollout.max_head_offpolicyness": "The staleness bound η: 0 is synchronous RL; 1-4 overlaps generation "
                                      "and training.",
    "rollout.group_filter": "`nonzero_std` trains only groups whose rewards differ (DAPO's dynamic sampling).",
    "trainer.total_steps": "Steps of the run (one weight version each).",
    "actor.dtype": "`bfloat16` on a GPU.",
    "trainer.device": "`cuda` on a GPU.",
    "inference.backend": "`sglang` on a GPU; `remote` to attach to servers started separately.",
    "sglang.mem_fraction_static": "The GPU memory SGLang takes; lower it when the trainer shares the GPU.",
    "actor.gradient_checkpointing": "Trades compute for activation memory on long sequences.",
    "actor.max_tokens_per_mb": "Tokens per micro-batch: lower it on an out-of-memory error.",
}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def builtin_env_defaults() -> dict[str, dict[str, Any]]:
    """What each built-in env proposes (its class's ``default_config``, then its recipe) as flat
    ``key -> value`` (the envs of the ``envs`` package, not its adapters of other libraries)."""
    from areal_agents.registry import envs

    found: dict[str, dict[str, Any]] = {}
    for name in envs.names():
        cls = envs.get(name)
        module = getattr(cls, "__module__", "")
        if module.startswith("envs.") and not module.startswith("envs.ecosystem."):  # not the adapters
            found[name] = {key: value for _, preset in env_presets(name) for key, value in _flatten(preset).items()}
    return found


def builtin_algorithm_defaults() -> dict[str, dict[str, Any]]:
    """What each built-in algorithm sets (its spec's ``defaults``) as flat ``algorithm.KEY -> value``,
    by name: those registered from the ``algorithms`` package, not a user's."""
    from areal_agents.registry import algorithms

    return {name: {f"algorithm.{key}": value for key, value in (getattr(algorithms.get(name), "defaults", None) or {}).items()}
            for name in algorithms.names() if algorithms.where(name).startswith("algorithms.")}


def _set_by_algorithms(key: str, by_algorithm: dict[str, dict[str, Any]]) -> str:
    """`` Set by the algorithm: `False` by dapo, grpo; `True` by decoupled-ppo.`` for a key some
    built-in algorithm sets, else empty."""
    names_by_value: dict[str, list[str]] = {}
    for name, keys in by_algorithm.items():
        if key in keys:
            names_by_value.setdefault(repr(keys[key]), []).append(name)
    if not names_by_value:
        return ""
    parts = [f"`{value}` by {', '.join(sorted(names))}" for value, names in sorted(names_by_value.items())]
    return " Set by the algorithm: " + "; ".join(parts) + "."


def _cell(value: Any) -> str:
    return f"`{value!r}`".replace("|", "\\|")


def _tune_first(defaults: dict[str, Any]) -> list[str]:
    lines = ["", "## Tune these first", "",
             "The defaults fit the tiny CPU model and 2-digit sums. For your own env or model, these keys "
             "matter most (a GPU recipe with values: [gpu.md](gpu.md); what the batch terms mean: "
             "[faq.md](faq.md)):", "", "| key | default | why |", "|---|---|---|"]
    lines += [f"| `{key}` | {_cell(defaults[key])} | {why} |" for key, why in TUNE_FIRST.items()]
    return lines


def _shorthands() -> list[str]:
    return ["", "## Shorthands", "",
            "`--env NAME`, `env=NAME`, `agent=NAME`, `algorithm=NAME` and `data=NAME` on the command line are "
            "short for `env.name=NAME` and so on (`agent=my-agent` is `agent.name=my-agent`). "
            "`allocation_mode` (below) is short for a device split."]


def _per_env(defaults: dict[str, Any]) -> list[str]:
    lines = ["", "## Per-env defaults", "",
             "A built-in env sets these keys unless your YAML or an override sets them: env-level ones (`env.*`, "
             "`agent.*`, `sampling.*`) through its class's `default_config`, the rest through its recipe "
             "`envs/recipes/NAME.yaml`; every other key keeps the default of the tables below. "
             "`areal-agents config show --env NAME` lists them as `env NAME` and `recipe NAME`.", "", "| env | key | env default | global default |", "|---|---|---|---|"]
    for name, keys in builtin_env_defaults().items():
        if not keys:
            lines.append(f"| `{name}` | (none: the global defaults) | | |")
        for key, value in keys.items():
            lines.append(f"| `{name}` | `{key}` | {_cell(value)} | {_cell(defaults.get(key))} |")
    return lines


def config_reference() -> str:
    """The whole ``docs/config.md``: every config key, the keys to tune first and each built-in env's defaults."""
    fields = config_fields()
    by_algorithm = builtin_algorithm_defaults()
    algorithm = next(default for key, _, default, _ in fields if key == "algorithm.name")
    chosen = by_algorithm.get(algorithm, {})  # what the default algorithm puts over the dataclass defaults
    defaults = {**{key: default for key, _, default, _ in fields}, **chosen}
    lines = ["# Config reference", "",
             "Generated from the dataclasses in `areal_agents/config/` and the built-in envs' defaults and recipes by "
             "`areal-agents config markdown > docs/config.md`; a test fails when this file is stale.",
             "Set any key in a YAML file (`--config`) or as `key=value` on the command line.",
             *_tune_first(defaults), *_shorthands(), *_per_env(defaults), "", "## Every key", "",
             "The default is the value a run uses when nothing sets the key: the dataclass's, or, marked "
             f"`(algorithm {algorithm})`, the one the default algorithm (`algorithm.name={algorithm}`) sets over it. "
             "Another algorithm sets its own (each key's meaning says which); a built-in env may set others "
             "([per-env defaults](#per-env-defaults)). `areal-agents config show [key=value ...]` prints a run's "
             "values with where each comes from."]
    section = None
    for key, type_name, _, help_text in fields:
        head = key.split(".")[0] if "." in key else "(top level)"
        if head != section:
            section = head
            lines += ["", f"### {section}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        shown = f"`{defaults[key]!r}`".replace("|", "\\|")
        if key in chosen:
            shown += f" (algorithm {algorithm})"
        meaning = (help_text + _set_by_algorithms(key, by_algorithm)).replace("|", "/")
        lines.append(f"| `{key}` | `{type_name.replace('|', 'or')}` | {shown} | {meaning} |")
    return "\n".join(lines) + "\n"
