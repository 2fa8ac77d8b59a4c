#!/usr/bin/env python3
"""A queen that breaks the spec on purpose, for the conformance kit's own tests: it
welcomes every hello (whatever its role, name or versions) with every feature, asked for
or not, and answers nothing else. The kit must FAIL it (``q.welcome``) and exit 1.

    python tests/peers/broken_queen.py     # prints {"router": ENDPOINT} when bound
"""

from __future__ import annotations

import json
import signal
import sys

import zmq

from meshant.protocol import Message, decode_any, encode_for
from meshant.protocol.negotiation import FEATURES as FEATURES_ALL


def main() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"router": f"tcp://127.0.0.1:{port}"}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            identity, *frames = sock.recv_multipart()
            try:
                msg, codec = decode_any(frames)
            except Exception:
                continue
            if msg.kind == "hello":
                welcome = Message("welcome", {
                    "version": 2, "features": list(FEATURES_ALL), "hb_interval": 1.0,
                    "hb_misses": 5, "assign_timeout": 30.0, "epoch": "e",
                    "name": msg.b.get("name", "x")}, frm="queen", ref=msg.id)
                sock.send_multipart([identity, *encode_for(welcome, codec)])
    finally:
        sock.close(0)
        ctx.term()


if __name__ == "__main__":
    main()
