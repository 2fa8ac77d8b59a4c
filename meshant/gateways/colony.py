"""What both gateways share, without either SDK: who a caller is (:class:`Caller`, from a
bearer token), one colony client per caller (:class:`ColonyLink`), the live catalog of
capabilities with their descriptions, the payload checks, and a task's stream as
asyncio events (:func:`follow`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshant.actors.attach import Attachment
from meshant.actors.client import Client
from meshant.actors.futures import TaskFuture, Update
from meshant.errors import ConfigError, MeshantError

log = logging.getLogger("meshant.gateways")

# What a caller may do: read (list capabilities, get a task) or act (submit, answer,
# cancel) too; an operator acts and also sees every caller's tasks in a gateway's task
# listings (A2A ListTasks). Rights per operation beyond that are the queen's (its rights
# table, applied to the caller's CURVE key).
READ, ACT, OPERATOR = "read", "act", "operator"
RIGHTS = (READ, ACT, OPERATOR)


@dataclass(frozen=True, slots=True)
class Caller:
    """A colony identity an HTTP caller acts as: the client ``name`` (and CURVE key
    ``curve_secret``, whose roles the queen's rights table checks) and ``rights``."""

    name: str | None = None
    curve_secret: str | None = None
    rights: str = ACT

    @property
    def may_act(self) -> bool:
        return self.rights in (ACT, OPERATOR)

    @property
    def operator(self) -> bool:
        """Whether the caller sees every caller's tasks in a listing."""
        return self.rights == OPERATOR

    @property
    def identity(self) -> tuple[str | None, str | None]:
        """The colony identity the caller acts as: whose tasks are its own."""
        return self.name, self.curve_secret


@dataclass(slots=True)
class Callers:
    """Bearer tokens and who each makes the caller; ``anonymous`` is what a request with
    no token may do (None: refused)."""

    tokens: dict[str, Caller] = field(default_factory=dict)
    anonymous: Caller | None = None

    def resolve(self, token: str) -> Caller | None:
        """The caller a token stands for (``''``: none given); None when refused."""
        import hmac

        if not token:
            return self.anonymous
        for known, caller in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return caller
        return None


def read_token_file(path: str) -> dict[str, Caller]:
    """A token file: one caller a line, ``TOKEN NAME [KEYFILE] [read|operator]`` (``#``
    comments). NAME is the client name the caller's requests come from; KEYFILE its CURVE
    secret key (the queen applies that key's roles); ``read`` makes the caller read-only,
    ``operator`` lets it see every caller's tasks in listings (so does a KEYFILE whose
    key holds the ``admin`` role: it is an operator at the queen too)."""
    out: dict[str, Caller] = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) < 2 or len(line) > 4:
            raise ConfigError(f"{path}:{n}: expected 'TOKEN NAME [KEYFILE] [read|operator]'")
        token, name, *rest = line
        rights = ACT
        if rest and rest[-1] in RIGHTS:
            rights = rest.pop()
        if len(rest) > 1:
            raise ConfigError(f"{path}:{n}: {rest[-1]!r} is not a right (read, act or "
                              "operator): expected 'TOKEN NAME [KEYFILE] [read|operator]'")
        key = rest[0] if rest else None
        if key is not None and not Path(key).exists():
            raise ConfigError(f"{path}:{n}: no key file {key!r}")
        if key is not None and rights == ACT and _admin_key(key):
            rights = OPERATOR
        if len(token) < 16:
            raise ConfigError(f"{path}:{n}: a token needs at least 16 characters")
        out[token] = Caller(name, key, rights)
    if not out:
        raise ConfigError(f"{path}: no tokens in it")
    return out


def _admin_key(path: str) -> bool:
    """Whether a CURVE key file grants the ``admin`` role (its metadata's roles)."""
    from meshant.adapters.security import read_grant

    try:
        grant = read_grant(Path(path))
    except (OSError, UnicodeDecodeError):
        return False
    return grant is not None and "admin" in grant.roles


