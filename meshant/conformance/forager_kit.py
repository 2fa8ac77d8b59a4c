"""``meshant conformance forager``: the kit plays the queen against a forager command.

It binds a ROUTER and a PUB on loopback, starts the command with ``MESHANT_QUEEN`` set to
the ROUTER (and ``{queen}`` in its arguments replaced by it), welcomes the forager's hello
and runs each check of :mod:`meshant.conformance.catalog` tagged ``forager``.

The forager under test should serve ``echo`` (returns its payload); ``sleep`` (payload
``{"seconds": s}``: waits, returns its payload) and ``stream`` (payload ``{"text": t,
"delay": d}``: a partial result and a progress report per word) enable more checks, as
meshant's demo capabilities do. A check that needs what the forager does not serve is a
SKIP, never a PASS.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

from meshant import protocol as p
from meshant.conformance.cases import DECODE_CASES, JSON_CASES
from meshant.conformance.report import CheckFailed, Report, Skipped, require
from meshant.conformance.wire import FakeQueen, kind_is
from meshant.core.tasks.checks import result_problem
from meshant.protocol.codec import JSON

HB_INTERVAL = 0.5
BIG = 100 * 1024



def _items(msg: p.Message) -> list[p.Message]:
    """``msg``, or the messages a task.batch's items stand for (each ``ref`` its own)."""
    if msg.kind != "task.batch":
        return [msg]
    return [p.Message(i.get("kind", "task.result"),
                      {k: v for k, v in i.items() if k not in ("ref", "kind")},
                      ref=i.get("ref")) for i in msg.b["results"] if isinstance(i, dict)]

