"""The online gateway against a real embedded inference server, over real HTTP: sessions opened
with the admin key, the official ``openai`` client calling with a session key, rewards posted
later, batches of token-exact trajectories, the security rules and the ledger in every case
(no reward, no calls, expiry, staleness, a client that hangs up mid-call, a restart)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from areal_agents.config.loader import load_config
from areal_agents.inference.launcher import ServerGroup, launch_servers
from areal_agents.online.rollout import OnlineRollout, build_online_rollout, gateway_line

ADMIN = "sk-admin-test-0123456789abcdef"
USER = [{"role": "user", "content": "What is 12 + 30?"}]


def corpus(n: int = 200) -> Iterator[str]:
    for a in range(n):
        yield (f"<|im_start|>user\nWhat is {a % 50} + {a // 50}?<|im_end|>\n<|im_start|>assistant\n"
               f"The answer is {a % 50 + a // 50}.<|im_end|>\n")


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model(corpus(), seed=0)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    cfg = load_config(None, ["env.name=math"])
    cfg.inference.setup_timeout = 120.0
    with launch_servers(cfg, str(model), 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group


def make_rollout(server: ServerGroup, model: Path, run_root: Path, monkeypatch: pytest.MonkeyPatch,
                 *extra: str) -> OnlineRollout:
    monkeypatch.setenv("AREAL_AGENTS_ADMIN_KEY", ADMIN)
    cfg = load_config(None, ["env.name=math", "mode=online", "online.port=0", f"output_dir={run_root}",
                             "rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=8", *extra])
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    return build_online_rollout(cfg, list(server.addresses), str(model))


@pytest.fixture
def gateway(server: ServerGroup, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OnlineRollout]:
    rollout = make_rollout(server, model, tmp_path, monkeypatch).start()
    try:
        yield rollout
    finally:
        rollout.shutdown()


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)


def balanced(rollout: OnlineRollout) -> dict[str, int]:
    c = rollout.counts()
    assert c["opened"] == c["trained"] + c["dropped"] + c["in_flight"], c
    assert c["in_flight"] == c["open"] + c["waiting"], c
    return c


def ask(base_url: str, key: str, stream: bool = False, **kw: Any) -> str:
    """One chat completion through the official client; returns its text."""
    async def main() -> str:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
            if stream:
                chunks = await client.chat.completions.create(model="policy", messages=USER, stream=True, **kw)
                return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
            reply = await client.chat.completions.create(model="policy", messages=USER, **kw)
            return reply.choices[0].message.content or ""

    return asyncio.run(main())


def test_a_session_from_opening_to_a_trained_batch(gateway: OnlineRollout) -> None:
    info = json.loads((Path(gateway._exp.run_dir) / "gateway.json").read_text())
    assert info["url"] == gateway.url and ADMIN not in json.dumps(info) and info["admin_key"] == "$AREAL_AGENTS_ADMIN_KEY"
    line = gateway_line(gateway._exp.run_dir)
    assert gateway.url in line and ADMIN not in line and f"{ADMIN[:4]}…{ADMIN[-4:]}" in line
    with admin(gateway.url) as http:
        grouped = [http.post("/rl/sessions", json={"group": "q1", "metadata": {"i": i}}).json() for i in range(2)]
        single = [http.post("/rl/sessions").json() for _ in range(2)]
        assert all(s["base_url"] == gateway.url + "/v1" and s["key"].startswith("sk-ses-") for s in grouped + single)
        assert len({s["key"] for s in grouped + single}) == 4
        texts = [ask(s["base_url"], s["key"], stream=i % 2 == 1, max_tokens=6) for i, s in enumerate(grouped + single)]
        assert all(isinstance(t, str) for t in texts)
        # a second call that extends the first: one multi-turn trajectory
        async def follow() -> None:
            async with openai.AsyncOpenAI(base_url=single[0]["base_url"], api_key=single[0]["key"]) as c:
                await c.chat.completions.create(model="policy", max_tokens=4, messages=[
                    *USER, {"role": "assistant", "content": texts[2]}, {"role": "user", "content": "And 1 + 1?"}])
        asyncio.run(follow())
        assert http.get(f"/rl/sessions/{single[0]['key']}").json()["calls"] == 2
        for s, r in zip(grouped + single, [1.0, 0.0, 0.5, 0.25], strict=True):
            got = httpx.post(f"{gateway.url}/rl/sessions/{s['key']}/reward", json={"reward": r})
            assert got.status_code == 200 and got.json() == {"id": s["id"], "status": "waiting", "reason": None}
        ledger = http.get("/rl/ledger").json()
        assert ledger["opened"] == 4 and ledger["waiting"] == 4 and ledger["ready"] == 4
    groups = gateway.prepare_batch(timeout=10)
    balanced(gateway)
    assert gateway.counts()["trained"] == 4
    by_size = sorted(groups, key=len)
    assert [len(g) for g in by_size] == [2, 2]
    assert len({t.group_id for g in groups for t in g}) == 2 and all(len({t.group_id for t in g}) == 1 for g in groups)
    rewards = sorted(t.reward for g in groups for t in g)
    assert rewards == [0.0, 0.25, 0.5, 1.0]
    multi = next(t for g in groups for t in g if t.info["session_id"] == single[0]["id"])
    assert multi.num_turns == 2 and multi.turn_rewards == [0.0, 0.5]
    for traj in (t for g in groups for t in g):
        traj.validate()
        assert traj.num_generated > 0 and all(v == 0 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m)
    stats = gateway.stats()
    assert stats["online/trained"] == 4 and stats["rollout/reward"] == pytest.approx(0.4375)


def test_keys_are_scoped_and_errors_are_openai_shaped(gateway: OnlineRollout) -> None:
    url = gateway.url
    with admin(url) as http:
        s = http.post("/rl/sessions").json()
        other = http.post("/rl/sessions").json()
    refused = [
        httpx.post(f"{url}/rl/sessions"),  # no admin key
        httpx.post(f"{url}/rl/sessions", headers={"Authorization": f"Bearer {s['key']}"}),  # a session key
        httpx.post(f"{url}/rl/sessions", headers={"Authorization": "Bearer " + ADMIN[:-1] + "x"}),
        httpx.post(f"{url}/v1/chat/completions", json={"model": "p", "messages": USER},
                   headers={"Authorization": f"Bearer {ADMIN}"}),  # the admin key is no session
        httpx.post(f"{url}/v1/chat/completions", json={"model": "p", "messages": USER},
                   headers={"Authorization": "Bearer sk-ses-guessed"}),
        httpx.get(f"{url}/rl/ledger", headers={"Authorization": f"Bearer {s['key']}"}),
    ]
    assert [r.status_code for r in refused] == [401] * 6
    for r in refused:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"} and r.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        ask(f"{url}/v1", "sk-ses-nope", max_tokens=2)
    missing = httpx.post(f"{url}/rl/sessions/sk-ses-nope/reward", json={"reward": 1})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
    by_id = httpx.post(f"{url}/rl/sessions/{s['id']}/end")  # an id names a session only with the admin key
    assert by_id.status_code == 404
    nowhere = httpx.get(f"{url}/nowhere")
    assert nowhere.status_code == 404 and "error" in nowhere.json()
    big = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {s['key']}"},
                     content=b'{"model": "p", "messages": [' + b" " * (5 * 1024**2) + b"]}")
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
    bad = [httpx.post(f"{url}/rl/sessions/{s['key']}/reward", **kw) for kw in (
        {"json": {"reward": "1"}}, {"json": {"reward": None}},
        {"json": {"reward": 1, "rewards": [1]}}, {"json": {}}, {"content": b"not json"},
        {"json": {"rewards": []}}, {"json": [1]})]
    assert [r.status_code for r in bad] == [400] * 7, [r.text for r in bad]
    with admin(url) as http:
        assert http.post("/rl/sessions", json={"group": ""}).status_code == 400
        assert http.post("/rl/sessions", json={"metadata": {"x": "y" * 20_000}}).status_code == 400
        assert http.post("/rl/sessions", json={"grop": "typo"}).json()["error"]["param"] == "grop"
        assert http.get(f"/rl/sessions/{other['id']}").json()["status"] == "open"  # by id, with the admin key
        assert http.post(f"/rl/sessions/{other['id']}/end").json() == {"id": other["id"], "status": "dropped",
                                                                        "reason": "no_calls"}
    c = balanced(gateway)
    assert c == {"opened": 2, "trained": 0, "dropped": 1, "in_flight": 1, "open": 1, "waiting": 0}


def test_rewards_twice_late_or_for_nothing_change_nothing(server: ServerGroup, model: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rollout = make_rollout(server, model, tmp_path, monkeypatch, "online.session_ttl=1.5").start()
    try:
        url = rollout.url
        with admin(url) as http:
            a, b, c, d = (http.post("/rl/sessions").json() for _ in range(4))
            for s in (a, b, c):
                ask(s["base_url"], s["key"], max_tokens=3)
            assert httpx.post(f"{url}/rl/sessions/{a['key']}/reward", json={"reward": 1}).status_code == 200
            before = http.get("/rl/ledger").json()
            again = httpx.post(f"{url}/rl/sessions/{a['key']}/reward", json={"reward": 0})
            assert again.status_code == 409 and again.json()["error"]["code"] == "session_closed"
            assert httpx.post(f"{url}/rl/sessions/{a['key']}/end").status_code == 409
            with pytest.raises(openai.AuthenticationError):  # a rewarded session takes no more calls
                ask(a["base_url"], a["key"], max_tokens=2)
            wrong = httpx.post(f"{url}/rl/sessions/{b['key']}/reward", json={"rewards": [1, 0]})  # b made 1 call
            assert wrong.status_code == 400 and "made 1 calls" in wrong.json()["error"]["message"]
            assert http.get("/rl/ledger").json() == before
            assert httpx.post(f"{url}/rl/sessions/{b['key']}/end").json()["reason"] == "no_reward"
            assert httpx.post(f"{url}/rl/sessions/{d['key']}/reward", json={"reward": 1}).json() == {
                "id": d["id"], "status": "dropped", "reason": "no_calls"}
            deadline = time.monotonic() + 30  # c expires 1.5 s after its call
            while not http.get("/rl/ledger").json()["dropped_by_reason"].get("expired") and time.monotonic() < deadline:
                time.sleep(0.1)
            late = httpx.post(f"{url}/rl/sessions/{c['key']}/reward", json={"reward": 1})
            assert late.status_code == 404
            ledger = http.get("/rl/ledger").json()
        assert ledger["dropped_by_reason"] == {"no_reward": 1, "no_calls": 1, "expired": 1}
        assert ledger["waiting"] == 1 and balanced(rollout)["opened"] == 4
    finally:
        rollout.shutdown()
    assert rollout.counts() == {"opened": 4, "trained": 0, "dropped": 4, "in_flight": 0, "open": 0, "waiting": 0}
    assert rollout.book.dropped["run_ended"] == 1


def test_a_client_that_hangs_up_mid_call_leaves_its_session_usable(gateway: OnlineRollout) -> None:
    with admin(gateway.url) as http:
        s = http.post("/rl/sessions").json()

    async def hang_up() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            call = asyncio.ensure_future(c.post(f"{s['base_url']}/chat/completions", json={
                "model": "p", "messages": USER, "max_tokens": 4000, "stream": True}, headers={"Authorization": f"Bearer {s['key']}"}))
            deadline = time.monotonic() + 30
            while not gateway.book.get(s["key"]).calls_running and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert gateway.book.get(s["key"]).calls_running == 1  # hung up while the call is being answered
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

    asyncio.run(hang_up())
    deadline = time.monotonic() + 30
    while gateway.book.get(s["key"]).calls_running and time.monotonic() < deadline:
        time.sleep(0.05)
    session = gateway.book.get(s["key"])
    assert session.calls_running == 0 and session.chat is not None and session.chat.records == []
    ask(s["base_url"], s["key"], max_tokens=3)
    assert httpx.post(f"{gateway.url}/rl/sessions/{s['key']}/reward", json={"reward": 1}).json()["status"] == "waiting"
    assert balanced(gateway)["waiting"] == 1


def test_stale_sessions_are_dropped_and_waiting_ones_survive_a_restart(server: ServerGroup, model: Path,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rollout = make_rollout(server, model, tmp_path, monkeypatch, "rollout.max_head_offpolicyness=1").start()
    try:
        with admin(rollout.url) as http:
            old, kept, still_open = (http.post("/rl/sessions").json() for _ in range(3))
            for s in (old, kept, still_open):
                ask(s["base_url"], s["key"], max_tokens=3)
            httpx.post(f"{rollout.url}/rl/sessions/{old['key']}/reward", json={"reward": 1})
            rollout.set_version(2)  # tokens of version 0 are now 2 versions behind: η = 1
            assert rollout.book.dropped["stale"] == 1
            late = httpx.post(f"{rollout.url}/rl/sessions/{kept['key']}/reward", json={"rewards": [0.5]})
            assert late.json() == {"id": kept["id"], "status": "dropped", "reason": "stale"}
            rollout.set_version(0)  # (a test's liberty: make the next reward fresh again)
            fresh = http.post("/rl/sessions").json()
            ask(fresh["base_url"], fresh["key"], max_tokens=3)
            assert httpx.post(f"{rollout.url}/rl/sessions/{fresh['key']}/reward",
                              json={"reward": 0.75}).json()["status"] == "waiting"
        state = rollout.state_dict()
        balanced(rollout)
    finally:
        rollout.shutdown()
    assert state["opened"] == 4 and len(state["waiting"]) == 1 and state["dropped"] == {"stale": 2}
    again = make_rollout(server, model, tmp_path, monkeypatch, "rollout.max_head_offpolicyness=1")
    again.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint keeps it
    again.start()
    try:
        c = balanced(again)
        assert c == {"opened": 4, "trained": 0, "dropped": 3, "in_flight": 1, "open": 0, "waiting": 1}
        assert again.book.dropped["restart"] == 1  # the session left open
        with pytest.raises(openai.AuthenticationError):
            ask(f"{again.url}/v1", still_open["key"], max_tokens=2)
        (traj,) = again.wait(1, timeout=5)[0]
        assert traj.reward == 0.75 and traj.info["session_id"] == fresh["id"] and traj.num_generated > 0
        assert balanced(again)["trained"] == 1
    finally:
        again.shutdown()


def test_256_concurrent_sessions_hold_and_balance(gateway: OnlineRollout) -> None:
    async def one(http: httpx.AsyncClient, i: int) -> str:
        s = (await http.post("/rl/sessions", json={"group": f"g{i // 4}"})).json()
        async with openai.AsyncOpenAI(base_url=s["base_url"], api_key=s["key"], max_retries=0,
                                      http_client=httpx.AsyncClient(timeout=120)) as c:
            await c.chat.completions.create(model="policy", messages=USER, max_tokens=4, stream=i % 2 == 0)
        if i % 16 == 15:
            return (await http.post(f"/rl/sessions/{s['key']}/end")).json()["status"]
        return (await http.post(f"/rl/sessions/{s['key']}/reward", json={"reward": i % 3})).json()["status"]

    async def main() -> list[str]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": f"Bearer {ADMIN}"},
                                     timeout=120, limits=limits) as http:
            return await asyncio.gather(*(one(http, i) for i in range(256)))

    statuses = asyncio.run(main())
    assert statuses.count("waiting") == 240 and statuses.count("dropped") == 16
    c = balanced(gateway)
    assert c["opened"] == 256 and c["waiting"] == 240 and c["open"] == 0
    trained = 0
    while (batch := gateway.book.take_batch()) is not None:
        trained += sum(map(len, batch))
    # whole groups of 4 or 3 fill batches of 4 sessions in the order they became ready, so a last
    # group of 3 may be left waiting for more: it is held, not lost, and a smaller batch takes it
    left = gateway.book.ready()
    assert left == 240 - trained and left < gateway.book.batch_sessions
    if left:
        trained += sum(map(len, gateway.book.take_batch(left) or []))
    assert trained == 240 and balanced(gateway)["trained"] == 240


def test_the_responses_and_messages_apis_are_recorded_in_the_session(gateway: OnlineRollout) -> None:
    with admin(gateway.url) as http:
        s = http.post("/rl/sessions", json={"metadata": {"app": "two apis"}}).json()
    responses = httpx.post(f"{gateway.url}/v1/responses", headers={"Authorization": f"Bearer {s['key']}"},
                           json={"model": "policy", "input": "What is 12 + 30?", "max_output_tokens": 4}, timeout=60)
    assert responses.status_code == 200 and responses.json()["object"] == "response"
    messages = httpx.post(f"{gateway.url}/v1/messages", headers={"x-api-key": s["key"]}, timeout=60,
                          json={"model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert messages.status_code == 200 and messages.json()["type"] == "message"
    wrong = httpx.post(f"{gateway.url}/v1/messages", headers={"x-api-key": ADMIN}, timeout=60,
                       json={"model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert wrong.status_code == 401
    got = httpx.post(f"{gateway.url}/rl/sessions/{s['key']}/reward", json={"rewards": [1, 0]})
    assert got.json()["status"] == "waiting"
    (traj,) = gateway.wait(1, timeout=5)[0]
    assert traj.info["num_calls"] == 2 and traj.info["metadata"] == {"app": "two apis"}
    assert len(traj.flatten()) == 2 and sorted(t.reward for t in traj.flatten()) == [0.0, 1.0]
