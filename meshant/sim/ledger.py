"""What the simulator saw happen, kept to check the colony's promises against: what was
submitted, what each handler produced, what each submitter was told, who led when."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Run:
    """One handler run: of ``task``'s attempt ``attempt``, on ``forager``, assigned by
    queen life ``life`` (``name@incarnation``)."""

    uid: int
    task: str
    attempt: int
    forager: str
    ref: str
    life: str
    partials: int = 0  # partial results its handler sent (values {"run": uid, "i": 0, 1...})
    started: float = 0.0
    stopped: float | None = None  # when its handler was told to stop
    ended: float | None = None  # when its handler ended (or its process died)


@dataclass(slots=True)
class Submission:
    task: str
    client: str
    capability: str
    payload: Any
    priority: int = 50
    key: str | None = None
    cancelled: bool = False
    max_attempts: int = 3
    retry_on: tuple[str, ...] = ()
    due: float | None = None  # delayed (at=/after=): not to start before, virtual time


@dataclass(slots=True)
class Kept:
    """A directed message sent to a name that was not connected."""

    id: str
    to: str
    frm: str
    receipt: bool
    deliveries: int = 0
    receipts: list[str] = field(default_factory=list)


# The promises that rest on the journal keeping every commit: a power cut under
# durability "process" may take back the last commits, and these with them. Everything
# else holds under any fault.
DURABLE = frozenset({"updates-kept", "attach-order", "attach-gapless", "live-order",
                     "inbox-once", "same-records", "wake-once", "rate-takeover"})


class Violation(Exception):
    """A promise broken: ``invariant`` names it."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class Ledger:
    """Everything the invariants need, filled in by the simulated processes."""

    def __init__(self) -> None:
        self.submissions: dict[str, Submission] = {}
        self.outcomes: dict[str, list[dict[str, Any]]] = {}
        self.runs: dict[int, Run] = {}
        self.graphs: dict[str, str] = {}  # graph id -> its client
        self.graph_outcomes: dict[str, list[dict[str, Any]]] = {}
        # graph id -> the nodes whose end its client heard (a node task's final result,
        # or graph.node for a node that ended without running)
        self.nodes_heard: dict[str, set[str]] = {}
        self.kept: dict[str, Kept] = {}
        self.terms: dict[int, str] = {}  # leadership term -> the queen granted it
        self.restored: dict[str, set[tuple[str, int]]] = {}  # queen life -> adoptable
        self.answers: int = 0
        self.writes = 0
        # Commits a power cut took back (durability "process"): the promises that rest on
        # the journal keeping everything hold for the runs without one.
        self.lossy = 0
        # How early, in virtual time, a queen may start a delayed task and still keep to
        # its own wall clock: the processes' wall clocks disagree (skew), their clocks
        # drift.
        self.delay_slack = 0.0
        # How far two processes' wall clocks may disagree: a sleep's end is stamped on one
        # queen's clock and, after a failover, kept on another's.
        self.skew_slack = 0.0
        # What went through each rate limit's bucket, on every queen in turn: (limit,
        # key) -> [(virtual time, cost, queen life)] (invariant rate-takeover).
        self.rate_log: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
        self.drift = 0.0  # how fast a process's clock may run: 1 + this, at most
        # Told of each outcome as it reaches its submitter (the colony checks what
        # follows from it: a cancel reaching the run).
        self.on_outcome: Callable[[str, dict[str, Any]], None] | None = None
        # Durable agents: what each (task, step position) produced each time it ran;
        # what replays of it were given; the children calls there found; the wakes a
        # leading queen committed for each wait; the tasks a run replayed records of;
        # and the positions of a task's records in the journal (the simulator's disk).
        self.step_runs: dict[tuple[str, int], list[Any]] = {}
        self.step_replays: dict[tuple[str, int], Any] = {}
        self.children: dict[tuple[str, int], set[str]] = {}
        self.wakes: dict[tuple[str, Any], int] = {}
        # When each sleep (task, position) may end at the earliest, in virtual time (the
        # handler asked for it then), and how far a queen's clock may drift meanwhile.
        self.sleeps: dict[tuple[str, int], float] = {}
        self.replaying: set[str] = set()
        self.journaled_steps: Callable[[str], set[int]] = lambda task: set()
        # What the journal held of a task's records as each attempt was assigned: the
        # steps that attempt's run must not make (a run of an older assignment, its
        # forager cut off past its lease, may: at least once).
        self.assigned_with: dict[tuple[str, int], set[int]] = {}

    def fail(self, invariant: str, detail: str) -> None:
        if self.lossy and invariant in DURABLE:
            return  # (a power cut took back commits: what it promised is gone with them)
        raise Violation(invariant, detail)

    def node_heard(self, graph: str, node: str) -> None:
        self.nodes_heard.setdefault(graph, set()).add(node)

    def graph_ended(self, body: dict[str, Any]) -> None:
        """A graph's end reached its client: every node's end reached it first (what a
        client's graph handle gathers its result from)."""
        heard = self.nodes_heard.get(body["graph"], set())
        nodes = body.get("nodes")
        if isinstance(nodes, int) and len(heard) < nodes:
            self.fail("graph-nodes-heard", f"graph {body['graph']} ended {body.get('state')} "
                      f"with {nodes} nodes; its client heard the end of {len(heard)}: "
                      f"{sorted(heard)}")

    def kept_delivered(self, msg: Any, to: str) -> None:
        """A directed message reached ``to``: at most once."""
        k = self.kept.get(msg.id)
        if k is None:
            return
        k.deliveries += 1
        if k.deliveries > 1:
            self.fail("inbox-once", f"message {msg.id} for {k.to} was delivered "
                      f"{k.deliveries} times")

    def outcome(self, task: str, body: dict[str, Any]) -> None:
        got = self.outcomes.setdefault(task, [])
        got.append(body)
        if self.on_outcome is not None:
            self.on_outcome(task, body)
        if len(got) > 1:
            self.fail("one-outcome", f"task {task} was given {len(got)} final outcomes: "
                      f"{[b.get('state', b.get('code')) for b in got]}")
        self._handler_failure(task, body)
        self._diverged(task, body)

    # -- durable agents -------------------------------------------------------------------

    def step_ran(self, task: str, pos: int, journaled: set[int], value: Any) -> None:
        """A run made the step at ``pos`` (a real call): never one the journal held when
        the run was assigned (it had the record to replay)."""
        if pos in journaled:
            self.fail("step-once", f"task {task}'s step {pos} ran again, though its record "
                      "was in the journal when this run was assigned")
        self.step_runs.setdefault((task, pos), []).append(value)

    def step_replayed(self, task: str, pos: int, value: Any) -> None:
        """A run was given the record at ``pos``: every run the same value, one that a
        run of the step produced."""
        key = (task, pos)
        seen = self.step_replays.setdefault(key, value)
        if seen != value:
            self.fail("same-records", f"task {task}'s step {pos} was replayed as {value!r}, "
                      f"and as {seen!r} before")
        made = self.step_runs.get(key)
        if made is not None and value not in made:
            self.fail("same-records", f"task {task}'s step {pos} was replayed as {value!r}, "
                      f"which no run of it produced ({made!r})")

    def child(self, task: str, pos: int, child: str) -> None:
        """A call at ``pos`` of ``task`` found sub-task ``child``: one per position."""
        got = self.children.setdefault((task, pos), set())
        got.add(child)
        if len(got) > 1:
            self.fail("one-child", f"task {task}'s call at step {pos} found {len(got)} "
                      f"sub-tasks: {sorted(got)}")

    def woke_at(self, task: str, wait: dict[str, Any], now: float, drift: float,
                life: str) -> None:
        """A queen wakes ``task`` from ``wait`` at virtual time ``now``: never before the
        sleep its handler asked for is over (give or take the queen's clock drift, and
        what the stamping and the waking queens' clocks disagree by)."""
        pos = wait.get("position")
        ends = self.sleeps.get((task, pos)) if isinstance(pos, int) else None
        if "until" in wait and ends is not None and now < ends - drift - self.skew_slack:
            self.fail("wake-on-time", f"{life} woke task {task} at {now:.3f}, before its "
                      f"sleep at step {pos} was over ({ends:.3f})")

    def woke(self, task: str, wait: dict[str, Any]) -> None:
        """A leading queen committed a wake of ``task`` from ``wait``: once per wait."""
        key = (task, wait.get("position"))
        n = self.wakes[key] = self.wakes.get(key, 0) + 1
        if n > 1:
            self.fail("wake-once", f"task {task} was woken {n} times from its wait at step "
                      f"{key[1]} ({wait})")

    def _diverged(self, task: str, body: dict[str, Any]) -> None:
        """A durable handler that changed (``diverge``) fails as not deterministic once a
        run of it replays records; one that did not never does."""
        sub = self.submissions.get(task)
        payload = sub.payload if sub is not None and isinstance(sub.payload, dict) else {}
        e = body.get("error")
        err: dict[str, Any] = e if isinstance(e, dict) else {}
        nondet = body.get("state") == "failed" and err.get("code") == "nondeterministic"
        if nondet and not payload.get("diverge"):
            self.fail("divergence", f"task {task} failed as not deterministic, though its "
                      f"handler makes the same steps each run: {err.get('message')}")
        if (payload.get("diverge") and task in self.replaying
                and body.get("state") == "completed"):
            self.fail("divergence", f"task {task}'s handler changed its steps, a run of it "
                      "replayed records, and it completed")

    def _handler_failure(self, task: str, body: dict[str, Any]) -> None:
        """A handler's exception fails its task at once unless the handler or the
        submission opted in for retrying it; then the task fails only once its attempts
        are used up."""
        sub = self.submissions.get(task)
        err = body.get("error")
        if (sub is None or sub.key is not None or body.get("state") != "failed"
                or not isinstance(err, dict) or err.get("code") != "handler-error"):
            return
        payload = sub.payload if isinstance(sub.payload, dict) else {}
        opted = bool(payload.get("retry")) or "*" in sub.retry_on or "SimError" in sub.retry_on
        failures = [r for r in err.get("reasons") or [] if "SimError" in r]
        if not opted and len(failures) > 1:
            self.fail("fail-fast", f"task {task}'s handler failed {len(failures)} times "
                      f"though nobody asked for a retry: {failures}")
        if opted and int(err.get("attempts", 0)) < sub.max_attempts:
            self.fail("retry-opt-in", f"task {task} failed after attempt "
                      f"{err.get('attempts')} of {sub.max_attempts} though its failure "
                      "was one to retry")


__all__ = ["Kept", "Ledger", "Run", "Submission", "Violation"]
