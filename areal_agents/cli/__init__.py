"""The ``areal-agents`` command line (``python -m areal_agents.cli`` too).

* :mod:`.main` — the commands (``run``, ``sft``, ``eval``, ``serve``, ``list``, ``config``, ``plot``) and
  :func:`main`, the console script;
* :mod:`.preflight` — the user's env, reward and agent checked on one row before any model or server starts;
* :mod:`.hub` — a Hugging Face Hub id checked before the run (cached, or one request).
"""

from __future__ import annotations

from areal_agents.cli.main import build_parser, check_model_dir, cli_serve, config_overrides, load_args_config, main

__all__ = ["build_parser", "check_model_dir", "cli_serve", "config_overrides", "load_args_config", "main"]
