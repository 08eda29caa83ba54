"""Rewards from a model: a judge asked through an OpenAI-compatible endpoint (no torch).

A :class:`Judge` is a reward like any other (``judge(completion, **row) -> float``, registered with
``register_reward("name")(Judge(...))``, named by an env's ``reward``): it renders its ``rubric``
with the row and the completion, asks the judge model with one ``/v1/chat/completions`` call, and
reads the score from the reply with its ``scale``:

* ``"yes/no"`` — the reply's first word: yes = 1.0, no = 0.0;
* ``"0-10"`` (any ``LO-HI``) — the first number of the reply, which must lie in the range, mapped to [0, 1];
* ``"choice:A=1,B=0.5,C=0"`` — the first of the choices the reply starts with, its value;
* ``"json:score"`` — the number under ``score`` in the first JSON object of the reply.

With ``after`` (e.g. ``"Verdict:"``) the scale reads only what follows the last ``after`` in the
reply: a judge that reasons (or works the answer out) first and gives its verdict last.
A reply the scale cannot read raises :class:`JudgeError` naming the reply; an endpoint that does
not answer within ``timeout`` after ``retries`` retries raises as well. By default a judge asks the
model the run serves for judges (``judge.model_path``, at ``$AREAL_AGENTS_JUDGE_URL``). In a run the judge runs in
the reward workers (:class:`~areal_agents.rewards.runner.RewardRunner`: beside the rollout, at most
``rollout.reward_workers`` calls at once, each under ``rollout.reward_timeout``), so a failure is
the episode's ``reward_error``: it is counted and the episode dropped, never scored 0 in silence.
The same request (rubric, completion and row) is answered from a cache of the process's last
4,096 replies. The endpoint is any OpenAI-compatible server: an external one (``base_url``, the
key in the environment variable ``api_key_env``), or ``areal-agents serve --model JUDGE_DIR``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["NOT_SERVED_YET", "GroupJudge", "Judge", "JudgeError", "RenderRow", "check_group_scale", "check_scale",
           "parse_group_scores", "parse_score"]

_T = TypeVar("_T")

NOT_SERVED_YET = "no judge endpoint"
"""How a judge's error starts when its endpoint variable is unset: before the run serves its judge
(the preflight check plays the env then, and lets this error pass)."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_RANGE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*-\s*(-?\d+(?:\.\d+)?)\s*$")
_CACHE_SIZE = 4096


class JudgeError(ValueError):
    """A judge's reply that its scale cannot read, or a judge that did not answer."""


def _shown(reply: str) -> str:
    return repr(reply if len(reply) <= 200 else reply[:200] + "...")


def parse_score(reply: str, scale: str) -> float:
    """The score ``scale`` reads in ``reply`` (see the module docstring); :class:`JudgeError`
    naming the reply when it cannot."""
    text = reply.strip()
    if scale == "yes/no":
        word = re.match(r"[A-Za-z]+", text)
        answer = word.group(0).lower() if word else ""
        if answer in ("yes", "no"):
            return 1.0 if answer == "yes" else 0.0
        raise JudgeError(f"the judge's reply {_shown(reply)} does not start with yes or no")
    if (bounds := _RANGE.match(scale)) is not None:
        lo, hi = float(bounds.group(1)), float(bounds.group(2))
        number = _NUMBER.search(text)
        if number is None or not lo <= float(number.group(0)) <= hi:
            raise JudgeError(f"the judge's reply {_shown(reply)} has no number in {lo:g}-{hi:g} first")
        return (float(number.group(0)) - lo) / (hi - lo)
    if scale.startswith("choice:"):
        choices = _choices(scale)
        for name, value in sorted(choices.items(), key=lambda kv: -len(kv[0])):  # the longest name first
            if text.lower().startswith(name.lower()):
                return value
        raise JudgeError(f"the judge's reply {_shown(reply)} starts with none of {', '.join(choices)}")
    if scale.startswith("json:"):
        key = scale[len("json:"):]
        found = _json_under(text, key)
        if isinstance(found, bool) or not isinstance(found, (int, float)):
            raise JudgeError(f"the judge's reply {_shown(reply)} has no JSON object with a number under {key!r}")
        return float(found)
    raise ValueError(f"unknown judge scale {scale!r}: yes/no, LO-HI (e.g. 0-10), choice:A=1,B=0 or json:KEY")


