"""OpenAI-compatible chat completions on the token-level generation path (no torch).

An agent written against ``openai.AsyncOpenAI`` trains unchanged: its ``chat.completions.create``
calls are rendered with the model's chat template, generated through the
:class:`~areal_agents.inference.client.InferenceClient` (SGLang ``/generate``, token ids in and
out), parsed back into OpenAI replies, and recorded token for token. Modules:

* :mod:`.schema` — request checking (:class:`ChatRequest`, :class:`APIError`);
* :mod:`.session` — one episode's completions: chains of calls, recording, replies;
* :mod:`.trajectories` — recorded calls to trajectories (``concat`` / ``individual``, the turn discount);
* :mod:`.client` — the in-process ``AsyncOpenAI`` stand-in bound to an episode;
* :mod:`.routes` — serving another API's requests through a chat session (a translation each);
* :mod:`.responses` — OpenAI's Responses API (``/v1/responses``) as chat completions;
* :mod:`.messages` — Anthropic's Messages API (``/v1/messages``) as chat completions;
* :mod:`.http` — the loopback endpoint (``/v1/chat/completions`` and the translated routes);
* :mod:`.loopback` — one such endpoint per event loop, shared by its episodes;
* :mod:`.agent` — agents written as ``async def agent(client, row)`` as rollout agents.
"""

from __future__ import annotations

__all__: list[str] = []
