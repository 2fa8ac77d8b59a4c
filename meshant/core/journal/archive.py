"""The journal as the queen core sees it: what it restores from, what it may read later,
and what it keeps in memory so that reading is rare.

The core never calls the journal. A restarted (or newly leading) queen is built from a
:class:`Restored` the driver read before the loop started. While it runs, the core keeps
an :class:`ArchiveIndex` of every task id, idempotency key and graph id the journal may
hold: a new id is "certainly not there" from memory (nearly every submission), and only a
"perhaps" becomes a :class:`~meshant.core.queen.outbox.Read`, an effect whose answer comes back
as an event (``QueenCore.fetched``). A read never blocks the queen's loop on a network
database; the driver does it off the loop.

:class:`Archive` is the journal's read interface (both backends implement it, and so
does whatever a test or the simulator puts in its place).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from meshant.core.journal.idfilter import IdFilter

INDEX_ERROR = 0.001  # false positives: a new id read from the journal for nothing
INDEX_MIN = 200_000
INDEX_LAYERS = 8  # filters before the index is rebuilt from the journal (bounded bytes)


class Archive(Protocol):
    """What the queen reads from its journal, and the answers the core expects."""

    def find(self, task_id: str, *, events: bool = False) -> dict[str, Any] | None:
        """A task's row (``final`` included), with its history when ``events``."""

    def find_key(self, key: str) -> dict[str, Any] | None:
        """The newest task row submitted with idempotency key ``key``."""

    def find_graph(self, graph_id: str) -> dict[str, Any] | None:
        """A task graph's summary and its nodes' states."""

    def updates(self, task_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """A task's journaled updates ``(seq, kind, body)``, oldest first."""

    def names(self) -> list[str]:
        """Every name the index holds (see :meth:`ArchiveIndex.name`)."""


@dataclass(slots=True)
class Restored:
    """Everything a queen takes back from its journal when it starts or takes over.

    ``tasks``: unfinished tasks and dead letters (journal rows). ``memory``: colony
    memory ``(key, value, expires_wall, seq)``. ``graphs``: unfinished task graphs with
    their nodes; ``graph_tasks``: the final rows of those graphs' node tasks that are not
    in ``tasks``. ``questions``, ``kept``, ``last_seqs``: the conversations (pending
    questions, inbox messages, each unfinished task's last update); ``marks``: each
    unfinished task's ``(attempt, n)``, its forager's number of the last progress or
    partial result journaled (what it need not send again). ``steps``: each unfinished
    task's recorded steps, in order. ``names``: what the
    archive index starts with (:meth:`ArchiveIndex.name` of each task id, key, graph id).
    """

    tasks: list[dict[str, Any]] = field(default_factory=list)
    memory: list[tuple[str, Any, float | None, int]] = field(default_factory=list)
    graphs: list[dict[str, Any]] = field(default_factory=list)
    graph_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    last_seqs: dict[str, int] = field(default_factory=dict)
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    # Each unfinished task's recorded steps (durable agents), in order.
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # The colony's schedules (core/schedules), as journaled rows.
    schedules: list[dict[str, Any]] = field(default_factory=list)
    # The time of the journal's newest task event (wall clock; None: no task yet): an
    # assignment is one, so until then the queen that journaled it may have let tasks
    # through its rate limits (core/tasks/rates.py, ``Rates.resume``).
    last_event: float | None = None


class ArchiveIndex:
    """Which task ids, keys and graph ids the journal may hold: Bloom filters, never
    wrong about absence. It only grows (an id pruned from the journal costs one read);
    past ``INDEX_LAYERS`` filters the core asks the journal for its names and starts
    afresh (``rebuild``), so its size stays bounded in bytes."""

    __slots__ = ("_last", "_since", "capacity", "layers", "rebuilding")

    def __init__(self, names: list[str] | None = None) -> None:
        names = names or []
        self.capacity = max(INDEX_MIN, 2 * len(names))
        self.layers = [IdFilter(self.capacity, INDEX_ERROR)]
        self.layers[0].update(names)
        self.rebuilding = False
        self._since: list[str] = []  # added while a rebuild's read is under way
        # The last answer of maybe(), (kind, key, answer), until the filters change: a
        # submission asks twice for its id (its declared reads, then its handler).
        self._last: tuple[str, str, bool] | None = None

    @staticmethod
    def name(kind: str, key: str) -> str:
        """``t`` (a task id), ``k`` (an idempotency key), ``g`` (a graph id)."""
        return f"{kind}:{key}"

    def add(self, kind: str, key: str) -> None:
        self._last = None
        n = f"{kind}:{key}"
        top = self.layers[-1]
        if top.full:
            top = IdFilter(self.capacity, INDEX_ERROR)
            self.layers.append(top)
        top.add(n)
        if self.rebuilding:
            self._since.append(n)

    def maybe(self, kind: str, key: str) -> bool:
        """False: the journal certainly holds no such name. True: perhaps."""
        last = self._last
        if last is not None and last[1] == key and last[0] == kind:
            return last[2]
        n = f"{kind}:{key}"
        layers = self.layers
        # (one layer nearly always: then no generator on every submission's path)
        found = n in layers[0] if len(layers) == 1 else any(n in f for f in layers)
        self._last = (kind, key, found)
        return found

    @property
    def crowded(self) -> bool:
        """Time to rebuild from the journal (too many layers)."""
        return len(self.layers) >= INDEX_LAYERS and not self.rebuilding

    def rebuild(self, names: list[str]) -> None:
        """The journal's names now, plus those added since the rebuild was asked for."""
        fresh = ArchiveIndex([*names, *self._since])
        self.capacity, self.layers = fresh.capacity, fresh.layers
        self._last = None
        self.rebuilding = False
        self._since = []

    @property
    def size(self) -> int:
        """Bytes held."""
        return sum(f.size for f in self.layers)


__all__ = ["Archive", "ArchiveIndex", "Restored"]
