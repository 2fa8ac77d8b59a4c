"""The queen's counters: one namespace for the whole core, each name declared once by the
part that owns it, so two parts can never count into (or overwrite) the same name.

A plain ``dict`` underneath (incremented in place, at C speed, on the hot path); what it
adds is the declaration: :meth:`Counters.declare` refuses a name another owner declared.
"""

from __future__ import annotations


class Counters(dict[str, int]):
    """Counter name -> value; ``owners`` says who declared each."""

    __slots__ = ("owners",)

    def __init__(self) -> None:
        super().__init__()
        self.owners: dict[str, str] = {}

    def declare(self, owner: str, *names: str) -> None:
        """Counters of ``owner``, from 0. A name declared by another owner is a bug
        (ValueError): the two would count into one number."""
        for name in names:
            other = self.owners.get(name)
            if other is not None and other != owner:
                raise ValueError(f"counter {name!r} of {owner} is {other}'s already")
            self.owners[name] = owner
            self.setdefault(name, 0)


__all__ = ["Counters"]
