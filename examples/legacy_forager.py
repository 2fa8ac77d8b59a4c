#!/usr/bin/env python3
"""An IACP 1.1 forager written with nothing but pyzmq and json: no meshant import.

It shows that an old agent joins a meshant colony unchanged: it connects a DEALER,
registers with its first heartbeat (``body: {"slots": 1, "tools": [...]}``), and answers
``task.assign`` with ``task.accept`` and ``task.result`` whose ``ref`` is the assign's id,
exactly as in the IACP 1.1 example exchange.

Run it against a queen:

    meshant queen &
    python examples/legacy_forager.py tcp://127.0.0.1:5670 legacy-1
    meshant submit upper '"hello"'
"""

from __future__ import annotations

import itertools
import json
import secrets
import signal
import sys
import time

import zmq

TOOLS = {"echo": lambda p: p, "upper": lambda p: str(p).upper()}


USAGE = ("usage: python examples/legacy_forager.py [QUEEN_ENDPOINT [NAME]]  (default "
         "tcp://127.0.0.1:5670, where `meshant queen` listens)")


def main() -> int:
    args = sys.argv[1:]
    if len(args) > 2 or args[:1] in (["-h"], ["--help"]):
        print(USAGE, file=sys.stderr if len(args) > 2 else sys.stdout)
        return 2 if len(args) > 2 else 0
    endpoint = args[0] if args else "tcp://127.0.0.1:5670"
    name = args[1] if len(args) > 1 else "legacy-" + secrets.token_hex(3)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 500)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:  # (EINVAL, EPROTONOSUPPORT: not an endpoint)
        sock.close()
        ctx.term()
        print(f"error: cannot connect to {endpoint!r}: {e}\n{USAGE}", file=sys.stderr)
        return 2
    counter = itertools.count(1)
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def send(kind: str, ref: str | None = None, body: dict | None = None) -> None:
        env: dict = {"v": "1.1", "id": f"m-{next(counter):06x}", "from": name, "to": "queen",
                     "kind": kind}
        if ref is not None:
            env["ref"] = ref
        env["ts"] = int(time.time())
        if body is not None:
            env["body"] = body
        sock.send((json.dumps(env, separators=(",", ":")) + "\n").encode())

    def heartbeat() -> None:
        send("hb", body={"slots": 1, "tools": sorted(TOOLS)})

    heartbeat()
    last_hb = time.monotonic()
    print(json.dumps({"event": "ready", "name": name}), flush=True)
    while running:
        if sock.poll(200):
            try:
                msg = json.loads(sock.recv())
                kind = msg.get("kind")
            except (ValueError, AttributeError):
                continue  # not a JSON object: bad input changes nothing
            if kind == "task.assign":
                body = msg.get("body", {})
                tool = TOOLS.get(body.get("capability"))
                if tool is None:
                    send("task.reject", msg["id"], {"reason": "no such tool here"})
                    continue
                send("task.accept", msg["id"])
                try:
                    send("task.result", msg["id"], {"status": "ok",
                                                    "result": tool(body.get("payload"))})
                except Exception as e:
                    send("task.result", msg["id"], {"status": "error", "error": {
                        "type": type(e).__name__, "message": str(e)}})
            elif kind == "ctl.halt":
                break
            elif kind == "error":
                print(f"queen says: {msg.get('body')}", file=sys.stderr, flush=True)
        if time.monotonic() - last_hb >= 1.0:
            heartbeat()
            last_hb = time.monotonic()
    sock.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
