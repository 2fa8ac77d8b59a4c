#!/usr/bin/env python3
"""The gateways beside the native client, in the same run: echo round trip p50/p99 and
partial results per second end to end.

    python benchmarks/gateways.py [--n 400] [--partials 2000] [--json]

One CLI queen and one CLI forager (tests/gateway_app.py: ``echo``, ``words``) on
loopback; ``meshant a2a`` and ``meshant mcp --listen`` in front of them. Measured, one
after the other on the same colony:

* native: a threaded ``Client`` (``run("echo", ...)``; a ``words`` stream's partials);
* A2A: JSON-RPC ``SendMessage`` over one kept-alive HTTP connection (httpx), and the
  official a2a-sdk client streaming ``SendStreamingMessage`` (SSE) for partials;
* MCP: the official mcp client over streamable HTTP (``tools/call``; partials arrive as
  progress notifications); ``mcp-http``: the same calls as plain JSON-RPC over httpx, the
  gateway's share without the SDK client's.

The target (docs/a2a-mcp.md): a gateway's echo p50 at most 2 ms over the native p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meshant import Client
from meshant.apps import _procs


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def native(queen: str, n: int, partials: int) -> dict[str, float]:
    with Client(queen) as c:
        for _ in range(50):
            c.run("echo", {"i": 0}, result_timeout=10)
        lat = []
        for i in range(n):
            t = time.perf_counter()
            c.run("echo", {"i": i}, result_timeout=10)
            lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        fut = c.submit("words", {"text": " ".join(["w"] * partials), "delay": 0})
        got = sum(1 for u in fut.updates(30) if u.kind == "partial")
        fut.result(30)
        rate = got / (time.perf_counter() - t)
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "partials_per_s": rate}


async def a2a(url: str, n: int, partials: int) -> dict[str, float]:
    import httpx
    from a2a.client import ClientConfig, create_client
    from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest

    from meshant.gateways.a2a import parts_of

    def body(i: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {"message": {
            "messageId": str(uuid.uuid4()), "role": "ROLE_USER",
            "parts": [{"data": {"i": i}}], "metadata": {"skill": "echo"}}}}

    lat = []
    async with httpx.AsyncClient(timeout=30, headers={"A2A-Version": "1.0"}) as http:
        for i in range(50):
            (await http.post(url, json=body(i))).raise_for_status()
        for i in range(n):
            t = time.perf_counter()
            r = await http.post(url, json=body(i))
            lat.append(time.perf_counter() - t)
            assert "result" in r.json(), r.text
        c = await create_client(url, ClientConfig(streaming=True, httpx_client=http))
        m = Message(message_id="m", role=Role.ROLE_USER, parts=parts_of(
            {"text": " ".join(["w"] * partials), "delay": 0}))
        m.metadata.update({"skill": "words"})
        t = time.perf_counter()
        got = 0
        async for ev in c.send_message(SendMessageRequest(message=m)):
            if ev.WhichOneof("payload") == "artifact_update" and \
                    ev.artifact_update.artifact.name == "partial":
                got += 1
        rate = got / (time.perf_counter() - t)
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "partials_per_s": rate}


async def mcp(url: str, n: int, partials: int) -> dict[str, float]:
    import httpx
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    lat = []
    got = 0

    async def on_progress(p: float, total: float | None, msg: str | None) -> None:
        nonlocal got
        got += msg == "w"

    async with httpx.AsyncClient(timeout=30) as http, McpClient(
            streamable_http_client(url, http_client=http), cache=None) as c:
        await c.list_tools()
        for i in range(50):
            await c.call_tool("echo", {"i": i})
        for i in range(n):
            t = time.perf_counter()
            r = await c.call_tool("echo", {"i": i})
            lat.append(time.perf_counter() - t)
            assert not r.is_error
        t = time.perf_counter()
        await c.call_tool("words", {"text": " ".join(["w"] * partials), "delay": 0},
                          progress_callback=on_progress)
        rate = got / 2 / (time.perf_counter() - t)  # each word: a partial and a progress
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "partials_per_s": rate}


async def mcp_raw(url: str, n: int) -> dict[str, float]:
    """``tools/call`` as plain JSON-RPC over one kept-alive httpx connection (no SDK
    client, as the A2A row measures): the gateway's own share of the MCP round trip."""
    import httpx

    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=30, headers=accept) as http:
        r = await http.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                       "params": {"protocolVersion": "2025-11-25",
                                                  "capabilities": {},
                                                  "clientInfo": {"name": "bench",
                                                                 "version": "1"}}})
        r.raise_for_status()
        session = {"mcp-protocol-version": "2025-11-25"}
        if r.headers.get("mcp-session-id"):
            session["mcp-session-id"] = r.headers["mcp-session-id"]
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers=session)
        lat = []
        for i in range(50 + n):
            t = time.perf_counter()
            r = await http.post(url, headers=session, json={
                "jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"i": i}}})
            if i >= 50:
                lat.append(time.perf_counter() - t)
            assert r.status_code == 200 and '"isError":false' in r.text, r.text
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "partials_per_s": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="echo round trips per client")
    ap.add_argument("--partials", type=int, default=2000, help="partials in the stream")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    procs: list[Any] = []

    def start(*a: str) -> dict[str, Any]:
        p = _procs.spawn(list(a))
        procs.append(p)
        return _procs.read_json_line(p, 30)

    try:
        q = start("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                  "--json", "--journal", ":memory:")["router"]
        start("forager", "--queen", q, "--app", "tests.gateway_app:forager", "--slots", "2",
              "--json")
        a2a_url = start("a2a", "--queen", q, "--listen", "127.0.0.1:0", "--json")["a2a"]
        mcp_url = start("mcp", "--queen", q, "--listen", "127.0.0.1:0", "--json")["mcp"]
        rows = {"native": native(q, args.n, args.partials),
                "a2a": asyncio.run(a2a(a2a_url, args.n, args.partials)),
                "mcp": asyncio.run(mcp(mcp_url, args.n, args.partials)),
                "mcp-http": asyncio.run(mcp_raw(mcp_url, args.n))}
    finally:
        _procs.stop(procs)
    base = rows["native"]["p50_ms"]
    for r in rows.values():
        r["p50_over_native_ms"] = r["p50_ms"] - base
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'client':8} {'p50 ms':>8} {'p99 ms':>8} {'p50 - native':>13} {'partials/s':>11}")
    for name, r in rows.items():
        print(f"{name:8} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['p50_over_native_ms']:+13.2f} {r['partials_per_s']:11.0f}")
    print(f"target: a gateway's p50 at most 2 ms over the native p50 ({base:.2f} ms)")


if __name__ == "__main__":
    main()
