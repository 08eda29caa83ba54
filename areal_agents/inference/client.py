"""Async client for SGLang-protocol servers (the embedded one or real SGLang); no torch.

One :class:`InferenceClient` spreads ``/generate`` calls over several servers:

* **choice** — ``round_robin`` or ``least_loaded`` (fewest requests in flight from this
  client); a ``rid`` (one per episode) sticks to the server it first went to;
* **faults** — connection errors, timeouts and 5xx replies are retried with exponential
  backoff; a server that fails that way leaves the rotation, its request goes to another
  one, and it is probed with ``GET /health`` before it comes back;
* **interruptible generation** — a reply with ``finish_reason.type == "abort"`` (a weight
  update interrupted it) is resumed from prompt + partial output with the remaining token
  budget; output ids, logprobs and the weight version of every token are concatenated;
* **request batching** — requests bound for one server within ``batch_window`` seconds of
  each other (a group's samples, say) travel in one batched ``/generate`` POST, which both
  sides parse once instead of once per request. A batch a server refuses with a 4xx is
  re-sent one request at a time, so only a bad request fails. With ``stream_batches`` (the
  embedded server) the batch is streamed and each request gets its reply as soon as it
  finishes, not when the batch's longest one does.

aiohttp sessions are bound to an event loop, so the client keeps one session per loop.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from areal_agents.inference.protocol import Generation, InferenceError, parse_generate_reply

__all__ = ["InferenceClient", "InferenceError", "normalize_address"]

_MAX_STICKY = 100_000


class _Retryable(Exception):
    """A failure worth retrying on another server (connection, timeout, 5xx)."""


class _Refused(InferenceError):
    """The server refused the request (HTTP 4xx): retrying it unchanged cannot help."""


def normalize_address(addr: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port``."""
    addr = addr.strip().rstrip("/")
    if not addr:
        raise ValueError("empty server address")
    return addr if addr.startswith(("http://", "https://")) else f"http://{addr}"


@dataclass(eq=False)
class _Waiting:
    """One request in a batch: its payload, the future of its reply, the POST that carries it and its members."""

    payload: dict[str, Any]
    reply: asyncio.Future[Any]
    post: asyncio.Future[None] | None = None
    members: list[_Waiting] | None = None
    cancelled: bool = False


def _settle(w: _Waiting, outcome: Any) -> None:
    if w.reply.done():
        return
    if isinstance(outcome, BaseException):
        w.reply.set_exception(outcome)
    else:
        w.reply.set_result(outcome)


_BATCH_DEFAULTS: dict[str, Any] = {"return_logprob": False, "top_logprobs_num": 0, "lora_path": None,
                                   "logprob_start_len": -1}


