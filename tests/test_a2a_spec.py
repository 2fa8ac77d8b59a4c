"""``meshant a2a`` to the letter of A2A 1.0: the pieces without a colony (the push
guard and its delivery against a receiver on loopback, the task book and its ListTasks
pages, payloads with files, the card's validators), then a colony with gateways driven
as a client would (raw JSON-RPC and HTTP+JSON over httpx, the official SDK client).
Every process is a CLI subprocess, stopped by PID in teardown; every server a thread
stopped in teardown."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a")

from a2a.types.a2a_pb2 import ListTasksRequest, Message, Part, Role, TaskState
from a2a.utils.errors import InvalidParamsError

from meshant import Client
from meshant.errors import ConfigError
from meshant.gateways.a2a import payload_of, takes_files
from meshant.gateways.a2a_push import Pusher, PushPolicy, PushRefused
from meshant.gateways.a2a_tasks import TaskBook
from meshant.gateways.colony import OPERATOR, Caller, read_token_file

from .conftest import Procs, wait_for

APP = "tests.gateway_app:forager"
V = {"A2A-Version": "1.0"}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# -- the push guard -------------------------------------------------------------------------

INWARD = ["http://127.0.0.1/x", "http://10.1.2.3/x", "http://172.16.0.9/x",
          "http://192.168.1.1/x", "http://169.254.169.254/latest/meta-data",
          "http://[::1]/x", "http://[fc00::1]/x", "http://[::ffff:127.0.0.1]/x",
          "http://0.0.0.0/x", "http://100.64.0.1/x", "http://[fe80::1]/x"]


@pytest.mark.parametrize("url", INWARD)
def test_the_push_guard_refuses_inward_addresses_unless_their_network_is_allowed(
        url: str) -> None:
    anywhere = PushPolicy.of(["*"], [])
    why = anywhere.refuse(url)
    assert why is not None and "not a public address" in why
    with pytest.raises(PushRefused, match="not a public address"):
        run(anywhere.addresses(url))
    # (An IPv4-mapped IPv6 address is judged as the IPv4 address it carries.)
    assert PushPolicy.of(["*"], ["0.0.0.0/0", "::/0"]).refuse(url) is None


def test_the_push_guard_allows_only_the_hosts_it_was_given() -> None:
    p = PushPolicy.of(["hooks.example.com", "*.example.org"], [])
    assert p.refuse("https://hooks.example.com/a") is None
    assert p.refuse("https://a.b.example.org/a") is None
    for url, why in (("https://example.org/a", "not allowed here"),
                     ("https://evil.example.com/a", "not allowed here"),
                     ("ftp://hooks.example.com/a", "not http"),
                     ("https://u:p@hooks.example.com/a", "no credentials"),
                     ("https:///a", "names no host"),
                     ("https://hooks.example.com:99999/a", "cannot be parsed")):
        got = p.refuse(url)
        assert got is not None and why in got, (url, got)
    off = PushPolicy.of([], [])
    assert not off.enabled and "no --push-host" in str(off.refuse("https://x.example/"))


def test_a_name_that_resolves_inward_is_refused_when_it_is_sent() -> None:
    """DNS answers when the notification goes: 'localhost' passes the name check but
    its address (loopback) is refused unless a network holds it."""
    named = PushPolicy.of(["localhost"], [])
    assert named.refuse("http://localhost:9/x") is None
    with pytest.raises(PushRefused, match="resolves to"):
        run(named.addresses("http://localhost:9/x"))
    allowed = PushPolicy.of(["localhost"], ["127.0.0.0/8", "::1/128"])
    assert run(allowed.addresses("http://localhost:9/x"))


def test_push_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="--push-host 'a b'"):
        PushPolicy.of(["a b"], [])
    with pytest.raises(ConfigError, match="--push-host"):
        PushPolicy.of(["*.*.example.com"], [])
    with pytest.raises(ConfigError, match="--push-network 'nope'"):
        PushPolicy.of(["*"], ["nope"])
    with pytest.raises(ConfigError, match="give --push-host too"):
        PushPolicy.of([], ["127.0.0.0/8"])


class Receiver:
    """A webhook receiver on loopback: answers each POST with the next status of
    ``statuses`` (then 200) and keeps what it got."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.got: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.got.append({"path": self.path, "status": status,
                                         "headers": {k.lower(): v for k, v in
                                                     self.headers.items()},
                                         "body": json.loads(body) if body else None})
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


