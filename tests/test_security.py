"""CURVE, key grants, limits and a fuzzed live queen."""

from __future__ import annotations

import random
import resource
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from meshant import (
    Client,
    Forager,
    Forbidden,
    MeshantError,
    Queen,
    QueenUnreachable,
    Refused,
)
from meshant.adapters.security import generate
from meshant.apps.builtin import add_builtins
from meshant.protocol import Message, binary

from .conftest import Colony, wait_for


class Keys:
    def __init__(self, root: Path) -> None:
        self.dir = root / "keys"
        self.authorized = root / "authorized"
        self.authorized.mkdir()
        self.queen_pub, self.queen_sec = generate(self.dir, "queen")
        self.files: dict[str, tuple[str, str]] = {}

    def make(self, name: str, *roles: str, authorize: bool = True,
             names: tuple[str, ...] = ()) -> tuple[str, str]:
        pub, sec = generate(self.dir, name, roles or ("client",), names)
        if authorize:
            shutil.copy(pub, self.authorized)
        return str(pub), str(sec)


PEERS = {"f1": ("forager",), "c1": ("client",), "listener": ("forager",),
         "speaker": ("client",), "temp": ("client",), "c2": ("client",)}


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[Keys, Queen, zmq.Context[Any], list[Any]]]:
    keys = Keys(tmp_path)
    keys.files = {name: keys.make(name, *roles) for name, roles in PEERS.items()}
    ctx: zmq.Context[Any] = zmq.Context()
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", curve_secret=str(keys.queen_sec),
              authorized=str(keys.authorized), hb_interval=0.2, context=ctx).start()
    owned: list[Any] = []
    try:
        yield keys, q, ctx, owned
    finally:
        for o in reversed(owned):
            o.close() if isinstance(o, Client) else o.stop()
        q.stop()
        ctx.destroy(linger=0)


def test_curve_colony_works_and_binds_names_to_keys(secure: Any) -> None:
    keys, q, ctx, owned = secure
    _, fsec = keys.files["f1"]
    _, csec = keys.files["c1"]
    f = Forager(q.endpoint, name="f1", curve_secret=fsec, queen_key=str(keys.queen_pub),
                context=ctx)
    add_builtins(f)
    owned.append(f.start())
    c = Client(q.endpoint, name="c1", curve_secret=csec, queen_key=str(keys.queen_pub),
               context=ctx)
    owned.append(c)
    assert c.run("echo", "sealed", result_timeout=10) == "sealed"
    # An authorized forager key cannot take another forager's name ...
    thief = Forager(q.endpoint, name="f2", curve_secret=fsec, queen_key=str(keys.queen_pub),
                    context=ctx)
    thief.add_handler("echo", lambda x: x)
    with pytest.raises(Refused) as info:
        thief.start(timeout=5)
    assert info.value.code == "not-allowed" and "may not use the name" in str(info.value)
    # ... and a client key cannot register as a forager.
    pretender = Forager(q.endpoint, name="c1", curve_secret=csec,
                        queen_key=str(keys.queen_pub), context=ctx)
    pretender.add_handler("echo", lambda x: x)
    with pytest.raises(Refused, match="not as forager"):
        pretender.start(timeout=5)
    assert c.status()["counters"]["refused_keys"] == 2


def test_unauthorized_key_never_reaches_the_queen(secure: Any) -> None:
    keys, q, ctx, _ = secure
    _, stranger = keys.make("stranger", authorize=False)
    before = q.counters["messages"]
    with pytest.raises(QueenUnreachable, match="CURVE is on"):
        Client(q.endpoint, name="stranger", curve_secret=stranger,
               queen_key=str(keys.queen_pub), timeout=1.5, context=ctx)
    assert q.counters["messages"] == before  # the handshake failed: nothing got through


@pytest.mark.slow
def test_wrong_queen_key_is_a_clear_client_error(secure: Any) -> None:
    keys, q, ctx, _ = secure
    _, csec = keys.files["c2"]
    impostor_pub, _ = keys.make("impostor", authorize=False)
    with pytest.raises(QueenUnreachable, match="wrong --queen-key"):
        Client(q.endpoint, name="c2", curve_secret=csec, queen_key=impostor_pub, timeout=1.5,
               context=ctx)


def test_a_key_added_later_is_picked_up(secure: Any) -> None:
    keys, q, ctx, owned = secure
    _, late = keys.make("latecomer")  # copied into the authorized folder now
    c = Client(q.endpoint, name="latecomer", curve_secret=late,
               queen_key=str(keys.queen_pub), timeout=10, context=ctx)
    owned.append(c)
    assert c.status()["clients"] >= 1


