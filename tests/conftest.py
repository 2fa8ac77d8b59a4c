"""Fixtures: real colonies on loopback, every process and thread stopped in teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from meshant import Client, Forager, Queen
from meshant.apps import _procs

# CLI queens journal to ./meshant-queen.db by default; tests that want a journal give
# their own path, the rest run volatile queens (and never share a file).
os.environ["MESHANT_JOURNAL"] = ":memory:"

# Tests press Ctrl-C (SIGINT) on the commands they start, as a person at a terminal
# does. A shell without job control (a CI script, `cmd &`) starts background commands
# with SIGINT ignored, an ignored signal stays ignored across exec, and Python then
# installs no KeyboardInterrupt handler: every `meshant submit` started from here would
# ignore Ctrl-C. The commands start as a terminal's foreground job does instead.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def colony(ctx: zmq.Context[Any]) -> Iterator[Colony]:
    col = Colony(ctx)
    yield col
    col.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One throwaway PostgreSQL server for the session (tests/pg_server.py)."""
    from tests.pg_server import PgServer

    srv = PgServer()
    yield srv
    srv.close()


@pytest.fixture
def pg_url(pg_server: Any, request: pytest.FixtureRequest) -> str:
    """A fresh database of that server, for one test."""
    import re
    import secrets

    name = re.sub(r"\W+", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    return str(pg_server.create_db(name))


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it is truthy (returned) or fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    v: Any = None
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what} (last seen: {v!r:.300})")


class Colony:
    """In-process queen, foragers and clients over real tcp loopback sockets."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.ctx = ctx
        self.queen: Queen | None = None
        self.foragers: list[Forager] = []
        self.clients: list[Client] = []

    def start_queen(self, **kw: Any) -> Queen:
        kw.setdefault("hb_interval", 0.2)
        kw.setdefault("hb_misses", 5)
        self.queen = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", context=self.ctx,
                           **kw).start()
        return self.queen

    @property
    def endpoint(self) -> str:
        assert self.queen is not None
        return self.queen.endpoint

    def forager(self, handlers: dict[str, Callable[..., Any]] | None = None, *,
                start: bool = True, **kw: Any) -> Forager:
        f = Forager(self.endpoint, context=self.ctx, **kw)
        for cap, fn in (handlers or {}).items():
            f.add_handler(cap, fn)
        self.foragers.append(f)
        if start:
            f.start(timeout=10)
        return f

    def client(self, **kw: Any) -> Client:
        c = Client(self.endpoint, context=self.ctx, **kw)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for f in self.foragers:
            f.stop()
        if self.queen is not None:
            self.queen.stop()


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    yield ps
    ps.close()


class Procs:
    """meshant subprocesses started through the CLI; all stopped by PID in teardown."""

    def __init__(self) -> None:
        self.all: list[subprocess.Popen[str]] = []

    def start(self, *args: str, ready: bool = True,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        p = _procs.spawn(list(args), env=env)
        self.all.append(p)
        info = _procs.read_json_line(p, 20) if ready else {}
        return p, info

    def queen(self, *extra: str) -> tuple[subprocess.Popen[str], str]:
        p, info = self.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                             "tcp://127.0.0.1:0", "--json", "--hb-interval", "0.2", *extra)
        return p, info["router"]

    def forager(self, endpoint: str, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        return self.start("forager", "--queen", endpoint, "--json", *extra)

    def close(self) -> None:
        _procs.stop(self.all, timeout=5)