def _batched(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One batched ``/generate`` body: ``input_ids`` and ``sampling_params`` as lists, every
    other field one value when the requests agree on it, else a list (one per request)."""
    body: dict[str, Any] = {"input_ids": [p["input_ids"] for p in payloads],
                            "sampling_params": [p["sampling_params"] for p in payloads]}
    for key in sorted({k for p in payloads for k in p} - {"input_ids", "sampling_params"}):
        values = [p.get(key, _BATCH_DEFAULTS.get(key)) for p in payloads]
        body[key] = values[0] if all(v == values[0] for v in values) else values
    return body


@dataclass(eq=False)
class InferenceClient:
    """``/generate`` over several servers with sticky choice, retries and resume-on-abort."""

    addresses: Sequence[str]
    schedule: str = "round_robin"
    timeout: float = 300.0
    retries: int = 3
    backoff: float = 0.1
    max_backoff: float = 5.0
    reprobe_after: float = 2.0
    abort_wait: float = 0.05
    max_resumes: int = 1000
    max_empty_aborts: int = 20
    lora_path: str | None = None
    batch_window: float = 0.002
    max_batch: int = 64
    stream_batches: bool = False

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("InferenceClient needs at least one server address")
        if self.schedule not in ("round_robin", "least_loaded"):
            raise ValueError(f"schedule must be round_robin or least_loaded (got {self.schedule!r})")
        self.urls = [normalize_address(a) for a in self.addresses]
        self.lora = {"lora_path": self.lora_path} if self.lora_path else {}  # every request decodes with this adapter
        self.inflight = [0] * len(self.urls)
        self.dead_until: dict[int, float] = {}
        self._rr = itertools.cycle(range(len(self.urls)))
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self.stats = {"requests": 0, "retries": 0, "resumes": 0, "failovers": 0, "posts": 0}
        self._pending: dict[tuple[asyncio.AbstractEventLoop, int], list[_Waiting]] = {}

    # ------------------------------------------------------------------ sessions
    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for other in [lp for lp in self._sessions if lp.is_closed()]:
                del self._sessions[other]  # sessions of finished loops cannot be reused
            connector = aiohttp.TCPConnector(limit=0, force_close=False)
            session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close this event loop's session (call once per loop that used the client)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ choice
    def _alive(self) -> list[int]:
        now = time.monotonic()
        return [i for i in range(len(self.urls)) if self.dead_until.get(i, 0.0) <= now]

    async def _probe_revived(self) -> None:
        """Servers whose back-off expired come back only if ``/health`` answers 200."""
        now = time.monotonic()
        for i, until in list(self.dead_until.items()):
            if until <= now and until > 0:
                try:
                    async with self._session().get(self.urls[i] + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        ok = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                if ok:
                    self.dead_until.pop(i, None)
                else:
                    self.dead_until[i] = time.monotonic() + self.reprobe_after

    async def _choose(self, rid: str | None) -> int:
        if self.dead_until:
            await self._probe_revived()
        alive = self._alive()
        if not alive:
            raise _Retryable("no live server")
        if rid is not None:
            idx = self._sticky.get(rid)
            if idx is not None and idx in alive:
                self._sticky.move_to_end(rid)
                return idx
        if self.schedule == "least_loaded":
            idx = min(alive, key=lambda i: (self.inflight[i], i))
        else:
            idx = next(self._rr)
            while idx not in alive:
                idx = next(self._rr)
        if rid is not None:
            self._sticky[rid] = idx
            if len(self._sticky) > _MAX_STICKY:
                self._sticky.popitem(last=False)
        return idx

    # ------------------------------------------------------------------ requests
    async def _post_once(self, idx: int, payload: dict[str, Any]) -> Any:
        """The reply to ``payload`` from server ``idx``: sent alone, or batched with the
        requests that arrive for that server within ``batch_window`` seconds."""
        if self.batch_window <= 0:
            return await self._send(idx, payload)
        loop = asyncio.get_running_loop()
        key = (loop, idx)
        batch = self._pending.get(key)
        if batch is None:
            batch = self._pending[key] = []
            loop.call_later(self.batch_window, self._flush, key, batch)
        waiting = _Waiting(payload, loop.create_future())
        batch.append(waiting)
        if len(batch) >= self.max_batch:
            self._flush(key, batch)
        try:
            return await waiting.reply
        except asyncio.CancelledError:
            waiting.cancelled = True  # its batch goes on for the others; a batch nobody waits for is cancelled
            if waiting.post is not None and all(w.cancelled or w.reply.done() for w in waiting.members or ()):
                waiting.post.cancel()
            raise

    def _flush(self, key: tuple[asyncio.AbstractEventLoop, int], batch: list[_Waiting]) -> None:
        if self._pending.get(key) is batch:
            del self._pending[key]
        members = [w for w in batch if not w.cancelled and w.post is None]
        if members:
            post = asyncio.ensure_future(self._send_batch(key[1], members))
            for w in members:
                w.post, w.members = post, members

    async def _send_batch(self, idx: int, members: list[_Waiting]) -> None:
        try:
            if len(members) == 1:
                replies = [await self._send(idx, members[0].payload)]
            elif self.stream_batches:  # settles each member as its reply arrives; any left over had none
                await self._stream(idx, members)
                replies = [_Retryable(f"{self.urls[idx]}: the streamed batch sent no reply for it")] * len(members)
            else:
                replies = await self._send(idx, _batched([w.payload for w in members]))
                if not isinstance(replies, list) or len(replies) != len(members):
                    raise InferenceError(f"{self.urls[idx]}: a batch of {len(members)} requests got "
                                         f"{type(replies).__name__} {str(replies)[:100]!r}, not a list of replies")
        except Exception as exc:  # noqa: BLE001 - an error reaches every member
            if len(members) > 1 and isinstance(exc, _Refused):
                # a 4xx names one bad request at most: send each alone so that only it fails
                replies = await asyncio.gather(*(self._send(idx, w.payload) for w in members), return_exceptions=True)
            else:
                replies = [exc] * len(members)
        except BaseException as exc:  # cancellation reaches every member as a retryable error
            for w in members:
                _settle(w, _Retryable(f"batch cancelled: {exc!r}"))
            raise
        for w, reply in zip(members, replies, strict=True):
            _settle(w, reply)

    async def _stream(self, idx: int, members: list[_Waiting]) -> None:
        """Send ``members`` as one streamed batch and settle each from its event (``index``,
        the whole reply once ``finish_reason`` is set, or an ``error``) as it arrives."""
        url = self.urls[idx] + "/generate"
        self.stats["posts"] += 1
        async with self._session().post(url, json={**_batched([w.payload for w in members]), "stream": True}) as resp:
            if resp.status != 200:
                await self._refusal(url, resp)
            buffer = b""
            async for chunk in resp.content.iter_any():
                *events, buffer = (buffer + chunk).split(b"\n\n")
                for event in events:
                    if event.startswith(b"data: [DONE]"):
                        return
                    if event.startswith(b"data:"):
                        self._settle_event(url, members, event[5:])
        raise _Retryable(f"{url}: the streamed batch ended before its [DONE]")

    @staticmethod
    def _settle_event(url: str, members: list[_Waiting], data: bytes) -> None:
        try:
            body = json.loads(data)
            i = body["index"]
            member = members[i] if type(i) is int and 0 <= i < len(members) else None
        except (ValueError, TypeError, KeyError):
            member = None
        if member is None:
            raise InferenceError(f"{url}: a streamed batch event has no valid 'index' (got {data[:100]!r})")
        if "error" in body:  # one request failed on the server: worth a retry, as a 5xx
            _settle(member, _Retryable(f"{url}: {str(body['error'])[:200]}"))
        elif isinstance(body.get("meta_info"), dict) and body["meta_info"].get("finish_reason") is not None:
            _settle(member, body)

    @staticmethod
    async def _refusal(url: str, resp: aiohttp.ClientResponse) -> None:
        """Raise what a non-200 reply means: a 5xx is worth a retry, a 4xx names a bad request."""
        if resp.status >= 500:
            raise _Retryable(f"{url}: HTTP {resp.status}")
        try:
            body = await resp.json(content_type=None)
        except ValueError:
            raise InferenceError(f"{url}: reply is not JSON (HTTP {resp.status})") from None
        msg = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise _Refused(f"{url}: HTTP {resp.status}: {msg or str(body)[:200]}")

    async def _send(self, idx: int, payload: dict[str, Any]) -> Any:
        url = self.urls[idx] + "/generate"
        self.stats["posts"] += 1
        async with self._session().post(url, json=payload) as resp:
            if resp.status != 200:
                await self._refusal(url, resp)
            try:
                return await resp.json(content_type=None)
            except ValueError:
                raise InferenceError(f"{url}: reply is not JSON (HTTP {resp.status})") from None

    async def _post(self, payload: dict[str, Any], rid: str | None) -> tuple[Any, str]:
        """POST to a live server; a failed one is marked down and the next live one tried at
        once. With every server down, each attempt waits for the earliest ``/health`` re-probe
        (at least ``backoff``, doubling): one transient error on the last live server costs a
        re-probe, not the request. All attempts together take at most ``timeout`` seconds
        (wherever one is stuck: connecting, in a batch, waiting for the reply), then
        :class:`InferenceError` says so in one line."""
        attempt, deadline = 0, time.monotonic() + self.timeout
        while True:
            try:
                idx = await self._choose(rid)
            except _Retryable as exc:
                err: BaseException = exc
                idx = -1
            else:
                self.inflight[idx] += 1
                try:
                    reply = await asyncio.wait_for(self._post_once(idx, payload), max(0.0, deadline - time.monotonic()))
                    return reply, self.urls[idx]
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, _Retryable) as exc:
                    err = exc
                    self.dead_until[idx] = time.monotonic() + self.reprobe_after  # out of the rotation
                    self.stats["failovers"] += 1
                finally:
                    self.inflight[idx] -= 1
            attempt += 1
            self.stats["retries"] += 1
            where = self.urls[idx] if idx >= 0 else "any server"
            if time.monotonic() >= deadline:
                raise InferenceError(f"/generate got no reply within {self.timeout:g} s "
                                     f"(inference.request_timeout; {attempt} attempts, last {where}: {err!r})") from err
            if attempt > self.retries:
                raise InferenceError(f"/generate failed after {attempt} attempts ({where}): {err!r}") from err
            if not self._alive():
                reprobe = min(self.dead_until.values(), default=0.0) - time.monotonic()
                backoff = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
                await asyncio.sleep(max(0.0, min(max(reprobe, backoff), deadline - time.monotonic())))

    async def generate(self, input_ids: Sequence[int], sampling: dict[str, Any], rid: str | None = None, *,
                       top_logprobs: int = 0) -> Generation:
        """Complete ``input_ids`` with SGLang ``sampling`` params, resuming after aborts.

        ``rid`` (e.g. the episode id) keeps the episode's requests on one server. With
        ``top_logprobs`` > 0, ``info["top_logprobs"]`` holds, per output token, the server's
        ``[[logprob, token_id, text], ...]`` of its most likely tokens.
        """
        if sampling.get("n", 1) not in (1, None):
            raise ValueError("InferenceClient.generate makes one completion per call; call it n times instead of n > 1")
        self.stats["requests"] += 1
        prompt = [int(t) for t in input_ids]
        budget = int(sampling.get("max_new_tokens", 128))
        min_new = int(sampling.get("min_new_tokens", 0) or 0)
        out: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        texts: list[str] = []
        tops: list[Any] = []
        finish: dict[str, Any] = {"type": "length", "length": 0}
        resumes = empty = 0
        while True:
            params = {**sampling, "max_new_tokens": budget - len(out)}
            if min_new:
                params["min_new_tokens"] = max(0, min_new - len(out))
            payload = {"input_ids": prompt + out, "sampling_params": params, "return_logprob": True, **self.lora}
            if top_logprobs > 0:
                payload["top_logprobs_num"] = top_logprobs
            body, url = await self._post(payload, rid)
            seg = parse_generate_reply(body, url)
            ids, finish = seg.output_ids, seg.info["finish"]
            if top_logprobs > 0:
                tops += seg.info.get("top_logprobs", [[]] * len(ids))
            out += ids
            lps += seg.logprobs
            versions += seg.versions
            texts.append(seg.text)
            if finish["type"] != "abort" or len(out) >= budget or resumes >= self.max_resumes:
                break
            empty = 0 if ids else empty + 1
            if empty > self.max_empty_aborts:
                raise InferenceError(f"{url} aborted the request {empty} times in a row without output: "
                                     f"{finish.get('message', '')}")  # fmt: skip
            resumes += 1
            self.stats["resumes"] += 1
            await asyncio.sleep(min(self.abort_wait * 2**empty, self.max_backoff))
        if finish["type"] == "abort" and len(out) >= budget:
            finish = {"type": "length", "length": len(out)}
        return Generation(
            output_ids=out,
            logprobs=lps,
            versions=versions,
            finish_reason=finish["type"],
            text="".join(texts),
            info={"finish": finish, "resumes": resumes, "server": url,
                  **({"top_logprobs": tops} if top_logprobs > 0 else {})},
        )
