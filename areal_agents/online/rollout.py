"""The rollout of an online run: batches of sessions that agents outside the run played (no torch).

:class:`OnlineRollout` implements the :class:`~areal_agents.rollout.interface.Rollout` protocol
the RL loop holds, with the gateway (:mod:`areal_agents.online.gateway`) as its source of
episodes instead of a dataset: it serves the gateway on an event loop of its own thread (in the
rollout's own process when ``rollout.process``, as the executor is), hands the trainer batches
of rewarded sessions (:meth:`SessionBook.take_batch <areal_agents.online.sessions.SessionBook.take_batch>`)
and drops the sessions the staleness rule or their TTL rule out. Calls are never paused: a weight
update reaches the calls being answered as it reaches episodes (each token keeps its version).
At start it writes ``RUN_DIR/gateway.json`` (its URL, where the admin key comes from, never the key),
removed when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from areal_agents.config import ExperimentConfig
from areal_agents.online.gateway import gateway_app, masked, resolve_admin_key
from areal_agents.online.sessions import OnlineState, SessionBook
from areal_agents.rollout.groups import batch_metrics
from areal_agents.rollout.staleness import StalenessBound
from areal_agents.runtime.hosts import is_loopback
from areal_agents.runtime.loop_thread import LoopThread
from areal_agents.types import Trajectory

__all__ = ["OnlineRollout", "build_online_rollout", "gateway_line"]

log = logging.getLogger("areal_agents.online")

_SWEEP_EVERY = 1.0  # seconds between two sweeps for expired sessions (at most)


def gateway_line(run_dir: str | Path) -> str:
    """One line saying how to reach a running gateway (from ``RUN_DIR/gateway.json``)."""
    info = json.loads((Path(run_dir) / "gateway.json").read_text())
    return (f"gateway: {info['url']}  open a session: POST {info['url']}/rl/sessions with the admin key "
            f"({info['admin_key']}, {info['admin_key_masked']}); docs/online.md")


class OnlineRollout:
    """Sessions from outside the run as the RL loop's rollout (see the module docstring).

    ``client`` generates (an :class:`~areal_agents.inference.client.InferenceClient`, closed at
    shutdown); ``sampling`` is the default SGLang sampling params of a call; ``tokenizer`` renders
    chats. Implements :class:`~areal_agents.rollout.interface.Rollout`.
    """

    runs_in = "the online gateway"

    def __init__(self, cfg: ExperimentConfig, *, client: Any, tokenizer: Any, sampling: dict[str, Any]) -> None:
        self.cfg = cfg.rollout
        self._exp = cfg
        online = cfg.online
        batch = online.batch_sessions or cfg.rollout.batch_size * cfg.rollout.group_size
        self._bound = StalenessBound(cfg.rollout.max_head_offpolicyness, batch, online.max_open_sessions)
        self.book = SessionBook(ttl=online.session_ttl, max_open=online.max_open_sessions, batch_sessions=batch,
                                bound=self._bound, turn_discount=cfg.env.turn_discount,
                                trajectory_mode=cfg.agent.trajectory_mode or "concat",
                                bounded_admission=online.admission == "bounded")
        self._client, self._tokenizer, self._sampling = client, tokenizer, dict(sampling)
        self._thread: LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._state = "new"
        self._last_batch: dict[str, float] = {}
        self._rate_mark = (time.monotonic(), 0, 0)
        self.url = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> OnlineRollout:
        """Serve the gateway (binds ``online.host:online.port``) and write ``RUN_DIR/gateway.json``."""
        if self._state != "new":
            raise RuntimeError(f"online rollout cannot start: it is {self._state}")
        run_dir = Path(self._exp.run_dir)
        key, source = resolve_admin_key(self._exp.online.admin_key_env, self._exp.online.admin_key_file, run_dir)
        host = self._exp.online.host
        if not is_loopback(host):
            log.warning("online.host=%s: the gateway is reachable from other machines (the admin key and session "
                        "keys are its only guard; put TLS in front of it)", host)
        self._thread = LoopThread("online-gateway")
        self._thread.start()
        try:
            self._thread.run(self._serve(host, key), 30.0)
        except BaseException:
            self._thread.stop(5.0)
            raise
        self._state = "running"
        self._rate_mark = (time.monotonic(), 0, 0)
        (run_dir / "gateway.json").write_text(json.dumps({
            "url": self.url, "base_url": f"{self.url}/v1", "admin_key": source, "admin_key_masked": masked(key),
            "batch_sessions": self.book.batch_sessions, "session_ttl": self.book.ttl}, indent=1))
        return self

    async def _serve(self, host: str, admin_key: str) -> None:
        app = gateway_app(self.book, admin_key=admin_key, client=self._client, tokenizer=self._tokenizer,
                          defaults=self._sampling, base_url=lambda: self.url,
                          max_request_bytes=self._exp.online.max_request_bytes)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                               shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, self._exp.online.port, backlog=1024)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(f"online gateway: cannot listen on {host}:{self._exp.online.port} ({exc.strerror or exc}); "
                          "set online.port (0 = any free port)") from None
        self._runner = runner
        port = int(runner.addresses[0][1])
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(_SWEEP_EVERY, self.book.ttl / 4))
            self.book.expire()

    async def _aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        with contextlib.suppress(Exception):
            await self._client.aclose()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the gateway; the sessions still open or waiting are dropped (``run_ended``). Idempotent."""
        state, self._state = self._state, "closed"
        self.book.close()
        if state != "running" or self._thread is None:
            return
        with contextlib.suppress(OSError):  # clients that read it find no gateway
            (Path(self._exp.run_dir) / "gateway.json").unlink()
        try:
            self._thread.run(self._aclose(), timeout)
        except Exception as exc:  # noqa: BLE001 - the shutdown goes on
            log.warning("online gateway: closing failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._thread.stop(timeout)

    def __enter__(self) -> OnlineRollout:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def bounded_staleness(self) -> bool:
        return self.book.bound.bounded

    @bounded_staleness.setter
    def bounded_staleness(self, value: bool) -> None:
        with self.book.cond:
            self.book.bound = StalenessBound(self._bound.eta, self._bound.batch_episodes, self._bound.max_concurrent,
                                             bool(value))

    def pause(self) -> None:
        """Nothing to stop: calls go on through a weight update (their tokens keep their versions)."""

    def resume(self) -> None:
        """See :meth:`pause`."""

    def set_version(self, version: int) -> None:
        """The trainer's weight version: rewarded sessions now too stale are dropped (``stale``)."""
        self.book.set_version(version)

    # ------------------------------------------------------------------ batches
    def wait(self, count: int, timeout: float | None = None) -> list[list[Trajectory]]:
        """The next batch of at least ``count`` rewarded sessions (whole groups), blocking up to
        ``timeout`` s (``TimeoutError``: nothing is taken)."""
        if count < 1:
            raise ValueError(f"count must be >= 1 (got {count})")
        deadline = None if timeout is None else time.monotonic() + timeout
        book = self.book
        with book.cond:
            while True:
                if self._state != "running":
                    raise RuntimeError(f"online rollout is {self._state}")
                groups = book.take_batch(count)
                if groups is not None:
                    return groups
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"online: {book.ready()} of {count} rewarded sessions ready after {timeout} s")
                book.cond.wait(_SWEEP_EVERY if remaining is None else min(remaining, _SWEEP_EVERY))

    def prepare_batch(self, timeout: float | None = None) -> list[list[Trajectory]]:
        """One training batch: ``online.batch_sessions`` rewarded sessions; updates :meth:`stats`."""
        groups = self.wait(self.book.batch_sessions, timeout)
        trajs = [t for g in groups for t in g]
        metrics = batch_metrics(trajs, self.book.version)
        now, done, tokens = time.monotonic(), self.book.rewarded, self.book.rewarded_tokens
        t0, f0, g0 = self._rate_mark  # rates of the sessions rewarded since the last batch
        self._rate_mark = (now, done, tokens)
        dt = max(now - t0, 1e-9)
        metrics["perf/episodes_per_s"] = (done - f0) / dt
        metrics["perf/gen_tokens_per_s"] = (tokens - g0) / dt
        metrics["online/batch_groups"] = float(len(groups))
        self._last_batch = metrics
        return groups

    def take_failed(self) -> list[Trajectory]:
        """Nothing: a call that fails is answered with its error and not recorded."""
        return []

    # ------------------------------------------------------------------ metrics and state
    def counts(self) -> dict[str, int]:
        """The ledger: ``opened == trained + dropped + in_flight``."""
        return self.book.counts()

    def stats(self) -> dict[str, float]:
        return {**self._last_batch, **self.book.metrics(), "rollout/version": float(self.book.version)}

    def state_dict(self) -> OnlineState:
        return self.book.state_dict()

    def load_state_dict(self, state: OnlineState) -> None:
        if self._state != "new":
            raise RuntimeError("load_state_dict() must be called before start()")
        self.book.load_state_dict(state)


def build_online_rollout(cfg: ExperimentConfig, addresses: list[str], model_path: str,
                         tokenizer: Any = None) -> OnlineRollout:
    """The online run's rollout (as :func:`~areal_agents.rollout.process.build_executor` builds a
    dataset run's): an inference client for ``addresses`` and the run's sampling params."""
    from areal_agents.rollout.wiring import inference_client, sampling_params

    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
    client = inference_client(cfg, addresses, lora_path=cfg.actor.lora.served)
    return OnlineRollout(cfg, client=client, tokenizer=tokenizer, sampling=sampling_params(cfg))
