"""Online RL: agents running outside the run train from their own traffic, rewards posted later.

``areal-agents run --env math mode=online`` starts the inference servers, the trainer and a
gateway; an agent anywhere opens a session with the admin key, calls the model through the
OpenAI (or Anthropic) API with the session's key, and posts the session's reward when it knows
it. Modules (docs/online.md is the protocol):

* :mod:`.sessions` — the sessions, the ledger, batches of rewarded sessions (no HTTP);
* :mod:`.gateway` — the HTTP routes (``/rl/sessions``, ``/v1/...``), keys and limits;
* :mod:`.rollout` — :class:`~.rollout.OnlineRollout`, the RL loop's rollout in an online run.
"""

from __future__ import annotations

__all__: list[str] = []
