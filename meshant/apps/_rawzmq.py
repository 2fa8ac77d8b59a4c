"""Raw pyzmq on the same topology as a colony, with no protocol logic: the benchmark floor.

client DEALER → broker ROUTER (front) → broker ROUTER (back) → worker DEALER, and back;
msgpack at each end, the broker only forwards frames.

    python -m meshant.apps._rawzmq broker FRONT BACK     # prints a JSON ready line
    python -m meshant.apps._rawzmq worker BACK_ENDPOINT
    python -m meshant.apps._rawzmq streamer BACK_ENDPOINT   # n messages per request
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import msgpack
import zmq


def broker(front_ep: str, back_ep: str) -> None:
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    back = ctx.socket(zmq.ROUTER)
    for s in (front, back):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.RCVHWM, 100_000)
    front.bind(front_ep)
    back.bind(back_ep)
    print(json.dumps({"event": "ready", "front": front.getsockopt_string(zmq.LAST_ENDPOINT),
                      "back": back.getsockopt_string(zmq.LAST_ENDPOINT)}), flush=True)
    workers: list[bytes] = []
    rr = 0
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    running = True

    def stop(*_: Any) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        events = dict(poller.poll(200))
        if back in events:
            while True:
                try:
                    fr = back.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if fr[1] == b"READY":
                    workers.append(fr[0])
                else:
                    front.send_multipart(fr[1:])
        if front in events and workers:
            while True:
                try:
                    fr = front.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                rr = (rr + 1) % len(workers)
                back.send_multipart([workers[rr], *fr])


def _joined(back_ep: str, hwm: int | None = None) -> zmq.Socket[Any]:
    """A worker's DEALER, connected to the broker's back and announced (READY)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if hwm is not None:
        s.setsockopt(zmq.SNDHWM, hwm)
    s.connect(back_ep)
    s.send(b"READY")
    print(json.dumps({"event": "ready"}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return s


def worker(back_ep: str) -> None:
    s = _joined(back_ep)
    packb, unpackb = msgpack.packb, msgpack.unpackb
    while True:
        frames = s.recv_multipart()
        payload = unpackb(frames[1])
        s.send_multipart([frames[0], packb(payload)])


def streamer(back_ep: str) -> None:
    """The streaming floor: a request ``{"n": N}`` is answered with N messages, one per
    token, as a worker relaying a model's tokens one by one would."""
    s = _joined(back_ep, hwm=0)
    packb, unpackb = msgpack.packb, msgpack.unpackb
    while True:
        frames = s.recv_multipart()
        for i in range(int(unpackb(frames[1])["n"])):
            s.send_multipart([frames[0], packb({"partial": True, "value": i})])


def pubbroker(front_ep: str, pub_ep: str) -> None:
    """The broadcast floor: what a DEALER sends, the broker publishes on PUB."""
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    pub = ctx.socket(zmq.PUB)
    for s in (front, pub):
        s.setsockopt(zmq.LINGER, 0)
    front.bind(front_ep)
    pub.bind(pub_ep)
    print(json.dumps({"event": "ready", "front": front.getsockopt_string(zmq.LAST_ENDPOINT),
                      "pub": pub.getsockopt_string(zmq.LAST_ENDPOINT)}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    unpackb = msgpack.unpackb
    while True:
        _, body = front.recv_multipart()
        topic = unpackb(body)["topic"]
        pub.send_multipart([b"u." + topic.encode(), body])


if __name__ == "__main__":
    if sys.argv[1] == "broker":
        broker(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "streamer":
        streamer(sys.argv[2])
    elif sys.argv[1] == "pubbroker":
        pubbroker(sys.argv[2], sys.argv[3])
    else:
        worker(sys.argv[2])
