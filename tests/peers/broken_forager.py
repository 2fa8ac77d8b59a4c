#!/usr/bin/env python3
"""A forager that breaks the spec on purpose, for the conformance kit's own tests: a kit
that cannot fail is a defect. It uses nothing of meshant but the codec.

Its bugs, each one a check the kit must FAIL: results without ``status`` (``f.assign``),
a heartbeat every 3 s whatever the welcome says (``f.heartbeat``), the wrong ``from``
after the welcome (``f.from``), and partial results although it asks for no feature
(``f.progress``; ``f.no-features`` is reached only through a reconnect).

    python tests/peers/broken_forager.py     # with MESHANT_QUEEN set, as the kit does
"""

from __future__ import annotations

import os
import time

import zmq

from meshant.protocol import Message, decode_any, encode_for


def main() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(os.environ["MESHANT_QUEEN"])
    sock.send_multipart(encode_for(Message("hello", {
        "role": "forager", "name": "broken-1", "versions": [2], "slots": 1,
        "tools": ["echo"]}, frm="broken-1"), "iacp2"))
    last = time.monotonic()
    try:
        while True:
            if sock.poll(100):
                msg, codec = decode_any(sock.recv_multipart())
                if msg.kind == "task.assign":
                    partial = Message("task.result", {"partial": True, "value": "p"},
                                      frm="someone-else", ref=msg.id)
                    sock.send_multipart(encode_for(partial, codec))
                    result = Message("task.result", {"result": msg.b.get("payload")},
                                     frm="broken-1", ref=msg.id)
                    sock.send_multipart(encode_for(result, codec))
            if time.monotonic() - last > 3.0:
                sock.send_multipart(encode_for(Message("hb", {}, frm="broken-1"), "iacp2"))
                last = time.monotonic()
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(0)
        ctx.term()


if __name__ == "__main__":
    main()
