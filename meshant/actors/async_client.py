"""The asyncio face of the client: :class:`AsyncClient` runs a threaded
:class:`~meshant.actors.client.Client` and awaits its futures."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack, overload

from meshant.actors.attach import Attachment
from meshant.actors.capability import Capability
from meshant.actors.client import Client, SubmitOptions
from meshant.actors.graphs import GraphHandle
from meshant.errors import MeshantError
from meshant.protocol.codes import Code

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class AsyncClient:
    """asyncio face of :class:`Client`: ``await client.submit(...)`` returns the result."""

    def __init__(self, queen: str | None = None, **kw: Any) -> None:
        self._kw = kw
        self._queen = queen
        self.client: Client | None = None

    async def connect(self) -> AsyncClient:
        self.client = await asyncio.to_thread(Client, self._queen, **self._kw)
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self.client is not None:
            await asyncio.to_thread(self.client.close)

    def _c(self) -> Client:
        if self.client is None:
            raise MeshantError("call 'await connect()' first", code=Code.CLOSED)
        return self.client

    @overload
    async def submit(self, capability: Capability[Concatenate[T, P], R], payload: T,
                     **options: Unpack[SubmitOptions]) -> R: ...

    @overload
    async def submit(self, capability: str, payload: Any = None,
                     **options: Unpack[SubmitOptions]) -> Any: ...

    async def submit(self, capability: str | Capability[Any, Any], payload: Any = None,
                     **options: Unpack[SubmitOptions]) -> Any:
        """Submit and await the result (``capability``: a name, or a handler decorated
        with ``@forager.task``, whose result type it returns)."""
        return await asyncio.wrap_future(self._c().submit(capability, payload, **options))

    @overload
    async def run(self, capability: Capability[Concatenate[T, P], R], payload: T,
                  **options: Unpack[SubmitOptions]) -> R: ...

    @overload
    async def run(self, capability: str, payload: Any = None,
                  **options: Unpack[SubmitOptions]) -> Any: ...

    async def run(self, capability: str | Capability[Any, Any], payload: Any = None,
                  **options: Unpack[SubmitOptions]) -> Any:
        """Submit and await the result: the same as :meth:`submit` (the name
        :class:`Client` uses)."""
        return await asyncio.wrap_future(self._c().submit(capability, payload, **options))

    async def cancel(self, task_id: str, *, timeout: float = 5.0) -> str | None:
        """Cancel a task and await what it became (:meth:`Client.cancel`)."""
        return await asyncio.to_thread(self._c().cancel, task_id, timeout=timeout)

    @overload
    def submit_nowait(self, capability: Capability[Concatenate[T, P], R], payload: T,
                      **options: Unpack[SubmitOptions]) -> asyncio.Future[R]: ...

    @overload
    def submit_nowait(self, capability: str, payload: Any = None,
                      **options: Unpack[SubmitOptions]) -> asyncio.Future[Any]: ...

    def submit_nowait(self, capability: str | Capability[Any, Any], payload: Any = None,
                      **options: Unpack[SubmitOptions]) -> asyncio.Future[Any]:
        """Submit and return an asyncio future at once."""
        return asyncio.wrap_future(self._c().submit(capability, payload, **options))

    async def submit_graph(self, graph: Any, *, updates: bool = False) -> dict[str, Any]:
        """Submit a task graph and await its node results (GraphFailed if it fails)."""
        handle = self._c().submit_graph(graph, updates=updates)
        return await asyncio.wrap_future(handle.done)

    def submit_graph_nowait(self, graph: Any, *, updates: bool = False) -> GraphHandle:
        """Submit a task graph; its handle's ``done`` (and ``nodes[name]``) can be awaited
        with ``asyncio.wrap_future``."""
        return self._c().submit_graph(graph, updates=updates)

    async def status(self, timeout: float = 5.0) -> dict[str, Any]:
        return await asyncio.to_thread(self._c().status, timeout)

    async def add_schedule(self, name: str, cron: str, capability: Any, payload: Any = None,
                           **kw: Any) -> dict[str, Any]:
        """Add a schedule (:meth:`Client.add_schedule`)."""
        return await asyncio.to_thread(
            functools.partial(self._c().add_schedule, name, cron, capability, payload, **kw))

    async def schedules(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every schedule (:meth:`Client.schedules`)."""
        return await asyncio.to_thread(self._c().schedules, timeout)

    async def schedule(self, op: str, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """Show, pause, resume, remove or trigger a schedule (:meth:`Client.schedule`)."""
        return await asyncio.to_thread(self._c().schedule, op, name, timeout)

    async def answer(self, task_id: str, value: Any, *, request: str | None = None
                     ) -> dict[str, Any]:
        """Answer a task's question (:meth:`Client.answer`)."""
        return await asyncio.to_thread(self._c().answer, task_id, value, request=request)

    async def attach(self, task_id: str, after_seq: int = 0) -> Attachment:
        """Follow a task from a cursor (:meth:`Client.attach`); await its result with
        ``await asyncio.wrap_future(attachment)``."""
        return await asyncio.to_thread(self._c().attach, task_id, after_seq)


__all__ = ["AsyncClient"]
