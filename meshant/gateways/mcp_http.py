"""``meshant mcp --listen``'s streamable HTTP transport: the mcp SDK's session manager
with resumable streams (SEP-1699) — each SSE stream opens with a priming event (an id,
empty data) and a ``retry`` field, and a client that lost its stream reconnects with
``Last-Event-ID`` and gets what it missed.

The events are kept in this process, bounded (:data:`MAX_EVENTS`, oldest dropped first),
and each session sees only its own: the SDK hands one store to every session and names
a stream by its JSON-RPC request id, which two sessions share, so the store is scoped
per session here (a session's transport gets its own view of it). What a stream carries
is the colony's anyway: a gateway restarted mid-call loses the stream, not the task
(call again, or read ``meshant://tasks/ID``).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import JSONRPCMessage

MAX_EVENTS = 10_000  # events kept for resumption, across all sessions
RETRY_MS = 1000  # the SSE retry field: how long a client waits before reconnecting


class Events:
    """The events of every session's streams, kept for resumption (bounded). Only a
    session's view (:meth:`scoped`) stores and replays; the store itself keeps nothing
    unscoped, so a session can never be handed another's events."""

    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self.max_events = max_events
        self._ids = itertools.count(1)
        # (session, stream) -> its events in order: (number, id, message or None)
        self._streams: dict[tuple[str, str], deque[tuple[int, str, JSONRPCMessage | None]]] = {}
        self._where: dict[str, tuple[str, str, int]] = {}  # event id -> session, stream, n
        self._order: deque[str] = deque()  # event ids, oldest first

    def scoped(self, session: str) -> SessionEvents:
        """The store as one session sees it."""
        return SessionEvents(self, session)

    def store(self, session: str, stream: str, message: JSONRPCMessage | None) -> str:
        n = next(self._ids)
        event_id = f"{n}"
        key = (session, stream)
        self._streams.setdefault(key, deque()).append((n, event_id, message))
        self._where[event_id] = (session, stream, n)
        self._order.append(event_id)
        while len(self._order) > self.max_events:
            self._forget(self._order.popleft())
        return event_id

    def _forget(self, event_id: str) -> None:
        session, stream, _ = self._where.pop(event_id)
        events = self._streams[(session, stream)]
        events.popleft()  # the oldest event overall is the oldest of its stream
        if not events:
            del self._streams[(session, stream)]

    async def replay(self, session: str, last: str, send: EventCallback) -> str | None:
        where = self._where.get(last)
        if where is None or where[0] != session:
            return None  # unknown, forgotten, or another session's
        _, stream, after = where
        for n, event_id, message in list(self._streams.get((session, stream), ())):
            if n > after and message is not None:
                await send(EventMessage(message, event_id))
        return stream

    def __len__(self) -> int:
        return len(self._order)


class SessionEvents(EventStore):
    """One session's view of :class:`Events` (the SDK's ``EventStore`` interface)."""

    def __init__(self, events: Events, session: str) -> None:
        self.events, self.session = events, session

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        return self.events.store(self.session, stream_id, message)

    async def replay_events_after(self, last_event_id: EventId,
                                  send_callback: EventCallback) -> StreamId | None:
        return await self.events.replay(self.session, last_event_id, send_callback)


class _Unscoped(EventStore):
    """What the manager holds: it hands each new session a scoped view instead. Used
    directly (a change in the SDK), it keeps nothing and replays nothing: resumption
    stops working rather than crossing sessions."""

    def __init__(self, events: Events) -> None:
        self.events = events

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        return f"0-{next(self.events._ids)}"

    async def replay_events_after(self, last_event_id: EventId,
                                  send_callback: EventCallback) -> StreamId | None:
        return None


class _Manager(StreamableHTTPSessionManager):
    """The SDK's session manager, each session's transport given its own view of the
    events."""

    def __init__(self, app: Any, events: Events, **kw: Any) -> None:
        super().__init__(app, event_store=_Unscoped(events), **kw)
        self.events = events

    def _admit_session(self, requestor: Any) -> Any:
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id:
            transport._event_store = self.events.scoped(transport.mcp_session_id)
        return transport


def http_app(server: Any, *, path: str = "/mcp", max_body: int,
             events: Events | None = None) -> Any:
    """A Starlette app serving ``server`` (a low-level SDK ``Server``) at ``path`` with
    resumable streams. Host and Origin checks are the caller's (meshant's shared Guard)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = _Manager(server, events or Events(), retry_interval=RETRY_MS,
                       max_request_body_size=max_body,
                       security_settings=TransportSecuritySettings(
                           enable_dns_rebinding_protection=False))
    return Starlette(routes=[Route(path, endpoint=StreamableHTTPASGIApp(manager))],
                     lifespan=lambda _app: manager.run())


__all__ = ["MAX_EVENTS", "RETRY_MS", "Events", "SessionEvents", "http_app"]
