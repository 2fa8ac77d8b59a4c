"""What a queen costs per thousand foragers, measured in the simulator: the real queen
core driven by N real forager links over the simulated network, in virtual time.

The foragers are idle (they beat, as idle foragers do) and a client keeps a trickle of
tasks going; what is measured is the CPU the queen's process spends — its core and its
driver, everything that runs in its turns — per virtual second, and the messages it
handles. Virtual time makes the figure independent of the machine's load: a second of
colony time is a second, however long the host took to simulate it.
"""

from __future__ import annotations

import functools
import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

from meshant import protocol as p
from meshant.sim.ledger import Ledger
from meshant.sim.peers import SimClient, SimForager
from meshant.sim.queen import SimQueen
from meshant.sim.run import config
from meshant.sim.world import Clock, Net


@dataclass
class Cost:
    foragers: int
    seconds: float  # virtual
    cpu: float  # seconds of the queen's CPU
    messages: int  # messages the queen handled
    tasks: int

    @property
    def cpu_share(self) -> float:
        """The share of one core the queen needs (CPU seconds per virtual second)."""
        return self.cpu / self.seconds

    def summary(self) -> str:
        per_k = self.cpu_share * 1000 / self.foragers
        return (f"{self.foragers} foragers, {self.seconds:g} virtual s: the queen used "
                f"{self.cpu_share:.1%} of a core ({per_k:.2%} per 1,000 foragers), "
                f"{self.messages / self.seconds:,.0f} messages/s, {self.tasks} tasks")


def measure(foragers: int = 1000, seconds: float = 20.0, rate: float = 20.0,
            seed: int = 0) -> Cost:
    """Run ``foragers`` idle foragers and a client submitting ``rate`` tasks a second
    against one queen for ``seconds`` of virtual time (after they joined)."""
    p.message.new_id.reset(f"cost{seed}-")
    rng = random.Random(seed)
    clock = Clock()
    ledger = Ledger()
    net = Net(clock, random.Random(rng.random()), lambda text: None)
    # The defaults a real colony runs with (1 s heartbeats, 5 misses), not the
    # simulator's short ones: what is measured is a real queen's cost.
    q = SimQueen("q1", config(hb_interval=1.0, hb_misses=5, assign_timeout=300.0,
                              max_peers=foragers + 10),
                 clock=clock, net=net, ledger=ledger, rng=random.Random(rng.random()),
                 disk=None, log=lambda text: None)
    net.queens["q1"] = q
    spent = [0.0]
    for name in ("_read_turn", "_tick", "_beat", "_read"):
        _timed(q, name, spent)
    q.start()
    uids = itertools.count(1)
    kw: dict[str, Any] = dict(clock=clock, net=net, ledger=ledger, queens=["q1"],
                              log=lambda text: None)
    fs = [SimForager(f"f{i}", ["echo"], 4, {}, uids.__next__,
                     rng=random.Random(rng.random()), **kw) for i in range(foragers)]
    for f in fs:
        clock.at(rng.uniform(0.0, 2.0), f.start)
    client = SimClient("c0", rng=random.Random(rng.random()), **kw)
    clock.at(0.0, client.start)
    warm = 5.0
    while clock.step(warm):
        pass
    spent[0] = 0.0
    handled = q.core.counters["messages"] if q.core is not None else 0
    end = warm + seconds
    n = int(seconds * rate)
    for i in range(n):
        clock.at(warm + i / rate, functools.partial(_submit, client, i))
    while clock.step(end):
        pass
    messages = (q.core.counters["messages"] if q.core is not None else 0) - handled
    return Cost(foragers, seconds, spent[0], messages, n)


def _submit(client: SimClient, i: int) -> None:
    client.submit("echo", {"n": i})


def _timed(q: SimQueen, name: str, spent: list[float]) -> None:
    real = getattr(q, name)

    def timed(*args: Any) -> Any:
        t0 = time.process_time()
        try:
            return real(*args)
        finally:
            spent[0] += time.process_time() - t0
    setattr(q, name, timed)


__all__ = ["Cost", "measure"]
