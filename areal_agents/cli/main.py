"""The ``areal-agents`` command line.

Subcommands find their implementation through ``"module:function"`` strings, so the core
stays importable without torch; each handler receives the parsed arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from areal_agents.cli.hub import check_hub_model
from areal_agents.config import ConfigError
from areal_agents.config.loader import config_fields, config_reference, explain_config, load_config, to_yaml
from areal_agents.inference.launcher import add_serve_args
from areal_agents.registry import KINDS, RegistryError, get_registry, load_object
from areal_agents.rewards import default_reward_workers
from areal_agents.rewards.worker import check_not_in_worker
from areal_agents.runtime.stopping import Terminated, stop_on_signals

__all__ = ["build_parser", "check_model_dir", "cli_serve", "config_overrides", "load_args_config", "main"]

# subcommand -> implementation; each is called as fn(args) and returns an exit code.
# For run/sft/eval, ``args.cfg`` holds the validated ExperimentConfig.
COMMANDS = {
    "run": "trainers.loop:cli_run",
    "sft": "trainers.sft:cli_sft",
    "eval": "trainers.evaluate:cli_eval",
    "serve": "areal_agents.cli.main:cli_serve",
    "plot": "trainers.plotting:cli_plot",
    "list": "areal_agents.cli.main:_cmd_list",
    "config": "areal_agents.cli.main:_cmd_config",
}

_STOPPABLE = ("run", "sft", "eval")  # Ctrl-C and SIGTERM end these in any phase (areal_agents.runtime.stopping)

# Failures that describe bad input or a broken setup: one line, exit 1. Any other exception is
# a bug and keeps its traceback; AREAL_AGENTS_TRACEBACK=1 shows one for these too.
_USER_ERRORS = (
    "areal_agents.data:DatasetError", "areal_agents.gym.checker:EnvCheckError", "areal_agents.failures:EpisodesFailed",
    "areal_agents.cli.preflight:PreflightError",
    "areal_agents.inference.control:ControlError", "areal_agents.inference.client:InferenceError",
    "areal_agents.inference.launcher:LaunchError",
)


def _is_user_error(exc: BaseException) -> bool:
    # only an imported module can have raised its error; OSError: missing files, full disks, refused ports
    loaded = [getattr(sys.modules[m], name) for m, name in (s.split(":") for s in _USER_ERRORS) if m in sys.modules]
    return isinstance(exc, (OSError, *loaded))


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    more = f" (+{len(lines) - 1} lines: AREAL_AGENTS_TRACEBACK=1 shows them)" if len(lines) > 1 else ""
    kind = "" if getattr(exc, "names_its_cause", False) else f"{type(exc).__name__}: "  # the message says it all
    return f"{kind}{lines[0]}{more}"


def check_model_dir(path: str | None, key: str) -> None:
    """A local model path must be a Hugging Face model directory; a Hub id must be in the
    Hugging Face cache or on a Hub this machine reaches (one request, see :mod:`areal_agents.cli.hub`)."""
    local = os.path.expanduser(path or "")
    if not (os.path.isabs(local) or local.startswith(".") or os.path.exists(local)):
        if path:  # a Hub id such as Qwen/Qwen2.5-1.5B-Instruct
            check_hub_model(path, key)
        return
    if not os.path.isdir(local):
        raise ConfigError(key, f"no such model directory: {path}")
    if not os.path.isfile(os.path.join(local, "config.json")):
        raise ConfigError(key, f"{path} is not a Hugging Face model directory (no config.json)")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", help="env name, short for env.name=NAME")
    p.add_argument("--config", help="YAML config file (sections as in `areal-agents config show`)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. actor.lr=1e-5")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="areal-agents",
        description="Asynchronous RL for LLM agents. `areal-agents config show` lists every config key.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_config_args(sub.add_parser("run", help="train an agent with async RL (mode=rollout|train for debug modes)",
                                    epilog="Config keys and defaults: `areal-agents config show`."))
    _add_config_args(sub.add_parser("sft", help="supervised fine-tuning on an env's dataset"))
    p = sub.add_parser("eval", help="greedy and pass@k evaluation of a model on an env's test split")
    p.add_argument("--model", help="HF model dir (default: the tiny default model)")
    p.add_argument("--output", help="JSON report path")
    _add_config_args(p)
    p = sub.add_parser("serve", help="start the embedded SGLang-protocol inference server")
    add_serve_args(p)
    p.add_argument("--env", default="math", help="env whose tiny default model to serve without --model")
    sub.add_parser("plot", help="write PNG plots for a run directory").add_argument("run_dir")
    p = sub.add_parser("list", help="print the registries")
    p.add_argument("kind", nargs="?", choices=[*KINDS, *(k[:-1] for k in KINDS)], help="one registry only")
    p = sub.add_parser("config", help="show or check a config")
    p.add_argument("action", choices=["show", "check", "markdown"], help="show: every key with the value a run "
                   "would use, where it comes from, and help; check: load and validate, print the resolved YAML; "
                   "markdown: the docs/config.md reference")
    _add_config_args(p)
    return parser


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The ``key=value`` overrides of ``args``, with ``--env`` turned into ``env.name``."""
    env = [f"env.name={args.env}"] if getattr(args, "env", None) else []
    return [*env, *(getattr(args, "overrides", []) or [])]