def _json_under(text: str, key: str) -> Any:
    """The value under ``key`` in the first JSON object of ``text`` (None when there is none)."""
    start = text.find("{")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except ValueError:
        return None
    return obj.get(key) if isinstance(obj, dict) else None


def _choices(scale: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in scale[len("choice:"):].split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"judge scale {scale!r}: each choice is NAME=VALUE")
        out[name.strip()] = float(value)
    return out


def check_scale(scale: str) -> str:
    """``scale`` if :func:`parse_score` knows it (``ValueError`` naming the forms otherwise)."""
    if scale == "yes/no" or _RANGE.match(scale) or scale.startswith("json:") and len(scale) > 5:
        return scale
    if scale.startswith("choice:"):
        _choices(scale)
        return scale
    raise ValueError(f"unknown judge scale {scale!r}: yes/no, LO-HI (e.g. 0-10), choice:A=1,B=0 or json:KEY")


class RenderRow(dict):  # type: ignore[type-arg]
    """Row fields for a rubric (``rubric.format_map(RenderRow(row))``); a field the row lacks is named in the error."""

    def __missing__(self, key: str) -> Any:
        raise JudgeError(f"the judge's rubric uses {{{key}}}, which the row does not have (it has: "
                         f"{', '.join(sorted(k for k in self if k != 'completion'))})")


_CLIENTS: dict[tuple[str, float], Any] = {}
_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_LOCK = threading.Lock()


def _close_clients() -> None:
    with _LOCK:
        for client in _CLIENTS.values():
            client.close()
        _CLIENTS.clear()


