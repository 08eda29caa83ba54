"""Load an :class:`ExperimentConfig` from YAML and ``key=value`` overrides.

Every failure becomes one :class:`ConfigError` whose message names the full key, e.g.
``actor.c_clip: must be > 1 when set (got 0.5)`` or ``no.such.key: unknown key``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from areal_agents.config import RENAMED_KEYS, ConfigError, ExperimentConfig
from areal_agents.failures import message_line
from areal_agents.registry import RegistryError, agents, algorithms, datasets, envs

__all__ = ["ENV_LEVEL_SECTIONS", "config_fields", "env_presets", "explain_config",
           "import_user_module", "load_config", "parse_allocation_mode", "recipe_path", "to_yaml", "user_files"]


def _omega_error(exc: OmegaConfBaseException, fallback_key: str = "") -> ConfigError:
    key = getattr(exc, "full_key", None) or fallback_key or "config"
    msg = message_line(exc, str(getattr(exc, "msg", None) or exc))
    if type(exc).__name__ == "ConfigKeyError" and "not in struct" in msg or "Key '" in msg and "not in" in msg:
        msg = "unknown key"
    return ConfigError(key, msg)


def _leaf_keys() -> dict[str, bool]:
    """Every valid dotted key (sections first) -> whether it is a free-form mapping (``kwargs``)."""
    keys: dict[str, bool] = {}
    for key, type_name, *_ in config_fields():
        parts = key.split(".")
        keys.update({".".join(parts[:i]): False for i in range(1, len(parts))})  # its sections
        keys[key] = type_name.startswith("dict")
    return keys


def _unknown_key(key: str, known: dict[str, bool]) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    close = [k for k in known if k.rsplit(".", 1)[-1] == leaf] or difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(key, f"unknown key{hint}")


def _check_keys(node: Any, known: dict[str, bool], prefix: str = "") -> None:
    """Reject keys the schema does not have, naming the full dotted key (``node``: plain containers)."""
    if not isinstance(node, dict):
        return
    for key, child in node.items():
        full = f"{prefix}{key!s}"
        if full in RENAMED_KEYS:
            raise ConfigError(full, f"renamed to {RENAMED_KEYS[full]}")
        if full not in known:
            while isinstance(child, dict) and child:  # name the full leaf key
                first = next(iter(child))
                full, child = f"{full}.{first!s}", child[first]
            raise _unknown_key(full, known)
        if known[full]:  # free-form mapping such as env.kwargs
            if child is not None and not isinstance(child, dict):
                raise ConfigError(full, "must be a mapping of key: value")
            continue
        first_field = next((k for k in known if k.startswith(full + ".")), None)
        if first_field is not None and not isinstance(child, dict):
            raise ConfigError(full, f"is a section: set its fields, e.g. {first_field}=...")
        _check_keys(child, known, full + ".")


_NAMED_SECTIONS = ("env", "agent", "algorithm", "data")


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    if (bad := next((item for item in overrides if "=" not in item or item.startswith("=")), None)) is not None:
        raise ConfigError(bad, "overrides must look like key=value")
    merged = OmegaConf.create()
    for item in overrides:
        key, value = item.split("=", 1)
        if key in _NAMED_SECTIONS and not value.lstrip().startswith("{"):  # agent=NAME is agent.name=NAME
            key, item = f"{key}.name", f"{key}.name={value}"
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            raise _omega_error(exc, key) from None
        except Exception as exc:  # the value's YAML does not parse
            raise ConfigError(key, f"cannot parse value {value!r}: {message_line(exc)}") from None
    return merged


def _materialise(node: DictConfig, prefix: str) -> Any:
    """``OmegaConf.to_object`` depth first, so a failing ``__post_init__`` gets its path."""
    for key in node.keys():
        child = node[key]
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) not in (dict, None):
            _materialise(child, f"{prefix}{key!s}.")
    try:
        return OmegaConf.to_object(node)
    except ConfigError as exc:
        raise ConfigError(prefix + exc.key, exc.rule) from None
    except OmegaConfBaseException as exc:
        raise _omega_error(exc, prefix.rstrip(".")) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(prefix.rstrip(".") or "config", message_line(exc)) from None


def _select(layer: DictConfig, key: str) -> Any:
    """``key`` of one layer (None when absent); OmegaConf's errors become a ConfigError naming it."""
    try:
        return OmegaConf.select(layer, key, default=None)
    except OmegaConfBaseException as exc:
        raise _omega_error(exc, key) from None


def _last_given(layers: list[DictConfig], key: str, default: Any = None) -> Any:
    """``key`` as the last layer that sets it has it, or ``default``."""
    given = [value for value in (_select(layer, key) for layer in layers) if value is not None]
    return given[-1] if given else default