def load_args_config(args: argparse.Namespace) -> Any:
    return load_config(args.config, config_overrides(args))


def cli_serve(args: argparse.Namespace) -> int:
    """``areal-agents serve``: the embedded server; without ``--model`` it serves the tiny default
    model of ``--env`` (warm-started and cached on first use by ``trainers.sft``)."""
    if not args.model:
        try:
            ensure_warm_model = load_object("trainers.sft:ensure_warm_model")
            args.model = str(ensure_warm_model(load_config(None, [f"env.name={args.env or 'math'}"])))
        except (ImportError, AttributeError, ValueError) as exc:
            print(f"error: no --model given and the default model is unavailable ({exc}); pass --model DIR",
                  file=sys.stderr)
            return 2
    return int(load_object("areal_agents.inference.server:cli_serve")(args))


def _cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for reg in map(get_registry, [args.kind] if args.kind else KINDS):  # get_registry takes the singular too
        table = Table(title=f"{reg.kind} ({len(reg)})", title_justify="left")
        table.add_column("name", style="bold cyan")
        table.add_column("defined at")
        for name in reg.names():
            table.add_row(name, reg.where(name))
        console.print(table)
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    if args.action != "show":
        print(config_reference() if args.action == "markdown" else to_yaml(load_args_config(args)), end="")
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cfg, sources = explain_config(args.config, config_overrides(args))
    table = Table(title=f"Config of a run with env {cfg.env.name}, algorithm {cfg.algorithm.name} (from: default = "
                  "the dataclass, algorithm NAME = the algorithm's defaults, yaml = --config, override = key=value)",
                  title_justify="left")
    for col in ("key", "value", "from", "help"):
        table.add_column(col, overflow="fold", no_wrap=col != "help")
    for key, _, _, help_text in config_fields():
        value: Any = functools.reduce(getattr, key.split("."), cfg)
        shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()
        if key == "rollout.reward_workers" and value is None:
            shown += f" ({default_reward_workers()} here)"
        table.add_row(key, Text(shown), sources[key], help_text)  # Text: a value like [all-linear] is not markup
    Console(width=200).print(table)
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command in ("run", "sft", "eval"):
        args.cfg = load_args_config(args)  # validate before importing anything heavy
        check_model_dir(args.cfg.actor.path, "actor.path")
    if args.command == "run" and "WORLD_SIZE" not in os.environ:  # user code, before torch loads
        from areal_agents.cli.preflight import preflight

        preflight(args.cfg)
    if args.command in ("eval", "serve"):
        check_model_dir(args.model, "--model")
    return int(load_object(COMMANDS[args.command])(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``areal-agents`` console script."""
    check_not_in_worker()  # an unguarded script, imported by a reward worker for a reward defined in it
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse fills a "*" positional from one run of arguments only: key=value after
        # an option (``config check --config F a.b=1``) comes back unparsed, yet is an override
        if hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with stop_on_signals() if args.command in _STOPPABLE else contextlib.nullcontext():
            return _dispatch(args)
    except (ConfigError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not _is_user_error(exc) or os.environ.get("AREAL_AGENTS_TRACEBACK") == "1":
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
