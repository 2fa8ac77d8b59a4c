"""The queen kit's checks of conversations (spec §6a: questions, attach, inboxes) and task
graphs (§7d). Mixed into :class:`meshant.conformance.queen_kit.QueenKit`, which provides
the peers; the task helpers are :class:`~meshant.conformance.queen_tasks_kit.TaskChecks`'."""

from __future__ import annotations

import functools
import time
from typing import Any

from meshant import protocol as p
from meshant.conformance.report import require
from meshant.conformance.wire import Peer


def _state_of(ref: str, m: p.Message) -> bool:
    return m.kind == "task.state" and m.ref == ref


class ConverseChecks:
    """Checks of §6a and §7d; ``self`` is a QueenKit."""

    timeout: float

    def cap(self) -> str:
        raise NotImplementedError  # QueenKit's

    def name(self, role: str) -> str:
        raise NotImplementedError  # QueenKit's

    def forager(self, tools: list[str], **hello: Any) -> Peer:
        raise NotImplementedError  # QueenKit's

    def client(self, **hello: Any) -> Peer:
        raise NotImplementedError  # QueenKit's

    def join(self, role: str, **hello: Any) -> Peer:
        raise NotImplementedError  # QueenKit's

    def submit(self, c: Peer, cap: str, **body: Any) -> p.Message:
        raise NotImplementedError  # TaskChecks'

    def assigned(self, f: Peer, task: str | None = None) -> p.Message:
        raise NotImplementedError  # TaskChecks'

    def final(self, c: Peer, task: str, timeout: float | None = None) -> p.Message:
        raise NotImplementedError  # TaskChecks'

    def _asking(self) -> tuple[Peer, Peer, p.Message, p.Message, p.Message]:
        """A task whose forager asked a question: forager, client, submit, assign, the
        question as the client received it."""
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap, payload="plan")
        a = self.assigned(f, sub.id)
        f.send("task.accept", ref=a.id)
        f.send("task.ask", {"request": f"{a.id}.q1", "prompt": "which branch?",
                            "data": {"choices": ["a", "b"]}}, ref=a.id)
        q = c.expect(lambda m: m.kind == "task.ask" and m.b.get("task") == sub.id,
                     self.timeout, "the relayed task.ask")
        return f, c, sub, a, q

    # -- §6b ------------------------------------------------------------------------------

    def _steps(self) -> str:
        cap = self.cap()
        f = self.forager([cap], slots=2)  # (a parent and its child at once)
        c = self.client()
        sub = self.submit(c, cap, payload="agent")
        a = self.assigned(f, sub.id)
        model = {"position": 0, "kind": "step", "name": "model", "occurrence": 1,
                 "value": {"text": "hi"}}
        f.send("task.step", {**model, "n": 1}, ref=a.id)
        gap = f.send("task.step", {**model, "position": 5, "n": 2}, ref=a.id)
        code = f.error(gap, self.timeout)
        require(code == "bad-value", f"a record past the next position: {code}")
        f.send("task.step", {"position": 1, "kind": "sleep", "name": "sleep",
                             "occurrence": 1, "seconds": 0.3, "n": 2}, ref=a.id)
        f.send("task.result", {"status": "suspended", "wait": {
            "until": time.time() + 0.3, "position": 1}}, ref=a.id)
        deadline = time.monotonic() + self.timeout
        while True:  # (the client's question may reach the queen before the result)
            st_id = c.send("task.status", {"task": sub.id}).id
            state = c.expect(functools.partial(_state_of, st_id), self.timeout)
            if state.b.get("state") != "accepted" or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        require(state.b.get("state") == "suspended" and "until" in (state.b.get("waiting")
                                                                    or {}),
                f"a suspended task's state: {state.b.get('state')} {state.b.get('waiting')}")
        again = self.assigned(f, sub.id)
        steps = again.b.get("steps") or []
        require(again.id != a.id and [r.get("kind") for r in steps] == ["step", "sleep"]
                and steps[0].get("value") == {"text": "hi"},
                f"the re-run's assignment carries {steps}")
        call = f.send("task.call", {"position": 2, "capability": cap, "payload": 3},
                      ref=again.id)
        called = f.expect(lambda m: m.kind == "task.called" and m.ref == call.id,
                          self.timeout, "task.called")
        child = f"{sub.id}/c2"
        require(called.b.get("child") == child and called.b.get("state") in (
            "queued", "assigned"), f"task.called {called.b}")
        ca = self.assigned(f, child)
        f.send("task.result", {"status": "ok", "result": 6}, ref=ca.id)
        # The same child for a call again at that position: ended (once its result is
        # taken, which this forager's next message follows on its connection).
        call2 = f.send("task.call", {"position": 2, "capability": cap, "payload": 3},
                       ref=again.id)
        done = f.expect(lambda m: m.kind == "task.called" and m.ref == call2.id,
                        self.timeout, "task.called for the ended child")
        require(done.b.get("child") == child and (done.b.get("final") or {}).get(
            "result") == 6, f"a call of an ended child: {done.b}")
        f.send("task.result", {"status": "ok", "result": "done"}, ref=again.id)
        final = self.final(c, sub.id)
        require(final.b.get("state") == "completed", f"final {final.b}")
        plain = self.forager([self.cap()], features=["progress"])
        no = plain.send("task.step", {**model, "n": 1}, ref=a.id)
        code = plain.error(no, self.timeout)
        require(code in ("unsupported", "not-yours", "unknown-task"),
                f"a task.step without steps negotiated: {code}")
        return ("records kept in order, a suspended sleep woke with its records, one child "
                "per position")

    # -- §6a ------------------------------------------------------------------------------

    def _questions(self) -> str:
        f, c, sub, a, q = self._asking()
        request = f"{a.id}.q1"
        require(q.b.get("request") == request and q.b.get("prompt") == "which branch?"
                and q.b.get("data") == {"choices": ["a", "b"]} and isinstance(q.b.get("seq"), int),
                f"relayed question {q.b}")
        require(q.ref == sub.id, f"a relayed task.ask's ref is {q.ref!r}, not the task id")
        st = c.send("task.status", {"task": sub.id})
        state = c.expect(lambda m: m.kind == "task.state" and m.ref == st.id, self.timeout)
        require(state.b.get("state") == "input-required", f"task state {state.b.get('state')}")
        wrong = c.send("task.answer", {"task": sub.id, "request": "no-such", "value": 1})
        code = c.error(wrong, self.timeout)
        require(code == "unknown-question", f"an answer to no question: {code}")
        ans = c.send("task.answer", {"task": sub.id, "value": "b"})  # the oldest question
        ok = c.expect(lambda m: m.ref == ans.id, self.timeout, "task.answered")
        require(ok.kind == "task.answered" and ok.b.get("task") == sub.id
                and ok.b.get("request") == request, f"answered with {ok.kind} {ok.b}")
        got = f.expect(lambda m: m.kind == "task.answer" and m.ref == a.id, self.timeout,
                       "the answer at the forager")
        require(got.b.get("task") == sub.id and got.b.get("request") == request
                and got.b.get("value") == "b" and got.b.get("by") == c.name,
                f"the forager got {got.b}")
        again = c.send("task.answer", {"task": sub.id, "request": request, "value": "a"})
        code = c.error(again, self.timeout)
        require(code == "already-answered", f"a second answer: {code}")
        f.send("task.result", {"status": "ok", "result": "planned"}, ref=a.id)
        final = self.final(c, sub.id)
        require(final.b.get("state") == "completed", f"final {final.b}")
        # A question reaches a submitter that negotiated progress only (§5.2).
        cap = self.cap()
        f2 = self.forager([cap])
        quiet = self.client(features=[])
        sub2 = self.submit(quiet, cap)
        a2 = self.assigned(f2, sub2.id)
        f2.send("task.ask", {"request": f"{a2.id}.q1", "prompt": "?"}, ref=a2.id)
        f2.send("task.result", {"status": "ok", "result": 1}, ref=a2.id)
        self.final(quiet, sub2.id)
        require(not any(m.kind == "task.ask" for m in quiet.inbox),
                "a task.ask reached a client that did not negotiate progress")
        return "asked, input-required, answered once (ref = the assign id), then completed"

    def _attach(self) -> str:
        f, c, sub, a, q = self._asking()
        f.send("task.progress", {"fraction": 0.5}, ref=a.id)
        f.send("task.result", {"partial": True, "value": "p"}, ref=a.id)
        f.send("task.result", {"status": "ok", "result": "done"}, ref=a.id)
        self.final(c, sub.id)
        w = self.client()
        att = w.send("task.attach", {"task": sub.id, "after": 0})
        ok = w.expect(lambda m: m.ref == att.id, self.timeout, "task.attached")
        require(ok.kind == "task.attached" and ok.b.get("task") == sub.id
                and ok.b.get("state") == "completed" and ok.b.get("after") == 0,
                f"attach answered {ok.kind} {ok.b}")
        ups: list[p.Message] = []
        while not ups or ups[-1].b.get("kind") != "task.result" or ups[-1].b["body"].get(
                "partial"):
            ups.append(w.expect(lambda m: m.kind == "task.update" and m not in ups,
                                self.timeout, "the next task.update"))
        kinds = [("partial" if u.b["body"].get("partial") else u.b["kind"]) for u in ups]
        require(kinds == ["task.ask", "task.progress", "partial", "task.result"],
                f"replayed {kinds}")
        seqs = [u.b["seq"] for u in ups]
        require(seqs == sorted(seqs) and seqs[0] == q.b["seq"] and seqs[-1] == ok.b.get("last"),
                f"update seqs {seqs}, last {ok.b.get('last')}")
        require(all(u.ref == sub.id for u in ups), "a task.update's ref is not the task id")
        require(ups[-1].b["body"].get("result") == "done", f"final {ups[-1].b['body']}")
        att2 = w.send("task.attach", {"task": sub.id, "after": seqs[-2]})
        w.expect(lambda m: m.ref == att2.id and m.kind == "task.attached", self.timeout)
        last = w.expect(lambda m: m.kind == "task.update" and m.b["seq"] > seqs[-2]
                        and m not in ups, self.timeout, "the update after the cursor")
        require(last.b["seq"] == seqs[-1], f"after {seqs[-2]} came {last.b['seq']}")
        code = w.error(w.send("task.attach", {"task": "conformance-no-such-task"}),
                       self.timeout)
        require(code == "unknown-task", f"attaching to an unknown task: {code}")
        return f"replayed {len(ups)} updates in seq order, then from a cursor"

    def _inbox(self) -> str:
        c = self.client()
        away = self.name("away")
        sent = c.send("msg", {"hello": away}, to=away, extra={"receipt": True, "ttl": 60})
        ls = c.send("inbox", {"op": "list", "name": away})
        reply = c.expect(lambda m: m.ref == ls.id, self.timeout, "inbox.reply")
        require(reply.kind == "inbox.reply" and reply.b.get("name") == away,
                f"inbox list answered {reply.kind} {reply.b}")
        (item,) = reply.b.get("items") or [None]
        require(isinstance(item, dict) and item.get("id") == sent.id
                and item.get("kind") == "msg" and item.get("from") == c.name
                and item.get("body") == {"hello": away} and item.get("receipt") is True
                and isinstance(item.get("expires"), int | float)
                and 0 < item["expires"] - item.get("sent", 0) <= 60, f"inbox item {item}")
        peer = self.join("client", name=away)
        got = peer.expect(lambda m: m.kind == "msg" and m.id == sent.id, self.timeout,
                          "the kept message")
        require(got.frm == c.name and got.b == {"hello": away}
                and (got.extra or {}).get("kept") is True, f"delivered {got.extra} {got.b}")
        rc = c.expect(lambda m: m.kind == "msg.receipt", self.timeout, "msg.receipt")
        require(rc.b.get("message") == sent.id and rc.b.get("to") == away
                and rc.b.get("status") == "delivered", f"receipt {rc.b}")
        # Delivered at once to a connected name: a receipt too, when asked for.
        direct = c.send("msg", {"now": 1}, to=away, extra={"receipt": True})
        peer.expect(lambda m: m.id == direct.id, self.timeout, "the direct message")
        rc2 = c.expect(lambda m: m.kind == "msg.receipt" and m.b.get("message") == direct.id,
                       self.timeout, "the direct message's receipt")
        require(rc2.b.get("status") == "delivered", f"receipt {rc2.b}")
        ls2 = c.send("inbox", {"op": "list", "name": away})
        empty = c.expect(lambda m: m.ref == ls2.id, self.timeout, "inbox.reply")
        require(empty.b.get("items") == [], f"after delivery the inbox holds {empty.b}")
        return "kept, listed, delivered once with kept: true, receipts for both"

    # -- §7d ------------------------------------------------------------------------------

    def _graph_peers(self) -> tuple[str, Peer, Peer, str]:
        """A capability, a forager serving it, a client, and an id for its graph."""
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        return cap, f, c, c.ids()

    def _graphs(self) -> str:
        cap, f, c, gid = self._graph_peers()
        nodes = [{"name": "a", "capability": cap, "payload": 2},
                 {"name": "b", "capability": cap, "payload": {"x": {"$result": "a"}}}]
        c.send("graph.submit", {"nodes": nodes}, id=gid)
        ok = c.expect(lambda m: m.ref == gid, self.timeout, "graph.submitted")
        require(ok.kind == "graph.submitted" and ok.b == {"graph": gid, "nodes": 2},
                f"graph.submit answered {ok.kind} {ok.b}")
        a = self.assigned(f, f"tg:{gid}/a")
        require(a.b.get("node") == f"tg:{gid}/a", f"a node's assign has node {a.b.get('node')}")
        st = c.send("graph.status", {"graph": gid})
        state = c.expect(lambda m: m.ref == st.id, self.timeout, "graph.state")
        require(state.kind == "graph.state" and state.b.get("state") == "running"
                and state.b.get("nodes") == 2 and state.b.get("client") == c.name
                and {n.get("node") for n in state.b.get("node_states") or []} == {"a", "b"},
                f"graph.status answered {state.kind} {state.b}")
        f.send("task.result", {"status": "ok", "result": 40}, ref=a.id)
        b = self.assigned(f, f"tg:{gid}/b")
        require(b.b.get("payload") == {"x": 40}, f"b's payload {b.b.get('payload')}")
        f.send("task.result", {"status": "ok", "result": 42}, ref=b.id)
        end = c.expect(lambda m: m.kind == "graph.result" and m.b.get("graph") == gid,
                       self.timeout, "graph.result")
        require(end.b.get("state") == "completed" and end.b.get("nodes") == 2
                and end.b.get("counts") == {"completed": 2} and end.b.get("client") == c.name
                and "failed" not in end.b, f"graph.result {end.b}")
        results = [m for m in c.inbox if m.kind == "task.result"
                   and str(m.b.get("task", "")).startswith(f"tg:{gid}/")]
        require(len(results) == 2, f"{len(results)} node results reached the submitter")
        # Sent again after it ended: answered by its graph.result, never run again.
        c.send("graph.submit", {"nodes": nodes}, id=gid)
        again = c.expect(lambda m: m.ref == gid and m is not ok, self.timeout,
                         "the answer to a re-sent graph")
        require(again.kind == "graph.result" and again.b.get("state") == "completed",
                f"a re-sent ended graph answered {again.kind} {again.b}")
        require(f.poll(lambda m: m.kind == "task.assign", 0.3) is None,
                "a re-sent graph ran again")
        bad = c.send("graph.submit", {"nodes": [
            {"name": "x", "capability": cap, "after": ["y"]},
            {"name": "y", "capability": cap, "after": ["x"]}]})
        code = c.error(bad, self.timeout)
        require(code == "bad-graph", f"a cycle: {code}")
        code = c.error(c.send("graph.status", {"graph": "conformance-no-such-graph"}),
                       self.timeout)
        require(code == "unknown-graph", f"an unknown graph's status: {code}")
        return "submitted, b ran on a's result, completed; a re-send and a cycle answered"

    def _graph_cancel(self) -> str:
        cap, f, c, gid = self._graph_peers()
        c.send("graph.submit", {"nodes": [
            {"name": "a", "capability": cap},
            {"name": "b", "capability": cap, "after": ["a"]}]}, id=gid)
        c.expect(lambda m: m.kind == "graph.submitted" and m.ref == gid, self.timeout)
        a = self.assigned(f, f"tg:{gid}/a")
        c.send("graph.cancel", {"graph": gid})
        f.expect(lambda m: m.kind == "task.cancel" and m.ref == a.id, self.timeout,
                 "the running node's task.cancel")
        node = c.expect(lambda m: m.kind == "graph.node" and m.b.get("node") == "b",
                        self.timeout, "graph.node for the pending node")
        require(node.b.get("state") == "cancelled" and node.b.get("task") == f"tg:{gid}/b",
                f"graph.node {node.b}")
        end = c.expect(lambda m: m.kind == "graph.result" and m.b.get("graph") == gid,
                       self.timeout, "graph.result")
        require(end.b.get("state") == "cancelled" and end.b.get("counts", {}).get("cancelled")
                == 2, f"graph.result {end.b}")
        return "the running node's task cancelled, the pending one ended cancelled"