def _import_user_modules(layers: list[DictConfig]) -> None:
    """Import the ``imports`` entries (module names or ``.py`` paths) of every layer: a list as given, or a bare
    entry (``imports=my_env.py``, ``imports=a.py,b.py``), which is also written back into the layer as a list for
    the schema."""
    for layer in layers:
        entries = _select(layer, "imports")
        if isinstance(entries, str):
            entries = layer.imports = [e.strip() for e in entries.split(",") if e.strip()]
        elif entries is not None and not isinstance(entries, ListConfig):
            raise ConfigError("imports", "must be a module name, a .py file or a list of them, "
                                         f"e.g. imports=my_env.py or imports=[a.py,b.py] (got {entries!r})")
        for entry in map(str, entries or []):
            if _is_path(entry) and not os.path.isfile(entry):
                raise ConfigError("imports", f"no such file: {entry} (relative paths start from {os.getcwd()})")
            try:
                import_user_module(entry)
            except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, one line
                raise ConfigError("imports", f"cannot import {entry!r}: {type(exc).__name__}: {exc}") from None


# .py files imported by path, by module name: worker processes (rewards) import them again.
_USER_FILES: dict[str, str] = {}


def _is_path(entry: str) -> bool:
    return entry.endswith(".py") or os.sep in entry


def user_files() -> dict[str, str]:
    """``{module name: absolute path}`` of the ``.py`` files imported by :func:`import_user_module`."""
    return dict(_USER_FILES)


def import_user_module(entry: str) -> Any:
    """Import a module by dotted name, or a Python file by path (registered as its stem)."""
    if not _is_path(entry):
        return importlib.import_module(entry)
    path = os.path.abspath(entry)
    name = os.path.splitext(os.path.basename(path))[0]
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python file at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _USER_FILES[name] = path
    return module


def _check_names(cfg: ExperimentConfig) -> None:
    """Registered names are checked now, not minutes later after the warm start."""
    for key, value, registry in (("env.name", cfg.env.name, envs), ("agent.name", cfg.agent.name, agents),
                                 ("data.name", cfg.data.name, datasets)):
        if value is not None and value not in registry:
            raise ConfigError(key, f"unknown {registry.kind[:-1]} {value!r}; registered: {', '.join(registry.names())}")


def _algorithm_defaults(layers: list[DictConfig]) -> tuple[str, dict[str, Any]]:
    """The algorithm chosen in ``layers`` and its spec's defaults (``spec.defaults``)."""
    name = str(_last_given(layers, "algorithm.name", "grpo"))
    try:
        spec = algorithms.get(name)
    except RegistryError as exc:  # unknown ("unknown algorithm 'x'; registered: ..."), or it cannot be loaded
        raise ConfigError("algorithm.name", str(exc)) from None
    return name, dict(getattr(spec, "defaults", {}) or {})


ENV_LEVEL_SECTIONS = ("env", "agent", "sampling")


