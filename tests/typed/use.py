"""The client's side of ``shared``: each ``assert_type`` is checked by mypy (and is a
no-op when run)."""

from __future__ import annotations

from typing import Any, assert_type

from meshant import AsyncClient, Client, TaskFuture

from .shared import embed, square, summarise


def use(client: Client) -> None:
    assert_type(client.run(summarise, "a b c"), dict[str, int])
    assert_type(client.submit(summarise, "text", priority=10), TaskFuture[dict[str, int]])
    assert_type(client.run(square, 4), int)
    assert_type(client.map(embed, ["a", "b"]), list[TaskFuture[list[float]]])
    assert_type(client.run("summarise", "by name, as before"), Any)
    assert_type(summarise.name, str)


async def use_async(client: AsyncClient) -> None:
    assert_type(await client.submit(square, 3), int)
    assert_type(await client.run(summarise, "x"), dict[str, int])
    anything: object = await client.submit(square, 3)  # (covariant in the result)
    print(anything)