def test_pub_stream_unreadable_without_keys(secure: Any) -> None:
    keys, q, ctx, owned = secure
    _, fsec = keys.files["listener"]
    heard: list[Any] = []
    f = Forager(q.endpoint, name="listener", curve_secret=fsec,
                queen_key=str(keys.queen_pub), context=ctx)
    f.add_handler("echo", lambda x: x)
    f.on("news.")(lambda t, d: heard.append(d))
    owned.append(f.start())
    plain = ctx.socket(zmq.SUB)
    plain.setsockopt(zmq.SUBSCRIBE, b"")
    plain.setsockopt(zmq.LINGER, 0)
    handshakes = plain.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    plain.connect(q.pub_endpoint)
    _, csec = keys.files["speaker"]
    c = Client(q.endpoint, name="speaker", curve_secret=csec, queen_key=str(keys.queen_pub),
               context=ctx)
    owned.append(c)
    deadline = time.monotonic() + 10
    while not heard and time.monotonic() < deadline:
        c.broadcast("news.x", "classified")
        time.sleep(0.1)
    assert heard and heard[0] == "classified"
    # The plain socket tried its handshake and was refused ...
    assert handshakes.poll(5000), "the plain subscriber never tried a handshake"
    event = recv_monitor_message(handshakes)["event"]
    assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED, event
    # ... so no heartbeat, no broadcast reached it.
    assert plain.poll(0) == 0
    plain.disable_monitor()
    handshakes.close(0)
    plain.close(0)


@pytest.mark.slow
def test_revoked_key_is_dropped_on_reload(secure: Any) -> None:
    keys, q, ctx, owned = secure
    pub, csec = keys.files["temp"]
    c = Client(q.endpoint, name="temp", curve_secret=csec, queen_key=str(keys.queen_pub),
               context=ctx)
    owned.append(c)
    assert "temp" in q.registry.by_name
    (keys.authorized / Path(pub).name).unlink()
    q.reload_keys()
    deadline = time.monotonic() + 5
    while "temp" in q.registry.by_name and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "temp" not in q.registry.by_name


def test_each_limit_answers_with_its_code(colony: Colony) -> None:
    q = colony.start_queen(max_queue=1, max_peers=3, submit_rate=5, max_message=4096,
                           mem_max_keys=1)
    c = colony.client(submit_timeout=0)  # rate-limited reaches the caller, not retried
    # queue-full
    futs = [c.submit("nobody", i, wait=60) for i in range(2)]
    with pytest.raises(MeshantError) as e1:
        futs[1].result(5)
    assert e1.value.code == "queue-full"
    # rate-limited: a burst far over 5/s (burst allowance 10)
    burst = [c.submit("nobody", i, wait=60) for i in range(30)]
    codes = set()
    for f in burst:
        try:
            f.result(0.5)
        except MeshantError as e:
            codes.add(e.code)
        except TimeoutError:
            pass
    assert "rate-limited" in codes
    # too-large: one frame over --max-message
    with pytest.raises(MeshantError) as e3:
        colony.client().run("echo", "x" * 10_000, result_timeout=5)
    assert e3.value.code == "too-large"
    # too-many-peers: c and the client above are 2; the fourth peer is refused
    colony.client()
    with pytest.raises(Refused) as e4:
        colony.client()
    assert e4.value.code == "too-many-peers"
    # memory-full, bad-topic, bad-name, bad-value (a note)
    c.memory.set("only", 1)
    with pytest.raises(MeshantError) as e5:
        c.memory.set("second", 2)
    assert e5.value.code == "memory-full"
    with pytest.raises(ValueError):
        c.broadcast("no spaces allowed", 1)
    with pytest.raises(ValueError):
        c.note("someone", "x" * 81)
    with pytest.raises(ValueError, match="invalid name"):
        Client(colony.endpoint, name="bad name", context=colony.ctx)
    assert q.counters["rate_limited"] >= 1
    # The same rules hold at the queen for a peer that skips the client library's checks.
    raw = colony.ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(colony.endpoint)

    def ask(kind: str, body: dict[str, Any], **env: Any) -> str:
        raw.send_multipart(binary.encode(Message(kind, body, **env)))
        assert raw.poll(5000), f"no answer to {kind}"
        reply = binary.decode(raw.recv_multipart())
        return str(reply.b.get("code", reply.kind))

    assert ask("hello", {"role": "client", "versions": [2], "name": "no spaces"}) == "bad-name"
    c.close()  # make room under --max-peers
    wait_for(lambda: c.name not in q.registry.by_name, what="the closed client to leave")
    assert ask("hello", {"role": "client", "versions": [2], "name": "raw",
                         "features": ["broadcast", "mem.sync"]}) == "welcome"
    assert ask("broadcast", {"topic": "bad topic", "data": 1}, frm="raw") == "bad-topic"
    assert ask("note", {"text": "two\nlines"}, frm="raw", to="raw") == "bad-value"
    raw.close(0)