LOOPBACK = PushPolicy.of(["127.0.0.1", "localhost"], ["127.0.0.0/8", "::1/128"])


def test_delivery_retries_with_backoff_then_succeeds(receiver: Receiver) -> None:
    receiver.statuses = [500, 503, 429]
    p = Pusher(LOOPBACK, attempts=4, backoff=0.01)
    ok = run(p.send(receiver.url("localhost"), b'{"task": {}}', {"Authorization": "Bearer t"}))
    assert ok and [g["status"] for g in receiver.got] == [500, 503, 429, 200]
    last = receiver.got[-1]
    assert last["headers"]["authorization"] == "Bearer t"
    assert last["headers"]["host"] == f"localhost:{receiver.port}"  # the name, not the IP
    assert last["headers"]["content-type"] == "application/json"
    run(p.close())


def test_delivery_gives_up_on_a_refusal_a_redirect_or_too_many_failures(
        receiver: Receiver) -> None:
    p = Pusher(LOOPBACK, attempts=3, backoff=0.01)
    receiver.statuses = [400]
    assert not run(p.send(receiver.url(), b"{}", {}))
    assert len(receiver.got) == 1  # a 4xx is the receiver's verdict: not sent again
    receiver.statuses = [302]  # a redirect is not followed (it could point anywhere)
    assert not run(p.send(receiver.url(), b"{}", {}))
    assert len(receiver.got) == 2
    receiver.statuses = [500, 500, 500]
    assert not run(p.send(receiver.url(), b"{}", {}))
    assert len(receiver.got) == 5 and p.failed == 3 and p.sent == 0
    run(p.close())


def test_delivery_to_loopback_is_refused_when_loopback_is_not_allowed(
        receiver: Receiver) -> None:
    p = Pusher(PushPolicy.of(["localhost", "127.0.0.1"], []), attempts=3, backoff=0.01)
    assert not run(p.send(receiver.url("localhost"), b"{}", {}))
    assert not run(p.send(receiver.url("127.0.0.1"), b"{}", {}))
    assert receiver.got == []  # nothing reached the receiver
    run(p.close())


# -- the task book and ListTasks ------------------------------------------------------------

def _msg(text: str, mid: str | None = None) -> Message:
    return Message(message_id=mid or str(uuid.uuid4()), role=Role.ROLE_USER,
                   parts=[Part(text=text)])


ALICE, BOB = ("alice", None), ("bob", None)


def _book(n: int = 7) -> TaskBook:
    book = TaskBook()
    for i in range(n):
        book.open(f"t{i}", "ctx-a" if i % 2 else "ctx-b", "echo", ALICE if i < 5 else BOB,
                  _msg(f"m{i}"), 1000.0 + i)
    return book


def test_list_tasks_pages_newest_first_through_a_cursor() -> None:
    book = _book()
    book.status("t1", TaskState.TASK_STATE_COMPLETED, None, 2000.0)  # t1 changed last
    seen, token, pages = [], "", 0
    while True:
        page, token, size, total = book.page(ListTasksRequest(page_size=2, page_token=token),
                                             ALICE)
        assert size == 2 and total == 5
        seen += [r.task_id for r in page]
        pages += 1
        if not token:
            break
    assert seen == ["t1", "t4", "t3", "t2", "t0"] and pages == 3


