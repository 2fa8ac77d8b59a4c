"""Regenerate the test vectors. Run only when the wire format changes on purpose:

    python tests/vectors/generate.py

The vectors are the spec's examples in executable form (docs/protocol.md refers to them);
tests check both directions, so code and spec cannot drift apart silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshant.conformance.cases import DECODE_CASES
from meshant.protocol import Blob, Message, binary, legacy

HERE = Path(__file__).parent


def to_json(v: Any) -> Any:
    if isinstance(v, Blob):
        return {"$blob": bytes(v).hex()}
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_json(x) for x in v]
    return v


def message_json(m: Message) -> dict[str, Any]:
    return {"v": m.v, "id": m.id, "from": m.frm, "to": m.to, "kind": m.kind, "ts": m.ts,
            "ref": m.ref, "body": to_json(m.body), "extra": m.extra}


BINARY = [
    ("hello from a forager", Message("hello", {
        "role": "forager", "name": "forager-07", "versions": [2], "codecs": ["msgpack"],
        "features": ["batch", "progress", "blobs"], "slots": 4, "tools": ["crawl", "echo"],
        "labels": {"zone": "eu"}}, id="m-4f91c1", frm="forager-07", to="queen",
        ts=1312284100)),
    ("welcome", Message("welcome", {
        "version": 2, "features": ["batch", "progress"], "hb_interval": 1.0, "hb_misses": 5,
        "assign_timeout": 300.0, "epoch": "3f2a9c01d4e5b6a7", "pub": "tcp://127.0.0.1:5671",
        "queen": "queen", "name": "forager-07"}, id="q-0001", frm="queen", to="forager-07",
        ts=1312284100.25, ref="m-4f91c1")),
    ("task.assign", Message("task.assign", {
        "task": "c1-7", "attempt": 1, "capability": "crawl",
        "payload": {"url": "cm://index/3"}}, id="c1-7.1", frm="queen", to="forager-07",
        ts=1312284101)),
    ("task.result, final", Message("task.result", {
        "status": "ok", "result": {"artifacts": ["cm://index/3"]}}, id="m-4f91c3",
        frm="forager-07", to="queen", ts=1312284180, ref="c1-7.1")),
    ("task.result, partial", Message("task.result", {"partial": True, "value": "tok"},
                                     id="m-4f91c4", frm="forager-07", to="queen",
                                     ref="c1-7.1")),
    ("task.result with a blob", Message("task.result", {
        "status": "ok", "result": Blob(b"\x00\x01binary\xff")}, id="m-4f91c5",
        frm="forager-07", to="queen", ref="c1-8.1")),
    ("task.batch", Message("task.batch", {"results": [
        {"ref": "c1-9.1", "status": "ok", "result": 1},
        {"ref": "c1-10.1", "status": "error", "error": {"type": "ValueError",
                                                         "message": "bad"}}]},
        id="m-4f91c6", frm="forager-07", to="queen")),
    ("note to several, with an unknown envelope field", Message(
        "note", {"text": "crawl done"}, id="m-5", frm="forager-07", to=["forager-08", "ops"],
        extra={"trace": "abc"})),
    ("error", Message("error", {"code": "name-taken", "message": "the name is held"},
                      id="q-0002", frm="queen", to="", ref="m-1")),
    # Added with the spec's "Changes" (appended: earlier vectors keep their places).
    ("task.assigns, the BATCH flag set", Message("task.assigns", {"assigns": [
        {"id": "c1-11.1", "task": "c1-11", "attempt": 1, "capability": "echo", "payload": 1},
        {"id": "c1-12.2", "task": "c1-12", "attempt": 2, "capability": "echo",
         "payload": None, "timeout": 29.5, "deadline": 1312284130.5}]},
        id="q-0003", frm="queen", to="forager-07", ts=1312284101)),
    ("the queen's heartbeat on PUB (after the topic frame $hb)", Message("hb", {
        "epoch": "3f2a9c01d4e5b6a7", "queen": "queen", "interval": 1.0, "mem_seq": 0},
        id="q-0004", frm="queen", ts=1312284102.5)),
    ("error rate-limited, with retry_after", Message("error", {
        "code": "rate-limited", "message": "slow down", "retry_after": 0.002},
        id="q-0005", frm="queen", ref="c1-13")),
    ("task.result to a client, an idempotent repeat: original", Message("task.result", {
        "result": 2, "task": "c2-1", "state": "completed", "attempt": 1, "seq": 1,
        "original": "c1-14"}, id="q-0006", frm="queen", to="client-1", ref="c2-1")),
    ("task.result failed, with reasons", Message("task.result", {
        "error": {"code": "attempts-exhausted", "message": "gave up after 3 attempts",
                  "reasons": ["assign timeout on f-1", "forager lost: f-2"],
                  "cause": "forager-lost", "attempts": 3},
        "task": "c1-15", "state": "failed", "attempt": 3, "seq": 4},
        id="q-0007", frm="queen", to="client-1", ref="c1-15")),
    ("integers and floats: 1.0 stays float64, 1 a fixint, -1 a negative fixint, 2**40 a "
     "uint64", Message("task.progress", {"fraction": 1.0, "seq": 1, "note": "é"},
                       id="m-6", frm="forager-07", ts=-1, ref="c1-16.1",
                       extra={"n": 2**40})),
    ("an empty to list is kept; a nil body", Message("ctl.drain", None, id="m-7",
                                                     frm="client-1", to=[])),
    # Conversations (kinds 60-68)
    ("task.ask from a forager", Message("task.ask", {
        "request": "c1-7.1.q1", "prompt": "Which branch?", "data": {"choices": ["a", "b"]},
        "timeout": 600.0}, id="m-60", frm="forager-07", to="queen", ref="c1-7.1")),
    ("task.ask relayed to the submitter", Message("task.ask", {
        "task": "c1-7", "seq": 3, "request": "c1-7.1.q1", "prompt": "Which branch?"},
        id="q-61", frm="queen", to="c1", ref="c1-7")),
    ("task.answer from a client", Message("task.answer", {
        "task": "c1-7", "request": "c1-7.1.q1", "value": "b"}, id="c1-20", frm="c1",
        to="queen")),
    ("task.attach", Message("task.attach", {"task": "c1-7", "after": 2}, id="c2-1",
                            frm="c2", to="queen")),
    ("task.update", Message("task.update", {
        "task": "c1-7", "seq": 3, "kind": "task.result",
        "body": {"task": "c1-7", "seq": 3, "partial": True, "value": "tok"}}, id="q-62",
        frm="queen", to="c2", ref="c1-7")),
    ("msg asking for a receipt, kept an hour at most", Message(
        "msg", {"text": "see you"}, id="m-63", frm="c1", to="forager-09",
        extra={"receipt": True, "ttl": 3600.0})),
    ("msg.receipt", Message("msg.receipt", {
        "message": "m-63", "to": "forager-09", "status": "delivered", "at": 1312284200.5},
        id="q-64", frm="queen", to="c1")),
    ("inbox list", Message("inbox", {"op": "list", "name": "forager-09"}, id="c1-21",
                           frm="c1", to="queen")),
    # Task graphs (kinds 50-58): the graph's id is its submission's id.
    ("graph.submit", Message("graph.submit", {"nodes": [
        {"name": "fetch", "capability": "crawl", "payload": {"url": "cm://index/3"}},
        {"name": "parse", "capability": "parse", "payload": {"doc": {"$result": "fetch"}}},
        {"name": "sum", "capability": "llm", "payload": {"$results": ["fetch", "parse"]},
         "after_spawned": ["parse"], "priority": 10}]}, id="crawl-index", frm="client-1",
        to="queen", ts=1312284100)),
    ("graph.submitted", Message("graph.submitted", {"graph": "crawl-index", "nodes": 3},
                                id="g-0003", frm="queen", to="client-1",
                                ref="crawl-index")),
    ("task.assign of a graph node", Message("task.assign", {
        "task": "tg:crawl-index/fetch", "node": "tg:crawl-index/fetch", "attempt": 1,
        "capability": "crawl", "payload": {"url": "cm://index/3"}},
        id="tg:crawl-index/fetch.1", frm="queen", to="forager-07", ts=1312284101)),
    ("graph.spawn", Message("graph.spawn", {"nodes": [
        {"name": "page-1", "capability": "parse", "payload": 1}]}, id="g-m6",
        frm="forager-07", to="queen", ref="tg:crawl-index/parse.1")),
    ("graph.spawned", Message("graph.spawned", {"graph": "crawl-index", "nodes": ["page-1"]},
                              id="g-0004", frm="queen", to="forager-07", ref="g-m6")),
    ("graph.node", Message("graph.node", {
        "graph": "crawl-index", "node": "sum", "state": "cancelled",
        "task": "tg:crawl-index/sum", "error": {"code": "upstream-failed",
                                                "cause": "upstream-failed", "node": "parse",
                                                "message": "node 'parse' did not complete"}},
        id="g-0005", frm="queen", to="client-1")),
    ("graph.result", Message("graph.result", {
        "graph": "crawl-index", "state": "failed", "failed": "parse", "client": "client-1",
        "nodes": 4, "counts": {"completed": 2, "failed": 1, "cancelled": 1}},
        id="g-0006", frm="queen", to="client-1")),
    ("graph.status", Message("graph.status", {"graph": "crawl-index"}, id="g-m7",
                             frm="client-1", to="queen")),
    ("graph.state", Message("graph.state", {
        "graph": "crawl-index", "state": "running", "nodes": 3,
        "counts": {"completed": 1, "running": 1, "pending": 1},
        "node_states": [{"node": "fetch", "state": "completed",
                         "id": "tg:crawl-index/fetch", "capability": "crawl"}]},
        id="g-0007", frm="queen", to="client-1", ref="g-m7")),
    ("graph.cancel", Message("graph.cancel", {"graph": "crawl-index"}, id="g-m8",
                             frm="client-1", to="queen")),
    ("task.batch with a progress item (batch.progress)", Message("task.batch", {"results": [
        {"ref": "c1-7.1", "partial": True, "value": "tok", "n": 1},
        {"ref": "c1-7.1", "kind": "task.progress", "fraction": 0.5, "n": 2},
        {"ref": "c1-7.1", "status": "ok", "result": "done"}]},
        id="m-4f91c7", frm="forager-07", to="queen")),
    # Durable steps (kinds 70-73, feature steps: §6b)
    ("task.step, a step's record", Message("task.step", {
        "position": 0, "kind": "step", "name": "search", "occurrence": 1,
        "value": {"hits": 3}, "n": 1}, id="m-70", frm="forager-07", to="queen",
        ref="c1-30.1")),
    ("task.step, a sleep's record", Message("task.step", {
        "position": 1, "kind": "sleep", "name": "sleep", "occurrence": 1, "seconds": 60.0,
        "n": 2}, id="m-71", frm="forager-07", to="queen", ref="c1-30.1")),
    ("task.result suspended, a durable question", Message("task.result", {
        "status": "suspended", "wait": {"request": "c1-30.s2", "position": 2, "name": "ask",
                                        "occurrence": 1, "prompt": "Publish?"}},
        id="m-72", frm="forager-07", to="queen", ref="c1-30.2")),
    ("task.assign of a re-run, with its records", Message("task.assign", {
        "task": "c1-30", "attempt": 3, "capability": "agent", "payload": "go",
        "steps": [{"position": 0, "kind": "step", "name": "search", "occurrence": 1,
                   "value": {"hits": 3}}]}, id="c1-30.3", frm="queen", to="forager-07")),
    ("task.call", Message("task.call", {"position": 3, "capability": "summarise",
                                        "payload": "text", "options": {"priority": 10},
                                        "task": "c1-30/c3"},
                          id="m-73", frm="forager-07", to="queen", ref="c1-30.3")),
    ("task.called, the child ended", Message("task.called", {
        "child": "c1-30/c3", "state": "completed", "final": {
            "result": "short", "task": "c1-30/c3", "state": "completed", "attempt": 1,
            "seq": 1}}, id="q-73", frm="queen", to="forager-07", ref="m-73")),
    ("task.steps, the records of a re-run in slices", Message("task.steps", {
        "task": "c1-30", "total": 2, "from": 1, "steps": [
            {"position": 1, "kind": "sleep", "name": "sleep", "occurrence": 1,
             "seconds": 60.0, "until": 1312284160.0}]}, id="q-74", frm="queen",
        to="forager-07", ref="c1-30.3")),
    # Schedules (kinds 80-81)
    ("schedule add: every 15 minutes in a time zone, ticks that overlap skipped",
     Message("schedule", {"op": "add", "name": "digest", "cron": "*/15 * * * *",
                          "tz": "Europe/Paris", "capability": "summarise",
                          "payload": {"feed": "news"}, "overlap": "skip",
                          "catch_up": "latest", "options": {"priority": 20}},
             id="c1-80", frm="client-1", to="queen")),
    ("schedule.reply to a trigger: the task it submitted", Message("schedule.reply", {
        "op": "trigger", "task": "digest.q-81", "schedule": {
            "name": "digest", "cron": "*/15 * * * *", "tz": "Europe/Paris",
            "capability": "summarise", "payload": {"feed": "news"}, "overlap": "skip",
            "catch_up": "latest", "options": {"priority": 20}, "paused": False,
            "next": 1312285500.0, "last_tick": 1312284600.0, "last_task": "digest.q-81",
            "queued": 0, "fired": 3, "skipped": 0, "created": 1312282800.0,
            "by": "client-1"}}, id="q-81", frm="queen", to="client-1", ref="c1-81")),
]

LEGACY_LINES = [
    '{"v":"1.1","id":"q-00a1","from":"queen","to":"forager-07","kind":"task.assign",'
    '"ts":1312284100,"body":{"node":"tg:crawl-index/3","deadline":1312284400}}',
    '{"v":"1.1","id":"m-4f91c2","from":"forager-07","to":"queen","kind":"task.accept",'
    '"ref":"q-00a1","ts":1312284101}',
    '{"v":"1.1","id":"m-4f91c3","from":"forager-07","to":"queen","kind":"task.result",'
    '"ref":"q-00a1","ts":1312284180,"body":{"status":"ok","artifacts":["cm://index/3"]}}',
    '{"v":"1.1","id":"m-9","from":"forager-07","to":"queen","kind":"hb","ts":1312284190,'
    '"body":{"slots":1,"tools":["echo"],"load":0.2},"colour":"unknown fields survive"}',
]

# Each wrong in exactly one way; shared with the conformance kit, which sends them.
ERRORS = DECODE_CASES


def main() -> None:
    vectors = []
    for desc, m in BINARY:
        frames = binary.encode(m)
        vectors.append({"description": desc, "codec": "iacp2",
                        "frames_hex": [bytes(f).hex() for f in frames],
                        "message": message_json(m)})
    for line in LEGACY_LINES:
        m = legacy.decode(line.encode())
        vectors.append({"description": f"IACP 1.1 {m.kind}", "codec": "iacp1.1",
                        "frames_hex": [line.encode().hex()], "message": message_json(m)})
    (HERE / "messages.json").write_text(json.dumps(vectors, indent=1) + "\n")
    errors = [{"description": d, "frames_hex": [f.hex() for f in fr], "code": code}
              for d, fr, code in ERRORS]
    (HERE / "errors.json").write_text(json.dumps(errors, indent=1) + "\n")


if __name__ == "__main__":
    main()
