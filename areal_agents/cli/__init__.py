"""The ``areal-agents`` command line (``python -m areal_agents.cli`` too), the top of the house.

* :mod:`.main` — the parser, :func:`main` (the console script) and how a failure is shown;
* :mod:`.commands` — what each command (``run``, ``sft``, ``eval``, ``serve``, ``list``, ``config``,
  ``plot``) does: the handlers import the trainers inside themselves, so ``--help``, ``list`` and
  ``config`` load no torch;
* :mod:`.hub` — a Hugging Face Hub id checked before the run (cached, or one request).

Nothing below the command line imports it (import-linter contracts say so).
"""

from __future__ import annotations

from areal_agents.cli.commands import check_model_dir, config_overrides, load_args_config
from areal_agents.cli.main import build_parser, main

__all__ = ["build_parser", "check_model_dir", "config_overrides", "load_args_config", "main"]
