"""The colony at the agent ecosystem's edge, end to end: ``meshant a2a`` driven by the
official a2a-sdk client, ``meshant mcp`` by the official mcp client (stdio and HTTP),
``meshant forager --mcp`` / ``--a2a`` wrapping a server and an agent written with those
SDKs. Every process is a CLI subprocess, stopped by PID in teardown."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshant import Client
from meshant.apps import _procs
from meshant.gateways.colony import Caller, Callers, catalog_of, check_payload, read_token_file

from .conftest import Procs, wait_for

HERE = Path(__file__).parent
APP = "tests.gateway_app:forager"


# -- pieces without a colony -------------------------------------------------------------

def test_catalog_merges_active_foragers_and_descriptions() -> None:
    cat = catalog_of([
        {"state": "active", "tools": ["a", "b"], "describe": {"a": {"description": "A."}}},
        {"state": "draining", "tools": ["c"]},
        {"state": "active", "tools": ["b"], "describe": {"b": {"description": "B."}}},
    ])
    assert cat == {"a": {"description": "A."}, "b": {"description": "B."}}


def test_payloads_are_checked_against_the_schema() -> None:
    about = {"payload": {"type": "object", "required": ["a"],
                         "properties": {"a": {"type": "integer"}}}}
    assert check_payload("add", about, {"a": 1}) is None
    why = check_payload("add", about, {"a": "x"})
    assert why is not None and "at a" in why
    assert check_payload("free", {}, object()) is None


def test_token_file(tmp_path: Path) -> None:
    key = tmp_path / "alice.key_secret"
    key.write_text("x")
    f = tmp_path / "tokens"
    f.write_text(f"# who\n{'a' * 20} alice {key}\n{'b' * 20} bob read\n")
    tokens = read_token_file(str(f))
    assert tokens["a" * 20] == Caller("alice", str(key), "act")
    assert tokens["b" * 20] == Caller("bob", None, "read")
    callers = Callers(tokens, None)
    assert callers.resolve("b" * 20) == Caller("bob", None, "read")
    assert callers.resolve("nope") is None and callers.resolve("") is None
    f.write_text("short bob\n")
    with pytest.raises(ValueError, match="16 characters"):
        read_token_file(str(f))


def test_no_sdk_is_imported_unless_a_gateway_runs() -> None:
    code = ("import sys, meshant, meshant.cli; "
            "from click.testing import CliRunner; "
            "CliRunner().invoke(meshant.cli.main, ['a2a', '--help']); "
            "CliRunner().invoke(meshant.cli.main, ['mcp', '--help']); "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('a2a', 'mcp', 'mcp_types', 'starlette', 'uvicorn')]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


# -- a colony with gateways --------------------------------------------------------------

class Edge:
    """A CLI queen, a forager serving tests/gateway_app.py, and gateways on demand."""

    def __init__(self, procs: Procs, queen_args: tuple[str, ...] = ()) -> None:
        self.procs = procs
        _, self.queen = procs.queen(*queen_args)
        self.forager, _ = procs.forager(self.queen, "--app", APP, "--slots", "8")

    def a2a(self, *extra: str, queen: str | None = None) -> tuple[subprocess.Popen[str], str]:
        p, info = self.procs.start("a2a", "--queen", queen or self.queen, "--listen",
                                   "127.0.0.1:0", "--json", "--refresh", "0.2", *extra)
        return p, str(info["a2a"]).rstrip("/")

    def mcp_http(self, *extra: str) -> tuple[subprocess.Popen[str], str]:
        p, info = self.procs.start("mcp", "--queen", self.queen, "--listen", "127.0.0.1:0",
                                   "--json", "--refresh", "0.2", *extra)
        return p, str(info["mcp"])


@pytest.fixture
def edge(procs: Procs) -> Edge:
    return Edge(procs)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# -- A2A -----------------------------------------------------------------------------------

a2a = pytest.importorskip("a2a")


def _msg(payload: Any, skill: str | None = None, task_id: str = "") -> Any:
    from a2a.types.a2a_pb2 import Message, Role

    from meshant.gateways.a2a import parts_of

    m = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts_of(payload),
                task_id=task_id)
    if skill:
        m.metadata.update({"skill": skill})
    return m


async def _client(url: str, streaming: bool = True, token: str | None = None) -> Any:
    from a2a.client import ClientConfig, create_client

    http = httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}
                             if token else None)
    c = await create_client(url, ClientConfig(streaming=streaming, httpx_client=http))
    c._test_http = http  # closed by _close: the SDK leaves a given HTTP client open
    return c


async def _close(c: Any) -> None:
    await c.close()
    await c._test_http.aclose()


async def _send(url: str, payload: Any, skill: str | None = None, task_id: str = "",
                streaming: bool = False) -> list[Any]:
    from a2a.types.a2a_pb2 import SendMessageRequest

    c = await _client(url, streaming)
    try:
        return [ev async for ev in c.send_message(SendMessageRequest(
            message=_msg(payload, skill, task_id)))]
    finally:
        await _close(c)


def _data(parts: Any) -> Any:
    from google.protobuf.json_format import MessageToDict

    from meshant.gateways.a2a import _narrow

    for p in parts:
        if p.HasField("data"):
            return _narrow(MessageToDict(p.data))
    return "".join(p.text for p in parts)


@pytest.mark.slow
def test_a2a_card_send_stream_get_cancel(edge: Edge) -> None:
    from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, SendMessageRequest, TaskState

    _, url = edge.a2a()
    card = httpx.get(url + "/.well-known/agent-card.json", timeout=10).json()
    skills = {s["id"]: s for s in card["skills"]}
    assert set(skills) >= {"add", "echo", "greet", "words"}
    assert skills["add"]["description"].startswith("Add two integers.")
    assert card["capabilities"]["streaming"] is True
    one = httpx.get(url + "/agents/add/.well-known/agent-card.json", timeout=10).json()
    assert [s["id"] for s in one["skills"]] == ["add"]
    assert httpx.get(url + "/agents/nope/.well-known/agent-card.json",
                     timeout=10).status_code == 404

    # Blocking send: the task, completed, its result an artifact (a data part).
    [ev] = run(_send(url, {"a": 2, "b": 3}, "add"))
    assert ev.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert _data(ev.task.artifacts[-1].parts) == 5
    # A capability's own agent takes plain text.
    [ev] = run(_send(url + "/agents/echo", "plain words"))
    assert _data(ev.task.artifacts[-1].parts) == "plain words"

    # Streaming: the task, then each partial as an artifact in order, then completed.
    evs = run(_send(url, {"text": "one two three", "delay": 0.01}, "words", streaming=True))
    kinds = [e.WhichOneof("payload") for e in evs]
    assert kinds[0] == "task" and evs[-1].status_update.status.state == \
        TaskState.TASK_STATE_COMPLETED
    partials = [_data(e.artifact_update.artifact.parts) for e in evs
                if e.WhichOneof("payload") == "artifact_update"
                and e.artifact_update.artifact.name == "partial"]
    assert partials == ["one", "two", "three"]
    task_id = evs[0].task.id

    async def get_and_cancel() -> tuple[Any, Any]:
        c = await _client(url, streaming=False)
        try:
            got = await c.get_task(GetTaskRequest(id=task_id))
            sent = [e async for e in c.send_message(SendMessageRequest(
                message=_msg(30, "hold"), configuration={"return_immediately": True}))]
            hold_id = sent[0].task.id
            with Client(edge.queen) as mc:
                wait_for(lambda: mc.task_status(hold_id)["state"] == "accepted", 10,
                         "the hold task to run")
            cancelled = await c.cancel_task(CancelTaskRequest(id=hold_id))
            return got, cancelled
        finally:
            await _close(c)

    got, cancelled = run(get_and_cancel())
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert [_data(a.parts) for a in got.artifacts if a.name == "partial"] == \
        ["one", "two", "three"]
    assert _data(got.artifacts[-1].parts) == {"words": 3}
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED


@pytest.mark.slow
def test_a2a_bad_input_gets_protocol_errors_and_leaves_the_colony_untouched(
        edge: Edge) -> None:
    from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

    _, url = edge.a2a("--max-body", "4096")
    with Client(edge.queen) as c:
        before = c.status()["counters"]
    for payload, skill, why in (({"a": 1}, "add", "schema"), (1, "nope", "unknown skill"),
                                ("hi", None, "name the skill")):
        with pytest.raises(InvalidParamsError, match=why):
            run(_send(url, payload, skill))
    with pytest.raises(TaskNotFoundError):
        run(_send(url, "answer", task_id="no-such-task"))
    # Garbage JSON-RPC, a wrong method, an oversize body: JSON-RPC's own errors.
    r = httpx.post(url + "/", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json", "A2A-Version": "1.0"})
    assert r.json()["error"]["code"] == -32700
    r = httpx.post(url + "/", json={"jsonrpc": "2.0", "id": 1, "method": "Nope"}, timeout=10)
    assert r.json()["error"]["code"] == -32601
    big = {"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
           "params": {"message": {"parts": [{"text": "x" * 10_000}]}}}
    r = httpx.post(url + "/", json=big, timeout=10)
    assert r.status_code == 413
    # A page on another site, and a rebinding Host, are refused by the shared policy.
    assert httpx.get(url + "/.well-known/agent-card.json", timeout=10,
                     headers={"Host": "evil.example"}).status_code == 403
    with Client(edge.queen) as c:
        after = c.status()["counters"]
    assert after["submitted"] == before["submitted"]


@pytest.mark.slow
def test_a2a_input_required_answered_by_a_second_message(edge: Edge) -> None:
    from a2a.types.a2a_pb2 import TaskState

    _, url = edge.a2a()
    [ev] = run(_send(url, {}, "greet"))
    t = ev.task
    assert t.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert "What is your name?" in _data(t.status.message.parts)
    # The answer is the next message on the task; streamed this time.
    evs = run(_send(url, "Ada", task_id=t.id, streaming=True))
    assert evs[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    results = [e.artifact_update.artifact for e in evs
               if e.WhichOneof("payload") == "artifact_update"]
    assert _data(results[-1].parts) == "hello, Ada"
    # A message on a task that ended is refused (the spec's UnsupportedOperationError).
    from a2a.utils.errors import UnsupportedOperationError

    with pytest.raises(UnsupportedOperationError, match="ended takes no more messages"):
        run(_send(url, "again", task_id=t.id))


def _counted_stream(url: str, n: int, log: Path, stop_after: int | None = None,
                    at: tuple[int, Any] | None = None,
                    gate: tuple[int, Path] | None = None) -> tuple[str, list[int]]:
    """Stream a ``counted`` task; return its id and the partials read (leaving the
    stream after ``stop_after`` of them; calling ``at[1]()`` after ``at[0]``). With
    ``gate``, the task stops before partial ``gate[0]`` until file ``gate[1]`` exists."""
    from a2a.types.a2a_pb2 import SendMessageRequest

    payload: dict[str, Any] = {"n": n, "log": str(log), "delay": 0.1}
    if gate is not None:
        payload.update(gate_at=gate[0], gate=str(gate[1]))

    async def go() -> tuple[str, list[int]]:
        c = await _client(url)
        seen: list[int] = []
        task_id = ""
        try:
            async for ev in c.send_message(SendMessageRequest(message=_msg(
                    payload, "counted"))):
                if ev.WhichOneof("payload") == "task":
                    task_id = ev.task.id
                elif ev.WhichOneof("payload") == "artifact_update":
                    if ev.artifact_update.artifact.name == "partial":
                        seen.append(_data(ev.artifact_update.artifact.parts))
                    if at is not None and len(seen) == at[0]:
                        at[1]()
                    if stop_after is not None and len(seen) >= stop_after:
                        break
        finally:
            await _close(c)
        return task_id, seen

    return run(go())  # type: ignore[no-any-return]


def _resubscribe(url: str, task_id: str,
                 on_snapshot: Any = None) -> tuple[list[int], Any]:
    """Subscribe to a task: the partials in its snapshot and after, and its end
    (``on_snapshot()`` called once the snapshot came)."""
    from a2a.types.a2a_pb2 import SubscribeToTaskRequest

    async def go() -> tuple[list[int], Any]:
        c = await _client(url)
        got: list[int] = []
        last = None
        try:
            async for ev in c.subscribe(SubscribeToTaskRequest(id=task_id)):
                which = ev.WhichOneof("payload")
                if which == "task":
                    got += [_data(a.parts) for a in ev.task.artifacts if a.name == "partial"]
                    if on_snapshot is not None:
                        on_snapshot()
                elif which == "artifact_update" and \
                        ev.artifact_update.artifact.name == "partial":
                    got.append(_data(ev.artifact_update.artifact.parts))
                elif which == "status_update":
                    last = ev.status_update.status.state
        finally:
            await _close(c)
        return got, last

    return run(go())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a2a_resubscribe_after_the_gateway_is_killed_and_restarted(
        edge: Edge, tmp_path: Path) -> None:
    from a2a.types.a2a_pb2 import TaskState

    gw, url = edge.a2a()
    log, gate = tmp_path / "runs", tmp_path / "go-on"
    # The task waits after its third partial until the new gateway's subscriber has its
    # snapshot (it used to run on, and could end before a slow gateway restart).
    task_id, seen = _counted_stream(url, 30, log, stop_after=3, gate=(3, gate))
    assert seen == [0, 1, 2]
    gw.send_signal(signal.SIGKILL)
    gw.wait(10)
    _, url2 = edge.a2a()  # a new gateway process, another port: it keeps no state
    got, last = _resubscribe(url2, task_id, on_snapshot=gate.touch)
    assert got == list(range(30)) and last == TaskState.TASK_STATE_COMPLETED
    assert len(log.read_text().splitlines()) == 1  # one run


def _failover_stream(procs: Procs, tmp_path: Path, pg_url: str) -> tuple[list[int], Path,
                                                                         list[int]]:
    """Two queens on one PostgreSQL journal, a gateway given both; the leader is killed
    while a task streams through the gateway. Returns the partials the A2A client saw,
    the run log, and the partials a later GetTask finds."""
    from a2a.types.a2a_pb2 import GetTaskRequest, TaskState

    from .test_failover import HB, LEASE

    def queen(name: str) -> subprocess.Popen[str]:
        p, _ = procs.start("queen", "--name", name, "--bind", f"ipc://{tmp_path}/{name}",
                           "--pub", f"ipc://{tmp_path}/{name}-pub", "--json",
                           "--journal", pg_url, "--lease", str(LEASE), *HB)
        return p

    qa = queen("qa")
    queen("qb")
    both = f"ipc://{tmp_path}/qa,ipc://{tmp_path}/qb"
    procs.forager(both, "--app", APP, "--slots", "4")
    _, info = procs.start("a2a", "--queen", both, "--listen", "127.0.0.1:0", "--json",
                          "--refresh", "0.2")
    url = str(info["a2a"]).rstrip("/")
    log = tmp_path / "runs"

    def kill_leader() -> None:
        qa.send_signal(signal.SIGKILL)
        qa.wait(10)

    task_id, seen = _counted_stream(url, 30, log, at=(5, kill_leader))

    async def get() -> Any:
        c = await _client(url, streaming=False)
        try:
            return await c.get_task(GetTaskRequest(id=task_id))
        finally:
            await _close(c)

    t = run(get())
    assert t.status.state == TaskState.TASK_STATE_COMPLETED
    return seen, log, [_data(a.parts) for a in t.artifacts if a.name == "partial"]


@pytest.mark.slow
def test_a2a_queen_failover_under_a_streaming_task(procs: Procs, tmp_path: Path,
                                                   pg_url: str) -> None:
    """The stream goes on through the failover to the task's end, from one run, each
    update once and in order; what the new leader has, the client gets."""
    seen, log, kept = _failover_stream(procs, tmp_path, pg_url)
    assert len(log.read_text().splitlines()) == 1  # no duplicate run
    assert seen == sorted(set(seen)) and seen[:5] == [0, 1, 2, 3, 4] and seen[-1] == 29
    # What the colony kept is what the client saw: the journaled partials from before the
    # failover too (a task taken back reads its update log from the journal).
    assert kept == seen


@pytest.mark.slow
def test_a2a_failover_loses_no_partial(  # (the forager sends again what died)
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    seen, _, kept = _failover_stream(procs, tmp_path, pg_url)
    assert seen == list(range(30)) and kept == list(range(30))


@pytest.mark.slow
def test_a2a_tokens_map_callers_and_read_only_ones_cannot_act(edge: Edge,
                                                              tmp_path: Path) -> None:
    from a2a.types.a2a_pb2 import SendMessageRequest
    from a2a.utils.errors import InvalidRequestError

    tokens = tmp_path / "tokens"
    act, read = "a" * 24, "r" * 24
    tokens.write_text(f"{act} alice\n{read} bob read\n")
    _, url = edge.a2a("--token-file", str(tokens))
    assert httpx.get(url + "/.well-known/agent-card.json", timeout=10).status_code == 401
    r = httpx.get(url + "/.well-known/agent-card.json", timeout=10,
                  headers={"Authorization": f"Bearer {read}"})
    assert r.status_code == 200

    async def send(token: str) -> Any:
        c = await _client(url, streaming=False, token=token)
        try:
            return [e async for e in c.send_message(SendMessageRequest(
                message=_msg({"a": 1, "b": 1}, "add")))]
        finally:
            await _close(c)

    [ev] = run(send(act))
    assert _data(ev.task.artifacts[-1].parts) == 2
    with pytest.raises(InvalidRequestError, match="read-only"):
        run(send(read))


# -- MCP -----------------------------------------------------------------------------------

mcp = pytest.importorskip("mcp")


def _elicit_answer(answer: str) -> Any:
    import mcp_types as types

    async def cb(context: Any, params: Any) -> Any:
        return types.ElicitResult(action="accept", content={"answer": answer})
    return cb


async def _mcp_session(target: Any, mode: str, checks: Any, **kw: Any) -> Any:
    from mcp import Client as McpClient

    async with McpClient(target, mode=mode, **kw) as c:
        return await checks(c)


async def _mcp_checks(c: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = {t.name: t for t in (await c.list_tools()).tools}
    out["tools"] = tools
    r = await c.call_tool("add", {"a": 2, "b": 40})
    out["add"] = (r.structured_content, r.content[0].text, r.is_error)
    progress: list[tuple[float, str | None]] = []

    async def on_progress(p: float, total: float | None, msg: str | None) -> None:
        progress.append((p, msg))
    r = await c.call_tool("words", {"text": "a b c"}, progress_callback=on_progress)
    out["words"] = (r.structured_content, progress)
    r = await c.call_tool("greet", {})
    out["greet"] = r.structured_content
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_mcp_over_stdio(edge: Edge, mode: str) -> None:
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "meshant", "mcp", "--queen", edge.queen, "--refresh", "0.2"])
    out = run(_mcp_session(params, mode, _mcp_checks,
                           elicitation_callback=_elicit_answer("Ada")))
    tools = out["tools"]
    assert tools["add"].description == "Add two integers."
    assert tools["add"].input_schema["required"] == ["a", "b"]
    assert out["add"] == ({"result": 42}, "42", False)
    structured, progress = out["words"]
    assert structured == {"words": 3}
    assert [m for _, m in progress if m in ("a", "b", "c")] == ["a", "b", "c"]
    assert [p for p, _ in progress] == sorted(p for p, _ in progress)
    assert out["greet"] == {"result": "hello, Ada"}


@pytest.mark.slow
def test_mcp_over_http_with_a_token_bad_input_cancel_and_list_changed(
        edge: Edge, procs: Procs) -> None:
    import mcp_types as types
    from mcp.client.streamable_http import streamable_http_client

    token = "t" * 24
    _, url = edge.mcp_http("--token", token)
    assert httpx.post(url, json={}, timeout=10).status_code == 401
    headers = {"Authorization": f"Bearer {token}"}
    changed: list[Any] = []

    async def on_message(m: Any) -> None:
        if isinstance(m, types.ToolListChangedNotification):
            changed.append(m)

    async def checks(c: Any) -> dict[str, Any]:
        out = await _mcp_checks(c)
        # What a model can correct is the call's outcome (SEP-1303), not a protocol error.
        for args, name, why in (({"a": "x", "b": 1}, "add", "'x' is not of type 'integer'"),
                                ({}, "nope", "unknown tool 'nope'")):
            r = await c.call_tool(name, args)
            assert r.is_error and why in r.content[0].text
        # Cancelling the call cancels the task.
        with Client(edge.queen) as mc:
            cancelled = mc.status()["counters"]["cancelled"]
            call = asyncio.ensure_future(c.call_tool("hold", {}))
            await asyncio.to_thread(wait_for, lambda: mc.status()["running"] == 1, 10,
                                    "the hold task to run")
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await asyncio.to_thread(wait_for, lambda: mc.status()["counters"]["cancelled"]
                                    == cancelled + 1, 10, "the task to be cancelled")
            # The slot is free once the forager's handler has ended (a moment after the
            # queen counted the cancel): it must come back.
            await asyncio.to_thread(wait_for, lambda: mc.status()["running"] == 0, 10,
                                    "the forager's slot to come back")
        # A forager with a new tool joins: the host is told.
        procs.forager(edge.queen, "--builtins")
        await asyncio.to_thread(wait_for, lambda: changed, 10, "tools/list_changed")
        out["after"] = {t.name for t in (await c.list_tools()).tools}
        return out

    async def go() -> Any:
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:
            return await _mcp_session(streamable_http_client(url, http_client=http), "legacy",
                                      checks, elicitation_callback=_elicit_answer("Grace"),
                                      message_handler=on_message)

    out = run(go())
    assert out["add"][0] == {"result": 42}
    assert out["greet"] == {"result": "hello, Grace"}
    assert "sleep" in out["after"]


@pytest.mark.slow
def test_mcp_host_without_elicitation_gets_a_clear_error(edge: Edge) -> None:
    _, url = edge.mcp_http()

    async def checks(c: Any) -> Any:
        return await c.call_tool("greet", {})

    from mcp.client.streamable_http import streamable_http_client

    async def go() -> Any:
        async with httpx.AsyncClient(timeout=30) as http:
            return await _mcp_session(streamable_http_client(url, http_client=http), "auto",
                                      checks)

    r = run(go())
    text = r.content[0].text
    assert r.is_error and "does not support elicitation" in text and "What is your name?" in text
    # The host is told the task is gone (not to answer it), and it is.
    task = text.split()[1]
    assert f"task {task} was cancelled" in text and "Call the tool again" in text
    with Client(edge.queen) as c:
        wait_for(lambda: c.task_status(task)["state"] == "cancelled", 10, "the cancel")


# -- existing servers and agents as foragers ---------------------------------------------

@pytest.mark.slow
def test_forager_mcp_wraps_an_sdk_server(procs: Procs) -> None:
    _, queen = procs.queen()
    procs.forager(queen, "--mcp", f"{sys.executable} {HERE / 'sdk_mcp_server.py'}",
                  "--slots", "2")
    with Client(queen) as c:
        [f] = c.tool_query("multiply")
        assert f["description"] == "Multiply two integers."
        assert f["payload"]["required"] == ["a", "b"]
        assert f["result"] == {"title": "Result", "type": "integer"}  # the value's schema
        assert c.run("multiply", {"a": 6, "b": 7}, result_timeout=30) == 42
        fut = c.submit("count", {"n": 3})
        assert fut.result(30) == "counted to 3"
        assert [u.note for u in fut.updates(5) if u.kind == "progress"] == \
            ["at 1", "at 2", "at 3"]
        fut = c.submit("welcome", {})
        for u in fut.updates(30):
            if u.kind == "input-required":
                assert u.note == "Who is there?"
                c.answer(fut.task_id, "Grace", request=u.request)
        assert fut.result(30) == "welcome, Grace"
        with pytest.raises(Exception, match="Error executing tool broken"):
            c.run("broken", {"x": 1}, result_timeout=30)


def _wrapped_agent(procs: Procs) -> str:
    """The SDK-written A2A agent, a queen, and a forager serving the agent's skills:
    the queen's endpoint."""
    agent = subprocess.Popen([sys.executable, str(HERE / "sdk_a2a_agent.py")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.all.append(agent)
    url = _procs.read_json_line(agent, 30)["url"]
    _, queen = procs.queen()
    procs.forager(queen, "--a2a", url)
    return queen


@pytest.mark.slow
def test_forager_a2a_wraps_an_sdk_agent(procs: Procs) -> None:
    queen = _wrapped_agent(procs)
    with Client(queen) as c:
        [f] = c.tool_query("shout")
        assert f["description"] == "Shout the words."
        fut = c.submit("shout", "hello big world")
        partials = []
        for u in fut.updates(30):
            if u.kind == "partial":
                partials.append(u.value)
            elif u.kind == "input-required":
                assert "exclamation" in u.note
                c.answer(fut.task_id, "yes", request=u.request)
        assert partials[:3] == ["HELLO", "BIG", "WORLD"]
        assert fut.result(30) == "HELLOBIGWORLD!"


@pytest.mark.slow
def test_a_gateway_in_front_of_a_wrapped_agent(procs: Procs) -> None:
    """meshant a2a in front of a colony whose forager wraps an A2A agent: the A2A
    client's input-required goes through two colonies' worth of protocols."""
    queen = _wrapped_agent(procs)
    _, info = procs.start("a2a", "--queen", queen, "--listen", "127.0.0.1:0", "--json")
    gw = str(info["a2a"]).rstrip("/")
    [ev] = run(_send(gw, "quiet please", "shout"))
    assert "exclamation" in _data(ev.task.status.message.parts)
    [ev] = run(_send(gw, "no", task_id=ev.task.id))
    assert _data(ev.task.artifacts[-1].parts) == "QUIETPLEASE"


@pytest.mark.slow
def test_a2a_callers_carry_their_curve_keys_rights(procs: Procs, tmp_path: Path) -> None:
    """With CURVE, each token's caller acts with its own key: the queen's rights table
    lets bob (a client key) not cancel alice's task, and ops (an admin key) cancel it."""
    from a2a.types.a2a_pb2 import CancelTaskRequest, SendMessageRequest, TaskState
    from a2a.utils.errors import InvalidRequestError

    from meshant.adapters.security import generate

    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    authorized.mkdir()
    queen_pub, queen_sec = generate(keys, "queen")
    secrets: dict[str, str] = {}
    for name, role in (("alice", "client"), ("bob", "client"), ("ops", "admin"),
                       ("gw", "client"), ("worker", "forager")):
        pub, sec = generate(keys, name, (role,))
        (authorized / pub.name).write_bytes(pub.read_bytes())
        secrets[name] = str(sec)
    _, ep = procs.queen("--curve-secret", str(queen_sec), "--authorized", str(authorized))
    curve = ("--queen-key", str(queen_pub))
    procs.forager(ep, "--app", APP, "--name", "worker-1", "--curve-secret", secrets["worker"],
                  *curve)
    tokens = {who: who[0] * 24 for who in ("alice", "bob", "ops")}
    (tmp_path / "tokens").write_text("".join(f"{t} {who} {secrets[who]}\n"
                                             for who, t in tokens.items()))
    _, info = procs.start("a2a", "--queen", ep, "--listen", "127.0.0.1:0", "--json",
                          "--curve-secret", secrets["gw"], *curve,
                          "--token-file", str(tmp_path / "tokens"))
    url = str(info["a2a"]).rstrip("/")

    async def go() -> tuple[str, Any]:
        alice = await _client(url, streaming=False, token=tokens["alice"])
        bob = await _client(url, streaming=False, token=tokens["bob"])
        ops = await _client(url, streaming=False, token=tokens["ops"])
        try:
            [ev] = [e async for e in alice.send_message(SendMessageRequest(
                message=_msg(30, "hold"), configuration={"return_immediately": True}))]
            with pytest.raises(InvalidRequestError, match="forbidden"):
                await bob.cancel_task(CancelTaskRequest(id=ev.task.id))
            return ev.task.id, await ops.cancel_task(CancelTaskRequest(id=ev.task.id))
        finally:
            for c in (alice, bob, ops):
                await _close(c)

    _, cancelled = run(go())
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
