"""The queen's HTTP side: ``/metrics``, ``/healthz``, the dashboard and its live feed.

It runs in threads of its own (the standard library's ``ThreadingHTTPServer``) and reads
only the snapshot the queen's loop publishes (:class:`~meshant.observe.snapshot.Observer`),
so a slow scraper or a hundred open dashboards never slow the loop. What a snapshot does
not hold — a task's timeline beyond the listed ones, and the actions — goes to the queen
the way any client's request does, through a :class:`~meshant.actors.client.Client` of
its own, so the queen treats it like every other peer.

Actions (drain, halt, cancel, dlq retry) need the token the queen was started with
(``--http-token``), as ``Authorization: Bearer TOKEN``; without a token they are refused.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from meshant.errors import MeshantError
from meshant.observe.metrics import exposition, registry_for
from meshant.observe.snapshot import Observer
from meshant.protocol.codes import Code

log = logging.getLogger("meshant.http")

MAX_BODY = 64 * 1024  # an action's request body, at most
MAX_STREAMS = 64  # live dashboards (server-sent event streams) at once
STATIC = {"index.html": "text/html; charset=utf-8",
          "dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}
ACTIONS = {"drain": "forager", "halt": "forager", "cancel": "task", "dlq-retry": "task"}
_TASK_PATH = re.compile(r"^/api/task/([^/?#]{1,200})$")
_ACTION_PATH = re.compile(r"^/api/action/([a-z-]{1,20})$")


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


class ObserveServer:
    """Serves one queen's observer over HTTP, from background threads.

    ``endpoint`` gives the queen's ROUTER endpoint once bound (for the server's own client,
    made on first need); ``wake`` wakes the queen's loop (for a command it must run);
    ``token`` turns the actions on.
    """

    def __init__(self, observer: Observer, address: str, *, token: str | None = None,
                 endpoint: Callable[[], str] = lambda: "",
                 wake: Callable[[], None] = lambda: None,
                 client_kwargs: dict[str, Any] | None = None) -> None:
        self.observer = observer
        self.host, self.port = parse_http(address)
        self.token = token or None
        self._endpoint = endpoint
        self._wake = wake
        self._client_kwargs = client_kwargs or {}
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._registry = registry_for(lambda: observer.latest)
        self._stop = threading.Event()
        self._streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._cache: tuple[int, bytes] = (-1, b"")
        self._cache_lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> ObserveServer:
        """Bind and serve from a background thread (raises MeshantError if it cannot bind)."""
        handler = type("Handler", (_Handler,), {"server_ref": self})
        try:
            httpd = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as e:
            raise MeshantError(f"--http {self.host}:{self.port}: cannot listen ({e.strerror});"
                               " pick a free port, or 0 for any") from None
        httpd.daemon_threads = True
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.25,),
                                        name="meshant-http", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._client_lock:
            if self._client is not None:
                self._client.close(1.0)
                self._client = None

    # -- what the handlers use ------------------------------------------------------------

    def snapshot_json(self) -> bytes | None:
        snap = self.observer.latest
        if snap is None:
            return None
        with self._cache_lock:
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

    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                from meshant.actors.client import Client
                from meshant.actors.config import ClientConfig

                endpoint = self._endpoint().replace("://0.0.0.0:", "://127.0.0.1:").replace(
                    "://*:", "://127.0.0.1:")
                self._client = Client(endpoint, config=ClientConfig(
                    name=f"dashboard-{self.port}", timeout=5.0, discover=False,
                    **self._client_kwargs))
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
        c = self.client()
        snap = self.observer.latest or {}
        if ACTIONS[op] == "forager":
            if not any(f["name"] == target for f in snap.get("foragers", ())):
                raise LookupError(f"no forager {target!r} is connected")
            (c.drain if op == "drain" else c.halt)(target)
            return {"ok": True, "op": op, "forager": target}
        if op == "cancel":
            # Any task, whoever submitted it: only the loop may do that, so it does it.
            fut = self.observer.command("cancel", target)
            self._wake()
            try:
                return fut.result(5.0)
            except TimeoutError:
                raise MeshantError("the queen's loop did not answer within 5 s",
                                   code=Code.TIMEOUT) from None
        r = c.dlq("retry", target, timeout=5.0)
        return {"ok": True, "op": op, "task": target, "result": r}

    def authorized(self, header: str | None) -> tuple[int, str] | None:
        """None if the request may act, else (status, why)."""
        if self.token is None:
            return 403, ("actions are off: this queen serves a read-only dashboard; start "
                         "it with --http-token (or MESHANT_HTTP_TOKEN) to allow them")
        given = (header or "").removeprefix("Bearer ").strip()
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            return 401, "a valid token is needed: send 'Authorization: Bearer TOKEN'"
        return None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def acquire_stream(self) -> bool:
        return self._streams.acquire(blocking=False)

    def release_stream(self) -> None:
        self._streams.release()


class _Handler(BaseHTTPRequestHandler):
    server_ref: ObserveServer
    server_version = "meshant"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
              ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, default=str).encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        srv = self.server_ref
        path, _, query = self.path.partition("?")
        try:
            if path in ("/", "/index.html"):
                path = "/static/index.html"
            if path == "/metrics":
                body, ctype = srv.metrics()
                self._send(200, body, ctype)
            elif path == "/healthz":
                status, obj = srv.health(leader_only="leader" in query.split("&"))
                self._json(status, obj)
            elif path == "/api/snapshot":
                snap = srv.snapshot_json()
                if snap is None:
                    self._json(503, {"error": "no snapshot yet: the queen is starting"})
                else:
                    self._send(200, snap, "application/json")
            elif path == "/api/events":
                self._events()
            elif path.startswith("/static/") and path[8:] in STATIC:
                name = path[8:]
                data = resources.files("meshant.observe").joinpath("static", name).read_bytes()
                self._send(200, data, STATIC[name])
            elif (m := _TASK_PATH.match(path)) is not None:
                task = srv.task(m.group(1))
                if task is None:
                    self._json(404, {"error": f"no task {m.group(1)!r}"})
                else:
                    self._json(200, task)
            else:
                self._json(404, {"error": f"nothing at {path}: try /, /metrics, /healthz, "
                                          "/api/snapshot, /api/events or /api/task/ID"})
        except MeshantError as e:
            self._json(502, {"error": str(e), "code": e.code})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self) -> None:
        srv = self.server_ref
        # The body is read before any answer: left unread on a kept-alive connection, it
        # would be parsed as the next request.
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._json(400, {"error": f"send a JSON body of at most {MAX_BODY} bytes"})
            return
        raw = self.rfile.read(length) if length else b""
        m = _ACTION_PATH.match(self.path)
        if m is None or m.group(1) not in ACTIONS:
            self._json(404, {"error": f"no action at {self.path}: the actions are "
                                      + ", ".join(f"/api/action/{a}" for a in ACTIONS)})
            return
        refused = srv.authorized(self.headers.get("Authorization"))
        if refused is not None:
            self._json(refused[0], {"error": refused[1]})
            return
        op = m.group(1)
        try:
            target = json.loads(raw)["target"]
            if not isinstance(target, str) or not target:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self._json(400, {"error": f'the body must be JSON {{"target": "<{ACTIONS[op]} '
                                      'name or id>"}'})
            return
        try:
            self._json(200, srv.act(op, target))
        except LookupError as e:
            self._json(404, {"error": str(e)})
        except MeshantError as e:
            status = 404 if e.code == "unknown-task" else 409
            self._json(status, {"error": str(e), "code": e.code})

    def _events(self) -> None:
        srv = self.server_ref
        if not srv.acquire_stream():
            self._json(503, {"error": f"{MAX_STREAMS} live dashboards are open, the most "
                                      "this queen serves; poll /api/snapshot instead"})
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            last = -1
            quiet = 0.0
            step = min(0.25, srv.observer.period / 2)
            while not srv.stopping:
                snap = srv.observer.latest
                if snap is not None and snap["seq"] != last:
                    last = snap["seq"]
                    data = srv.snapshot_json() or b"{}"
                    self.wfile.write(b"data: " + data + b"\n\n")
                    self.wfile.flush()
                    quiet = 0.0
                elif quiet >= 15.0:
                    self.wfile.write(b": keep-alive\n\n")  # proxies close silent streams
                    self.wfile.flush()
                    quiet = 0.0
                time.sleep(step)
                quiet += step
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            srv.release_stream()


__all__ = ["ACTIONS", "ObserveServer", "parse_http"]
