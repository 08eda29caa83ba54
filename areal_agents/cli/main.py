"""The ``areal-agents`` command line: the parser, :func:`main` and how a failure is shown.

Each subcommand is a handler of :mod:`areal_agents.cli.commands`, called as ``fn(args)``; the
handlers import the trainers inside themselves, so the parser and ``--help`` stay light.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from areal_agents.cli.commands import (
    cmd_config,
    cmd_eval,
    cmd_list,
    cmd_plot,
    cmd_rm,
    cmd_run,
    cmd_serve,
    cmd_sft,
    cmd_view,
)
from areal_agents.config import ConfigError
from areal_agents.failures import UserError
from areal_agents.inference.launcher import add_serve_args
from areal_agents.registry import KINDS, RegistryError
from areal_agents.rewards.worker import check_not_in_worker
from areal_agents.runtime.cpus import yield_idle_threads
from areal_agents.runtime.heap import keep_freed_memory
from areal_agents.runtime.stopping import Terminated, stop_on_signals

__all__ = ["COMMANDS", "build_parser", "main"]

# subcommand -> handler, called as fn(args) -> exit code; ``args.argv`` holds the command line's
# arguments (after the program name), with which the ranks of a run re-enter it
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run, "sft": cmd_sft, "eval": cmd_eval, "serve": cmd_serve, "plot": cmd_plot, "list": cmd_list,
    "config": cmd_config, "view": cmd_view, "rm": cmd_rm,
}

_STOPPABLE = ("run", "sft", "eval", "rm")  # Ctrl-C and SIGTERM end these in any phase (areal_agents.runtime.stopping)


def _is_user_error(exc: BaseException) -> bool:
    """Bad input or a broken setup (one line, exit 1): a :class:`~areal_agents.failures.UserError`, or
    an OSError (missing files, full disks, refused ports). Any other exception is a bug and keeps
    its traceback; ``AREAL_AGENTS_TRACEBACK=1`` shows one for these too."""
    return isinstance(exc, (OSError, UserError))


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    more = f" (+{len(lines) - 1} lines: AREAL_AGENTS_TRACEBACK=1 shows them)" if len(lines) > 1 else ""
    kind = "" if getattr(exc, "names_its_cause", False) else f"{type(exc).__name__}: "  # the message says it all
    return f"{kind}{lines[0]}{more}"


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
    _add_config_args(sub.add_parser("rm", help="train a reward model on an env's preference pairs (Bradley-Terry)"))
    p = sub.add_parser("eval", help="greedy and pass@k evaluation of a model on an env's test split")
    p.add_argument("--model", help="HF model dir (default: the tiny default model)")
    p.add_argument("--output", help="JSON report path")
    _add_config_args(p)
    p = sub.add_parser("serve", help="start the embedded SGLang-protocol inference server")
    add_serve_args(p)
    p.add_argument("--env", default="math", help="env whose tiny default model to serve without --model")
    sub.add_parser("plot", help="write PNG plots for a run directory").add_argument("run_dir")
    p = sub.add_parser("view", help="serve a local page over run directories: live curves, episodes, tokens")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (several are overlaid)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only; any other "
                   "address lets anyone who reaches it read the runs, and prints a warning)")
    p = sub.add_parser("list", help="print the registries")
    p.add_argument("kind", nargs="?", choices=[*KINDS, *(k[:-1] for k in KINDS)], help="one registry only")
    p = sub.add_parser("config", help="show or check a config")
    p.add_argument("action", choices=["show", "check", "markdown"], help="show: every key with the value a run "
                   "would use, where it comes from, and help; check: load and validate, print the resolved YAML; "
                   "markdown: the docs/config.md reference")
    _add_config_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``areal-agents`` console script."""
    check_not_in_worker()  # an unguarded script, imported by a reward worker for a reward defined in it
    yield_idle_threads()  # before any command imports torch
    keep_freed_memory()  # here and in the servers, ranks and rollout process it starts
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = argv
    if extra:  # argparse fills a "*" positional from one run of arguments only: key=value after
        # an option (``config check --config F a.b=1``) comes back unparsed, yet is an override
        if hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with stop_on_signals() if args.command in _STOPPABLE else contextlib.nullcontext():
            return int(COMMANDS[args.command](args) or 0)
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