def test_list_tasks_filters_and_scopes() -> None:
    book = _book()
    book.status("t3", TaskState.TASK_STATE_WORKING, None, 1500.0)
    q = ListTasksRequest(context_id="ctx-a")
    assert [r.task_id for r in book.page(q, ALICE)[0]] == ["t3", "t1"]
    assert [r.task_id for r in book.page(q, BOB)[0]] == ["t5"]
    assert [r.task_id for r in book.page(q, None)[0]] == ["t3", "t5", "t1"]  # operator
    q = ListTasksRequest(status=TaskState.TASK_STATE_WORKING)
    assert [r.task_id for r in book.page(q, ALICE)[0]] == ["t3"]
    q = ListTasksRequest()
    q.status_timestamp_after.FromNanoseconds(int(1003.5e9))
    assert [r.task_id for r in book.page(q, ALICE)[0]] == ["t3", "t4"]
    page, token, _, total = book.page(ListTasksRequest(), ("carol", None))
    assert page == [] and token == "" and total == 0


def test_list_tasks_refuses_a_bad_page() -> None:
    book = _book()
    for q, why in ((ListTasksRequest(page_size=0), "minimum page size"),
                   (ListTasksRequest(page_size=101), "maximum page size"),
                   (ListTasksRequest(page_token="not-a-cursor"), "pageToken")):
        with pytest.raises(InvalidParamsError, match=why):
            book.page(q, ALICE)


def test_the_book_keeps_questions_and_answers_in_order_and_forgets_the_oldest() -> None:
    book = TaskBook(max_tasks=3)
    book.open("t", "c", "greet", ALICE, _msg("hi", "u1"), 1.0)
    ask = Message(message_id="q1", role=Role.ROLE_AGENT, parts=[Part(text="name?")])
    book.status("t", TaskState.TASK_STATE_WORKING, None, 2.0)
    book.status("t", TaskState.TASK_STATE_INPUT_REQUIRED, ask, 3.0)
    rec = book.get("t")
    assert rec is not None and [m.message_id for m in rec.history] == ["u1"]
    assert rec.task().status.message.message_id == "q1"
    book.said("t", _msg("Ada", "u2"), 4.0)
    book.status("t", TaskState.TASK_STATE_COMPLETED, None, 5.0)
    book.status("t", TaskState.TASK_STATE_WORKING, None, 6.0)  # late: changes nothing
    t = book.get("t")
    assert t is not None and [m.message_id for m in t.history] == ["u1", "q1", "u2"]
    assert t.state == TaskState.TASK_STATE_COMPLETED and t.updated == 5.0
    assert t.task().status.timestamp.ToNanoseconds() == int(5e9)
    for i in range(3):
        book.open(f"n{i}", "c", "echo", ALICE, None, 10.0 + i)
    assert book.get("t") is None and len(book) == 3
    small = TaskBook(max_bytes=2000)
    for i in range(20):
        small.open(f"b{i}", "c", "echo", ALICE, _msg("x" * 200), float(i))
    assert 0 < len(small) < 20 and small.get("b19") is not None


# -- payloads, cards, callers ---------------------------------------------------------------

REQUESTS = [
    ("SendMessageRequest", {}),
    ("SendMessageRequest", {"message": {"role": "ROLE_USER", "parts": []}}),
    ("SendMessageRequest", {"message": {"messageId": "m", "parts": [{"text": "x"}]},
                            "configuration": {"taskPushNotificationConfig": {
                                "authentication": {}}}}),
    ("SendMessageRequest", {"message": {"messageId": "m", "role": "ROLE_USER",
                                        "parts": [{"data": {"a": [1, {"b": None}]}}]}}),
    ("GetTaskRequest", {}), ("GetTaskRequest", {"id": "x"}), ("ListTasksRequest", {}),
    ("TaskPushNotificationConfig", {}), ("TaskPushNotificationConfig", {"url": "u"}),
    ("CancelTaskRequest", {}), ("SubscribeToTaskRequest", {}),
    ("GetTaskPushNotificationConfigRequest", {}),
    ("DeleteTaskPushNotificationConfigRequest", {"taskId": "t"}),
    ("ListTaskPushNotificationConfigsRequest", {}),
]


