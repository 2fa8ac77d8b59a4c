"""The peer session, sans-IO: its lifecycle table driven with events and a fake clock,
and a session talking to a real QueenCore through the codec, in memory (tests/inmemory.py)."""

from __future__ import annotations

import random

import pytest

from meshant.core.peers import peer_session as ses
from meshant.core.peers.peer_session import TRANSITIONS, PeerSession, State

from .inmemory import InMemoryColony

WELCOME = {"version": 2, "features": ["batch"], "hb_interval": 1.0, "hb_misses": 3,
           "assign_timeout": 30.0, "epoch": "e1", "max_message": 1000}


def kinds(s: PeerSession) -> list[str]:
    return [type(a).__name__ for a in s.take()]


def welcomed(now: float = 0.0) -> PeerSession:
    s = PeerSession(rng=random.Random(1))
    s.start(now)
    s.take()
    s.hello_sent("h1", now)
    s.on_welcome("h1", dict(WELCOME), now)
    s.take()
    return s


def test_hello_is_retried_with_a_growing_jittered_wait_and_waiting_is_said() -> None:
    s = PeerSession(rng=random.Random(7))
    s.start(0.0)
    assert kinds(s) == ["SayHello"]
    waits, now = [], 0.0
    for i in range(6):
        s.hello_sent(f"h{i}", now)
        nxt = s.next_deadline()
        waits.append(nxt - now)
        now = nxt
        s.tick(now)
        got = kinds(s)
        assert "SayHello" in got or "StillWaiting" in got
        while "SayHello" not in got:  # a waiting note came first
            now = s.next_deadline()
            s.tick(now)
            got = kinds(s)
    assert waits[-1] > waits[0] and max(waits) <= 5.0


def test_a_welcome_for_an_older_hello_is_ignored_and_the_right_one_activates() -> None:
    s = PeerSession()
    s.start(0.0)
    s.take()
    s.hello_sent("h2", 0.0)
    s.on_welcome("h1", dict(WELCOME), 0.0)
    assert s.state is State.HELLO and s.take() == []
    s.on_welcome("h2", dict(WELCOME), 0.1)
    assert s.state is State.ACTIVE and s.max_message == 1000
    (w,) = s.take()
    assert isinstance(w, ses.Welcomed) and w.first


def test_rate_limited_and_name_taken_once_are_waited_out_other_refusals_are_final() -> None:
    s = PeerSession()
    s.start(0.0)
    s.take()
    s.hello_sent("h1", 0.0)
    assert s.on_error("h1", "rate-limited", "slow down", 2.0, 0.0)
    assert s.next_deadline() <= 2.0 and s.state is State.HELLO
    s.hello_sent("h2", 2.0)
    assert s.on_error("h2", "name-taken", "held", 3.0, 2.0)  # once: wait for it to expire
    # ... said at once, and while it waits, the queen (which answered) is not missed.
    assert s.state is State.HELLO and s.take() == [ses.NameHeld("held", 3.0)]
    s.tick(4.5)
    assert not any(isinstance(a, ses.StillWaiting) for a in s.take())
    s.hello_sent("h3", 5.0)
    assert s.on_error("h3", "name-taken", "held", 3.0, 5.0)  # twice: final
    (r,) = s.take()
    assert isinstance(r, ses.Refused) and r.code == "name-taken"
    assert s.state is State.REFUSED


def test_silence_a_new_epoch_or_being_forgotten_send_the_session_back_to_hello() -> None:
    s = welcomed()
    s.tick(2.9)  # within 3 missed intervals: alive; a beat is due (nothing sent since 0)
    assert kinds(s) == ["Beat"]
    s.sent(2.9, beat=True)
    s.tick(3.1)
    assert kinds(s) == ["Lost", "SayHello"] and s.state is State.HELLO
    assert s.reconnects == 1
    s = welcomed()
    s.on_queen_beat("e2", 0.5)
    assert kinds(s) == ["Lost", "SayHello"]
    s = welcomed()
    assert s.on_error("x", "not-registered", "who?", None, 0.5)
    assert kinds(s) == ["Forgotten", "SayHello"]


def test_an_idle_peer_beats_only_when_quiet_a_busy_one_every_interval() -> None:
    s = welcomed()
    s.sent(0.8)  # a message went out: it counts as a sign of life
    s.tick(1.5)
    assert kinds(s) == []
    s.tick(1.5, busy=True)  # running tasks: the heartbeat lists them, every interval
    assert kinds(s) == ["Beat"]


