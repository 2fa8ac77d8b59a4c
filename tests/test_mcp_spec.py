"""``meshant mcp`` to the letter of MCP: resources and prompts, resumable SSE streams
(priming event, ``retry``, Last-Event-ID, each session its own), tool errors a model can
act on, content blocks and sampling carried through the colony, and ``meshant forager
--mcp`` returning a tool's value and refusing a bad payload in one line. The pieces
without a colony first, then end to end with CLI subprocesses (stopped by PID)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.server.streamable_http import EventMessage
from mcp.shared.exceptions import MCPError

from meshant import Client
from meshant.errors import TaskFailed
from meshant.gateways import mcp as gw
from meshant.gateways.mcp_http import Events
from meshant.gateways.wrap import MCPWrap, sampled, sampling_prompt, tool_value

from .conftest import Procs, wait_for

HERE = Path(__file__).parent
ROOT = HERE.parent
APP = "tests.gateway_app:forager"
SDK_SERVER = f"{sys.executable} {HERE / 'sdk_mcp_server.py'}"
PNG_BLOCK = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# -- pieces without a colony -------------------------------------------------------------

WRAPPED = {"type": "object", "properties": {"result": {"type": "integer"}},
           "required": ["result"]}


def test_a_wrapped_tool_returns_its_value() -> None:
    def result(**kw: Any) -> types.CallToolResult:
        return types.CallToolResult(**kw)

    text = [types.TextContent(text="42")]
    # The SDK wraps a non-object output as {"result": VALUE}: the task's value is VALUE.
    assert tool_value(result(content=text, structured_content={"result": 42}), WRAPPED) == 42
    # An object output is the value as it is (even one with a "result" key of its own).
    assert tool_value(result(content=text, structured_content={"result": 1, "more": 2}),
                      WRAPPED) == {"result": 1, "more": 2}
    assert tool_value(result(content=text, structured_content={"result": 42}), None) == \
        {"result": 42}
    assert tool_value(result(content=text), None) == "42"
    assert tool_value(result(content=[*text, types.TextContent(text="x")]), None) == ["42", "x"]
    # Anything but text is carried as MCP's JSON, for meshant mcp to serve again.
    image = types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png")
    assert tool_value(result(content=[*text, image]), None) == {
        "$content": [{"type": "text", "text": "42"}, PNG_BLOCK]}


def test_content_blocks_are_served_as_blocks_and_anything_else_as_a_value() -> None:
    r = gw._result({}, {"$content": [PNG_BLOCK, {"type": "text", "text": "hi"}]})
    assert [c.type for c in r.content] == ["image", "text"] and r.structured_content is None
    # Not blocks after all (or more than the one key): an ordinary value.
    for value in ({"$content": [{"type": "nonsense"}]}, {"$content": "x"},
                  {"$content": [PNG_BLOCK], "other": 1}):
        r = gw._result({}, value)
        assert r.structured_content == value and json.loads(r.content[0].text) == value


def test_a_failure_names_its_exception_type() -> None:
    assert gw.failure_text(TaskFailed("broken on 1", remote_type="ValueError")) == \
        "handler-error: ValueError: broken on 1"
    assert gw.failure_text(TaskFailed("no type")) == "handler-error: no type"


def test_sampling_answers_from_a_host_or_a_person() -> None:
    request = {"messages": [{"role": "user", "content": {"type": "text", "text": "2+2?"}}],
               "maxTokens": 10}
    assert sampling_prompt(request) == "2+2?"
    host = sampled({"role": "assistant", "content": {"type": "text", "text": "4"},
                    "model": "m"})
    assert host.model == "m" and host.content.text == "4"  # type: ignore[union-attr]
    person = sampled("four")
    assert person.role == "assistant" and person.content.text == "four"  # type: ignore[union-attr]


def _message(n: int) -> types.JSONRPCMessage:
    return types.JSONRPCNotification(jsonrpc="2.0", method="notifications/progress",
                                     params={"progressToken": 1, "progress": n})


def _replay(events: Events, session: str, last: str) -> tuple[str | None, list[str]]:
    got: list[EventMessage] = []

    async def send(e: EventMessage) -> None:
        got.append(e)

    stream = run(events.replay(session, last, send))
    return stream, [str(e.event_id) for e in got]


def test_events_replay_only_the_sessions_own_stream() -> None:
    events = Events()
    a, b = events.scoped("a"), events.scoped("b")
    # Both sessions' request 1 is stream "1": the SDK names streams by request id.
    prime_a = run(a.store_event("1", None))
    prime_b = run(b.store_event("1", None))
    a1, b1, a2 = (run(s.store_event("1", _message(n))) for s, n in ((a, 1), (b, 1), (a, 2)))
    run(a.store_event("2", _message(9)))  # another stream of a's
    assert _replay(events, "a", prime_a) == ("1", [a1, a2])
    assert _replay(events, "a", a1) == ("1", [a2])
    assert _replay(events, "b", prime_b) == ("1", [b1])
    # Another session's event id replays nothing, nor does an unknown one.
    assert _replay(events, "b", prime_a) == (None, [])
    assert _replay(events, "a", "nope") == (None, [])


def test_events_are_bounded_oldest_first() -> None:
    events = Events(max_events=3)
    s = events.scoped("s")
    ids = [run(s.store_event("1", _message(n))) for n in range(5)]
    assert len(events) == 3
    assert _replay(events, "s", ids[0]) == (None, [])  # forgotten
    assert _replay(events, "s", ids[2]) == ("1", ids[3:])


def test_a_bad_payload_to_a_wrapped_tool_is_one_line_without_frames(colony: Any) -> None:
    """Refused by the wrapper before the server is called: the failure is the one line
    saying why, with none of meshant's frames; a handler's own failure keeps its."""
    class Tool:
        name = "multiply"
        description = "Multiply."
        input_schema = {"type": "object", "required": ["a", "b"],
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
        output_schema = WRAPPED

    def mine(payload: Any) -> Any:
        raise ValueError("mine")

    wrap = MCPWrap("unused")  # never started: a refused payload reaches no server
    try:
        colony.start_queen()
        colony.forager({"multiply": wrap._handler(Tool()), "mine": mine})
        c = colony.client()
        for payload, why in (({"a": "x", "b": 1}, "at a: 'x' is not of type 'integer'"),
                             ("x", "takes an object of arguments, not str")):
            with pytest.raises(TaskFailed, match=why) as e:
                c.run("multiply", payload, result_timeout=10)
            assert e.value.remote_type == "BadArguments" and e.value.remote_traceback == ""
            assert "\n" not in str(e.value)
        with pytest.raises(TaskFailed) as e:
            c.run("mine", None, result_timeout=10)
        assert "raise ValueError" in e.value.remote_traceback
    finally:
        wrap.close()


def test_the_conformance_run_compares_check_by_check(tmp_path: Path) -> None:
    """benchmarks/mcp_conformance.py's reading of the suite's results (the run itself is
    opt-in: it installs the suite from npm)."""
    from benchmarks.mcp_conformance import read_results, regressions

    def write(side: str, scenario: str, checks: list[tuple[str, str]]) -> None:
        d = tmp_path / side / f"server-{scenario}-2026-12-02T14-01-19-817Z"
        d.mkdir(parents=True)
        (d / "checks.json").write_text(json.dumps([{"id": i, "status": st}
                                                   for i, st in checks]))

    write("ref", "tools-list", [("tools-list", "SUCCESS")])
    write("ref", "server-sse-polling", [("outgoing-request", "INFO"),
                                        ("server-sse-priming-event", "WARNING")])
    write("ref", "ping", [("ping", "SUCCESS")])
    write("ours", "tools-list", [("tools-list", "SUCCESS"), ("tools-list", "FAILURE")])
    write("ours", "server-sse-polling", [("server-sse-priming-event", "SUCCESS")])
    ref, ours = read_results(tmp_path / "ref"), read_results(tmp_path / "ours")
    assert ref["server-sse-polling"] == {"server-sse-priming-event": "WARNING"}  # no INFO
    assert ours["tools-list"] == {"tools-list": "FAILURE"}  # the worst of a check's two
    assert sorted(regressions(ref, ours)) == [("ping", "ping", "missing"),
                                              ("tools-list", "tools-list", "FAILURE")]
    assert regressions(ours, ref) == [("server-sse-polling", "server-sse-priming-event",
                                       "WARNING")]


# -- end to end --------------------------------------------------------------------------

class Colony:
    """A CLI queen, foragers, and ``meshant mcp`` (HTTP) on demand."""

    def __init__(self, procs: Procs, *forager_args: str) -> None:
        self.procs = procs
        _, self.queen = procs.queen()
        procs.forager(self.queen, *forager_args)

    def http(self) -> str:
        _, info = self.procs.start("mcp", "--queen", self.queen, "--listen", "127.0.0.1:0",
                                   "--json", "--refresh", "0.2")
        return str(info["mcp"])

    def stdio(self) -> StdioServerParameters:
        return StdioServerParameters(command=sys.executable, args=[
            "-m", "meshant", "mcp", "--queen", self.queen, "--refresh", "0.2"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_resources_prompts_and_tool_errors_over_stdio(procs: Procs, mode: str) -> None:
    colony = Colony(procs, "--app", APP, "--builtins", "--slots", "4")
    with Client(colony.queen) as c:
        c.memory.set("config/rate", {"rate": 5})
        done = c.submit("echo", {"x": 1})
        done.result(30)

    async def checks(mc: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        listed = (await mc.list_resources()).resources
        out["uris"] = [str(r.uri) for r in listed]
        templates = (await mc.list_resource_templates()).resource_templates
        out["templates"] = [t.uri_template for t in templates]
        out["memory"] = (await mc.read_resource("meshant://memory/config%2Frate")).contents[0]
        out["task"] = (await mc.read_resource(f"meshant://tasks/{done.task_id}")).contents[0]
        out["status"] = (await mc.read_resource("meshant://colony/status")).contents[0]
        for uri in ("meshant://memory/nope", "meshant://tasks/nope", "file:///etc/passwd"):
            with pytest.raises(MCPError) as e:
                await mc.read_resource(uri)
            assert e.value.error.code == types.INVALID_PARAMS and "not found" in str(e.value)
        out["prompts"] = (await mc.list_prompts()).prompts
        with pytest.raises(MCPError) as e:
            await mc.get_prompt("anything")
        assert e.value.error.code == types.INVALID_PARAMS
        out["unknown"] = await mc.call_tool("nope", {})
        out["bad"] = await mc.call_tool("add", {"a": "x", "b": 1})
        out["failed"] = await mc.call_tool("fail", {"message": "on purpose"})
        return out

    async def go() -> dict[str, Any]:
        async with McpClient(colony.stdio(), mode=mode) as mc:
            return await checks(mc)

    out = run(go())
    assert out["uris"] == ["meshant://colony/status", "meshant://memory/config%2Frate"]
    assert out["templates"] == ["meshant://tasks/{task}", "meshant://memory/{key}"]
    assert json.loads(out["memory"].text) == {"rate": 5}
    assert out["memory"].mime_type == "application/json"
    task = json.loads(out["task"].text)
    assert task["state"] == "completed" and task["result"] == {"x": 1}
    assert "add" in {t for f in json.loads(out["status"].text)["foragers"] for t in f["tools"]}
    assert out["prompts"] == []
    for key, why in (("unknown", "unknown tool 'nope'"), ("bad", "is not of type 'integer'"),
                     ("failed", "handler-error: DemoError: on purpose")):
        r = out[key]
        assert r.is_error and why in r.content[0].text, (key, r.content[0].text)


@pytest.mark.slow
def test_memory_keys_are_resources_that_tell_of_changes(procs: Procs) -> None:
    """A handshake session subscribes to a key (resources/subscribe) and hears the list
    change; a 2026-07-28 session hears both on a subscriptions/listen stream."""
    import warnings

    from mcp.shared.exceptions import MCPDeprecationWarning

    colony = Colony(procs, "--app", APP)
    uri = "meshant://memory/plan"
    heard: list[Any] = []

    async def on_message(m: Any) -> None:
        if isinstance(m, types.ResourceUpdatedNotification | types.ResourceListChangedNotification):
            heard.append(m)

    def kinds() -> list[str]:
        return [type(m).__name__ for m in heard]

    async def legacy() -> Any:
        async with McpClient(colony.stdio(), mode="legacy", message_handler=on_message) as mc:
            with warnings.catch_warnings():  # (removed on 2026-07-28, not on this revision)
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await mc.subscribe_resource(uri)
                with pytest.raises(MCPError, match="only colony memory keys"):
                    await mc.subscribe_resource("meshant://tasks/x")
            with Client(colony.queen) as c:
                await asyncio.to_thread(c.memory.set, "plan", {"step": 1})
                await asyncio.to_thread(wait_for, lambda: len(heard) >= 2, 10, "two notices")
                await asyncio.to_thread(c.memory.set, "plan", {"step": 2})
                await asyncio.to_thread(wait_for, lambda: len(heard) >= 3, 10, "an update")
            return (await mc.read_resource(uri)).contents[0]

    got = run(legacy())
    assert json.loads(got.text) == {"step": 2}
    # A new key changes the list and updates its resource; a changed one only updates.
    assert sorted(kinds()[:2]) == ["ResourceListChangedNotification",
                                   "ResourceUpdatedNotification"]
    assert kinds()[2] == "ResourceUpdatedNotification"
    assert all(str(m.params.uri) == uri for m in heard
               if isinstance(m, types.ResourceUpdatedNotification))

    async def modern() -> list[Any]:
        events: list[Any] = []
        async with McpClient(colony.stdio(), mode="auto") as mc, mc.listen(
                resources_list_changed=True, resource_subscriptions=[uri]) as sub:
            with Client(colony.queen) as c:
                await asyncio.to_thread(c.memory.delete, "plan")
            async for event in sub:
                events.append(event)
                if len(events) == 2:
                    break
        return events

    events = run(modern())
    assert sorted(type(e).__name__ for e in events) == ["ResourceUpdated",
                                                        "ResourcesListChanged"]


def _sse(text: str) -> list[dict[str, str]]:
    """The events of an SSE body: each a map of its fields."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
        if fields:
            events.append(fields)
    return events


