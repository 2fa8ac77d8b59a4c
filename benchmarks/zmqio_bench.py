#!/usr/bin/env python3
"""Socket-helper micro-benchmark: meshant's ``_zmqio.recv_frames``/``send_frames``
against pyzmq's ``recv_multipart``/``send_multipart``, on a real socket pair.

    python benchmarks/zmqio_bench.py [--transport inproc|ipc|both] [--rounds 30] [--json]

The message is the queen's usual shape: a routing identity frame and one ~200-byte frame
(header, envelope and body in one, as IACP/2 sends them). Each round sends (or, for the
receive figures, first queues) ``--batch`` messages and times only the calls measured;
the two helpers take turns round by round, so drifts in machine load fall on both alike.
Each figure is the median round's cost per message, in µs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

from meshant.actors import _zmqio

IDENTITY = b"\x00k\x8bEg"  # what a ROUTER's generated identity looks like (5 bytes)
FRAME = bytes(range(200))
NOBLOCK = zmq.NOBLOCK  # the enum, as callers usually pass it
NOBLOCK_INT = int(zmq.NOBLOCK)


def _pair(ctx: zmq.Context[Any], transport: str, where: str) -> tuple[zmq.Socket[Any],
                                                                      zmq.Socket[Any]]:
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    for s in (a, b):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
    ep = "inproc://zmqio-bench" if transport == "inproc" else f"ipc://{where}/zmqio-bench"
    b.bind(ep)
    a.connect(ep)
    a.send(b"hello")
    assert b.recv() == b"hello"
    return a, b


def _recv_round(tx: zmq.Socket[Any], rx: zmq.Socket[Any], batch: int,
                recv: Callable[[zmq.Socket[Any]], Any]) -> float:
    for _ in range(batch):
        tx.send_multipart([IDENTITY, FRAME])
    time.sleep(0.02)  # untimed: let ipc's I/O thread move the whole batch into the pipe
    t0 = time.perf_counter()
    for _ in range(batch):
        recv(rx)
    return (time.perf_counter() - t0) / batch


def _send_round(tx: zmq.Socket[Any], rx: zmq.Socket[Any], batch: int,
                send: Callable[[zmq.Socket[Any]], Any]) -> float:
    t0 = time.perf_counter()
    for _ in range(batch):
        send(tx)
    t = time.perf_counter() - t0
    for _ in range(batch):
        rx.recv_multipart()
    return t / batch


RECV: dict[str, Callable[[zmq.Socket[Any]], Any]] = {
    "_zmqio.recv_frames": _zmqio.recv_frames,
    "recv_multipart": lambda s: s.recv_multipart(),
}
SEND: dict[str, Callable[[zmq.Socket[Any]], Any]] = {
    "_zmqio.send_frames": lambda s: _zmqio.send_frames(s, [FRAME], IDENTITY),
    "send_multipart": lambda s: s.send_multipart([IDENTITY, FRAME], NOBLOCK),
    "send_multipart(int)": lambda s: s.send_multipart([IDENTITY, FRAME], NOBLOCK_INT),
}


def run(transport: str, rounds: int = 30, batch: int = 2000) -> list[dict[str, Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    rows = []
    with tempfile.TemporaryDirectory() as where:
        tx, rx = _pair(ctx, transport, where)
        try:
            for op, table, one in (("recv", RECV, _recv_round), ("send", SEND, _send_round)):
                times: dict[str, list[float]] = {name: [] for name in table}
                for fn in table.values():  # warm-up
                    one(tx, rx, batch, fn)
                for r in range(rounds):
                    order = list(table.items())
                    if r % 2:
                        order.reverse()  # neither always goes first
                    for name, fn in order:
                        times[name].append(one(tx, rx, batch, fn))
                for name, ts in times.items():
                    rows.append({"transport": transport, "op": op, "helper": name,
                                 "us_per_msg": round(statistics.median(ts) * 1e6, 3),
                                 "min_us": round(min(ts) * 1e6, 3)})
        finally:
            tx.close(0)
            rx.close(0)
            ctx.term()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", choices=("inproc", "ipc", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=2000, help="messages per round")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    transports = ("inproc", "ipc") if args.transport == "both" else (args.transport,)
    rows = [row for t in transports for row in run(t, args.rounds, args.batch)]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}, Python "
          f"{sys.version.split()[0]}")
    print(f"{'transport':10} {'op':5} {'helper':20} {'µs/msg (median)':>16} {'min':>7}")
    for r in rows:
        print(f"{r['transport']:10} {r['op']:5} {r['helper']:20} {r['us_per_msg']:>16.3f} "
              f"{r['min_us']:>7.3f}")


if __name__ == "__main__":
    main()
