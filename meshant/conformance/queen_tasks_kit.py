"""The queen kit's task checks (spec §6, §2.4, §5.2): the lifecycle and its order, each
failure code, fencing, malformed answers, batches and feature gating. Mixed into
:class:`meshant.conformance.queen_kit.QueenKit`, which provides the peers."""

from __future__ import annotations

import time
from typing import Any

from meshant import protocol as p
from meshant.conformance.report import require
from meshant.conformance.wire import Peer, kind_is


def _final_of(task: str) -> Any:
    return lambda m: (m.kind == "task.result" and m.b.get("task") == task
                      and not m.b.get("partial"))


class TaskChecks:
    """Checks that submit tasks; ``self`` is a QueenKit."""

    timeout: float
    hb_interval: float

    def cap(self) -> str:
        raise NotImplementedError  # QueenKit's

    def forager(self, tools: list[str], **hello: Any) -> Peer:
        raise NotImplementedError  # QueenKit's

    def client(self, **hello: Any) -> Peer:
        raise NotImplementedError  # QueenKit's

    # -- helpers --------------------------------------------------------------------------

    def final(self, c: Peer, task: str, timeout: float | None = None) -> p.Message:
        """The task's one final result; a second one within a moment fails the check."""
        m = c.expect(_final_of(task), timeout or self.timeout, f"the final result of {task}")
        extra = c.poll(_final_of(task), 0.2)
        require(extra is None, f"a second final result for {task}: {extra and extra.b}")
        return m

    def failed(self, c: Peer, task: str, code: str, timeout: float | None = None) -> str:
        m = self.final(c, task, timeout)
        err = m.b.get("error") or {}
        require(m.b.get("state") == "failed" and err.get("code") == code,
                f"final {m.b.get('state')} {err}, expected failed {code}")
        return f"cause {err.get('cause')!r}"

    def submit(self, c: Peer, cap: str, **body: Any) -> p.Message:
        return c.send("task.submit", {"capability": cap, **body})

    def assigned(self, f: Peer, task: str | None = None) -> p.Message:
        return f.expect(lambda m: m.kind == "task.assign"
                        and (task is None or m.b.get("task") == task),
                        self.timeout, f"task.assign of {task or 'a task'}")

    # -- checks ---------------------------------------------------------------------------

    def _lifecycle(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap, payload={"x": 1}, ack=True)
        ack = c.expect(lambda m: m.kind == "task.submitted" and m.ref == sub.id, self.timeout)
        require(ack.b["task"] == sub.id, f"task.submitted names {ack.b['task']}, not the submit id")
        a = self.assigned(f)
        require(a.id == f"{sub.id}.1", f"assign id {a.id!r}, expected '<task id>.1'")
        require(a.b.get("task") == sub.id and a.b.get("attempt") == 1
                and a.b.get("capability") == cap and a.b.get("payload") == {"x": 1},
                f"assign body {a.b}")
        f.send("task.accept", ref=a.id)
        f.send("task.progress", {"fraction": 0.5, "note": "half"}, ref=a.id)
        f.send("task.result", {"partial": True, "value": "p1"}, ref=a.id)
        f.send("task.result", {"status": "ok", "result": {"y": 2}}, ref=a.id)
        prog = c.expect(lambda m: m.kind == "task.progress" and m.b.get("task") == sub.id,
                        self.timeout, "task.progress")
        part = c.expect(lambda m: bool(m.b.get("partial")) and m.b.get("task") == sub.id,
                        self.timeout, "the partial result")
        final = self.final(c, sub.id)
        b = final.b
        require(b.get("state") == "completed" and b.get("attempt") == 1
                and b.get("result") == {"y": 2}, f"final {b}")
        seqs = [prog.b["seq"], part.b["seq"], b["seq"]]
        require(seqs == sorted(seqs) and len(set(seqs)) == 3, f"seq not increasing: {seqs}")
        require(prog.b.get("fraction") == 0.5 and part.b.get("value") == "p1",
                f"relayed {prog.b} {part.b}")
        return f"seq {seqs}"

    def _bad_answer(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap, payload=1)
        a = self.assigned(f)
        bad: list[tuple[dict[str, Any], str]] = [
            ({"result": 5}, "bad-value"), ({}, "bad-value"), ({"status": "meh"}, "bad-value"),
            ({"status": "error"}, "bad-value"), ({"status": "error", "error": {}}, "bad-value"),
            ({"status": "error", "error": "boom"}, "bad-type"), ({"partial": True}, "bad-value"),
        ]
        for body, want in bad:
            code = f.error(f.send("task.result", body, ref=a.id), self.timeout)
            require(code == want, f"result {body}: {code}, expected {want}")
        code = f.error(f.send("task.progress", {"fraction": 7}, ref=a.id), self.timeout)
        require(code == "bad-value", f"progress fraction 7: {code}")
        f.send("task.result", {"status": "ok", "result": "fine"}, ref=a.id)
        final = self.final(c, sub.id)
        require(final.b.get("state") == "completed" and final.b.get("result") == "fine",
                f"after the malformed answers, a good one gave {final.b}")
        return f"{len(bad) + 1} malformed answers refused, the attempt stayed current"

    def _not_yours(self) -> str:
        cap = self.cap()
        f1 = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap)
        a = self.assigned(f1)
        f2 = self.forager([self.cap()])
        code = f2.error(f2.send("task.accept", ref=a.id), self.timeout)
        require(code == "not-yours", f"another forager's accept: {code}")
        f1.send("task.result", {"status": "ok", "result": None}, ref=a.id)
        self.final(c, sub.id)
        return ""

    def _duplicate_task(self) -> str:
        cap = self.cap()
        c1, c2 = self.client(), self.client()
        sub = self.submit(c1, cap, wait=5.0)
        code = c2.error(c2.send("task.submit", {"capability": cap}, id=sub.id), self.timeout)
        require(code == "duplicate-task", f"the same id from another client: {code}")
        again = c1.send("task.submit", {"capability": cap, "ack": True}, id=sub.id)
        m = c1.expect(lambda x: x.ref == again.id, self.timeout, "an answer to a re-sent submit")
        require(m.kind == "task.submitted", f"a re-sent submit from its client: {m.kind} {m.b}")
        c1.send("task.cancel", {"task": sub.id})
        self.final(c1, sub.id)
        return ""

    def _handler_error(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap, max_attempts=1)
        a = self.assigned(f)
        f.send("task.result", {"status": "error", "error": {"type": "E", "message": "boom"}},
               ref=a.id)
        return self.failed(c, sub.id, "handler-error")

    def _rejected(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap)
        a = self.assigned(f)
        f.send("task.reject", {"reason": "not today"}, ref=a.id)
        return self.failed(c, sub.id, "rejected")

    def _no_forager(self) -> str:
        c = self.client()
        sub = self.submit(c, self.cap(), wait=0.2)
        return self.failed(c, sub.id, "no-forager")

    def _deadline(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap, timeout=0.5)
        a = self.assigned(f)
        require(isinstance(a.b.get("timeout"), int | float) and a.b["timeout"] <= 0.5,
                f"the assign of a task with a timeout carries {a.b.get('timeout')!r}")
        f.send("task.accept", ref=a.id)
        out = self.failed(c, sub.id, "deadline-exceeded")
        f.expect(kind_is("task.cancel", a.id), self.timeout, "task.cancel of the late attempt")
        return out

    def _cancel(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        queued = self.submit(c, self.cap(), wait=30.0)
        c.send("task.cancel", {"task": queued.id})
        m = self.final(c, queued.id)
        require(m.b.get("state") == "cancelled", f"a queued task cancelled: {m.b}")
        sub = self.submit(c, cap)
        a = self.assigned(f)
        f.send("task.accept", ref=a.id)
        c.send("task.cancel", {"task": sub.id})
        m = self.final(c, sub.id)
        require(m.b.get("state") == "cancelled", f"an assigned task cancelled: {m.b}")
        f.expect(kind_is("task.cancel", a.id), self.timeout, "task.cancel for the forager")
        f.send("task.result", {"status": "cancelled"}, ref=a.id)  # its answer frees the slot
        sub2 = self.submit(c, cap)
        self.assigned(f, sub2.id)
        return "queued and assigned; the slot is free after the forager's answer"

    def _delayed(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        bad = self.submit(c, cap, after=-1)
        e = c.expect(kind_is("error", bad.id), self.timeout, "the refusal of after: -1")
        require(e.b.get("code") == "bad-value", f"after: -1 answered {e.b}")
        gone = self.submit(c, cap, after=3600)
        t0 = time.monotonic()
        sub = self.submit(c, cap, after=0.5)
        c.send("task.status", {"task": sub.id})
        st = c.expect(lambda m: m.kind == "task.state" and m.b.get("task") == sub.id,
                      self.timeout, "task.state of the delayed task")
        require(st.b.get("state") == "delayed" and isinstance(
            st.b.get("not_before"), int | float), f"a delayed task's state: {st.b}")
        a = self.assigned(f, sub.id)
        early = time.monotonic() - t0
        require(early >= 0.5 - 0.02, f"assigned {early:.3f} s after a submission with "
                "after: 0.5")
        f.send("task.result", {"status": "ok", "result": None}, ref=a.id)
        self.final(c, sub.id)
        c.send("task.cancel", {"task": gone.id})
        m = self.final(c, gone.id)
        require(m.b.get("state") == "cancelled", f"a delayed task cancelled: {m.b}")
        return f"assigned {early:.3f} s after submission (after: 0.5)"

    def _schedules(self) -> str:
        cap = self.cap()
        name = f"conf-{cap.replace('.', '-')}"
        f = self.forager([cap])
        c = self.client()
        add = {"op": "add", "name": name, "cron": "* * * * * *", "capability": cap,
               "payload": {"n": 1}, "overlap": "allow"}
        bad = c.send("schedule", {**add, "cron": "61 * * * * *"})
        e = c.expect(kind_is("error", bad.id), self.timeout, "the refusal of a bad cron")
        require(e.b.get("code") == "bad-value", f"a bad cron answered {e.b}")
        sent = c.send("schedule", add)
        r = c.expect(lambda m: m.ref == sent.id, self.timeout, "the answer to an add")
        require(r.kind == "schedule.reply" and r.b["schedule"]["name"] == name,
                f"an add answered {r.kind} {r.b}")
        again = c.send("schedule", add)
        e = c.expect(kind_is("error", again.id), self.timeout, "the refusal of a second add")
        require(e.b.get("code") == "schedule-exists", f"a second add answered {e.b}")
        try:
            ticks = []
            for _ in range(2):
                a = self.assigned(f)
                require(a.b.get("payload") == {"n": 1}, f"a tick's task: {a.b}")
                got = time.time()
                f.send("task.result", {"status": "ok", "result": None}, ref=a.id)
                ticks.append(got)
            listed = c.send("schedule", {"op": "list"})
            r = c.expect(lambda m: m.ref == listed.id, self.timeout, "the answer to list")
            mine = [s for s in r.b.get("items", []) if s.get("name") == name]
            require(len(mine) == 1 and mine[0]["fired"] >= 2, f"list: {mine}")
            key = mine[0].get("last_task")
            require(isinstance(key, str), f"a schedule's last task: {mine[0]}")
            st = c.send("task.status", {"task": key})
            s = c.expect(lambda m: m.ref == st.id, self.timeout, "the last task's state")
            tick = mine[0]["last_tick"]
            require(isinstance(tick, int | float) and s.kind == "task.state",
                    f"the last task {key}: {s.kind} {s.b}")
            paused = c.send("schedule", {"op": "pause", "name": name})
            r = c.expect(lambda m: m.ref == paused.id, self.timeout, "the answer to pause")
            require(r.kind == "schedule.reply" and r.b["schedule"]["paused"] is True,
                    f"pause answered {r.kind} {r.b}")
            late = f.poll(kind_is("task.assign"), 1.5)
            if late is not None:  # (one tick may have fired as the pause went out)
                f.send("task.result", {"status": "ok", "result": None}, ref=late.id)
                late = f.poll(kind_is("task.assign"), 1.5)
            require(late is None, f"a paused schedule fired: {late and late.b}")
        finally:
            gone = c.send("schedule", {"op": "remove", "name": name})
            c.expect(lambda m: m.ref == gone.id, self.timeout, "the answer to remove")
        unknown = c.send("schedule", {"op": "show", "name": name})
        e = c.expect(kind_is("error", unknown.id), self.timeout, "a removed schedule's show")
        require(e.b.get("code") == "unknown-schedule", f"a removed schedule: {e.b}")
        return f"2 ticks assigned {ticks[1] - ticks[0]:.2f} s apart; paused, removed"

    def _exhausted(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        sub = self.submit(c, cap, max_attempts=1)
        self.assigned(f)
        f.send("hb", {"state": "leaving"})
        f.hb_interval = 0.0
        return self.failed(c, sub.id, "attempts-exhausted")

    def _fencing(self) -> str:
        cap = self.cap()
        f = self.forager([cap], session="s-fence")
        c = self.client()
        sub = self.submit(c, cap, max_attempts=3)
        a1 = self.assigned(f)
        f.send("task.accept", ref=a1.id)
        # Saying hello again without listing the attempt abandons it (§5.4): reissued.
        w = f.hello("forager", tools=[cap], slots=1, running=[], session="s-fence")
        require(w.kind == "welcome", f"hello again: {w.b}")
        a2 = self.assigned(f, sub.id)
        require(a2.id == f"{sub.id}.2" and a2.b.get("attempt") == 2,
                f"the reissue is {a2.id} (attempt {a2.b.get('attempt')}), expected attempt 2")
        f.send("task.result", {"status": "ok", "result": "late"}, ref=a1.id)
        f.send("task.result", {"status": "ok", "result": "current"}, ref=a2.id)
        m = self.final(c, sub.id)
        require(m.b.get("result") == "current" and m.b.get("attempt") == 2,
                f"the submitter got {m.b}")
        return "attempt 1's late result dropped; one final result, from attempt 2"

    def _batch(self) -> str:
        cap = self.cap()
        f = self.forager([cap], slots=2)
        c = self.client()
        subs = [self.submit(c, cap, payload=i) for i in range(2)]
        assigns = [self.assigned(f, s.id) for s in subs]
        f.send("task.batch", {"results": [{"ref": a.id, "status": "ok", "result": i}
                                          for i, a in enumerate(assigns)]})
        for i, s in enumerate(subs):
            m = self.final(c, s.id)
            require(m.b.get("result") == i, f"batched item {i}: {m.b}")
        plain = self.forager([self.cap()], features=["progress"])
        code = plain.error(plain.send("task.batch", {"results": []}), self.timeout)
        require(code == "unsupported", f"task.batch without batch negotiated: {code}")
        return ""

    def _features(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client(features=[])
        sub = self.submit(c, cap)
        a = self.assigned(f)
        f.send("task.progress", {"fraction": 0.5}, ref=a.id)
        f.send("task.result", {"partial": True, "value": "p"}, ref=a.id)
        f.send("task.result", {"status": "ok", "result": 1}, ref=a.id)
        self.final(c, sub.id)
        got = [m.kind for m in c.inbox if m.b.get("task") == sub.id]
        require(not got, f"a client without progress received {got}")
        for kind, body in (("mem.sync", {"op": "snapshot"}),
                           ("broadcast", {"topic": "conformance", "data": 1})):
            code = c.error(c.send(kind, body), self.timeout)
            require(code == "unsupported", f"{kind} without its feature: {code}")
        cap2 = self.cap()
        nf = self.forager([cap2], features=[])
        c2 = self.client()
        sub2 = self.submit(c2, cap2)
        a2 = self.assigned(nf, sub2.id)
        code = nf.error(nf.send("task.progress", {"fraction": 0.1}, ref=a2.id), self.timeout)
        require(code == "unsupported", f"progress from a forager without it: {code}")
        nf.send("task.result", {"status": "ok", "result": None}, ref=a2.id)
        self.final(c2, sub2.id)
        return "progress, mem.sync, broadcast"