async def _session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    r = await http.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}})
    assert r.status_code == 200, r.text
    headers = {"mcp-session-id": r.headers["mcp-session-id"],
               "mcp-protocol-version": "2025-11-25"}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                    headers=headers)
    return headers


CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "words", "arguments": {"text": "a b c d", "delay": 0.2},
                   "_meta": {"progressToken": 7}}}


@pytest.mark.slow
def test_sse_streams_are_primed_and_resumable_within_their_session(procs: Procs) -> None:
    colony = Colony(procs, "--app", APP, "--slots", "4")
    url = colony.http()
    accept = {"Accept": "application/json, text/event-stream"}

    async def go() -> tuple[list[dict[str, str]], list[dict[str, str]], int, str]:
        async with httpx.AsyncClient(timeout=30, headers=accept) as http:
            mine, other = await _session(http, url), await _session(http, url)
            # Read the priming event and the first progress, then drop the connection.
            first: list[dict[str, str]] = []
            async with http.stream("POST", url, json=CALL, headers=mine) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                buf = ""
                async for chunk in r.aiter_text():
                    buf += chunk
                    first = _sse(buf)
                    if len(first) >= 2 and buf.replace("\r\n", "\n").endswith("\n\n"):
                        break
            last = first[-1]["id"]
            # Another session cannot read this stream with its id.
            r = await http.get(url, headers={**other, "last-event-id": last,
                                             "Accept": "text/event-stream"})
            foreign = r.text  # (an unknown cursor: the stream ends at once, empty)
            # Its own session reconnects and gets the rest: the partials, then the result.
            rest: list[dict[str, str]] = []
            async with http.stream("GET", url, headers={**mine, "last-event-id": last,
                                                        "Accept": "text/event-stream"}) as r:
                buf = ""
                async for chunk in r.aiter_text():
                    buf += chunk
                    rest = _sse(buf)
                    if any('"id":7' in e.get("data", "") and '"result"' in e.get("data", "")
                           for e in rest):
                        break
            return first, rest, r.status_code, foreign

    first, rest, status, foreign = run(go())
    prime = first[0]
    assert prime["id"] and prime.get("data", "") == "" and prime["retry"] == "1000"
    assert status == 200
    data = [json.loads(e["data"]) for e in rest if e.get("data")]
    assert data[-1]["id"] == 7 and data[-1]["result"]["structuredContent"] == {"words": 4}
    seen = [json.loads(e["data"])["params"]["progress"] for e in first[1:] + rest
            if e.get("data") and "notifications/progress" in e["data"]]
    assert seen == sorted(set(seen)) and len(seen) >= 4  # none twice, none lost
    assert '"id":7' not in foreign