class ForagerKit:
    """One run against one forager command."""

    def __init__(self, command: list[str], *, startup: float = 30.0,
                 echo: Callable[[str], None] | None = None) -> None:
        self.command = command
        self.startup = startup
        self.report = Report("forager", " ".join(command), echo=echo)
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.q = FakeQueen(self.ctx, HB_INTERVAL)
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: p.Message | None = None
        self.features: frozenset[str] = frozenset()
        self.tools: list[str] = []
        self.slots = 1
        self.n = 0
        self.running = ""
        # The forager's output, kept for a failure's diagnosis; closed by _stop.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    # -- running --------------------------------------------------------------------------

    def run(self) -> Report:
        try:
            self._start()
            r = self.report
            if not r.run("f.hello", self._first_message):
                return r
            legacy = self.q.codec == JSON
            if legacy:
                for cid in ("f.hello-fields", "f.assigns", "f.progress", "f.lease", "f.cancel",
                            "f.blobs", "f.reconnect", "f.rejoin", "f.no-features"):
                    r.add(cid, "SKIP", "an IACP 1.1 forager (§8) has no hello or features")
                r.run("f.legacy", self._legacy)
                r.run("f.bad-input", self._bad_input)
                r.run("f.stale-cancel", self._stale_cancel)
            else:
                r.run("f.hello-fields", self._hello_fields)
                self._welcome(list(self.features))
                r.run("f.heartbeat", self._heartbeat)
                r.run("f.assign", self._assign)
                r.run("f.assigns", self._assigns)
                r.run("f.progress", self._progress)
                r.run("f.lease", self._lease)
                r.run("f.cancel", self._cancel)
                r.run("f.stale-cancel", self._stale_cancel)
                r.run("f.blobs", self._blobs)
                r.run("f.bad-input", self._bad_input)
                if r.run("f.reconnect", self._reconnect):
                    r.run("f.rejoin", self._rejoin)
                    r.run("f.no-features", self._no_features)
                else:
                    for cid in ("f.rejoin", "f.no-features"):
                        r.add(cid, "SKIP", "needs the reconnect of f.reconnect")
                r.add("f.legacy", "SKIP", "the forager speaks IACP/2")
            r.run("f.from", self._from)
            r.run("f.decode", self._decode)
            return r
        finally:
            self._stop()

    def _start(self) -> None:
        env = {**os.environ, "MESHANT_QUEEN": self.q.endpoint}
        args = [a.replace("{queen}", self.q.endpoint) for a in self.command]
        self.proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.q.close()
        self.ctx.term()
        self._log.close()

    def output(self) -> str:
        """The last lines the forager printed (for a failure's diagnosis)."""
        self._log.seek(0)
        return self._log.read()[-2000:].decode("utf-8", "replace")

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise CheckFailed(f"the forager exited (code {self.proc.returncode})")

    # -- helpers --------------------------------------------------------------------------

    def _welcome(self, features: list[str]) -> None:
        assert self.hello is not None
        b = self.hello.b
        self.q.name = str(b.get("name") or f"forager-{secrets.token_hex(3)}")
        self.q.send("welcome", {
            "version": 2, "features": features, "hb_interval": HB_INTERVAL, "hb_misses": 10,
            "assign_timeout": 30.0, "epoch": self.q.epoch, "pub": self.q.pub_endpoint,
            "queen": "queen", "name": self.q.name, "max_message": 64 * 1024 * 1024,
            "max_broadcast": 128 * 1024}, ref=self.hello.id)
        self.q.beat()

    def _need(self, tool: str) -> None:
        if tool not in self.tools:
            raise Skipped(f"the forager does not serve {tool!r}")

    def _assign_one(self, capability: str, payload: Any) -> str:
        self.n += 1
        task = f"kt-{self.n}"
        aid = f"{task}.1"
        body = {"task": task, "attempt": 1, "capability": capability, "payload": payload}
        if self.q.codec == JSON:
            body["node"] = task
        self.q.send("task.assign", body, id=aid)
        return aid

    def _final(self, aid: str, timeout: float = 10.0) -> dict[str, Any]:
        """The forager's final answer about ``aid`` (a task.result or a task.batch item)."""
        found: dict[str, Any] = {}

        def match(m: p.Message) -> bool:
            if m.kind == "task.result" and m.ref == aid and not m.b.get("partial"):
                found.update(m.b)
                return True
            if m.kind == "task.batch":
                items = [i for i in m.b["results"] if isinstance(i, dict)]
                mine = [i for i in items if i.get("ref") == aid and not i.get("partial")
                        and "kind" not in i]
                if mine:
                    found.update(mine[0])
                    rest = [i for i in items if i.get("ref") != aid]
                    if rest:  # the others stay for whoever waits for them
                        self.q.inbox.append(p.Message("task.batch", {"results": rest}))
                    return True
            return False

        self._alive()
        self.q.expect(match, timeout, f"final result for {aid}")
        problem = result_problem(found, self.q.codec)
        require(problem is None, f"malformed result for {aid}: {problem}")
        about = [(m, n) for _, msg, n in self.q.log for m in _items(msg) if m.ref == aid]
        if "progress" not in self.features and self.q.codec != JSON:
            require(not any(m.kind == "task.progress" or m.b.get("partial") for m, _ in about),
                    f"progress or partial results for {aid} without progress negotiated")
        require("blobs" in self.features or not any(n for _, n in about),
                f"blob frames about {aid} without blobs negotiated")
        return found

    def _echo_ok(self, what: str = "echo") -> None:
        value = {"check": what, "n": self.n}
        aid = self._assign_one("echo", value)
        got = self._final(aid)
        require(got.get("status") == "ok" and got.get("result") == value,
                f"echo of {value} answered {got}")

    # -- checks ---------------------------------------------------------------------------

    def _first_message(self) -> str:
        m = self.q.poll(lambda m: True, self.startup)
        if m is None:
            self._alive()
            raise CheckFailed(f"nothing from the forager within {self.startup:g} s; "
                              f"its output: {self.output()[-300:]!r}")
        if self.q.codec == JSON:
            require(m.kind == "hb", f"an IACP 1.1 forager registers with hb, not {m.kind}")
            self.hello = m
            self.q.name = m.frm
            self.tools = [t for t in m.b.get("tools", []) if isinstance(t, str)]
            return f"IACP 1.1 forager {m.frm!r}, tools {self.tools}"
        require(m.kind == "hello", f"the first message is {m.kind}, not hello")
        self.hello = m
        b = m.b
        self.tools = [t for t in b.get("tools", []) if isinstance(t, str)]
        self.slots = int(b.get("slots", 1))
        wanted = b.get("features") or []
        self.features = frozenset(f for f in p.negotiation.FEATURES if f in wanted)
        return f"{b.get('name')!r}, tools {self.tools}, features {sorted(self.features)}"

    def _hello_fields(self) -> str:
        assert self.hello is not None
        b = self.hello.b
        require(b.get("role") == "forager", f"role is {b.get('role')!r}")
        require(2 in b["versions"], f"versions {b['versions']} do not include 2")
        require("msgpack" in b.get("codecs", ["msgpack"]), f"codecs {b.get('codecs')}")
        require(not b.get("name") or p.valid_name(b["name"]), f"name {b.get('name')!r}")
        require(1 <= self.slots <= 10_000, f"slots {self.slots}")
        require(all(isinstance(t, str) and t for t in b.get("tools", [])), "tools")
        return ""

    def _heartbeat(self) -> str:
        start = time.monotonic()
        self.q.expect(kind_is("hb"), 4 * HB_INTERVAL, "hb while idle")
        gaps = []
        for _ in range(2):
            t0 = time.monotonic()
            self.q.expect(lambda m: True, 2 * HB_INTERVAL + 0.5, "a message every interval")
            gaps.append(time.monotonic() - t0)
        return f"first after {time.monotonic() - start:.2f} s, then gaps of " + ", ".join(
            f"{g:.2f}" for g in gaps)

    def _assign(self) -> str:
        self._need("echo")
        self._echo_ok("assign")
        return ""

    def _assigns(self) -> str:
        self._need("echo")
        if "batch" not in self.features:
            raise Skipped("batch was not negotiated")
        n = min(3, self.slots)
        if n < 2:
            raise Skipped("needs slots >= 2 to send a batch of assignments")
        items: list[dict[str, Any]] = []
        for i in range(n):
            self.n += 1
            task = f"kt-{self.n}"
            items.append({"id": f"{task}.1", "task": task, "attempt": 1, "capability": "echo",
                          "payload": i})
        self.q.send("task.assigns", {"assigns": items})
        for i, item in enumerate(items):
            got = self._final(item["id"])
            require(got.get("result") == i, f"item {item['id']} answered {got}")
        return f"{n} assignments in one message"

    def _progress(self) -> str:
        if "progress" not in self.features and self.q.codec != JSON:
            # Not negotiated, so not to be used (§5.2): a task that would stream ends with
            # its final result alone (_final fails the check on anything else).
            cap = "stream" if "stream" in self.tools else "echo"
            self._need(cap)
            self._final(self._assign_one(cap, {"text": "one two", "delay": 0.01}))
            return f"progress not negotiated, and none used ({cap})"
        self._need("stream")
        if "progress" not in self.features:
            raise Skipped("progress was not negotiated")
        words = ["alpha", "beta", "gamma"]
        aid = self._assign_one("stream", {"text": " ".join(words), "delay": 0.01})
        self._final(aid)
        # A batch's items stand for messages of their own, in order (§2.4).
        seen = [m for _, msg, _ in self.q.log for m in _items(msg) if m.ref == aid]
        kinds = [("partial" if m.b.get("partial") else m.kind) for m in seen
                 if m.kind != "task.accept"]
        partials = [m.b.get("value") for m in seen if m.b.get("partial")]
        require(partials == words, f"partial values {partials}, expected {words}")
        require(kinds[-1] == "task.result", f"something after the final result: {kinds}")
        fractions = [m.b["fraction"] for m in seen if m.kind == "task.progress"
                     and "fraction" in m.b]
        require(fractions == sorted(fractions), f"progress went backwards: {fractions}")
        return f"{len(partials)} partials, {len(fractions)} progress reports, then the result"

    def _lease(self) -> str:
        self._need("sleep")
        aid = self._assign_one("sleep", {"seconds": 4 * HB_INTERVAL})
        listed = 0
        for _ in range(2):
            self.q.expect(lambda m: m.kind == "hb" and aid in (m.b.get("running") or []),
                          2 * HB_INTERVAL + 0.5, f"hb with running listing {aid}")
            listed += 1
        self._final(aid)
        return f"listed in {listed} consecutive heartbeats"

    def _cancel(self) -> str:
        self._need("sleep")
        aid = self._assign_one("sleep", {"seconds": 30})
        self.q.poll(lambda m: m.ref == aid, 1.0)  # an accept, if it sends one
        task = aid.rpartition(".")[0]
        self.q.send("task.cancel", {"task": task}, ref=aid)
        try:
            got = self._final(aid, 5.0)
        except CheckFailed:
            self._echo_ok("after cancel")
            return "no answer to the cancel (allowed: SHOULD); still serving"
        require(got.get("status") in ("cancelled", "error"),
                f"a cancelled 30 s sleep answered {got} within 5 s")
        self._echo_ok("after cancel")
        return f"answered status {got.get('status')!r}"

    def _stale_cancel(self) -> str:
        self._need("echo")
        stale = f"kt-stale-{secrets.token_hex(3)}.1"
        self.q.send("task.cancel", {"task": stale.rpartition(".")[0]}, ref=stale)
        for m in self.q.drain(0.3):
            require(m.ref != stale or m.kind in ("task.result", "error"),
                    f"answered a stale cancel with {m.kind}")
        self._echo_ok("after a stale cancel")
        return ""

    def _blobs(self) -> str:
        self._need("echo")
        data = secrets.token_bytes(BIG)
        blobs = "blobs" in self.features
        aid = self._assign_one("echo", p.Blob(data) if blobs else data)
        got = self._final(aid)
        result = got.get("result")
        result = bytes(result) if isinstance(result, p.Blob) else result
        require(result == data, f"{BIG} bytes came back as {type(result).__name__} "
                f"of {len(result) if isinstance(result, bytes) else '?'} bytes")
        frames = [n for _, m, n in self.q.log if m.ref == aid]
        require(blobs or not any(frames), "blob frames sent without blobs negotiated")
        return "as a blob frame" if blobs else "inline (blobs not negotiated)"

    def _bad_input(self) -> str:
        self._need("echo")
        sent = 0
        if self.q.codec == JSON:
            for _desc, line, _code in JSON_CASES:
                self.q.send_raw([line])
                sent += 1
        else:
            for _desc, frames, _code in DECODE_CASES:
                if frames:
                    self.q.send_raw(frames)
                    sent += 1
        self.q.drain(0.3)
        self._alive()
        self._echo_ok("after malformed messages")
        return f"{sent} malformed messages, then still serving"

    def _reconnect(self) -> str:
        # A task left running across the reconnect, for f.rejoin.
        self.running = self._assign_one("sleep", {"seconds": 30}) if "sleep" in self.tools else ""
        if self.running:
            self.q.poll(lambda m: m.ref == self.running, 1.0)  # accepted, if it says so
        old = self.q.epoch
        self.q.epoch = secrets.token_hex(8)
        self.q.name = ""  # beats stop until the hello: as a queen that restarted
        self.q.beat()
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            self._alive()
            self.q.beat()
            m = self.q.poll(kind_is("hello"), HB_INTERVAL)
            if m is not None:
                self.hello = m
                # Welcomed with no features: f.no-features checks none is used.
                self.features = frozenset()
                self._welcome([])
                return f"epoch {old[:6]}… → {self.q.epoch[:6]}…: hello again"
        raise CheckFailed("no hello within 15 s of a new epoch on the PUB heartbeat")

    def _rejoin(self) -> str:
        if not self.running:
            raise Skipped("the forager does not serve 'sleep'")
        assert self.hello is not None
        running = self.hello.b.get("running") or []
        require(self.running in running, f"the hello after the reconnect lists running "
                f"{running}, not the 30 s sleep {self.running} it was running")
        # This queen does not hold that assignment (it "restarted"): it cancels it (§5.4).
        self.q.send("task.cancel", {"task": self.running.rpartition(".")[0]}, ref=self.running)
        try:
            got = self._final(self.running, 5.0)
        except CheckFailed:
            got = {}
        self._need("echo")
        self._echo_ok("after a stale assignment's cancel")
        if not got:
            return "listed in running; no answer to the cancel (allowed: SHOULD)"
        require(got.get("status") in ("cancelled", "error"),
                f"a cancelled 30 s sleep answered {got}")
        return f"listed in running; the cancel answered {got.get('status')!r}"

    def _no_features(self) -> str:
        self._need("echo")
        self._echo_ok("without features")
        used = []
        if "stream" in self.tools:
            aid = self._assign_one("stream", {"text": "one two", "delay": 0.01})
            self._final(aid)
            if any(m.ref == aid and (m.kind == "task.progress" or m.b.get("partial"))
                   for _, msg, _ in self.q.log for m in _items(msg)):
                used.append("progress")
        data = secrets.token_bytes(BIG)
        aid = self._assign_one("echo", data)
        got = self._final(aid)
        if any(n for _, m, n in self.q.log if m.ref == aid):
            used.append("blobs")
        result = got.get("result")
        result = bytes(result) if isinstance(result, p.Blob) else result
        require(result == data, "100 KiB of bytes did not come back intact")
        if any(m.kind == "task.batch" for _, m, _ in self.q.log[-20:]):
            used.append("batch")
        require(not used, f"used without negotiation: {', '.join(used)}")
        return ""

    def _legacy(self) -> str:
        self._need("echo")
        aid = self._assign_one("echo", "hello 1.1")
        got = self._final(aid)
        value = got.get("result", {k: v for k, v in got.items() if k != "status"})
        require(got.get("status") == "ok" and value == "hello 1.1", f"answered {got}")
        return "JSON task.assign answered with ref = its id"

    def _from(self) -> str:
        require(not self.q.bad_from, f"'from' is not the registered name: {self.q.bad_from[:3]}")
        return ""

    def _decode(self) -> str:
        require(not self.q.decode_errors,
                f"{len(self.q.decode_errors)} malformed: {self.q.decode_errors[0]}"
                if self.q.decode_errors else "")
        return f"{len(self.q.log)} messages"


def check_forager(command: list[str], *, startup: float = 30.0,
                  echo: Callable[[str], None] | None = None) -> Report:
    """Play the queen against the forager started by ``command`` (an argv list; it gets
    ``MESHANT_QUEEN``, and ``{queen}`` in an argument becomes the kit's endpoint) and stop
    it at the end. ``echo`` receives each verdict line as it is decided. The
    :class:`Report` holds one outcome per forager check; ``report.failed`` is the number
    of FAILs (the CLI exits 1 when it is not 0). Raises OSError if the command cannot be
    started."""
    return ForagerKit(command, startup=startup, echo=echo).run()
