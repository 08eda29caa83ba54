"""What each ``areal-agents`` command does, from its parsed arguments to its exit code.

The command line is the top of the house: the handlers here call the trainers (``trainers``)
and the rollout's preflight check with plain imports, made inside each handler so that
``areal-agents --help``, ``list`` and ``config`` load neither torch nor a trainer. Nothing
below the command line imports it; ranks that a run launches re-enter it as processes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from areal_agents.cli.hub import check_hub_model
from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.config.doc import config_reference
from areal_agents.config.loader import config_fields, explain_config, load_config, to_yaml
from areal_agents.registry import KINDS, get_registry
from areal_agents.rewards import default_reward_workers
from areal_agents.runtime.heap import quiet_setup

__all__ = ["check_model_dir", "cmd_config", "cmd_eval", "cmd_list", "cmd_plot", "cmd_rm", "cmd_run", "cmd_serve", "cmd_sft",
           "cmd_view", "config_overrides", "load_args_config"]


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


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The ``key=value`` overrides of ``args``, with ``--env`` turned into ``env.name``."""
    env = [f"env.name={args.env}"] if getattr(args, "env", None) else []
    return [*env, *(getattr(args, "overrides", []) or [])]


def load_args_config(args: argparse.Namespace) -> ExperimentConfig:
    """The validated config of ``--config``, ``--env`` and the ``key=value`` overrides."""
    return load_config(args.config, config_overrides(args))


def _experiment(args: argparse.Namespace) -> ExperimentConfig:
    """The config of ``run``, ``sft`` or ``eval``, checked before anything heavy is imported."""
    cfg = load_args_config(args)
    check_model_dir(cfg.actor.path, "actor.path")
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    """``areal-agents run``: the preflight check of the user's env, reward and agent, once, then
    the trainer's :func:`~trainers.loop.launch`. A rank it launches (``torchrun``, Ray) re-enters
    this command with ``WORLD_SIZE`` set and goes straight to the trainer: its launcher checked."""
    cfg = _experiment(args)
    if "WORLD_SIZE" not in os.environ:  # user code, before torch loads
        from areal_agents.rollout.preflight import preflight

        preflight(cfg)
    with quiet_setup():  # torch and transformers, with no full collection at each quarter of growth
        from trainers.loop import launch

    return launch(cfg, args.argv)


def cmd_sft(args: argparse.Namespace) -> int:
    """``areal-agents sft --env NAME [key=value ...]``: warm-start the tiny model (or, with
    ``actor.path``, fine-tune that model on the env's reference completions)."""
    cfg = _experiment(args)
    from rich.console import Console

    with quiet_setup():
        from trainers.sft import run_sft

    path = run_sft(cfg)
    console = Console()
    report = path / "sft_report.json"
    if report.is_file():
        console.print(json.loads(report.read_text()))
    where = "" if cfg.actor.path or cfg.sft.output_dir else (
        " (in the model cache, $AREAL_AGENTS_CACHE; sft.output_dir=DIR writes elsewhere; train it with RL: "
        "areal-agents run actor.path=<this dir>)")
    console.print(f"[bold green]model written to:[/] {path}{where}", soft_wrap=True)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """``areal-agents rm --env NAME [key=value ...]``: train a reward model (Bradley-Terry) on the
    preference rows of the env's dataset (``data.name``; rows with ``prompt``, ``chosen``, ``rejected``)."""
    cfg = _experiment(args)
    from rich.console import Console

    with quiet_setup():
        from trainers.reward_model import run_rm

    path = run_rm(cfg)
    console = Console()
    console.print(json.loads((path / "rm_report.json").read_text()))
    console.print(f"[bold green]reward model written to:[/] {path} (serve it for rewards: judge.model_path=<this dir>)",
                  soft_wrap=True)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """``areal-agents eval``: greedy accuracy and pass@k of ``--model`` (default ``actor.path``, else
    the env's tiny model) on the env's test split; the report is written as JSON and shown."""
    cfg = _experiment(args)
    check_model_dir(args.model, "--model")
    from rich.console import Console
    from rich.table import Table

    with quiet_setup():
        from trainers.evaluate import evaluate_model
        from trainers.sft import ensure_warm_model

    model_path = args.model or cfg.actor.path
    if not model_path:
        model_path = str(ensure_warm_model(cfg, progress=cfg.logging.progress, warm_start=True))
    report = evaluate_model(cfg, model_path, progress=cfg.logging.progress)
    out = Path(args.output) if args.output else Path(cfg.run_dir) / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    table = Table(title=f"eval: {cfg.env.name}", title_justify="left", show_header=False)
    for key, value in report.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    table.add_row("report", str(out))
    Console().print(table)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """``areal-agents serve``: the embedded server; without ``--model`` it serves the tiny default
    model of ``--env`` (warm-started and cached on first use by ``trainers.sft``, which says so and
    shows its progress), and says which model that is."""
    check_model_dir(args.model, "--model")
    if not args.model:
        env = args.env or "math"
        try:
            with quiet_setup():
                from trainers.sft import ensure_warm_model

            cfg = load_config(None, [f"env.name={env}"])
            args.model = str(ensure_warm_model(cfg, progress=cfg.logging.progress))
        except (ImportError, ValueError) as exc:
            print(f"error: no --model given and the default model is unavailable ({exc}); pass --model DIR",
                  file=sys.stderr)
            return 2
        print(f"no --model: serving the tiny default model of env {env!r} from {args.model}", flush=True)
    from areal_agents.inference.server import cli_serve

    return int(cli_serve(args))


def cmd_plot(args: argparse.Namespace) -> int:
    """``areal-agents plot RUN_DIR``: the PNG plots of a run directory, one path a line."""
    from trainers.plotting import plot_run

    try:
        paths = plot_run(args.run_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    """``areal-agents view RUN_DIR [RUN_DIR ...] [--port N] [--host H]``: the viewer's page until Ctrl-C."""
    from areal_agents.viewer import serve

    serve(args.run_dirs, host=args.host, port=args.port)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``areal-agents list [KIND]``: the registries, each name with where it is defined."""
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


def cmd_config(args: argparse.Namespace) -> int:
    """``areal-agents config show|check|markdown``."""
    if args.action != "show":
        print(config_reference() if args.action == "markdown" else to_yaml(load_args_config(args)), end="")
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cfg, sources = explain_config(args.config, config_overrides(args))
    table = Table(title=f"Config of a run with env {cfg.env.name}, algorithm {cfg.algorithm.name} (from: default = "
                  "the dataclass, algorithm NAME = the algorithm's defaults, env NAME = the env's default_config, "
                  "recipe NAME = the env's recipe, yaml = --config, override = key=value)",
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
