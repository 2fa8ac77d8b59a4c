"""Thousands of idle and half-sent connections on a live queen's --http port (#27): the
colony's round trip, /healthz and /metrics keep answering, the queen's threads, memory
and descriptors stay bounded, and slow senders are cut off after the header timeout.

The flood runs in a process of its own (benchmarks/http_flood.py's FloodProcess), on
loopback, bounded in count and time; the figures for 10,000 connections, held or
re-opened as fast as the server closes them, are that benchmark's (docs/operations.md).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from benchmarks.http_flood import FloodProcess, proc_status
from meshant import Client
from meshant.adapters.web.policy import Limits

from .conftest import Procs, wait_for

pytestmark = pytest.mark.slow
CONNECTIONS = 2000
MB = 1 << 20
TIMEOUT = Limits().header_timeout


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_connection_flood_does_not_starve_the_queen(procs: Procs) -> None:
    queen, info = procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                              "tcp://127.0.0.1:0", "--json", "--http", "127.0.0.1:0")
    procs.forager(info["router"], "--name", "flood-ant")
    url = info["http"]
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    assert _get(url + "healthz") == 200
    base = proc_status(queen.pid)
    flood = FloodProcess(port, CONNECTIONS, reopen=False, limit=90)
    figures: dict[str, Any] = {}
    try:
        assert flood.wait_connected(CONNECTIONS, 60)["connected"] >= CONNECTIONS
        t0 = time.monotonic()
        slow = socket.create_connection(("127.0.0.1", port), timeout=30)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        with Client(info["router"], timeout=10) as c:
            for i in range(30):
                assert c.run("echo", i, result_timeout=10) == i
                if i % 10 == 0:
                    assert _get(url + "healthz") == 200
                    assert _get(url + "metrics") == 200
                    now = proc_status(queen.pid)
                    # Every connection held, and no thread for any of them.
                    assert now["fds"] >= base["fds"] + CONNECTIONS * 0.9, (base, now)
                    assert now["threads"] <= base["threads"] + 2, (base, now)
                    assert now["rss"] < 300 * MB, now
        # A sender that stops half-way through its head is cut off after the header
        # timeout, with a 408...
        with slow:
            data = b""
            while chunk := slow.recv(65536):
                data += chunk
        took = time.monotonic() - t0
        assert data.startswith(b"HTTP/1.1 408") and "took too long" in json.loads(
            data.split(b"\r\n\r\n", 1)[1])["error"]
        assert TIMEOUT - 0.5 <= took < TIMEOUT + 5, took
        # ...and so is every connection of the flood, idle or half-sent.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and figures.get("closed_by_server", 0) < CONNECTIONS:
            figures = flood.wait_connected(CONNECTIONS, 0.5)
        assert figures["closed_by_server"] == CONNECTIONS, figures
        # Every descriptor given back (once the closing ones linger out, a moment).
        wait_for(lambda: proc_status(queen.pid)["fds"] <= base["fds"] + 2, 5,
                 "the queen's descriptors back to where they were")
        assert _get(url + "healthz") == 200
    finally:
        flood.stop()
