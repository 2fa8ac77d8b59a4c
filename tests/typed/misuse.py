"""What mypy must refuse: a payload of the wrong type, a result used as the wrong type."""

from __future__ import annotations

from meshant import Client

from .shared import square, summarise


def misuse(client: Client) -> None:
    client.run(square, "four")  # line 11: the payload is an int
    words: str = client.run(summarise, "a b")  # noqa: F841  (line 12: the result is a dict)
    client.run(summarise, "text", priorty=1)  # line 13: no such option
