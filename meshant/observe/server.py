"""The queen's HTTP side: ``/metrics``, ``/healthz``, the dashboard and its live feed.

Served by :class:`~meshant.adapters.web.server.WebServer` — one asyncio thread, bounded
connections, header, body and idle timeouts — under the shared
:class:`~meshant.adapters.web.policy.Policy`: only this server's names as Host, no
cross-origin caller, a token for the actions and, with a read token, for the reads. It
reads only the snapshot the queen's loop publishes
(:class:`~meshant.observe.snapshot.Observer`), so no request slows the loop. What a
snapshot does not hold — a task's timeline beyond the listed ones, and the actions —
goes to the queen as any client's request does, through a client the queen's driver
hands in (``client``: this package sits below the actors and imports none of them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import resource
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from importlib import resources
from typing import Any, Protocol

from meshant.adapters.web.policy import Access, Limits, Policy
from meshant.adapters.web.server import Request, Response, Stream, WebServer, json_response
from meshant.errors import MeshantError, Timeout
from meshant.observe.metrics import exposition, registry_for
from meshant.observe.snapshot import Observer

log = logging.getLogger("meshant.http")

STATIC = {"index.html": "text/html; charset=utf-8",
          "dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}
ACTIONS = {"drain": "forager", "halt": "forager", "cancel": "task", "dlq-retry": "task"}
PUBLIC = frozenset({"/", "/index.html", "/healthz", "/api/access"})
KEEPALIVE = 15.0  # seconds of a quiet live feed before a comment line (proxies close silence)
_TASK_PATH = re.compile(r"^/api/task/([^/?#]{1,200})$")
_ACTION_PATH = re.compile(r"^/api/action/([a-z-]{1,20})$")


class ColonyClient(Protocol):
    """What the server asks of the client the queen hands it."""

    def task_status(self, task_id: str, timeout: float = ...) -> dict[str, Any]: ...

    def drain(self, forager: str | list[str]) -> None: ...

    def halt(self, forager: str | list[str]) -> None: ...

    def dlq(self, op: str = ..., task: str | None = ..., *, all: bool = ...,
            timeout: float = ...) -> dict[str, Any]: ...

    def close(self, timeout: float = ...) -> None: ...


# (the queen's ROUTER endpoint, a name for the client) -> a client of that queen
ClientFactory = Callable[[str, str], ColonyClient]


def parse_http(value: str) -> tuple[str, int]:
    """``PORT`` (on loopback), ``HOST:PORT`` or ``[V6]:PORT`` as (host, port); a
    ValueError says what is wrong."""
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http {value!r}: expected PORT or HOST:PORT with a port from 0 "
                         "to 65535 (e.g. 127.0.0.1:9100)")
    return host, int(port)


def default_limits() -> Limits:
    """The shared defaults, with connections bounded by this process's open-file limit."""
    return Limits().bounded(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


class ObserveServer:
    """Serves one queen's observer over HTTP from a thread of its own.

    ``endpoint`` gives the queen's ROUTER endpoint once bound and ``client`` makes a
    client of it (on first need: task lookups and actions); ``wake`` wakes the queen's
    loop (for a command it must run). ``token`` turns the actions on; ``read_token``
    makes the reads need a token too; ``allow_hosts`` adds Host names (a reverse
    proxy's) to this server's own.
    """

    def __init__(self, observer: Observer, address: str, *, token: str | None = None,
                 read_token: str | None = None, allow_hosts: Iterable[str] = (),
                 endpoint: Callable[[], str] = lambda: "",
                 wake: Callable[[], None] = lambda: None,
                 client: ClientFactory | None = None, limits: Limits | None = None) -> None:
        self.observer = observer
        self.host, port = parse_http(address)
        self.token = token or None
        self.policy = Policy(self.host, allow_hosts=allow_hosts, read_token=read_token,
                             action_token=self.token)
        self.web = WebServer(self, self.policy, self.host, port,
                             limits=limits or default_limits())
        self._endpoint = endpoint
        self._wake = wake
        self._make_client = client
        self._client: ColonyClient | None = None
        self._client_lock = threading.Lock()
        self._registry = registry_for(lambda: observer.latest)
        self._cache: tuple[int, bytes] = (-1, b"")
        self._static: dict[str, bytes] = {}

    @property
    def port(self) -> int:
        return self.web.port

    @property
    def url(self) -> str:
        return self.web.url

    def start(self) -> ObserveServer:
        """Bind and serve from a background thread (raises MeshantError if it cannot bind)."""
        try:
            self.web.start()
        except OSError as e:
            raise MeshantError(f"--http {self.host}:{self.port}: cannot listen "
                               f"({e.strerror}); pick a free port, or 0 for any") from None
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.web.stop(timeout)
        with self._client_lock:
            if self._client is not None:
                self._client.close(1.0)
                self._client = None

    # -- what the requests read ------------------------------------------------------------

    def snapshot_json(self) -> bytes | None:
        snap = self.observer.latest
        if snap is None:
            return None
        if self._cache[0] != snap["seq"]:
            # Serialized once per snapshot however many dashboards are open.
            self._cache = (snap["seq"], json.dumps(snap, default=str).encode())
        return self._cache[1]

    def metrics(self) -> tuple[bytes, str]:
        return exposition(self._registry)

    def health(self, leader_only: bool = False) -> tuple[int, dict[str, Any]]:
        """200 when the loop publishes (and, with ``leader_only``, this queen leads)."""
        snap = self.observer.latest
        if snap is None:
            return 503, {"status": "starting", "role": self.observer.role}
        # The loop's clock, not the wall's: a stepped wall clock is no stall.
        age = max(0.0, time.monotonic() - self.observer.published)
        # A loop that stopped publishing is a stuck queen: tell the supervisor.
        ok = age < max(5.0, 10 * self.observer.period)
        status = "ok" if ok else "stalled"
        if ok and leader_only and snap["role"] != "leader":
            ok, status = False, "standby"
        return (200 if ok else 503), {"status": status,
                                      "role": snap["role"], "term": snap["term"],
                                      "leader": snap["leader"], "name": snap["queen"]["name"],
                                      "epoch": snap["queen"]["epoch"],
                                      "snapshot_age": round(age, 3),
                                      "foragers": len(snap["foragers"]),
                                      "queued": snap["queued"], "running": snap["running"]}

    def access(self, rights: Access) -> dict[str, bool]:
        """What the page may show and do, for the token it sent."""
        return {"read": rights >= Access.READ, "act": rights >= Access.ACT,
                "actions": self.token is not None,
                "read_token": self.policy.read_token is not None}

    def client(self) -> ColonyClient:
        with self._client_lock:
            if self._client is None:
                if self._make_client is None:
                    raise MeshantError("this server has no client of the queen: task "
                                       "lookups and actions are off")
                endpoint = self._endpoint().replace("://0.0.0.0:", "://127.0.0.1:").replace(
                    "://*:", "://127.0.0.1:")
                self._client = self._make_client(endpoint, f"dashboard-{self.port}")
            return self._client

    def task(self, task_id: str) -> dict[str, Any] | None:
        snap = self.observer.latest or {}
        for key in ("running_tasks", "recent_tasks", "dead_letter_tasks"):
            for t in snap.get(key, ()):
                if t["task"] == task_id:
                    return dict(t)
        try:
            return dict(self.client().task_status(task_id, timeout=5.0))
        except MeshantError as e:
            if e.code == "unknown-task":
                return None
            raise

    def act(self, op: str, target: str) -> dict[str, Any]:
        snap = self.observer.latest or {}
        if ACTIONS[op] == "forager":
            if not any(f["name"] == target for f in snap.get("foragers", ())):
                raise LookupError(f"no forager {target!r} is connected")
            c = self.client()
            (c.drain if op == "drain" else c.halt)(target)
            return {"ok": True, "op": op, "forager": target}
        if op == "cancel":
            # Any task, whoever submitted it: only the loop may do that, so it does it.
            fut = self.observer.command("cancel", target)
            self._wake()
            try:
                return fut.result(5.0)
            except TimeoutError:
                raise Timeout("the queen's loop did not answer within 5 s") from None
        r = self.client().dlq("retry", target, timeout=5.0)
        return {"ok": True, "op": op, "task": target, "result": r}

    # -- the routes (the WebServer's App) -----------------------------------------------------

    def need(self, method: str, path: str) -> Access:
        if method != "GET":
            return Access.ACT
        if path in PUBLIC or path.startswith("/static/"):
            return Access.PUBLIC  # the page itself, so it can ask for the token
        return Access.READ

    async def handle(self, request: Request) -> Response | Stream:
        head = request.head
        path = head.path
        try:
            if head.method == "POST":
                return await self._action(path, request.body)
            if head.method not in ("GET", "HEAD"):
                return json_response(405, {"error": f"{head.method} is not served here"})
            return await self._get(path, head.query, request.rights)
        except MeshantError as e:
            return json_response(502, {"error": str(e), "code": e.code})

    async def _get(self, path: str, query: str, rights: Access) -> Response | Stream:
        if path in ("/", "/index.html"):
            path = "/static/index.html"
        if path == "/metrics":
            body, ctype = self.metrics()
            return Response(200, body, ctype)
        if path == "/healthz":
            status, obj = self.health(leader_only="leader" in query.split("&"))
            # Without read rights, the status alone: enough for a supervisor.
            return json_response(status, obj if rights >= Access.READ else
                                 {"status": obj["status"]})
        if path == "/api/access":
            return json_response(200, self.access(rights))
        if path == "/api/snapshot":
            snap = self.snapshot_json()
            if snap is None:
                return json_response(503, {"error": "no snapshot yet: the queen is starting"})
            return Response(200, snap)
        if path == "/api/events":
            return Stream(self._events(), busy="live dashboards are open, the most this "
                                               "queen serves; poll /api/snapshot instead")
        if path.startswith("/static/") and path[8:] in STATIC:
            name = path[8:]
            if name not in self._static:
                self._static[name] = resources.files("meshant.observe").joinpath(
                    "static", name).read_bytes()
            return Response(200, self._static[name], STATIC[name])
        if (m := _TASK_PATH.match(path)) is not None:
            task = await self.web.offload(self.task, m.group(1))
            if task is None:
                return json_response(404, {"error": f"no task {m.group(1)!r}"})
            return json_response(200, task)
        return json_response(404, {"error": f"nothing at {path}: try /, /metrics, /healthz, "
                                            "/api/snapshot, /api/events or /api/task/ID"})

    async def _action(self, path: str, raw: bytes) -> Response:
        m = _ACTION_PATH.match(path)
        if m is None or m.group(1) not in ACTIONS:
            return json_response(404, {"error": f"no action at {path}: the actions are "
                                       + ", ".join(f"/api/action/{a}" for a in ACTIONS)})
        op = m.group(1)
        try:
            target = json.loads(raw)["target"]
            if not isinstance(target, str) or not target:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return json_response(400, {"error": f'the body must be JSON {{"target": '
                                                f'"<{ACTIONS[op]} name or id>"}}'})
        try:
            return json_response(200, await self.web.offload(self.act, op, target))
        except LookupError as e:
            return json_response(404, {"error": str(e)})
        except MeshantError as e:
            status = 404 if e.code == "unknown-task" else 409
            return json_response(status, {"error": str(e), "code": e.code})

    async def _events(self) -> AsyncGenerator[bytes, None]:
        """Each new snapshot as a server-sent event, and a comment line when quiet."""
        last = -1
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        step = min(0.25, self.observer.period / 2)
        while True:
            snap = self.observer.latest
            now = loop.time()
            if snap is not None and snap["seq"] != last:
                last = snap["seq"]
                yield b"data: " + (self.snapshot_json() or b"{}") + b"\n\n"
                quiet_since = now
            elif now - quiet_since >= KEEPALIVE:
                yield b": keep-alive\n\n"
                quiet_since = now
            await asyncio.sleep(step)


__all__ = ["ACTIONS", "ClientFactory", "ColonyClient", "ObserveServer", "default_limits",
           "parse_http"]