def _flat_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value and f"{prefix}{key}" != "env.kwargs":
            keys.extend(_flat_keys(value, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def recipe_path(name: str) -> Path | None:
    """The recipe of the env registered as ``name``: ``recipes/<name>.yaml`` in the top-level package
    of the module that defines it (``envs/recipes/countdown.yaml`` for ``countdown``), or None."""
    try:
        module = str(getattr(envs.get(name), "__module__", "") or "")
    except RegistryError:  # unknown, or it cannot be loaded: left to _check_names
        return None
    package = sys.modules.get(module.split(".")[0])
    for base in getattr(package, "__path__", None) or ():
        path = Path(base) / "recipes" / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def env_presets(name: str) -> list[tuple[str, dict[str, Any]]]:
    """What the env registered as ``name`` proposes, lowest layer first, each with its source:
    its class's ``default_config`` (``env NAME``: only ``env.*``, ``agent.*`` and ``sampling.*``
    keys) and its recipe (``recipe NAME``: any key but ``env.name``, see :func:`recipe_path`).
    An unknown env proposes nothing (:func:`_check_names` reports it)."""
    try:
        cls = envs.get(name)
    except RegistryError:
        return []
    presets: list[tuple[str, dict[str, Any]]] = []
    defaults = getattr(cls, "default_config", None)
    if defaults:
        if not isinstance(defaults, dict):
            raise ConfigError("env.name", f"env {name!r}: default_config must be a dict of config keys")
        for key in _flat_keys(defaults):
            if key.split(".")[0] not in ENV_LEVEL_SECTIONS:
                raise ConfigError(key, f"env {name!r} ({getattr(cls, '__qualname__', cls)}.default_config) may set only "
                                       "env.*, agent.* and sampling.* keys; put run-level keys in a recipe "
                                       f"(recipes/{name}.yaml in the package that defines the env) or in your --config")
        presets.append((f"env {name}", defaults))
    path = recipe_path(name)
    if path is not None:
        try:
            recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError("env.name", f"env {name!r}: cannot parse its recipe {path}: {message_line(exc)}") from None
        if recipe is not None and not isinstance(recipe, dict):
            raise ConfigError("env.name", f"env {name!r}: its recipe {path} must hold a mapping of sections")
        if recipe is not None and isinstance(recipe.get("env"), dict) and "name" in recipe["env"]:
            raise ConfigError("env.name", f"env {name!r}: its recipe {path} may not set env.name")
        if recipe:
            presets.append((f"recipe {name}", recipe))
    return presets


_ALLOCATION = re.compile(r"(sglang|embedded)\.d(\d+)(?:p(\d+))?(?:t(\d+))?\+d(\d+)(?:p(\d+))?(?:t(\d+))?")


def parse_allocation_mode(mode: str) -> dict[str, Any]:
    """The keys an ``allocation_mode`` such as ``sglang.d2t2+d4`` stands for (``d`` data
    parallel, ``p`` pipeline, ``t`` tensor parallel; inference part + trainer part)."""
    m = _ALLOCATION.fullmatch(mode.replace(" ", ""))
    if m is None:
        raise ConfigError("allocation_mode", f"expected e.g. 'sglang.d2t2+d4' or 'embedded.d2+d1' (got {mode!r})")
    backend, servers, gen_pp, tp, ranks, train_pp, train_tp = m.groups(default="1")
    if (gen_pp, train_pp, train_tp) != ("1", "1", "1"):
        raise ConfigError("allocation_mode", f"only p1 and a trainer of FSDP ranks (dN, t1) are supported (got {mode!r})")
    if min(int(servers), int(tp), int(ranks)) < 1:
        raise ConfigError("allocation_mode", f"every size must be >= 1 (got {mode!r})")
    if backend == "embedded" and int(tp) != 1:
        raise ConfigError("allocation_mode", "embedded servers have no tensor parallelism (t1)")
    return {"inference.backend": backend, "inference.num_servers": int(servers), "sglang.tp_size": int(tp),
            "trainer.nproc": int(ranks), "trainer.device": "cuda" if backend == "sglang" else "cpu"}


def _allocation_layer(layers: list[DictConfig]) -> DictConfig | None:
    """The keys of the last ``allocation_mode`` given, refusing explicit values that contradict it."""
    mode = _last_given(layers, "allocation_mode")
    if mode is None:
        return None
    keys = parse_allocation_mode(str(mode))
    for key, value in keys.items():
        for layer in layers:
            given = OmegaConf.select(layer, key, default=None, throw_on_resolution_failure=False)
            if given is not None and given != value:
                raise ConfigError(key, f"is {given!r} but allocation_mode={mode} implies {value!r}")
    return OmegaConf.from_dotlist([f"{key}={value}" for key, value in keys.items()])


def _holds_mapping(path: str | os.PathLike[str]) -> bool:
    """Whether the YAML file's document is a mapping (or empty). ``OmegaConf.load`` parses a
    document that is one string a second time, so a file holding ``"a: 1"`` (or ``\'\'\': \'\'\'``)
    would otherwise load as the mapping inside the string."""
    try:
        with open(path, encoding="utf-8") as fh:
            top = yaml.safe_load(fh)
    except Exception:  # noqa: BLE001 - OmegaConf already parsed it; its view stands
        return True
    return top is None or isinstance(top, dict)


def _layers(
    config_file: str | os.PathLike[str] | None,
    overrides: Sequence[str],
) -> list[tuple[str, DictConfig]]:
    """The layers merged over the schema, lowest first, each with the source it stands for:
    algorithm spec defaults, the env's ``default_config``, the env's recipe, ``allocation_mode``,
    the YAML file, the overrides."""
    layers: list[tuple[str, DictConfig]] = []
    if config_file is not None:
        if not os.path.isfile(config_file):
            raise ConfigError("--config", f"file not found: {config_file}")
        try:
            loaded = OmegaConf.load(os.fspath(config_file))
        except AssertionError:  # OmegaConf's answer to a top-level scalar
            raise ConfigError("--config", f"{config_file} must hold a mapping of sections") from None
        except Exception as exc:  # yaml.YAMLError and friends
            raise ConfigError("--config", f"cannot parse {config_file}: {message_line(exc)}") from None
        if not isinstance(loaded, DictConfig) or not _holds_mapping(config_file):
            raise ConfigError("--config", f"{config_file} must hold a mapping of sections")
        layers.append(("yaml", loaded))
    layers.append(("override", _parse_overrides(overrides)))
    given = [layer for _, layer in layers]
    known = _leaf_keys()
    for layer in given:
        _check_keys(OmegaConf.to_container(layer, resolve=False), known)
    _import_user_modules(given)
    if (allocation := _allocation_layer(given)) is not None:
        layers.insert(0, ("allocation_mode", allocation))
    env_name = str(_last_given([layer for _, layer in layers], "env.name", "math"))
    for source, preset in reversed(env_presets(env_name)):
        try:
            _check_keys(preset, known)
        except ConfigError as exc:
            raise ConfigError(exc.key, f"{exc.rule} (set by {source})") from None
        layers.insert(0, (source, OmegaConf.create(preset)))
    name, defaults = _algorithm_defaults([layer for _, layer in layers])
    if defaults:
        layers.insert(0, (f"algorithm {name}", OmegaConf.create({"algorithm": defaults})))
    return layers


def _unmergeable_key(base: DictConfig, layer: DictConfig, prefix: str = "") -> str:
    """The dotted key of ``layer`` that OmegaConf cannot merge into ``base``."""
    for key in layer.keys():
        try:
            OmegaConf.merge(base, OmegaConf.masked_copy(layer, [str(key)]))
        except Exception:  # noqa: BLE001 - whatever merge raised, this key is the one
            child = OmegaConf.select(layer, str(key), throw_on_resolution_failure=False)
            base_child = OmegaConf.select(base, str(key), throw_on_resolution_failure=False)
            if isinstance(child, DictConfig) and isinstance(base_child, DictConfig):
                return _unmergeable_key(base_child, child, f"{prefix}{key!s}.")
            return f"{prefix}{key!s}"
    return prefix.rstrip(".") or "config"


def _build(layers: list[tuple[str, DictConfig]]) -> ExperimentConfig:
    """Merge ``layers`` over the schema, resolve, validate every section, check registered names."""
    merged = OmegaConf.structured(ExperimentConfig)
    for _, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            raise _omega_error(exc) from None
        except (TypeError, ValueError) as exc:  # e.g. a mapping where the schema has a list
            raise ConfigError(_unmergeable_key(merged, layer), message_line(exc)) from None
    try:
        OmegaConf.resolve(merged)
    except OmegaConfBaseException as exc:
        raise _omega_error(exc) from None
    cfg = _materialise(merged, "")
    assert isinstance(cfg, ExperimentConfig)
    _check_names(cfg)
    return cfg


def load_config(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
) -> ExperimentConfig:
    """Schema ← algorithm defaults ← the env's ``default_config`` ← the env's recipe ←
    ``allocation_mode`` ← YAML file ← overrides, then validate."""
    return _build(_layers(config_file, overrides))


_UNSET = object()


def explain_config(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
) -> tuple[ExperimentConfig, dict[str, str]]:
    """The config :func:`load_config` gives for the same arguments (what a run uses), and for
    every leaf key where its value comes from: ``default`` (the dataclass), ``algorithm NAME``
    (the algorithm spec's defaults), ``env NAME`` (the env's ``default_config``), ``recipe NAME``
    (the env's recipe, :func:`recipe_path`), ``allocation_mode``,
    ``yaml`` or ``override``."""
    layers = _layers(config_file, overrides)
    cfg = _build(layers)
    sources = {key: "default" for key, *_ in config_fields()}
    for source, layer in layers:
        for key in sources:
            if OmegaConf.select(layer, key, default=_UNSET, throw_on_resolution_failure=False) is not _UNSET:
                sources[key] = source
    return cfg, sources


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (for ``runs/.../config.yaml``)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_fields(cls: type = ExperimentConfig, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """``(key, type, default, help)`` for every leaf field, in declaration order: the one walk over the
    schema (the known keys, ``config show``, the ``docs/config.md`` tables). Defaults are as declared,
    before ``__post_init__`` fills anything in (``experiment_name`` is None, not the env's name)."""
    rows: list[tuple[str, str, Any, str]] = []
    for fld in dataclasses.fields(cls):
        factory = fld.default_factory  # a nested section, or a mutable default
        value = factory() if factory is not dataclasses.MISSING else fld.default
        if dataclasses.is_dataclass(value):
            rows.extend(config_fields(type(value), f"{prefix}{fld.name}."))
        else:
            rows.append((prefix + fld.name, str(fld.type), value, fld.metadata.get("help", "")))  # postponed: a str
    return rows