@dataclass(frozen=True)
class Judge:
    """A reward read from a judge model's reply (see the module docstring).

    ``rubric``: the user message, a ``str.format`` template of ``{completion}`` and the row's fields
    (``{prompt}``, ``{answer}``, ...); ``system``: an optional system message; ``scale``: how the
    reply is read; ``base_url``: the endpoint's OpenAI base URL (``http://HOST:PORT/v1``);
    ``model``: the model name sent; ``api_key_env``: the environment variable holding the key
    (none sent when unset); ``max_tokens``/``temperature``: the judge's sampling (greedy by default);
    ``after``: the marker the verdict follows (the scale reads the reply after its last occurrence).
    """

    rubric: str
    base_url: str = "$AREAL_AGENTS_JUDGE_URL"
    scale: str = "yes/no"
    model: str = "judge"
    system: str | None = None
    api_key_env: str | None = None
    max_tokens: int = 16
    temperature: float = 0.0
    timeout: float = 30.0
    retries: int = 2
    after: str = ""

    def __post_init__(self) -> None:
        self.check_scale()
        if not self.base_url.startswith(("http://", "https://", "$")):
            raise ValueError(f"{type(self).__name__}.base_url must be an http(s) URL ending in /v1, or $VARIABLE "
                             f"holding one (got {self.base_url!r})")

    def check_scale(self) -> None:
        """``ValueError`` naming the forms when :func:`parse_score` does not know ``scale``."""
        check_scale(self.scale)

    def endpoint(self) -> str:
        """The base URL asked: ``base_url``, or the value of the variable it names (``$NAME``)."""
        if not self.base_url.startswith("$"):
            return self.base_url
        url = os.environ.get(self.base_url[1:], "")
        if not url:
            raise JudgeError(f"{NOT_SERVED_YET}: {self.base_url} is unset (set judge.model_path for the run to "
                             "serve a judge model, or give the Judge a base_url)")
        return url

    @property
    def __name__(self) -> str:  # how the reward runner names the call in errors
        return f"judge {self.model}@{self.base_url}"

    def messages(self, completion: str, row: dict[str, Any]) -> list[dict[str, str]]:
        """The chat messages the judge is asked for ``completion`` of ``row``."""
        user = self.rubric.format_map(RenderRow({**row, "completion": completion}))
        return ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": user}]

    def client(self) -> Any:
        """The process's HTTP client for this judge's endpoint (one per endpoint and timeout, kept open)."""
        import httpx

        url = self.endpoint()
        with _LOCK:
            client = _CLIENTS.get((url, self.timeout))
            if client is None:
                if not _CLIENTS:
                    atexit.register(_close_clients)
                client = _CLIENTS[(url, self.timeout)] = httpx.Client(timeout=self.timeout)
            return client

    def ask(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply to ``messages`` (one call, retried on connection errors and 5xx)."""
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        url = self.endpoint()
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature}
        answer = self.request(f"{url.rstrip('/')}/chat/completions", body,
                              headers={"Authorization": f"Bearer {key}"} if key else {},
                              refused="the judge endpoint", unanswered=f"the judge at {url}")
        return str(answer["choices"][0]["message"]["content"] or "")

    def request(self, url: str, body: dict[str, Any] | None, *, headers: dict[str, str] | None = None,
                refused: str, unanswered: str) -> Any:
        """The JSON answer of ``url`` (POST ``body``, or GET when it is None), retried ``retries``
        times on connection errors and 5xx; :class:`JudgeError` naming ``refused`` for a 4xx, and
        ``unanswered`` when no try succeeded."""
        import httpx

        client, last = self.client(), ""
        for attempt in range(self.retries + 1):
            try:
                resp = client.post(url, json=body, headers=headers) if body is not None else client.get(url, headers=headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code < 500:
                    if resp.status_code != 200:
                        raise JudgeError(f"{refused} refused the request ({resp.status_code}): {resp.text[:300]}")
                    return resp.json()
                last = f"status {resp.status_code}: {resp.text[:200]}"
            if attempt < self.retries:
                time.sleep(min(2.0, 0.25 * 2**attempt))
        raise JudgeError(f"{unanswered} did not answer after {self.retries + 1} tries ({last})")

    def after_marker(self, reply: str) -> str:
        """What the scale reads: the reply after the last ``after`` (all of it when unset)."""
        if not self.after:
            return reply
        at = reply.rfind(self.after)
        if at < 0:
            raise JudgeError(f"the judge's reply {_shown(reply)} has no verdict (nothing after {self.after!r})")
        return reply[at + len(self.after):]

    def score(self, reply: str) -> float:
        """The score in the judge's ``reply`` (after the last ``after``, when set)."""
        return parse_score(self.after_marker(reply), self.scale)

    def cached(self, messages: list[Any], read: Callable[[str], _T]) -> _T:
        """``read(reply)`` for the judge's reply to ``messages``, from the cache when asked before."""
        key = (self, self.endpoint(), json.dumps(messages, sort_keys=True))
        with _LOCK:
            if key in _CACHE:
                _CACHE.move_to_end(key)
                return _CACHE[key]  # type: ignore[no-any-return]
        got = read(self.ask(messages))
        with _LOCK:
            _CACHE[key] = got
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
        return got

    def __call__(self, completion: str, **row: Any) -> float:
        return self.cached(self.messages(completion, row), self.score)


_LABELS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class GroupJudge(Judge):
    """A group reward (:func:`~areal_agents.rewards.builtin.group_reward`) read from one judge call
    that sees every reply of a group: ``judge(completions, **row) -> list[float]``.

    The ``rubric`` holds ``{completions}``: the replies labelled ``a``, ``b``, ... (``item`` per
    reply, ``{label}`` and ``{completion}``, joined by ``separator``), besides the row's fields. The
    ``scale`` reads the reply (after ``after``, when set):

    * ``"ranking"`` — labels best first (``b > a > c``): the i-th of n listed scores (n - i) / n, an
      unlisted reply 0;
    * ``"picks"`` — the labels of the acceptable replies (``a d``; ``none``): 1.0 each, the rest 0;
    * ``"verdicts"`` — a yes or no after each label, every label once (``a yes b no c: yes``); the
      reply graded may be quoted between them (``a 82 yes b 81 no``);
    * ``"scores:LO-HI"`` — one number per reply, in order, each in the range, mapped to [0, 1];
    * ``"json:KEY"`` — under ``KEY``, a list of one number per reply, or an object of label: number.

    With ``distinct=True`` the judge sees each different reply once (in order of first appearance)
    and every copy gets its score: shorter prompts, and no count of copies to sway the judge
    (a small judge asked about a group takes its most common answer for the right one).
    """

    scale: str = "ranking"
    item: str = "{label}) {completion}"
    separator: str = "\n"
    distinct: bool = False
    group = True

    def check_scale(self) -> None:
        """``ValueError`` naming the forms when :func:`parse_group_scores` does not know ``scale``."""
        check_group_scale(self.scale)

    def messages(self, completion: Any, row: dict[str, Any]) -> list[dict[str, str]]:
        """The chat messages the judge is asked for the group's replies ``completion`` (a list)."""
        replies = list(completion)
        if len(replies) > len(_LABELS):
            raise JudgeError(f"a group judge labels at most {len(_LABELS)} replies (got {len(replies)})")
        listed = self.separator.join(self.item.format(label=_LABELS[i], completion=c) for i, c in enumerate(replies))
        user = self.rubric.format_map(RenderRow({**row, "completions": listed}))
        return ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": user}]

    def scores(self, reply: str, n: int) -> list[float]:
        """The ``n`` scores the judge's ``reply`` gives (:class:`JudgeError` naming it when unreadable)."""
        return parse_group_scores(self.after_marker(reply), self.scale, n)

    def __call__(self, completion: Any, **row: Any) -> list[float]:  # type: ignore[override]
        replies = list(completion)
        shown = list(dict.fromkeys(replies)) if self.distinct else replies
        scores = self.cached(self.messages(shown, row), lambda reply: self.scores(reply, len(shown)))
        if not self.distinct:
            return scores
        by_reply = dict(zip(shown, scores, strict=True))
        return [by_reply[r] for r in replies]


def check_group_scale(scale: str) -> str:
    """``scale`` if :func:`parse_group_scores` knows it (``ValueError`` naming the forms otherwise)."""
    if scale in ("ranking", "picks", "verdicts") or scale.startswith("json:") and len(scale) > 5 or \
            scale.startswith("scores:") and _RANGE.match(scale[len("scores:"):]):
        return scale
    raise ValueError(f"unknown group judge scale {scale!r}: ranking, picks, verdicts, scores:LO-HI or json:KEY")


def _labels(text: str, n: int, reply: str) -> list[int]:
    """The reply labels ``text`` names, in order: its one-letter lowercase words (``none`` alone: no label)."""
    words = re.findall(r"[A-Za-z]+", text)
    if [w.lower() for w in words] == ["none"]:
        return []
    found = [_LABELS.index(w) for w in words if len(w) == 1 and w in _LABELS]  # labels are lowercase letters
    if any(k >= n for k in found):
        raise JudgeError(f"the judge's reply {_shown(reply)} names a reply past {_LABELS[n - 1]}")
    if not found:
        raise JudgeError(f"the judge's reply {_shown(reply)} names none of the replies {', '.join(_LABELS[:n])}")
    if len(set(found)) < len(found):
        raise JudgeError(f"the judge's reply {_shown(reply)} names a reply twice")
    return found


def parse_group_scores(reply: str, scale: str, n: int) -> list[float]:
    """The ``n`` scores ``scale`` reads in ``reply`` (see :class:`GroupJudge`); :class:`JudgeError` naming
    the reply when it cannot."""
    check_group_scale(scale)
    if scale == "verdicts":
        said = re.findall(r"\b([a-z])\)?\s*:?\s*(?:[^\s:]+\s+)?(yes|no)\b", reply, flags=re.IGNORECASE)
        labels = [label for label, _ in said]
        if sorted(labels) != list(_LABELS[:n]):
            raise JudgeError(f"the judge's reply {_shown(reply)} does not give one yes or no to each of "
                             f"{', '.join(_LABELS[:n])}")
        return [1.0 if dict(said)[label].lower() == "yes" else 0.0 for label in _LABELS[:n]]
    if scale in ("ranking", "picks"):
        order = _labels(reply, n, reply)
        out = [0.0] * n
        for i, k in enumerate(order):
            out[k] = 1.0 if scale == "picks" else (n - i) / n
        return out
    if scale.startswith("scores:"):
        lo, hi = (float(x) for x in _RANGE.match(scale[len("scores:"):]).groups())  # type: ignore[union-attr]
        numbers = [float(x) for x in _NUMBER.findall(reply)][:n]
        if len(numbers) < n or not all(lo <= x <= hi for x in numbers):
            raise JudgeError(f"the judge's reply {_shown(reply)} does not give {n} numbers in {lo:g}-{hi:g}")
        return [(x - lo) / (hi - lo) for x in numbers]
    key = scale[len("json:"):]
    found = _json_under(reply, key)
    if isinstance(found, dict):
        found = [found.get(label) for label in _LABELS[:n]]
    if not isinstance(found, list) or len(found) != n or \
            not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in found):
        raise JudgeError(f"the judge's reply {_shown(reply)} has no JSON object with {n} numbers under {key!r}")
    return [float(x) for x in found]
