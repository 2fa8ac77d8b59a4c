"""The whole colony in a deterministic simulator: the real queen core (a leader and its
standbys), the real forager and client sessions and the real journal code, over a
simulated network and a virtual clock, through seeded fault schedules, with every
promise checked as an invariant at every step and at the end. ``python -m meshant.sim
--seeds N`` runs N seeds; ``--seed S`` replays one. docs/architecture.md says where it
plugs in, what it checks and how to run it."""

from meshant.sim.ledger import Violation
from meshant.sim.run import Colony, Result, relevant, run_seed, shrink

__all__ = ["Colony", "Result", "Violation", "relevant", "run_seed", "shrink"]