def _answer(text: str) -> Any:
    async def cb(context: Any, params: Any) -> types.CreateMessageResult:
        prompt = params.messages[-1].content.text
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(text=f"{text} to {prompt}"))
    return cb


@pytest.mark.slow
def test_sampling_and_content_blocks_cross_the_colony(procs: Procs) -> None:
    """The suite's reference tools, wrapped by forager --mcp, behind meshant mcp: the
    server's sampling request reaches the host's model; images and resources arrive as
    blocks."""
    colony = Colony(procs, "--mcp", f"{SDK_SERVER} --tools suite", "--slots", "4")

    async def go(params: StdioServerParameters, **kw: Any) -> dict[str, Any]:
        async with McpClient(params, mode="legacy", **kw) as mc:
            out = {"sampling": await mc.call_tool("test_sampling", {"prompt": "hello"})}
            for tool in ("test_image_content", "test_multiple_content_types",
                         "test_error_handling"):
                out[tool] = await mc.call_tool(tool, {})
            return out

    out = run(go(colony.stdio(), sampling_callback=_answer("an answer")))
    r = out["sampling"]
    assert not r.is_error and r.content[0].text == "LLM response: an answer to hello"
    assert [c.type for c in out["test_image_content"].content] == ["image"]
    assert out["test_image_content"].content[0].mime_type == "image/png"
    assert [c.type for c in out["test_multiple_content_types"].content] == \
        ["text", "image", "resource"]
    r = out["test_error_handling"]
    # (MCPServer tells only that an unexpected exception happened, not its message.)
    assert r.is_error and r.content[0].text == \
        "handler-error: WrapError: Error executing tool test_error_handling"

    # A host without sampling is told the task was cancelled, and it is.
    async def without() -> Any:
        async with McpClient(colony.stdio(), mode="legacy") as mc:
            return await mc.call_tool("test_sampling", {"prompt": "hello"})

    r = run(without())
    assert r.is_error and "does not support sampling" in r.content[0].text
    task = r.content[0].text.split()[1]
    with Client(colony.queen) as c:
        wait_for(lambda: c.task_status(task)["state"] == "cancelled", 10, "the cancel")


@pytest.mark.slow
def test_the_mcp_server_example(procs: Procs) -> None:
    """examples/mcp_server.py as its header runs it: a forager through --mcp, then the
    whole chain in one go (--demo)."""
    _, queen = procs.queen()
    procs.forager(queen, "--mcp", f"{sys.executable} {ROOT / 'examples' / 'mcp_server.py'}")
    with Client(queen) as c:
        assert c.run("word_count", {"text": "the quick brown fox"}, result_timeout=30) == \
            {"words": 4}
        fut = c.submit("countdown", {"n": 3})
        assert fut.result(30) == "liftoff"
        assert [u.note for u in fut.updates(5) if u.kind == "progress"] == \
            ["3...", "2...", "1..."]
    import subprocess

    r = subprocess.run([sys.executable, str(ROOT / "examples" / "mcp_server.py"), "--demo"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "word_count: {'words': 4}" in r.stdout and "confirm: deploy: done" in r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "mcp_server.py"), "--nope"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage:" in r.stderr and "Traceback" not in r.stderr