class ColonyLink:
    """One threaded :class:`Client` per caller identity, made on first use; and the
    colony's capabilities, refreshed from ``status`` every ``refresh`` seconds."""

    def __init__(self, queen: str | None, *, refresh: float = 1.0,
                 **client_kwargs: Any) -> None:
        self.queen = queen
        self.refresh = refresh
        self.client_kwargs = client_kwargs
        self._clients: dict[tuple[str | None, str | None], Client] = {}
        self._lock = threading.Lock()
        self.catalog: dict[str, dict[str, Any]] = {}
        self._watchers: list[Callable[[], Any]] = []
        self._task: asyncio.Task[None] | None = None
        # Task id -> what wakes the coroutine that follows it (see follow()).
        self.wakers: dict[str, Callable[[], None]] = {}
        # Called as fn(task_id, update) in a client's I/O thread for every update of a
        # task submitted through this link (a gateway's record of its tasks' states).
        self.observers: list[Callable[[str, Update], None]] = []
        self.colony = "default"  # the colony's name, as its queen says
        self.catalog_changed = time.time()  # wall time the capabilities last changed

    def client(self, caller: Caller | None = None) -> Client:
        """The connected client of ``caller`` (None: the gateway's own identity)."""
        key = (caller.name, caller.curve_secret) if caller is not None else (None, None)
        with self._lock:
            c = self._clients.get(key)
            if c is not None and c._died is None:
                return c
            kw = dict(self.client_kwargs)
            if key[0] is not None:
                kw["name"] = key[0]
            if key[1] is not None:
                kw["curve_secret"] = key[1]
            c = Client(self.queen, on_progress=self._woken, **kw)
            self._clients[key] = c
            return c

    def _woken(self, task_id: str, update: Update) -> None:
        """A submitted task's update is in its future (the client's I/O thread)."""
        for fn in self.observers:
            fn(task_id, update)
        wake = self.wakers.get(task_id)
        if wake is not None:
            wake()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    # -- the catalog ----------------------------------------------------------------------

    def on_change(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` (in the event loop) whenever the capabilities change."""
        self._watchers.append(fn)

    async def refresh_now(self) -> bool:
        """Read the capabilities once; True when they changed."""
        st = await asyncio.to_thread(self.client().status)
        colony = (st.get("queen") or {}).get("colony")
        if isinstance(colony, str) and colony:
            self.colony = colony
        new = catalog_of(st.get("foragers") or [])
        if new == self.catalog:
            return False
        self.catalog = new
        self.catalog_changed = time.time()
        for fn in list(self._watchers):
            try:
                out = fn()
                if asyncio.iscoroutine(out):
                    await out
            except Exception:
                log.exception("a catalog watcher failed")
        return True

    def start(self) -> None:
        """Keep the catalog fresh from the running event loop."""
        async def loop() -> None:
            while True:
                try:
                    await self.refresh_now()
                except MeshantError as e:
                    log.warning("cannot read the colony's capabilities: %s", e)
                await asyncio.sleep(self.refresh)

        self._task = asyncio.get_running_loop().create_task(loop())


def catalog_of(foragers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Capability -> what its foragers say of it (description, payload, result; the
    first forager that describes it wins), for the active foragers of a status."""
    out: dict[str, dict[str, Any]] = {}
    for f in foragers:
        if f.get("state") != "active":
            continue
        about = f.get("describe") or {}
        for tool in f.get("tools") or []:
            if not out.get(tool):
                out[tool] = dict(about.get(tool) or {})
    return dict(sorted(out.items()))


def check_payload(capability: str, about: dict[str, Any], payload: Any) -> str | None:
    """Why ``payload`` does not fit the capability's payload schema, or None. Without
    ``jsonschema`` installed the schema is not checked (the handler's own check stands)."""
    schema = about.get("payload")
    if not schema:
        return None
    try:
        import jsonschema
    except ImportError:
        return None
    try:
        jsonschema.validate(payload, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(x) for x in e.absolute_path)
        return f"the payload does not fit {capability!r}'s schema" + (
            f" at {where}" if where else "") + f": {e.message}"
    except jsonschema.SchemaError:
        return None  # the forager's schema is broken: let the handler judge
    return None


# -- a task's stream in asyncio ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ended:
    """A task's end: ``value`` when it completed, else ``error``."""

    value: Any = None
    error: MeshantError | None = None


Event = Update | Ended


class _Pump:
    """A future's updates moved from a thread of its own onto an asyncio queue (a pool's
    few threads would make streams wait on each other: each blocks until its task ends).
    """

    def __init__(self, fut: TaskFuture[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.fut = fut
        self.q: asyncio.Queue[Update | None] = asyncio.Queue()

        def pump() -> None:
            try:
                for u in fut.updates():
                    loop.call_soon_threadsafe(self.q.put_nowait, u)
            finally:
                loop.call_soon_threadsafe(self.q.put_nowait, None)

        self.thread = threading.Thread(target=pump, name=f"meshant-follow-{fut.task_id}",
                                       daemon=True)
        self.thread.start()

    async def get(self, timeout: float | None) -> Update | object | None:
        try:
            # asyncio.timeout, not wait_for: no task made per wait (3.11's wait_for wraps
            # the awaitable in one), on a path every update of a stream takes.
            async with asyncio.timeout(timeout):
                return await self.q.get()
        except TimeoutError:
            return _TICK

    def stop(self) -> None:
        if self.thread.is_alive():
            self.fut._updates.put(None)  # nobody reads on: end the thread's wait


class _Woken:
    """A submitted task's updates read from its future without a thread: the client's
    ``on_progress`` (an update arrived) and the future's end wake the loop."""

    def __init__(self, fut: TaskFuture[Any], loop: asyncio.AbstractEventLoop,
                 wakers: dict[str, Callable[[], None]]) -> None:
        self.fut = fut
        self.event = asyncio.Event()
        self.wakers = wakers

        def wake() -> None:
            loop.call_soon_threadsafe(self.event.set)

        wakers[fut.task_id] = wake
        fut.add_done_callback(lambda _f: wake())

    async def get(self, timeout: float | None) -> Update | object | None:
        while True:
            self.event.clear()  # cleared before looking: a wake after the look is kept
            try:
                return self.fut._updates.get_nowait()
            except queue.Empty:
                pass
            try:
                async with asyncio.timeout(timeout):
                    await self.event.wait()
            except TimeoutError:
                return _TICK

    def stop(self) -> None:
        self.wakers.pop(self.fut.task_id, None)


_TICK = object()
TICK = 0.5  # seconds between checks that the queen is still the same one


async def kept(client: Client, att: Attachment, wait: float = 5.0) -> list[Update]:
    """The updates an attachment was sent on attaching (those up to its ``last``),
    waiting at most ``wait`` seconds for them; it stays attached."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while att.last_seq < att.last and not att.done() and loop.time() < deadline:
        await asyncio.sleep(0.005)
    out: list[Update] = []
    while True:
        try:
            u = att._updates.get_nowait()
        except Exception:
            break
        if u is None:
            att._updates.put(None)  # the end stays for whoever follows
            break
        out.append(u)
    return out


async def follow(fut: TaskFuture[Any], client: Client | None = None,
                 link: ColonyLink | None = None, after: int | None = None
                 ) -> AsyncIterator[Event]:
    """The updates of a submitted task (or an attachment), each once and in order, then
    its end. With ``client`` (the one that submitted or attached) a queen's failover
    loses nothing past the cursor: the updates the new leader got before this client
    was back are read from it (an attachment from the cursor), and an attachment, which
    a new leader does not know of, is made again there. With ``link`` (whose client
    submitted it) a submitted task is followed without a thread of its own. ``after``:
    the last update already read (by :func:`kept`), when it may be older than the
    attachment's cursor (an update arriving after ``kept`` returned is still to come)."""
    loop = asyncio.get_running_loop()
    last = after if after is not None else (
        fut.last_seq if isinstance(fut, Attachment) else 0)
    epoch = client.epoch if client is not None else ""
    src: _Pump | _Woken = (_Woken(fut, loop, link.wakers)
                           if link is not None and not isinstance(fut, Attachment)
                           else _Pump(fut, loop))
    try:
        while True:
            item: Any = await src.get(TICK if client else None)
            if client is not None and client.epoch and client.epoch != epoch:
                epoch = client.epoch
                att = await attach(client, fut.task_id, last)
                if isinstance(src.fut, Attachment):
                    src.stop()
                    src = _Pump(att, loop)  # follow the new leader's attachment instead
                    continue
                for u in await kept(client, att):
                    if u.seq > last:
                        last = u.seq
                        yield u
                if not att.done():
                    client._detach(att)
            if item is _TICK:
                continue
            if item is None:
                break
            if item.seq > last or item.seq == 0:
                last = max(last, item.seq)
                yield item
        try:
            # Most often it has ended already (its end is what stopped the updates): read
            # it at once, without a loop future and a wake-up from another thread.
            value = (src.fut.result() if src.fut.done()
                     else await asyncio.wrap_future(src.fut))
        except MeshantError as e:
            yield Ended(error=e)
        else:
            yield Ended(value=value)
    finally:
        src.stop()


PATIENCE = 30.0  # seconds a read waits through a queen's failover before giving up


async def patiently(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args)`` in a thread, asked again while the queen does not answer (a standby
    taking over answers after its lease runs out), for at most PATIENCE seconds."""
    from meshant.errors import Timeout

    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while True:
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except Timeout:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.2)


async def attach(client: Client, task_id: str, after: int = 0) -> Attachment:
    """Follow a task from a cursor (waiting through a failover)."""
    att: Attachment = await patiently(client.attach, task_id, after)
    return att


# A result ``{"$content": [BLOCK, ...]}`` carries MCP content blocks (images, audio,
# resources) in MCP's JSON form: ``meshant mcp`` shows them to its host as they are.
CONTENT_KEY = "$content"


def payload_text(value: Any) -> str:
    """A value as text: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def jsonable(value: Any) -> Any:
    """A result as JSON values (bytes as text)."""
    return json.loads(json.dumps(value, default=lambda v: v.decode("utf-8", "replace")
                                 if isinstance(v, bytes) else str(v)))


__all__ = [
    "ACT",
    "CONTENT_KEY",
    "OPERATOR",
    "PATIENCE",
    "READ",
    "Caller",
    "Callers",
    "ColonyLink",
    "Ended",
    "Event",
    "attach",
    "catalog_of",
    "check_payload",
    "follow",
    "jsonable",
    "patiently",
    "payload_text",
    "read_token_file",
]
