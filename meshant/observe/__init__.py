"""Seeing the colony from outside: the snapshot the queen's loop publishes, Prometheus
metrics, the HTTP server with its live dashboard, and ``meshant top``.

Nothing here runs in the queen's loop but :meth:`Observer.publish` (every half second,
a dict built from what the core holds); everything else reads its result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshant.observe.snapshot import Observer

if TYPE_CHECKING:
    from meshant.observe.server import ObserveServer


def http_side(address: str, token: str | None, endpoint: Any,
              wake: Any) -> tuple[Observer, ObserveServer]:
    """The observer a queen's loop publishes to and the (unstarted) server reading it;
    a bad address or a missing ``prometheus-client`` fails here, before anything binds."""
    from meshant.observe.server import ObserveServer

    obs = Observer()
    return obs, ObserveServer(obs, address, token=token, endpoint=endpoint, wake=wake)


__all__ = ["Observer", "http_side"]