def test_the_table_refuses_what_it_does_not_list() -> None:
    s = PeerSession()
    s.state = State.REFUSED
    with pytest.raises(RuntimeError):
        s._move(State.ACTIVE)
    assert State.ACTIVE not in TRANSITIONS[State.REFUSED]


def test_a_session_and_a_queen_core_agree_in_memory() -> None:
    sim = InMemoryColony(max_message=5000)
    c = sim.client("sess")  # its real session said hello, and the welcome came back
    s = c.peer.sess if c.peer is not None else None
    assert s is not None and s.state is State.ACTIVE
    assert s.max_message == 5000 and s.epoch == sim.core.epoch
    assert s.hb_interval == sim.core.config.hb_interval
    assert "sess" in sim.core.registry.by_name
    sim.advance(5.0)  # its beats keep it registered; the queen's keep it active
    assert s.state is State.ACTIVE and s.reconnects == 0
    assert sim.core.registry.by_name["sess"].identity == c.identity


def test_not_leader_to_a_hello_redirects_soon_and_to_an_active_peer_loses_the_queen() -> None:
    s = PeerSession(rng=random.Random(3))
    s.start(0.0)
    s.take()
    for i in range(4):  # a few unanswered hellos: the backoff grew
        s.hello_sent(f"h{i}", s.next_deadline())
    now = 10.0
    assert s.on_error("h3", "not-leader", "standby", None, now, "tcp://leader:1")
    got = s.take()
    assert got == [ses.Redirect("tcp://leader:1")] and s.state is State.HELLO
    s.tick(now + 0.05)
    assert "SayHello" not in kinds(s)
    s.tick(now + 0.35)  # soon, not after the grown backoff: a live queen answered
    assert "SayHello" in kinds(s)
    # An active peer told not-leader (its queen stepped down) reconnects, to the leader.
    a = welcomed()
    assert a.on_error("hb-1", "not-leader", "standby now", None, 5.0, None)
    assert kinds(a) == ["Redirect", "Lost", "SayHello"] and a.state is State.HELLO
    assert a.reconnects == 1


def test_requests_sent_to_a_lost_queen_are_asked_again_or_failed_at_once() -> None:
    # A request already sent when the queen was lost: one that changes nothing goes again
    # to the next queen; any other fails now as queen-lost (it may have been carried out),
    # instead of waiting for its timeout with nobody left to answer it.
    from meshant import protocol as p
    from meshant.core.peers.client_session import ClientSession, RequestFailed

    cs = ClientSession()
    ask = p.Message("schedule", {"op": "list"}, to="queen")
    act = p.Message("schedule", {"op": "trigger", "name": "t"}, to="queen")
    unsent = p.Message("dlq", {"op": "retry", "task": "x"}, to="queen")
    for m in (ask, act):
        cs.request(m)
    assert cs.flush(0.0) == [ask, act]  # (both went to the queen that is then lost)
    cs.request(unsent)  # (still in the outbox: it goes to the next queen as it is)
    cs.lost(1.0, "no sign of life")
    cs.welcomed(first=False)
    assert [m for m in cs.flush(2.0) if isinstance(m, p.Message)] == [unsent, ask]
    failed = [a for a in cs.out if isinstance(a, RequestFailed)]
    assert [(f.ref, f.error["code"]) for f in failed] == [(act.id, "queen-lost")]
    assert "may have been carried out" in failed[0].error["message"]
    assert set(cs.requests) == {ask.id, unsent.id}


def test_a_request_refused_by_a_queen_that_forgot_us_goes_again_and_is_not_failed() -> None:
    # Seen in the CI of a kill -9 test: the client answered a question before it saw its
    # queen restart; the new queen refused the answer as from a stranger, the client
    # said hello again, and then failed the answer as queen-lost ("it may have been
    # carried out") while it sent it again all the same, carried out behind its caller's
    # back. A refused request was not carried out: it goes again, once, and nothing fails.
    from meshant import protocol as p
    from meshant.core.peers.client_session import ClientSession, RequestFailed

    cs = ClientSession()
    answer = p.Message("task.answer", {"task": "t", "request": "t.q1", "value": 1},
                       to="queen")
    status = p.Message("task.status", {"task": "t"}, to="queen")
    for m in (answer, status):
        cs.request(m)
    assert cs.flush(0.0) == [answer, status]
    for m in (answer, answer, status):  # (a refusal heard twice changes nothing)
        cs.on_forgotten(m.id)
    cs.welcomed(first=False)
    assert not [a for a in cs.out if isinstance(a, RequestFailed)]
    assert [m for m in cs.flush(1.0) if isinstance(m, p.Message)] == [answer, status]
    assert set(cs.requests) == {answer.id, status.id}