@pytest.mark.parametrize(("kind", "body"), REQUESTS)
def test_requests_are_checked_as_the_sdk_checks_them(kind: str, body: dict[str, Any]) -> None:
    """The gateway's check of REQUIRED fields (read from the descriptors once) finds
    exactly what the SDK's own validate_proto_required_fields finds."""
    from a2a.types import a2a_pb2
    from a2a.utils.proto_utils import validate_proto_required_fields
    from google.protobuf.json_format import ParseDict

    from meshant.gateways.a2a import _checked

    msg = ParseDict(body, getattr(a2a_pb2, kind)())
    try:
        validate_proto_required_fields(msg)
        sdk: list[dict[str, str]] = []
    except InvalidParamsError as e:
        sdk = (e.data or {})["errors"]
    try:
        _checked(msg)
        mine: list[dict[str, str]] = []
    except InvalidParamsError as e:
        mine = (e.data or {})["errors"]
        assert all(x["field"] in e.message for x in mine)  # the message names them
    assert sorted(map(str, mine)) == sorted(map(str, sdk))

def test_file_parts_are_the_payload_as_bytes() -> None:
    one = Message(message_id="m", role=Role.ROLE_USER,
                  parts=[Part(raw=b"\x00\x01", media_type="image/png")])
    assert payload_of(one) == b"\x00\x01"
    mixed = Message(message_id="m", role=Role.ROLE_USER, parts=[
        Part(text="look"), Part(raw=b"abc", media_type="text/plain", filename="a.txt"),
        Part(url="https://example.com/f.pdf")])
    assert payload_of(mixed) == ["look", {"raw": b"abc", "mediaType": "text/plain",
                                          "filename": "a.txt"},
                                 {"url": "https://example.com/f.pdf"}]
    empty = Message(message_id="m", role=Role.ROLE_USER, parts=[Part()])
    with pytest.raises(InvalidParamsError, match=r"part 0 .* no content"):
        payload_of(empty)
    assert takes_files({}) and takes_files({"payload": {"type": "string"}})
    assert not takes_files({"payload": {"type": "object"}})


def test_token_file_operators(tmp_path: Path) -> None:
    from meshant.adapters.security import generate

    _, ops_key = generate(tmp_path / "keys", "ops", ("admin",))
    _, cli_key = generate(tmp_path / "keys", "cli", ("client",))
    f = tmp_path / "tokens"
    f.write_text(f"{'a' * 20} alice operator\n{'o' * 20} ops {ops_key}\n"
                 f"{'c' * 20} cli {cli_key}\n{'r' * 20} reader read\n")
    tokens = read_token_file(str(f))
    assert tokens["a" * 20] == Caller("alice", None, OPERATOR)
    assert tokens["o" * 20].operator  # an admin key is an operator at the queen too
    assert not tokens["c" * 20].operator and tokens["c" * 20].may_act
    assert not tokens["r" * 20].may_act and not tokens["r" * 20].operator
    f.write_text(f"{'a' * 20} alice {cli_key} sudo\n")
    with pytest.raises(ValueError, match="'sudo' is not a right"):
        read_token_file(str(f))


# -- a colony with gateways ----------------------------------------------------------------

class Edge:
    """A CLI queen, a forager serving tests/gateway_app.py, gateways on demand."""

    def __init__(self, procs: Procs) -> None:
        self.procs = procs
        _, self.queen = procs.queen()
        procs.forager(self.queen, "--app", APP, "--slots", "8")

    def a2a(self, *extra: str) -> tuple[str, dict[str, Any]]:
        _, info = self.procs.start("a2a", "--queen", self.queen, "--listen", "127.0.0.1:0",
                                   "--json", "--refresh", "0.2", *extra)
        return str(info["a2a"]).rstrip("/"), info

    def submitted(self) -> int:
        with Client(self.queen) as c:
            return int(c.status()["counters"]["submitted"])


