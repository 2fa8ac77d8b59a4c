"""Token streams through one queen: ``tasks`` tasks each streaming ``partials`` partial
results to their own client, against raw pyzmq relaying the same messages (one per
token) through the benchmark broker, in the same run (``meshant bench -s streaming``,
``python -m benchmarks.streaming``).

meshant: a CLI queen and one CLI forager with a slot per task serving the built-in
``stream`` with no delay (a partial per word, and a progress report after each unless
``progress`` is off); one ``Client`` per task, each on its own thread in this process,
counting the partials its ``updates()`` yields. Raw: the broker of
``meshant.apps._rawzmq`` and its ``streamer`` worker (n messages per request), one DEALER
per task. The rate is every client's count over the time from the first submission to
the last message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from meshant.actors.client import Client
from meshant.apps.bench_topologies import MeshTopology, RawTopology


def _together(n: int, work: Callable[[int], None]) -> float:
    """Run ``work(i)`` on n threads started at once; the seconds until the last ends."""
    go = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        go.wait()
        try:
            work(i)
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a stream did not end within 120 s")
    return time.perf_counter() - t0


def mesh_rate(queen: str, tasks: int, partials: int, progress: bool = False) -> float:
    """Partial results per second, ``tasks`` streams at once through the colony."""
    clients = [Client(queen, timeout=10) for _ in range(tasks)]
    payload = {"text": " ".join(["w"] * partials), "delay": 0, "progress": progress}
    try:
        for c in clients:  # connected and welcomed before the clock starts
            c.run("echo", None, result_timeout=10)
        got = [0] * tasks

        def one(i: int) -> None:
            fut = clients[i].submit("stream", payload)
            got[i] = sum(1 for u in fut.updates(30) if u.kind == "partial")
            fut.result(30)

        secs = _together(tasks, one)
    finally:
        for c in clients:
            c.close()
    if sum(got) != tasks * partials:
        raise RuntimeError(f"meshant delivered {sum(got)} of {tasks * partials} partials")
    return sum(got) / secs


def raw_rate(front: str, tasks: int, partials: int) -> float:
    """Messages per second, ``tasks`` streams at once through the raw broker."""
    ctx: zmq.Context[Any] = zmq.Context()
    socks: list[zmq.Socket[Any]] = []
    try:
        for _ in range(tasks):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 0)
            s.connect(front)
            s.send(msgpack.packb({"n": 1}))
            if not s.poll(10_000):
                raise RuntimeError("the raw streamer did not answer within 10 s")
            s.recv()
            socks.append(s)
        got = [0] * tasks

        def one(i: int) -> None:
            s = socks[i]
            s.send(msgpack.packb({"n": partials}))
            unpackb = msgpack.unpackb
            for _ in range(partials):
                if not s.poll(30_000):
                    raise RuntimeError("the raw stream stalled for 30 s")
                unpackb(s.recv())
                got[i] += 1

        secs = _together(tasks, one)
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return sum(got) / secs


def round_once(tasks: int, partials: int, progress: bool = False,
               journal: str | None = None) -> tuple[float, float]:
    """One round: (meshant's partials/s, raw's messages/s), each on a fresh topology."""
    mesh = MeshTopology("tcp", foragers=1, slots=tasks, journal=journal)
    try:
        m = mesh_rate(mesh.endpoint, tasks, partials, progress)
    finally:
        mesh.close()
    raw = RawTopology("tcp", kind="streamer")
    try:
        r = raw_rate(raw.endpoint, tasks, partials)
    finally:
        raw.close()
    return m, r


__all__ = ["mesh_rate", "raw_rate", "round_once"]
