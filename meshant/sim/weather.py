"""The weather of a simulated run: what can happen (a :class:`Profile`) and what this
seed drew of it (its :class:`Weather`).

Every seed draws its own weather from its profile, as TigerBeetle's VOPR and swarm
testing do: which faults strike and how often (some kinds not at all), how slow and
lossy the network is, how full a pipe may get, how far each process's clock drifts and
its wall clock is off, how often and how slowly the journal answers a read, whether a
power cut loses what was not yet synced, how many messages the queen reads a turn, and
how big the workload is. A bug that needs a rare mix meets it in some seed; one that
needs a common mix meets it in most.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

FAULT_KINDS: tuple[tuple[str, float], ...] = (
    ("kill-queen", 3), ("crash-mid-turn", 3), ("crash-at-commit", 2), ("power-loss", 1),
    ("pause-queen", 2), ("kill-forager", 3), ("pause-forager", 2), ("client-reconnect", 2),
    ("partition", 2), ("late-duplicate", 3), ("garbage", 1), ("oversize", 1))


@dataclass(frozen=True)
class Profile:
    """What a run may be made of, in probabilities: the default is every kind of fault
    and workload; a test may lean on some (the mutants' tests do, to meet their bug
    sooner). ``swarm``: each seed draws its own fault weights from these (some kinds
    left out), its network, clocks, reads and sizes; off, every seed has the profile's
    plain weather (the weights as given, a quiet network)."""

    weights: tuple[tuple[str, float], ...] = FAULT_KINDS
    faults: tuple[int, int] = (0, 8)
    failover: float = 0.3
    graphs: float = 0.5
    asks: float = 0.5
    mailbox: float = 0.4
    attaches: float = 0.5  # a run where another client follows tasks
    swarm: bool = True
    big: float = 0.05  # a run of hundreds of tasks
    durable: float = 0.4  # a run with durable agents (steps, sleeps, sub-tasks, asks)
    delays: float = 0.3  # a run with delayed tasks (at=/after=)
    limits: float = 0.2  # a run whose queens hold tasks to concurrency limits
    schedules: float = 0.3  # a run with schedules (cron ticks, every second or two)
    # A long run: this many hours of virtual time, faults all along, schedules ticking
    # every minute throughout (0: a run of seconds).
    hours: float = 0.0

    def only(self, *kinds: str, faults: tuple[int, int] = (2, 8), **kw: Any) -> Profile:
        """This profile with only these faults, at least ``faults[0]`` of them."""
        return dataclasses.replace(self, weights=tuple((k, 1.0) for k in kinds),
                                   faults=faults, **kw)


DEFAULT = Profile()

# Named profiles for ``python -m meshant.sim --profile``: ``all`` runs each seed in the
# one its number picks, so every thousand seeds cover them all.
PROFILES: dict[str, Profile] = {
    "default": DEFAULT,
    "crashes": DEFAULT.only("kill-queen", "crash-mid-turn", "crash-at-commit", "power-loss",
                            "client-reconnect", faults=(1, 6)),
    "failover": DEFAULT.only("pause-queen", "kill-queen", "partition", faults=(1, 6),
                             failover=1.0),
    "foragers": DEFAULT.only("kill-forager", "pause-forager", "partition", "late-duplicate",
                             faults=(1, 8)),
    "conversations": DEFAULT.only("kill-queen", "crash-mid-turn", "client-reconnect",
                                  "pause-forager", faults=(1, 5), asks=1.0, mailbox=1.0,
                                  attaches=1.0),
    "graphs": DEFAULT.only("kill-queen", "crash-at-commit", "kill-forager",
                           "late-duplicate", faults=(1, 5), graphs=1.0),
    "big": dataclasses.replace(DEFAULT, big=1.0, faults=(0, 4)),
    "durable": DEFAULT.only("kill-forager", "pause-forager", "kill-queen", "crash-mid-turn",
                            "crash-at-commit", "pause-queen", "partition", faults=(1, 6),
                            durable=1.0, asks=1.0),
    "calm": dataclasses.replace(DEFAULT, swarm=False),
    # An hour of schedules ticking each minute through queen kills, pauses and failovers.
    "hour": DEFAULT.only("kill-queen", "crash-mid-turn", "crash-at-commit", "pause-queen",
                         "kill-forager", "partition", faults=(6, 16), schedules=1.0,
                         hours=1.0, failover=0.5, graphs=0.0, durable=0.0),
}


def profile_of(name: str, seed: int) -> Profile:
    """The profile ``name`` (``all``: the one seed ``seed`` picks)."""
    if name == "all":  # (the long runs aside: --profile hour runs them)
        names = sorted(n for n, p in PROFILES.items() if not p.hours)
        return PROFILES[names[seed % len(names)]]
    return PROFILES[name]


@dataclass(frozen=True)
class Weather:
    """What one seed drew: everything about the run but its workload and its faults'
    targets and times."""

    weights: tuple[tuple[str, float], ...]
    delay: tuple[float, float]  # a message's time on the wire, seconds
    slow: float  # how often a message takes a slow path (50-250 ms)
    up_hwm: int  # messages a peer's pipe to a queen holds before send says "not now"
    pub_hwm: int  # messages a subscriber's PUB queue holds before PUB drops
    drift: float  # each process's clock runs at 1 ± up to this
    skew: float  # each process's wall clock is off by up to this many seconds
    read_fail: float  # how often a journal read fails (the queen says "try again")
    read_delay: tuple[float, float]  # a journal read's time
    durability: str  # "process": a power cut loses what was not synced; "power": nothing
    sync_every: int  # under "process", the journal is synced every this many commits
    turn: int  # messages the queen reads a turn before it ends it
    tasks: tuple[int, int]  # how many tasks the workload submits

    @classmethod
    def plain(cls, profile: Profile) -> Weather:
        """The weather without swarm: the profile's weights, a quick network."""
        return cls(weights=profile.weights, delay=(0.0002, 0.002), slow=0.02,
                   up_hwm=1_000_000, pub_hwm=1000, drift=0.0, skew=0.0, read_fail=0.0,
                   read_delay=(0.0001, 0.003), durability="power", sync_every=1, turn=16,
                   tasks=(5, 30))

    @classmethod
    def draw(cls, rng: random.Random, profile: Profile) -> Weather:
        """This seed's weather, from ``profile``."""
        if not profile.swarm:
            w = cls.plain(profile)
            big = rng.random() < profile.big
            return dataclasses.replace(w, tasks=(100, 300) if big else w.tasks)
        # Swarm: each kind of fault is in or out, and as likely as a roll says.
        weights = tuple((k, w * rng.choice((0.0, 0.5, 1.0, 1.0, 2.0, 4.0)))
                        for k, w in profile.weights)
        if not any(w for _, w in weights):
            kind, weight = profile.weights[rng.randrange(len(profile.weights))]
            weights = tuple((k, weight if k == kind else 0.0) for k, _ in profile.weights)
        lo = rng.choice((0.00005, 0.0002, 0.001))
        hi = lo * rng.choice((2, 10, 50))
        big = rng.random() < profile.big
        return cls(
            weights=weights,
            delay=(lo, hi),
            slow=rng.choice((0.0, 0.02, 0.1)),
            up_hwm=rng.choice((4, 32, 1000, 1_000_000)),
            pub_hwm=rng.choice((8, 100, 1000)),
            drift=rng.choice((0.0, 0.001, 0.01)),
            skew=rng.choice((0.0, 0.05, 2.0)),
            read_fail=rng.choice((0.0, 0.0, 0.05, 0.3)),
            read_delay=rng.choice(((0.0001, 0.003), (0.001, 0.05), (0.01, 0.5))),
            durability=rng.choice(("process", "power")),
            sync_every=rng.choice((1, 4, 32)),
            turn=rng.choice((1, 4, 16, 16)),
            tasks=(100, 300) if big else rng.choice(((5, 30), (5, 30), (20, 60))),
        )

    def describe(self) -> str:
        """One line for a trace: what this seed drew."""
        kinds = ", ".join(f"{k} {w:g}" for k, w in self.weights if w)
        return (f"weather: faults [{kinds}]; wire {self.delay[0] * 1000:g}-"
                f"{self.delay[1] * 1000:g} ms, slow {self.slow:g}; pipes {self.up_hwm}, "
                f"pub {self.pub_hwm}; clocks ±{self.drift:g} drift, ±{self.skew:g} s skew; "
                f"reads fail {self.read_fail:g}, {self.read_delay[1] * 1000:g} ms; "
                f"durability {self.durability} (sync every {self.sync_every}); turn "
                f"{self.turn}; tasks {self.tasks[0]}-{self.tasks[1]}")


__all__ = ["DEFAULT", "FAULT_KINDS", "PROFILES", "Profile", "Weather", "profile_of"]
