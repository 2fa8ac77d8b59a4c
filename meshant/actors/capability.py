"""A decorated handler is also the call site: ``@forager.task("summarise")`` returns a
:class:`Capability` that still calls the function, and that a client submits by
(``client.run(summarise, text)``), so the capability's name is written once and its
payload and result types reach the client's code (one module shared by clients and
foragers is checked by mypy).

The type parameters are the handler's own: ``P`` its parameters (the payload first, then
the optional context), ``R`` what a submitter gets back — the return type of a plain
handler, the awaited type of an ``async def`` one, the item type of a batch handler's list.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from meshant.actors.handlers import TaskContext

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
# What a capability gives back, covariant: a capability of an int result is one of an
# object result too (``o: object = await client.submit(cap, x)``).
R_co = TypeVar("R_co", covariant=True)


class Capability(Generic[P, R_co]):
    """A capability a forager serves, by name, with its handler's types (see the module).
    ``name`` is what a client submits to; ``fn`` is the function registered."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.durable = False  # its questions are durable (@forager.task(durable=True))
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]  # (its name, doc, module)

    def __repr__(self) -> str:
        return f"<capability {self.name!r}: {getattr(self.fn, '__qualname__', self.fn)!r}>"


class SyncCapability(Capability[P, R_co]):
    """A plain handler's capability; calling it calls the handler."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        return self.fn(*args, **kwargs)  # type: ignore[no-any-return]


class AsyncCapability(Capability[P, R_co]):
    """An ``async def`` handler's capability; calling it makes the handler's coroutine."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]:
        return self.fn(*args, **kwargs)  # type: ignore[no-any-return]


class BatchCapability(Capability[[T], R_co]):
    """A batch handler's capability: a client submits one payload (``T``) and gets one
    result (``R``); calling it calls the handler with lists."""

    def __call__(self, payloads: list[T], *ctxs: list[TaskContext]) -> list[R_co]:
        return list(self.fn(payloads, *ctxs))


class Register:
    """What ``@forager.task(name)`` applies to a plain or ``async def`` handler."""

    __slots__ = ("_add", "durable", "name")

    def __init__(self, name: str, add: Callable[[Callable[..., Any]], None],
                 durable: bool = False) -> None:
        self.name = name
        self._add = add
        self.durable = durable

    @overload
    def __call__(  # type: ignore[overload-overlap]
            self, fn: Callable[P, Coroutine[Any, Any, R]]) -> AsyncCapability[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> SyncCapability[P, R]: ...

    def __call__(self, fn: Callable[P, Any]) -> Capability[P, Any]:
        self._add(fn)
        cap: Capability[P, Any] = (AsyncCapability(self.name, fn)
                                   if inspect.iscoroutinefunction(fn)
                                   else SyncCapability(self.name, fn))
        cap.durable = self.durable
        return cap


class BatchRegister:
    """What ``@forager.task(name, batch=N)`` applies to a batch handler:
    ``fn(payloads: list[T]) -> Iterable[R]`` (or with the contexts' list too)."""

    __slots__ = ("_add", "name")

    def __init__(self, name: str, add: Callable[[Callable[..., Any]], None]) -> None:
        self.name = name
        self._add = add

    def __call__(self, fn: Callable[Concatenate[list[T], P], Iterable[R]],
                 ) -> BatchCapability[T, R]:
        self._add(fn)
        return BatchCapability(self.name, fn)


def capability_name(capability: str | Capability[Any, Any]) -> str:
    """The name to submit to: a string as it is, a :class:`Capability`'s ``name``."""
    if isinstance(capability, str):  # (the common case first: one cheap test)
        return capability
    if isinstance(capability, Capability):
        return capability.name
    raise TypeError("the capability is a name (str) or a handler decorated with "
                    f"@forager.task, not {type(capability).__name__}")


__all__ = ["AsyncCapability", "BatchCapability", "BatchRegister", "Capability", "Register",
           "SyncCapability", "capability_name"]
