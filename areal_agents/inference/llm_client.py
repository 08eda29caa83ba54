"""The per-episode ``llm`` backed by inference servers over HTTP (no torch)."""

from __future__ import annotations

import uuid
from typing import Any

from areal_agents.inference.client import InferenceClient
from areal_agents.llm import LLM, Generation, Tokenizer

__all__ = ["ClientLLM"]


class ClientLLM(LLM):
    """An :class:`~areal_agents.llm.LLM` whose generations come from an :class:`InferenceClient`.

    ``rid`` identifies the episode (a fresh one is made when omitted), so every turn of
    the episode goes to the same server; ``default_sampling`` holds SGLang sampling
    params applied to every call unless overridden.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        client: InferenceClient,
        rid: str | None = None,
        default_sampling: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.rid = rid if rid is not None else uuid.uuid4().hex
        super().__init__(tokenizer, default_sampling)

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Generation:
        return await self.client.generate(input_ids, sampling, rid=self.rid)
