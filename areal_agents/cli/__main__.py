"""``python -m areal_agents.cli``: the ``areal-agents`` command line."""

from __future__ import annotations

from areal_agents.cli.main import main

raise SystemExit(main())
