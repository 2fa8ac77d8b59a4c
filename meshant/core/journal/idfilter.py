"""Which task ids the journal may hold, without asking it: a Bloom filter.

A new submission's id must be checked against the journal (a finished task keeps its id
for good), and on PostgreSQL that check is a network round trip per submission. The
filter answers "certainly not there" for nearly every new id from memory; "perhaps"
(an id that is there, or a false positive, about 1 % at capacity) falls through to the
query. It never forgets an id, so it is never wrong: an id pruned from the journal only
costs a query. Fixed size in bytes; past its capacity it is rebuilt larger from the
journal by its owner (``full``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

HASHES = 3  # probes an id (unrolled below: add and __contains__ are on every submission)
_LOW = 0xFFFFFFFF


class IdFilter:
    """A Bloom filter over strings, sized for ``capacity`` ids at ``error`` false
    positives (1 % by default)."""

    def __init__(self, capacity: int = 200_000, error: float = 0.01) -> None:
        self.capacity = max(1024, capacity)
        # Bits for that error with HASHES probes: about 12.5 an id at 1 % (30 % more than
        # the optimal 7 probes' 9.6), 28.5 at the archive index's 0.1 % (712 KB a layer of
        # 200,000 ids, twice the optimal's): memory spent for fewer probes a submission.
        self.bits = max(8 * 1024, int(-self.capacity * HASHES
                                      / math.log(1 - error ** (1 / HASHES))))
        self._set = bytearray((self.bits + 7) // 8)
        self.count = 0

    def add(self, key: str) -> None:
        # Python's own string hash: cached on the string and about 20x cheaper than a
        # digest; it is salted per process, which is fine for a filter that lives in
        # memory only (rebuilt from the journal by each process that needs one).
        h = hash(key)
        h1, h2 = h & _LOW, ((h >> 32) & _LOW) | 1
        bits, s = self.bits, self._set
        pos = h1 % bits
        s[pos >> 3] |= 1 << (pos & 7)
        pos = (h1 + h2) % bits
        s[pos >> 3] |= 1 << (pos & 7)
        pos = (h1 + 2 * h2) % bits
        s[pos >> 3] |= 1 << (pos & 7)
        self.count += 1

    def update(self, keys: Iterable[str]) -> None:
        for k in keys:
            self.add(k)

    def __contains__(self, key: str) -> bool:
        # Probe by probe: a new id usually misses on the first one.
        h = hash(key)
        h1, h2 = h & _LOW, ((h >> 32) & _LOW) | 1
        bits, s = self.bits, self._set
        pos = h1 % bits
        if not s[pos >> 3] & (1 << (pos & 7)):
            return False
        pos = (h1 + h2) % bits
        if not s[pos >> 3] & (1 << (pos & 7)):
            return False
        pos = (h1 + 2 * h2) % bits
        return bool(s[pos >> 3] & (1 << (pos & 7)))

    @property
    def full(self) -> bool:
        """Past its capacity: false positives grow; rebuild a larger one."""
        return self.count > self.capacity

    @property
    def size(self) -> int:
        """Bytes held."""
        return len(self._set)
