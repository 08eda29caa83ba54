"""``areal-agents view RUN_DIR ...``: a local page over run directories: the run dashboard (the curves of
``metrics.jsonl``, live, several runs overlaid, their configs compared), the episode table of the
episode record, one episode token by token, and one group side by side. Every asset ships with the
package (no CDN, no network); see docs/viewer.md."""

from __future__ import annotations

from areal_agents.viewer.server import build_app, serve

__all__ = ["build_app", "serve"]
