"""Seeing the colony from outside: the snapshot the queen's loop publishes, Prometheus
metrics, the HTTP server with its live dashboard, and ``meshant top``.

Nothing here runs in the queen's loop but :meth:`Observer.publish` (every half second,
a dict built from what the core holds); everything else reads its result. This package
sits below the actors: what it needs of them (a client of the queen) is handed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from meshant.observe.snapshot import Observer

if TYPE_CHECKING:
    from meshant.observe.server import ClientFactory, ObserveServer


class HttpSettings(Protocol):
    """The ``http*`` settings of a queen (:class:`~meshant.core.queen.router.QueenConfig`)."""

    @property
    def http(self) -> str | None: ...

    @property
    def http_token(self) -> str | None: ...

    @property
    def http_read_token(self) -> str | None: ...

    @property
    def http_allow_host(self) -> tuple[str, ...]: ...


def http_side(settings: HttpSettings, endpoint: Callable[[], str], wake: Callable[[], None],
              client: ClientFactory) -> tuple[Observer, ObserveServer]:
    """The observer a queen's loop publishes to and the (unstarted) server reading it;
    a bad address or allowed host, or a missing ``prometheus-client``, fails here,
    before anything binds."""
    from meshant.observe.server import ObserveServer

    assert settings.http is not None
    hosts = settings.http_allow_host
    obs = Observer()
    return obs, ObserveServer(obs, settings.http, token=settings.http_token,
                              read_token=settings.http_read_token,
                              allow_hosts=(hosts,) if isinstance(hosts, str) else hosts,
                              endpoint=endpoint, wake=wake, client=client)


__all__ = ["HttpSettings", "Observer", "http_side"]
