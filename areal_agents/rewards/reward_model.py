"""Rewards from a reward model: a sequence-classification model's score of the conversation (no torch).

A :class:`RewardModel` is a judge (:class:`~areal_agents.rewards.judge.Judge`) that answers with a
number instead of a reply: the conversation (the ``rubric`` rendered with the row as the user's
turn, the completion as the assistant's) is rendered with the reward model's chat template and
sent to the server's ``/classify`` (SGLang's reward-model endpoint; the embedded server serves any
``AutoModelForSequenceClassification`` directory there: ``judge.model_path`` in a run, or
``areal-agents serve --model RM_DIR``). Its ``scale`` maps the model's output to the reward:

* ``"logit"`` — the first output as it is (a Bradley-Terry reward model's score);
* ``"sigmoid"`` — the first output through a sigmoid, in (0, 1);
* ``"softmax:K"`` — the probability of class ``K`` (a classifier with several labels).

With ``group=True`` it is a group reward (``rollout.group_reward``): the group's replies are scored
in one request, one batch on the server. As a judge's, its failures are ``reward_error`` s (counted,
the episode dropped), the same request is answered from the cache, and each request counts as a
judge call (``perf/judge_calls_per_s``).
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass
from typing import Any

from areal_agents.rewards.judge import Judge, JudgeError, RenderRow

__all__ = ["RewardModel", "check_model_scale"]

_TOKENIZERS: dict[str, Any] = {}
_SERVED: dict[str, str] = {}  # server root -> the tokenizer path it names
_LOCK = threading.Lock()
_SOFTMAX = re.compile(r"^softmax:(\d+)$")


def check_model_scale(scale: str) -> str:
    """``scale`` if a :class:`RewardModel` knows it (``ValueError`` naming the forms otherwise)."""
    if scale in ("logit", "sigmoid") or _SOFTMAX.match(scale):
        return scale
    raise ValueError(f"unknown reward model scale {scale!r}: logit, sigmoid or softmax:K")


@dataclass(frozen=True)
class RewardModel(Judge):
    """A reward read from a reward model's score (see the module docstring).

    ``rubric``: the user's turn, a ``str.format`` template of the row's fields (``{prompt}`` by
    default); ``system``: an optional system turn; ``base_url``: the server (its root, or its
    OpenAI base URL ending in ``/v1``; the run's judge server by default); ``tokenizer``: the
    directory whose chat template renders the conversation (default: the tokenizer the server
    reports at ``/get_model_info``); ``group``: score whole groups (a group reward).
    """

    rubric: str = "{prompt}"
    scale: str = "logit"
    model: str = "reward-model"
    tokenizer: str | None = None
    group: bool = False

    def check_scale(self) -> None:
        check_model_scale(self.scale)

    @property
    def __name__(self) -> str:
        return f"reward model @{self.base_url}"

    def root(self) -> str:
        """The server's root URL (the endpoint without its ``/v1``)."""
        return self.endpoint().rstrip("/").removesuffix("/v1")

    def messages(self, completion: Any, row: dict[str, Any]) -> list[dict[str, str]]:
        """The conversation scored: the rubric as the user's turn, ``completion`` as the assistant's."""
        user = self.rubric.format_map(RenderRow(row))
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": "user", "content": user}, {"role": "assistant", "content": str(completion)}]

    def ask(self, messages: list[Any]) -> str:
        """The server's raw scores for one conversation (or a list of them), as a JSON list."""
        convs = messages if messages and isinstance(messages[0], list) else [messages]
        texts = [self._render(conv) for conv in convs]
        return json.dumps(self._classify(texts))

    def _render(self, conv: list[dict[str, str]]) -> str:
        path = self.tokenizer or self._served_tokenizer()
        with _LOCK:
            tok = _TOKENIZERS.get(path)
        if tok is None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path)
            with _LOCK:
                _TOKENIZERS[path] = tok
        return str(tok.apply_chat_template(conv, tokenize=False))

    def _served_tokenizer(self) -> str:
        """The tokenizer the server names (asked once per server and process)."""
        root = self.root()
        with _LOCK:
            known = _SERVED.get(root)
        if known is not None:
            return known
        info = self._post_or_get("get_model_info", None)
        if not isinstance(info, dict) or not isinstance(info.get("tokenizer_path"), str):
            raise JudgeError(f"the reward model at {root} does not say its tokenizer (give RewardModel(tokenizer=DIR))")
        with _LOCK:
            _SERVED[root] = str(info["tokenizer_path"])
        return str(info["tokenizer_path"])

    def _classify(self, texts: list[str]) -> list[list[float]]:
        got = self._post_or_get("classify", {"text": texts})
        outs = [item.get("embedding") if isinstance(item, dict) else None for item in got] if isinstance(got, list) else []
        if len(outs) != len(texts) or not all(isinstance(o, list) and o and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in o) for o in outs):
            raise JudgeError(f"the reward model at {self.root()} answered {str(got)[:200]!r}, not one "
                             f"'embedding' (a list of numbers) for each of the {len(texts)} texts")
        return [[float(x) for x in o] for o in outs]  # type: ignore[union-attr]

    def _post_or_get(self, path: str, body: dict[str, Any] | None) -> Any:
        """The JSON answer of ``/path`` (POST when ``body`` is given), retried on connection errors and 5xx."""
        url = f"{self.root()}/{path}"
        return self.request(url, body, refused="the reward model", unanswered=f"the reward model at {url}")

    def value(self, outputs: list[float]) -> float:
        """The reward ``scale`` makes of one text's outputs."""
        if self.scale == "logit":
            return outputs[0]
        if self.scale == "sigmoid":
            return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, outputs[0]))))
        k = int(_SOFTMAX.match(self.scale).group(1))  # type: ignore[union-attr]
        if k >= len(outputs):
            raise JudgeError(f"reward model scale {self.scale!r}: the model has {len(outputs)} outputs")
        top = max(outputs)
        exps = [math.exp(x - top) for x in outputs]
        return exps[k] / sum(exps)

    def __call__(self, completion: Any, **row: Any) -> Any:
        if self.group:
            convs = [self.messages(c, row) for c in completion]
            return self.cached(convs, lambda reply: [self.value(o) for o in json.loads(reply)])
        return self.cached(self.messages(completion, row), lambda reply: self.value(json.loads(reply)[0]))
