"""The session book's rules under any order of events (property-based; no HTTP): the ledger
always balances, no session is trained twice or without its reward, nothing trained is staler
than η, refusals change nothing, and a checkpoint keeps what was rewarded but not trained."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_agents.online.sessions import Refused, Session, SessionBook
from areal_agents.openai_compat.session import CallRecord, ChatSession
from areal_agents.rollout.staleness import StalenessBound


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def book(clock: Clock, *, eta: int = 1, batch: int = 3, bounded: bool = False) -> SessionBook:
    return SessionBook(ttl=10.0, max_open=6, batch_sessions=batch, bound=StalenessBound(eta, batch, 6),
                       bounded_admission=bounded, clock=clock)


def call(b: SessionBook, s: Session, n: int = 0) -> None:
    """One finished call of ``s`` at the book's version, as the gateway records it."""
    assert s.chat is not None
    b.call_started(s)
    prompt = [1, 2, 3] if not s.chat.records else [*s.chat.records[-1].prompt_ids, *s.chat.records[-1].completion_ids, 9]
    s.chat.records.append(CallRecord(index=len(s.chat.records), prompt_ids=prompt, completion_ids=[5, 6 + n],
                                     logprobs=[-0.5, -0.25], versions=[b.version] * 2, finish_reason="stop"))
    b.call_finished(s)


def opened(b: SessionBook, group: str | None = None) -> Session:
    s = b.open(group)
    s.chat = ChatSession(None, None)  # type: ignore[arg-type] - its records are all the book reads
    return s


def check(b: SessionBook) -> dict[str, int]:
    c = b.counts()
    assert c["opened"] == c["trained"] + c["dropped"] + c["in_flight"] and c["in_flight"] == c["open"] + c["waiting"]
    assert c["dropped"] == sum(b.dropped.values())
    return c


KINDS = ["open"] * 4 + ["call"] * 4 + ["reward"] * 3 + ["rewards", "end", "wait", "save"] + ["version", "take"] * 2
EVENTS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 7), st.sampled_from([None, None, "a", "b"])),
                  max_size=80)


@settings(max_examples=300, deadline=None)
@given(events=EVENTS, bounded=st.booleans())
def test_the_ledger_balances_and_nothing_is_trained_twice_or_stale(events: list[tuple[str, int, Any]],
                                                                   bounded: bool) -> None:
    clock = Clock()
    b = book(clock, bounded=bounded)
    sessions: list[Session] = []
    trained: list[str] = []
    rewarded: set[str] = set()
    for kind, i, group in events:
        before = check(b)
        s = sessions[i % len(sessions)] if sessions else None
        try:
            if kind == "open":
                sessions.append(opened(b, group))
            elif kind == "call" and s is not None and s.state == "open":
                call(b, s, i)
            elif kind in ("reward", "rewards") and s is not None:
                n = len(s.chat.records) if s.chat is not None else 1
                b.reward(s.key, float(i % 2) if kind == "reward" else [0.5] * max(n, 1))
                if s.state == "waiting":
                    rewarded.add(s.sid)
            elif kind == "end" and s is not None:
                b.end(s.key)
            elif kind == "wait":
                clock.t += 4.0 * (i % 4)
                b.expire()
            elif kind == "version":
                b.set_version(b.version + 1)
            elif kind == "take":
                for group_trajs in b.take_batch() or []:
                    assert len({t.group_id for t in group_trajs}) == 1
                    for t in group_trajs:
                        assert b.version - t.start_version <= b.bound.eta  # never staler than η
                        trained.append(t.info["session_id"])
            elif kind == "save":
                state = b.state_dict()
                again = book(clock, bounded=bounded)
                again.load_state_dict(state)
                c = check(again)
                assert c["open"] == 0 and c["waiting"] == before["waiting"] and c["trained"] == before["trained"]
                assert again.dropped["restart"] == b.dropped["restart"] + before["open"]
        except Refused as exc:
            assert exc.status in (400, 404, 409, 429)
            assert check(b) == before  # a refusal changes nothing
        check(b)
    assert len(trained) == len(set(trained)) and set(trained) <= rewarded
    assert check(b)["trained"] == len(trained)
    b.close()
    assert check(b)["in_flight"] == 0


def test_sessions_that_became_stale_while_waiting_are_dropped_not_trained() -> None:
    clock = Clock()
    b = book(clock, eta=1, batch=1)
    old = opened(b)
    call(b, old)
    b.set_version(1)
    fresh = opened(b)
    call(b, fresh)
    b.reward(old.key, 1.0)
    b.reward(fresh.key, 1.0)
    b.set_version(2)  # old's tokens are of version 0: 2 behind, η = 1
    assert old.state == "dropped" and old.reason == "stale" and fresh.state == "waiting"
    ((traj,),) = b.take_batch() or [[]]
    assert traj.info["session_id"] == fresh.sid and traj.start_version == 1
    assert check(b) == {"opened": 2, "trained": 1, "dropped": 1, "in_flight": 0, "open": 0, "waiting": 0}


def test_rewards_settle_per_call_or_at_the_last_call() -> None:
    clock = Clock()
    b = book(clock, batch=2)
    one, per = opened(b), opened(b)
    for s in (one, per):
        call(b, s)
        call(b, s)  # extends the first: one trajectory of two turns
    b.reward(one.key, 1.0)
    b.reward(per.key, [0.25, 0.5])
    (group,) = b.take_batch() or []
    by_id = {t.info["session_id"]: t for t in group}
    assert by_id[one.sid].turn_rewards == [0.0, 1.0] and by_id[one.sid].reward == 1.0
    assert by_id[per.sid].turn_rewards == [0.25, 0.5] and by_id[per.sid].reward == 0.75
    assert by_id[per.sid].turn_returns == [0.75, 0.5]


def test_groups_wait_for_their_open_members_and_singles_share_a_baseline() -> None:
    clock = Clock()
    b = book(clock, batch=3)
    members = [opened(b, "q") for _ in range(3)]
    x, y = opened(b), opened(b)
    for s in [*members, x, y]:
        call(b, s)
    for s in members[:2]:
        b.reward(s.key, 1.0)
    b.reward(x.key, 0.0)
    assert b.ready() == 1 and b.take_batch() is None  # q waits for its third member
    b.reward(members[2].key, 0.0)
    b.reward(y.key, 1.0)
    groups = b.take_batch(5) or []
    sizes = sorted(len(g) for g in groups)
    assert sizes == [2, 3]  # q, and the two singles as one group
    assert len({t.group_id for g in groups for t in g}) == 2


def test_bounded_admission_refuses_what_could_not_be_trained_in_time() -> None:
    clock = Clock()
    b = book(clock, eta=0, batch=2, bounded=True)
    a, c = opened(b), opened(b)
    with pytest.raises(Refused) as refused:
        opened(b)
    assert refused.value.status == 429 and refused.value.code == "trainer_behind"
    for s in (a, c):
        call(b, s)
        b.reward(s.key, 1.0)
    assert b.take_batch() is not None
    with pytest.raises(Refused):
        opened(b)  # still version 0: its one batch is taken
    b.set_version(1)
    opened(b)
    check(b)
