"""Who may join the colony and stay: hello (negotiation, authorisation, name takeover,
adoption of the tasks a forager still runs), heartbeats, the registration of IACP 1.1
foragers by their first heartbeat, liveness, and revoked keys.

A service of the queen core (:mod:`meshant.core.queen.router`): it owns the registry's changes;
it tells the scheduler, the graphs and the inboxes about peers coming and going.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from meshant import protocol as p
from meshant.core.graphs.book import GraphBook
from meshant.core.nodes.registry import ACTIVE, Node, Registry
from meshant.core.queen.state import HELLO_RATE, LEGACY_HB_INTERVAL, Arrival, QueenState, Request
from meshant.core.tasks.scheduler import Scheduler
from meshant.protocol.codec import JSON
from meshant.protocol.codes import Code


class AdmissionService:
    """Peers joining, beating and leaving."""

    def __init__(self, state: QueenState, registry: Registry, scheduler: Scheduler,
                 graphs: GraphBook, greet: Callable[[Node, float], None]) -> None:
        self.state = state
        self.registry = registry
        self.scheduler = scheduler
        self.graphs = graphs
        self.greet = greet  # a name registered: hand it what its inbox kept

    # -- hello ----------------------------------------------------------------------------

    def hello(self, req: Arrival) -> None:
        st, msg, identity, now = self.state, req.msg, req.identity, req.now
        if st.rates.wait(b"hello:" + identity, now, HELLO_RATE):
            st.counters["rate_limited"] += 1
            st.refuse(req, Code.RATE_LIMITED,
                      f"more than {HELLO_RATE:g} hellos per second from this connection",
                      retry_after=1.0)
            return
        body = msg.b
        fallback = f"{body.get('role', 'peer')}-{identity.hex()[:8]}"
        decision = p.negotiate(body, st.terms, fallback)
        if isinstance(decision, p.Refusal):
            st.refuse(req, decision.code, decision.reason)
            return
        if st.authorized is not None:
            why = st.authorized.check(req.key, decision.name, decision.role)
            if why is not None:
                st.counters["refused_keys"] += 1
                st.refuse(req, Code.NOT_ALLOWED, why)
                return
        registry = self.registry
        session = str(body.get("session", ""))
        if registry.name_taken(decision.name, identity, now, session):
            st.counters["protocol_errors"] += 1
            held = registry.by_name[decision.name]
            # When the holder stops beating it is declared offline and the name is free:
            # a restarted peer may wait that long instead of giving up.
            left = max(0.0, held.last_seen + (held.timeout or registry.timeout) - now)
            st.refuse(req, Code.NAME_TAKEN, f"the name {decision.name!r} is held by a live "
                      "peer; choose another", retry_after=round(left + 0.05, 3))
            return
        if req.node is None and registry.full():
            st.refuse(req, Code.TOO_MANY_PEERS, "the queen has no room for more peers")
            return
        new = Node(name=decision.name, identity=identity, role=decision.role, codec=req.codec,
                   slots=decision.slots, tools=frozenset(decision.tools),
                   labels=decision.labels, host=str(body.get("host", "")),
                   pid=int(body.get("pid", 0)), version=decision.version,
                   features=frozenset(decision.features), session=session, key=req.key,
                   describe=decision.describe or None)
        # The same peer again: on this connection, or reconnected on a fresh one.
        previous = req.node
        if previous is None:
            same = registry.by_name.get(decision.name)
            if same is not None and session and same.session == session:
                previous = same
                registry.remove(same, now)
        registry.add(new, now)
        sched = self.scheduler
        stale: list[str] = []
        marks: dict[str, int] = {}
        if decision.role == "forager":
            running = list(body.get("running", []))
            if previous is not None and previous.role == "forager":
                sched.forager_rejoined(previous, new, running, now)
            if sched.held:
                sched.adopt(new, running, now)
            sched.forager_joined(new)
            mine = sched.running_on(new)
            stale = [r for r in running if isinstance(r, str) and r not in mine]
            # Of each run it still has, the last progress or partial result taken: it
            # sends the later ones again (they may have died with a connection or a queen).
            marks = {r: att.n for r, att in mine.items() if r in running}
        elif previous is not None and previous.identity != identity:
            sched.client_moved(previous.identity, identity)
            self.graphs.peer_moved(previous.identity, identity)
        welcome = decision.body(st.terms)
        if marks and new.codec != JSON:  # (an IACP 1.1 forager numbers nothing)
            welcome["updates"] = marks
        st.send(new, p.Message("welcome", welcome, ref=msg.id))
        # Assignments it still runs that this queen no longer holds (it restarted without
        # them, or gave them to another forager): stop them there, and take no answer
        # for them as the answer to a new assignment of the same id.
        for ref in stale:
            st.send(new, p.Message("task.cancel", {"task": ref.rpartition(".")[0]}, ref=ref))
        if stale:
            new.stale = set(stale)
        self.greet(new, now)

    def rehello(self, req: Request) -> None:
        """A registered peer says hello again (its session restarted)."""
        self.hello(Arrival(req.identity, req.node, req.msg, req.codec, req.key, req.now))

    # -- heartbeats -----------------------------------------------------------------------

    def hb(self, req: Request) -> None:
        node, body, now = req.node, req.msg.b, req.now
        if body.get("state") == "draining" and node.state == ACTIVE:
            self.registry.drain(node)
        if body.get("state") == "leaving":
            self.registry.remove(node, now)
            if node.role == "forager":
                self.scheduler.forager_lost(node, now, "forager left")
            return
        if "load" in body and isinstance(body["load"], int | float):
            node.load = float(body["load"])
        running = body.get("running")
        if running:
            self.scheduler.renew(node, running, now)
        if node.stale:
            listed = set(running) if isinstance(running, list) else set()
            node.stale &= {r for r in listed if isinstance(r, str)}
            if not node.stale:
                node.stale = None
                self.scheduler.dirty = True  # (what waited for it may go to it now)

    def legacy(self, req: Arrival) -> None:
        """An IACP 1.1 forager registers with its first heartbeat."""
        st, msg, now = self.state, req.msg, req.now
        body = msg.b
        name = msg.frm
        if not p.valid_name(name):
            st.refuse(req, Code.BAD_NAME, f"name {name!r} is not allowed")
            return
        if self.registry.name_taken(name, req.identity, now):
            st.refuse(req, Code.NAME_TAKEN, f"the name {name!r} is held by a live peer")
            return
        if st.authorized is not None:
            why = st.authorized.check(req.key, name, "forager")
            if why is not None:
                st.counters["refused_keys"] += 1
                st.refuse(req, Code.NOT_ALLOWED, why)
                return
        slots = body.get("slots", 1)
        tools = body.get("tools", [])
        if not isinstance(slots, int) or slots < 1 or not all(isinstance(t, str) for t in tools):
            st.refuse(req, Code.BAD_HELLO, "hb body needs slots >= 1 and a list of tool names")
            return
        # IACP 1.1 had partial results and no hello to negotiate them in (spec §8).
        new = Node(name=name, identity=req.identity, role="forager", codec=JSON, slots=slots,
                   key=req.key, features=frozenset({"progress"}),
                   tools=frozenset(tools), labels=dict(body.get("labels") or {}),
                   version=msg.v)
        # 1.1 peers beat every 10 s; give them the same number of misses at that pace.
        new.timeout = max(self.registry.timeout, LEGACY_HB_INTERVAL * self.registry.hb_misses)
        self.registry.add(new, now)
        self.scheduler.forager_joined(new)
        self.greet(new, now)  # a 1.1 agent's durable inbox too

    # -- leaving --------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Peers silent past their liveness timeout are offline; foragers' tasks move on."""
        for node in self.registry.expired(now):
            if node.role == "forager":
                self.scheduler.forager_lost(node, now, "forager went silent")

    def revoke(self, grants: Iterable[bytes], now: float) -> int:
        """Authorized keys changed: drop the live peers whose key is no longer granted."""
        allowed = set(grants)
        dropped = 0
        for node in list(self.registry.by_id.values()):
            if node.key is not None and node.key not in allowed:
                self.registry.remove(node, now)
                if node.role == "forager":
                    self.scheduler.forager_lost(node, now, "key revoked")
                dropped += 1
        return dropped

    def halt(self, node: Node, now: float) -> None:
        """An operator halted the forager: it is gone, its tasks move on."""
        self.registry.remove(node, now)
        self.scheduler.forager_lost(node, now, "forager halted")


__all__ = ["AdmissionService"]