def _hostile(rng: random.Random, valid: list[list[bytes]]) -> list[bytes]:
    """One generated hostile message."""
    choice = rng.randrange(9)
    if choice == 0:
        return [rng.randbytes(rng.randrange(0, 64))]
    if choice == 1:  # a valid message, one byte changed, maybe cut short
        f = bytearray(rng.choice(valid)[0])
        f[rng.randrange(len(f))] = rng.randrange(256)
        return [bytes(f[: rng.randrange(1, len(f) + 1)])]
    if choice == 2:  # IACP 1.1 garbage
        return [b"{" + rng.randbytes(rng.randrange(0, 40))]
    if choice == 3:  # deep JSON
        return [b'{"v":"1.1","a":' + b"[" * 500 + b"]" * 500 + b"}"]
    if choice == 4:  # results for tasks never assigned, accepts for wrong attempts
        kind = rng.choice(["task.result", "task.accept", "task.reject", "task.progress"])
        body = {"status": "ok", "result": 1, "reason": "x"}
        return binary.encode(Message(kind, body, frm="fuzz",
                                     ref=f"{rng.randbytes(4).hex()}.{rng.randrange(5)}"))
    if choice == 5:  # unknown kinds and wrong types in a well-formed frame
        env = msgpack.packb({"id": "x", "from": rng.choice(["fuzz", 7, None])})
        body = msgpack.packb(rng.choice([{"capability": 5}, [1, 2], {"role": "forager"}]))
        return [binary.header(rng.randrange(256), 0, 0, len(env)) + env + body]
    if choice == 6:  # a flood of hellos
        return binary.encode(Message("hello", {"role": "forager", "versions": [2],
                                               "name": f"fuzz-{rng.randrange(3)}",
                                               "slots": 1, "tools": ["nope"]}))
    if choice == 7:  # blobs announced but missing, extra frames
        f = bytearray(rng.choice(valid)[0])
        f[5] = rng.randrange(1, 4)
        return [bytes(f)] + [b"x"] * rng.randrange(0, 3)
    return rng.choice(valid)  # replayed valid messages


def test_fuzzing_a_live_queen_changes_nothing_for_good_peers(colony: Colony) -> None:
    q = colony.start_queen()
    colony.forager({"echo": lambda x: x}, name="good-forager", slots=2)
    client = colony.client(name="good-client")
    rng = random.Random(20261130)
    valid = [binary.encode(Message("task.submit", {"capability": "echo", "payload": i},
                                   frm="fuzz")) for i in range(5)]
    valid += [binary.encode(Message("status.query", None, frm="fuzz")),
              binary.encode(Message("hb", {"slots": 1}, frm="fuzz"))]
    stop = threading.Event()
    results: list[Any] = []

    def good_work() -> None:
        n = 0
        while not stop.is_set():
            assert client.run("echo", {"n": n}, result_timeout=20) == {"n": n}
            results.append(n)
            n += 1

    worker = threading.Thread(target=good_work)
    worker.start()
    socks = []
    for _ in range(4):
        s = colony.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(q.endpoint)
        socks.append(s)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sent = 0
    try:
        for _ in range(6000):
            s = rng.choice(socks)
            try:
                s.send_multipart(_hostile(rng, valid), zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
            while s.poll(0):
                s.recv_multipart()  # drain the queen's error answers
            if sent % 1000 == 999:
                # Good work goes on during the fuzz: one more good result before more
                # garbage (a condition, not a rate: a loaded machine is slow, not wrong).
                seen = len(results)
                wait_for(lambda seen=seen: len(results) > seen or not worker.is_alive(), 30,
                         "a good result while the fuzz goes on")
    finally:
        stop.set()
        worker.join(60)
        for s in socks:
            s.close(0)
    assert not worker.is_alive() and len(results) >= 6
    # The queen reads a few messages a turn and answers the status request in the turn
    # it reads it: fuzz still queued behind that request is counted in a later turn.
    wait_for(lambda: client.status()["counters"]["messages"] >= sent, 30,
             "every fuzzed message read")
    st = client.status()
    assert st["counters"]["protocol_errors"] > 1000
    assert st["counters"]["messages"] >= sent
    # Bounded: the fuzz peers' submissions and registrations stay within the limits.
    assert len(q.registry.by_id) <= 3 + 4
    assert q.scheduler.queued <= 5000
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mb < 200
    assert client.run("echo", "still fine", result_timeout=10) == "still fine"


def test_cancelling_another_clients_task_is_forbidden_and_changes_nothing(
        secure: Any) -> None:
    keys, q, ctx, owned = secure
    f = Forager(q.endpoint, name="f1", curve_secret=keys.files["f1"][1],
                queen_key=str(keys.queen_pub), context=ctx)
    add_builtins(f)
    owned.append(f.start())
    c1, c2 = (Client(q.endpoint, name=n, curve_secret=keys.files[n][1],
                     queen_key=str(keys.queen_pub), context=ctx) for n in ("c1", "c2"))
    owned += [c1, c2]
    fut = c1.submit("sleep", {"seconds": 30})
    wait_for(lambda: c1.task_status(fut.task_id)["state"] == "accepted", 10, "running")
    with pytest.raises(Forbidden) as e:
        c2.cancel(fut.task_id)
    assert e.value.code == "forbidden" and "task.cancel" in e.value.message
    assert c1.task_status(fut.task_id)["state"] == "accepted"  # still running
    assert c1.cancel(fut.task_id) == "cancelled"  # its submitter may