@pytest.fixture
def edge(procs: Procs) -> Edge:
    return Edge(procs)


def rpc(url: str, method: str, params: dict[str, Any], token: str | None = None,
        **kw: Any) -> dict[str, Any]:
    headers = {**V, **({"Authorization": f"Bearer {token}"} if token else {})}
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                              "params": params}, headers=headers, timeout=30, **kw)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def message(payload: Any, skill: str | None = None, **fields: Any) -> dict[str, Any]:
    part = {"text": payload} if isinstance(payload, str) else {"data": payload}
    m: dict[str, Any] = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER",
                         "parts": [part], **fields}
    if skill:
        m["metadata"] = {"skill": skill}
    return m


@pytest.mark.slow
def test_malformed_requests_are_errors_and_run_nothing(edge: Edge) -> None:
    """CORE-ERR-002: a SendMessage without a message, or a message missing what the spec
    requires, or a body that is not JSON, is an error naming what is wrong; no task is
    submitted (the queen's counter stays where it was)."""
    url, _ = edge.a2a()
    before = edge.submitted()
    cases = [({}, "message: Field is required"),
             ({"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}},
              "message.message_id"),
             ({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}},
              "message.parts"),
             ({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{}]}},
              "no content"),
             ({"message": message("x"), "configuration": {"historyLength": -1}},
              "history length")]
    for params, why in cases:
        for target in (url + "/agents/echo", url + "/agents/echo/"):
            err = rpc(target, "SendMessage", params)["error"]
            assert err["code"] == -32602 and why in err["message"], (params, err)
        r = httpx.post(url + "/agents/echo/rest/message:send", json=params, headers=V,
                       timeout=30)
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    # A body that says it is not JSON: ContentTypeNotSupported (-32005; 415 on REST).
    r = httpx.post(url + "/agents/echo", content=b"{}", timeout=30,
                   headers={**V, "Content-Type": "text/plain"})
    assert r.json()["error"]["code"] == -32005
    r = httpx.post(url + "/agents/echo/rest/message:send", content=b"{}", timeout=30,
                   headers={**V, "Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    assert edge.submitted() == before
    # The same path with a good message runs, with and without the slash.
    for target in (url + "/agents/echo", url + "/agents/echo/"):
        task = rpc(target, "SendMessage", {"message": message("hi")})["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert edge.submitted() == before + 2
    r = httpx.post(url + "/agents/echo/rest/message:send", json={"message": message("hi")},
                   headers=V, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"


@pytest.mark.slow
def test_the_card_has_validators_and_names_the_colony(edge: Edge) -> None:
    url, info = edge.a2a()
    assert info["colony"] == "default"
    for path in ("/.well-known/agent-card.json", "/agents/echo/.well-known/agent-card.json"):
        r = httpx.get(url + path, timeout=10)
        card = r.json()
        assert card["name"] in ("default", "default/echo"), card["name"]
        assert card["capabilities"]["pushNotifications"] is False  # no --push-host
        etag, modified = r.headers["etag"], r.headers["last-modified"]
        assert etag.startswith('W/"') and r.headers["cache-control"] == "max-age=1"
        assert httpx.get(url + path, headers={"If-None-Match": etag},
                         timeout=10).status_code == 304
        assert httpx.get(url + path, headers={"If-None-Match": '"other"'},
                         timeout=10).status_code == 200
        assert httpx.get(url + path, headers={"If-Modified-Since": modified},
                         timeout=10).status_code == 304
        assert httpx.get(url + path, headers={"If-Modified-Since": "not a date"},
                         timeout=10).status_code == 200
    # The card changes when the capabilities do: a new ETag, a later Last-Modified.
    first = httpx.get(url + "/.well-known/agent-card.json", timeout=10)
    edge.procs.forager(edge.queen, "--name", "builtins")  # echo, sleep, fail, stream

    def changed() -> bool:
        r = httpx.get(url + "/.well-known/agent-card.json", timeout=10)
        return r.headers["etag"] != first.headers["etag"]
    wait_for(changed, 15, "the card to list the new forager's capabilities")
    r = httpx.get(url + "/.well-known/agent-card.json",
                  headers={"If-None-Match": first.headers["etag"]}, timeout=10)
    assert r.status_code == 200 and "fail" in {s["id"] for s in r.json()["skills"]}


@pytest.mark.slow
def test_files_travel_as_bytes_and_failures_name_their_exception(edge: Edge) -> None:
    url, _ = edge.a2a()
    raw = {"raw": "AAEC/w==", "mediaType": "image/png", "filename": "p.png"}
    m = {"messageId": "f1", "role": "ROLE_USER", "parts": [raw]}
    task = rpc(url + "/agents/echo", "SendMessage", {"message": m})["result"]["task"]
    [part] = task["artifacts"][-1]["parts"]
    assert part == {"raw": "AAEC/w==", "mediaType": "application/octet-stream"}
    # A capability whose schema takes JSON only: ContentTypeNotSupported, and no task.
    before = edge.submitted()
    err = rpc(url + "/agents/add", "SendMessage", {"message": m})["error"]
    assert err["code"] == -32005 and "'add' takes JSON" in err["message"]
    assert edge.submitted() == before
    card = httpx.get(url + "/.well-known/agent-card.json", timeout=10).json()
    modes = {s["id"]: s["inputModes"] for s in card["skills"]}
    assert "application/octet-stream" in modes["echo"]
    assert "application/octet-stream" not in modes["add"]
    # A handler's exception: its type is in the failure (text and metadata).
    task = rpc(url + "/agents/explode", "SendMessage",
               {"message": message("boom")})["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    msg = task["status"]["message"]
    assert msg["parts"][0]["text"] == "handler-error: ValueError: boom"
    assert msg["metadata"] == {"code": "handler-error", "type": "ValueError"}


@pytest.mark.slow
def test_contexts_history_and_timestamps(edge: Edge) -> None:
    url, _ = edge.a2a()
    t0 = time.time()
    sent = message({}, contextId="conv-1")
    task = rpc(url + "/agents/greet", "SendMessage", {
        "message": sent, "configuration": {"historyLength": 10}})["result"]["task"]
    tid = task["id"]
    assert task["contextId"] == "conv-1" and task["status"]["state"] == \
        "TASK_STATE_INPUT_REQUIRED"
    assert [h["messageId"] for h in task["history"]] == [sent["messageId"]]
    # (Without a historyLength, the reply to a message does not send it back.)
    again = rpc(url + "/agents/echo", "SendMessage", {"message": message("x")})["result"]
    assert "history" not in again["task"]
    # A message naming the task with another context is refused; with none, inferred.
    err = rpc(url + "/agents/greet", "SendMessage", {"message": message(
        "Ada", taskId=tid, contextId="conv-2")})["error"]
    assert err["code"] == -32602 and "conv-1" in err["message"]
    answer = message("Ada", taskId=tid)
    done = rpc(url + "/agents/greet", "SendMessage", {"message": answer})["result"]["task"]
    assert done["contextId"] == "conv-1" and done["status"]["state"] == \
        "TASK_STATE_COMPLETED"
    # The history: what was said, in order: the message, the question, the answer.
    got = rpc(url + "/", "GetTask", {"id": tid})["result"]
    hist = got["history"]
    assert [h["role"] for h in hist] == ["ROLE_USER", "ROLE_AGENT", "ROLE_USER"]
    assert hist[0]["messageId"] == sent["messageId"] and hist[2]["messageId"] == \
        answer["messageId"]
    assert hist[1]["parts"][0]["text"] == "What is your name?"
    assert rpc(url + "/", "GetTask", {"id": tid, "historyLength": 1})["result"][
        "history"] == [hist[2]]
    assert "history" not in rpc(url + "/", "GetTask", {"id": tid, "historyLength": 0})[
        "result"]
    # Status timestamps: ISO 8601 UTC, when the state began.
    from datetime import datetime

    stamp = datetime.fromisoformat(got["status"]["timestamp"].replace("Z", "+00:00"))
    assert t0 - 5 <= stamp.timestamp() <= time.time() + 5
    # A task that ended takes no more messages (UnsupportedOperationError, -32004).
    err = rpc(url + "/agents/greet", "SendMessage", {"message": message(
        "again", taskId=tid)})["error"]
    assert err["code"] == -32004 and "completed" in err["message"]


@pytest.mark.slow
def test_list_tasks_is_scoped_paged_and_ordered(edge: Edge, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    alice, bob, ops = "a" * 24, "b" * 24, "o" * 24
    tokens.write_text(f"{alice} alice\n{bob} bob\n{ops} ops operator\n")
    url, _ = edge.a2a("--token-file", str(tokens))
    mine = [rpc(url + "/agents/echo", "SendMessage", {"message": message(f"a{i}")},
                alice)["result"]["task"]["id"] for i in range(5)]
    held = rpc(url + "/agents/hold", "SendMessage", {
        "message": message(30), "configuration": {"returnImmediately": True}},
        alice)["result"]["task"]["id"]
    theirs = rpc(url + "/agents/echo", "SendMessage", {"message": message("b")},
                 bob)["result"]["task"]["id"]
    with Client(edge.queen) as c:
        wait_for(lambda: c.task_status(held)["state"] == "accepted", 10, "hold to run")
    # Alice's, newest first, two a page, through the cursor; nextPageToken "" at the end.
    seen, token = [], ""
    while True:
        r = rpc(url + "/", "ListTasks", {"pageSize": 2, "pageToken": token}, alice)
        page = r["result"]
        assert page["totalSize"] == 6 and "artifacts" not in json.dumps(page["tasks"])
        seen += [t["id"] for t in page["tasks"]]
        token = page["nextPageToken"]
        if not token:
            break
    assert seen == [held, *reversed(mine)]
    stamps = [t["status"]["timestamp"] for t in rpc(url + "/", "ListTasks", {}, alice)[
        "result"]["tasks"]]
    assert stamps == sorted(stamps, reverse=True)
    # Filters: state; artifacts only when asked for; Bob sees his own; ops sees all.
    working = rpc(url + "/", "ListTasks", {"status": "TASK_STATE_WORKING"}, alice)["result"]
    assert [t["id"] for t in working["tasks"]] == [held]
    full = rpc(url + "/", "ListTasks", {"includeArtifacts": True, "pageSize": 1,
                                        "status": "TASK_STATE_COMPLETED"}, alice)["result"]
    assert [p["text"] for p in full["tasks"][0]["artifacts"][-1]["parts"]] == ["a4"]
    assert [t["id"] for t in rpc(url + "/", "ListTasks", {}, bob)["result"]["tasks"]] == \
        [theirs]
    everyone = rpc(url + "/", "ListTasks", {}, ops)["result"]
    assert everyone["totalSize"] == 7 and theirs in {t["id"] for t in everyone["tasks"]}
    r = httpx.get(url + "/rest/tasks", params={"pageSize": 2},
                  headers={**V, "Authorization": f"Bearer {bob}"}, timeout=30)
    assert r.status_code == 200 and [t["id"] for t in r.json()["tasks"]] == [theirs]
    assert rpc(url + "/", "ListTasks", {"pageToken": "garbage"}, alice)["error"][
        "code"] == -32602
    rpc(url + "/", "CancelTask", {"id": held}, alice)


@pytest.mark.slow
def test_push_notifications_deliver_to_loopback_only_when_allowed(
        edge: Edge, receiver: Receiver) -> None:
    """A webhook on this machine gets each of a task's events in order, with its
    credentials, when the gateway allows loopback; a gateway that does not refuses the
    config and sends nothing."""
    guarded, _ = edge.a2a("--push-host", "127.0.0.1")
    card = httpx.get(guarded + "/.well-known/agent-card.json", timeout=10).json()
    assert card["capabilities"]["pushNotifications"] is True
    cfg = {"url": receiver.url(), "authentication": {"scheme": "Bearer",
                                                      "credentials": "hook-secret"}}
    before = edge.submitted()
    err = rpc(guarded + "/agents/greet", "SendMessage", {
        "message": message({}), "configuration": {"taskPushNotificationConfig": cfg}})[
        "error"]
    assert err["code"] == -32602 and "not a public address" in err["message"]
    assert edge.submitted() == before  # refused before anything ran

    url, _ = edge.a2a("--push-host", "127.0.0.1", "--push-network", "127.0.0.0/8")
    task = rpc(url + "/agents/greet", "SendMessage", {
        "message": message({}), "configuration": {"taskPushNotificationConfig": cfg}})[
        "result"]["task"]
    tid = task["id"]
    wait_for(lambda: receiver.got, 15, "the question's notification")
    rpc(url + "/agents/greet", "SendMessage", {"message": message("Ada", taskId=tid)})

    def states() -> list[str]:
        return [g["body"].get("statusUpdate", {}).get("status", {}).get("state", "artifact")
                for g in receiver.got]
    wait_for(lambda: "TASK_STATE_COMPLETED" in states(), 15, "the end's notification")
    assert states() == ["TASK_STATE_INPUT_REQUIRED", "artifact", "TASK_STATE_COMPLETED"]
    assert all(g["headers"]["authorization"] == "Bearer hook-secret" for g in receiver.got)
    assert receiver.got[1]["body"]["artifactUpdate"]["artifact"]["parts"] == [
        {"text": "hello, Ada"}]
    # The config's own operations: get, list, delete (twice: the same end), then gone.
    made = rpc(url + "/", "CreateTaskPushNotificationConfig",
               {"taskId": tid, "id": "c2", "url": receiver.url(path="/two")})["result"]
    assert made["id"] == "c2" and made["taskId"] == tid
    listed = rpc(url + "/", "ListTaskPushNotificationConfigs", {"taskId": tid})["result"]
    assert {c["id"] for c in listed["configs"]} >= {"c2"}
    assert rpc(url + "/", "GetTaskPushNotificationConfig", {"taskId": tid, "id": "c2"})[
        "result"]["url"].endswith("/two")
    for _ in range(2):
        assert "error" not in rpc(url + "/", "DeleteTaskPushNotificationConfig",
                                  {"taskId": tid, "id": "c2"})
    assert rpc(url + "/", "GetTaskPushNotificationConfig", {"taskId": tid, "id": "c2"})[
        "error"]["code"] == -32001
    assert rpc(url + "/", "CreateTaskPushNotificationConfig",
               {"taskId": "no-such-task", "url": receiver.url()})["error"]["code"] == -32001
    # Without --push-host: PushNotificationNotSupported (-32003).
    plain, _ = edge.a2a()
    assert rpc(plain + "/", "CreateTaskPushNotificationConfig",
               {"taskId": tid, "url": receiver.url()})["error"]["code"] == -32003


@pytest.mark.slow
def test_a_wrapped_agent_takes_and_gives_files(procs: Procs) -> None:
    """meshant forager --a2a in front of the SDK's echo agent: a bytes payload goes as a
    file part and the agent's file comes back as bytes."""
    import subprocess
    import sys

    from meshant.apps import _procs

    agent = subprocess.Popen([sys.executable, str(Path(__file__).parent / "sdk_a2a_agent.py"),
                              "--echo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    procs.all.append(agent)
    url = _procs.read_json_line(agent, 30)["url"]
    _, queen = procs.queen()
    procs.forager(queen, "--a2a", url)
    with Client(queen) as c:
        assert c.run("echo", b"\x00\xffbinary", result_timeout=30) == b"\x00\xffbinary"
        assert c.run("echo", {"a": 1}, result_timeout=30) == {"a": 1}
