"""The other direction: an existing MCP server (``meshant forager --mcp "COMMAND ARGS"``)
or A2A agent (``meshant forager --a2a URL``) joins a colony as a forager. Each tool or
skill becomes a capability with its description and schemas; the colony's guarantees
(leases, retries, dead letters, audit, rights, the dashboard) then hold for it.

The SDK's client lives on an event loop of its own thread (:class:`Bridge`); a handler
runs in the forager's worker thread and hands its call over to that loop, which talks
back to the task (progress, partial results, questions) through the task's context.
"""

from __future__ import annotations

import asyncio
import contextvars
import shlex
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from contextlib import AsyncExitStack
from typing import Any

from meshant.actors.forager import Forager
from meshant.actors.handlers import TaskContext
from meshant.errors import BadInput, ConfigError, MeshantError, TaskCancelled
from meshant.gateways.colony import CONTENT_KEY, check_payload, jsonable, payload_text

CALL_TIMEOUT = None  # the task's own timeout (the queen's lease) bounds a call


class Bridge:
    """An event loop on a thread of its own, holding an SDK client's connection."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.run(self.stack.aclose(), timeout)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()


class WrapError(MeshantError):
    """What the wrapped server or agent answered as a failure."""

    code = "handler-error"


# -- MCP ------------------------------------------------------------------------------------

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "meshant_task", default=None)


class BadArguments(BadInput):
    """A wrapped tool's payload that its input schema refuses (or that is no object): the
    task fails with this one line, and nothing reaches the server."""


def _wrapped_result(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema of the value inside an SDK-wrapped output (``{"result": VALUE}``, what
    MCPServer declares for a tool that returns a non-object), else None."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    props = schema.get("properties")
    if isinstance(props, dict) and set(props) == {"result"} and schema.get("required") == [
            "result"] and isinstance(props["result"], dict):
        return dict(props["result"])
    return None


def tool_value(result: Any, output_schema: dict[str, Any] | None) -> Any:
    """A wrapped tool's ``CallToolResult`` as the task's value: its structured content
    (the value itself where the SDK wrapped it as ``{"result": VALUE}``); else its text
    (one block: the string; several: a list of strings); else, when it holds images,
    audio or resources, ``{"$content": [BLOCK, ...]}`` in MCP's JSON form, which
    ``meshant mcp`` serves again as those blocks."""
    structured = result.structured_content
    if structured is not None:
        if _wrapped_result(output_schema) is not None and isinstance(structured, dict) \
                and set(structured) == {"result"}:
            return structured["result"]
        return structured
    blocks = list(result.content or [])
    if all(getattr(c, "type", "") == "text" for c in blocks):
        texts = [c.text for c in blocks]
        return texts[0] if len(texts) == 1 else texts or None
    return {CONTENT_KEY: [c.model_dump(by_alias=True, mode="json", exclude_none=True)
                          for c in blocks]}


class MCPWrap:
    """An MCP server started as a subprocess (stdio), its tools served on ``forager``."""

    def __init__(self, command: str, *, env: dict[str, str] | None = None) -> None:
        argv = shlex.split(command)
        if not argv:
            raise ConfigError("--mcp needs a command, e.g. --mcp 'python server.py'")
        self.argv = argv
        self.env = env
        self.bridge = Bridge("meshant-mcp")
        self.client: Any = None
        self.tools: list[Any] = []
        self._running: dict[str, TaskContext] = {}
        self._lock = threading.Lock()

    def start(self, timeout: float = 30.0) -> list[Any]:
        """Start the server and list its tools."""
        self.tools = self.bridge.run(self._start(), timeout)
        return self.tools

    async def _start(self) -> list[Any]:
        from mcp import Client, StdioServerParameters

        params = StdioServerParameters(command=self.argv[0], args=self.argv[1:], env=self.env)
        # The handshake era: a server's elicitation (ctx.elicit) and sampling are requests
        # on the connection's back-channel, which the 2026-07-28 stdio envelope lacks.
        self.client = await self.bridge.stack.enter_async_context(
            Client(params, mode="legacy", elicitation_callback=self._elicit,
                   sampling_callback=self._sample))
        listed = await self.client.list_tools()
        return list(listed.tools)

    def close(self) -> None:
        self.bridge.close()

    def serve_on(self, forager: Forager) -> None:
        for tool in self.tools:
            out = dict(tool.output_schema) if tool.output_schema else None
            forager.add_handler(tool.name, self._handler(tool),
                                description=tool.description or None,
                                schema=dict(tool.input_schema or {}) or None,
                                result_schema=_wrapped_result(out) or out)

    def _handler(self, tool: Any) -> Any:
        name = tool.name
        schema = dict(tool.input_schema or {})
        out = dict(tool.output_schema) if tool.output_schema else None

        def handle(payload: Any, ctx: TaskContext) -> Any:
            if payload is None:
                payload = {}
            if not isinstance(payload, dict):
                raise BadArguments(f"tool {name!r} takes an object of arguments, not "
                                   f"{type(payload).__name__} (e.g. {{\"name\": value}})")
            why = check_payload(name, {"payload": schema}, payload)
            if why is not None:
                raise BadArguments(why)
            with self._lock:
                self._running[ctx.ref] = ctx
            try:
                result = self.bridge.run(self._call(name, payload, ctx), CALL_TIMEOUT)
            except WrapError as e:
                # Raised afresh here: the bridge's frames say nothing of the failure,
                # which is the server's own.
                raise WrapError(e.message) from None
            finally:
                with self._lock:
                    self._running.pop(ctx.ref, None)
            return tool_value(result, out)
        handle.__name__ = name
        return handle

    async def _call(self, name: str, args: dict[str, Any], ctx: TaskContext) -> Any:
        _current.set(ctx)

        async def progress(value: float, total: float | None, message: str | None) -> None:
            ctx.progress(value / total if total else None, message)

        call = asyncio.ensure_future(self.client.call_tool(name, args,
                                                           progress_callback=progress))
        while not call.done():
            # A cancelled task cancels the call (the SDK tells the server).
            await asyncio.wait([call], timeout=0.05)
            if ctx.is_cancelled and not call.done():
                call.cancel()
        if call.cancelled():
            raise TaskCancelled(f"task {ctx.task_id} was cancelled")
        result = call.result()
        if result.is_error:
            raise WrapError(" ".join(getattr(c, "text", "") for c in result.content)
                            or f"tool {name!r} failed")
        return result

    def _task(self) -> TaskContext | None:
        """The task a server's request (elicitation, sampling) is on behalf of."""
        ctx = _current.get()
        if ctx is None:
            with self._lock:
                running = list(self._running.values())
            ctx = running[0] if len(running) == 1 else None
        return ctx

    async def _elicit(self, context: Any, params: Any) -> Any:
        """The server asks: the task's ``ctx.ask``, its answer the form's content."""
        import mcp_types as types

        ctx = self._task()
        if ctx is None:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message="no single task to ask on behalf of")
        schema = getattr(params, "requested_schema", None)
        try:
            value = await asyncio.to_thread(ctx.ask, params.message,
                                            data={"schema": schema} if schema else None)
        except TaskCancelled:
            return types.ElicitResult(action="cancel")
        content = value if isinstance(value, dict) else {"answer": value}
        props = (schema or {}).get("properties") or {}
        if not isinstance(value, dict) and len(props) == 1:
            content = {next(iter(props)): value}
        return types.ElicitResult(action="accept", content=content)

    async def _sample(self, context: Any, params: Any) -> Any:
        """The server asks the host's model (``sampling/createMessage``): the task's
        ``ctx.ask`` with the request as ``data.sampling``; ``meshant mcp`` puts it to
        its host's model, and a person may answer it with plain text."""
        import mcp_types as types

        ctx = self._task()
        if ctx is None:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message="no single task to ask on behalf of")
        request = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            value = await asyncio.to_thread(ctx.ask, sampling_prompt(request),
                                            data={SAMPLING_KEY: request})
        except TaskCancelled:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message=f"task {ctx.task_id} was cancelled")
        return sampled(value)


SAMPLING_KEY = "sampling"  # in a question's data: a sampling/createMessage request


def sampling_prompt(request: dict[str, Any]) -> str:
    """A sampling request's question as a person reads it: its last message's text."""
    for m in reversed(request.get("messages") or []):
        content = m.get("content") if isinstance(m, dict) else None
        for c in content if isinstance(content, list) else [content]:
            if isinstance(c, dict) and c.get("type") == "text":
                return str(c.get("text", ""))
    return "a sampling request (see data.sampling)"


def sampled(value: Any) -> Any:
    """An answer to a sampling question as a ``CreateMessageResult``: the host's result
    as it came, or a person's plain text."""
    import mcp_types as types

    if isinstance(value, dict):
        try:
            return types.CreateMessageResult.model_validate(value)
        except ValueError:
            pass
    return types.CreateMessageResult(role="assistant", model="meshant-answer",
                                     content=types.TextContent(text=payload_text(value)))


# -- A2A ------------------------------------------------------------------------------------

class A2AWrap:
    """An A2A agent, its skills served on ``forager``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bridge = Bridge("meshant-a2a")
        self.client: Any = None
        self.card: Any = None

    def start(self, timeout: float = 30.0) -> list[Any]:
        self.card = self.bridge.run(self._start(), timeout)
        return list(self.card.skills)

    async def _start(self) -> Any:
        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, create_client

        http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        self.bridge.stack.push_async_callback(http.aclose)
        card = await A2ACardResolver(http, self.url).get_agent_card()
        self.client = await create_client(card, ClientConfig(streaming=True,
                                                             httpx_client=http))
        self.bridge.stack.push_async_callback(self.client.close)
        return card

    def close(self) -> None:
        self.bridge.close()

    def serve_on(self, forager: Forager) -> None:
        skills = list(self.card.skills)
        if not skills:
            raise ConfigError(f"the agent at {self.url} lists no skills")
        for skill in skills:
            forager.add_handler(skill.id, self._handler(skill.id),
                                description=skill.description or skill.name or None)

    def _handler(self, skill: str) -> Any:
        def handle(payload: Any, ctx: TaskContext) -> Any:
            return self.bridge.run(self._call(skill, payload, ctx), CALL_TIMEOUT)
        handle.__name__ = skill
        return handle

    async def _call(self, skill: str, payload: Any, ctx: TaskContext) -> Any:
        from a2a.types.a2a_pb2 import CancelTaskRequest, TaskState

        from meshant.gateways.a2a import _narrow

        message = _message(payload, skill)
        artifacts: dict[str, Any] = {}
        task_id = context_id = ""
        while True:
            state = None
            prompt: str | None = None
            events = self.client.send_message(_request(message))
            try:
                async for ev in events:
                    if ctx.is_cancelled and task_id:
                        await self.client.cancel_task(CancelTaskRequest(id=task_id))
                        raise TaskCancelled(f"task {ctx.task_id} was cancelled")
                    which = ev.WhichOneof("payload")
                    if which == "message":
                        return _value(ev.message.parts, _narrow)
                    if which == "task":
                        task_id, context_id = ev.task.id, ev.task.context_id
                        for a in ev.task.artifacts:
                            artifacts[a.artifact_id] = a
                        state = ev.task.status.state
                        prompt = _text(ev.task.status.message.parts) or prompt
                    elif which == "artifact_update":
                        a = ev.artifact_update.artifact
                        task_id = ev.artifact_update.task_id or task_id
                        artifacts[a.artifact_id] = a
                        if a.name != "result":
                            ctx.partial(_value(a.parts, _narrow))
                    elif which == "status_update":
                        st = ev.status_update.status
                        task_id = ev.status_update.task_id or task_id
                        context_id = ev.status_update.context_id or context_id
                        state = st.state
                        text = _text(st.message.parts)
                        if state == TaskState.TASK_STATE_WORKING and text:
                            ctx.progress(None, text[:200])
                        elif text:
                            prompt = text
            finally:
                await events.aclose()
            if state == TaskState.TASK_STATE_INPUT_REQUIRED:
                answer = await asyncio.to_thread(ctx.ask, prompt or "input required")
                message = _message(answer, skill, task_id, context_id)
                continue
            if state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED,
                         TaskState.TASK_STATE_AUTH_REQUIRED):
                raise WrapError(prompt or f"the agent's task ended {TaskState.Name(state)}")
            if state == TaskState.TASK_STATE_CANCELED:
                raise TaskCancelled(prompt or f"the agent cancelled task {task_id}")
            return _result(list(artifacts.values()), _narrow)


def _message(payload: Any, skill: str, task_id: str = "", context_id: str = "") -> Any:
    import uuid

    from a2a.types.a2a_pb2 import Message, Role

    from meshant.gateways.a2a import parts_of

    value = payload if isinstance(payload, bytes) else jsonable(payload)  # bytes: a file
    m = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                parts=parts_of(value), task_id=task_id, context_id=context_id)
    m.metadata.update({"skill": skill})
    return m


def _request(message: Any) -> Any:
    from a2a.types.a2a_pb2 import SendMessageRequest

    return SendMessageRequest(message=message)


def _text(parts: Any) -> str:
    return "\n".join(p.text for p in parts if p.HasField("text"))


def _value(parts: Any, narrow: Any) -> Any:
    """Parts as one value: a data part's JSON, else a file's bytes (one raw part and no
    text), else the text."""
    from google.protobuf.json_format import MessageToDict

    for p in parts:
        if p.HasField("data"):
            return narrow(MessageToDict(p.data))
    raw = [p for p in parts if p.HasField("raw")]
    if len(raw) == 1 and not any(p.HasField("text") for p in parts):
        return bytes(raw[0].raw)
    return _text(parts)


def _result(artifacts: list[Any], narrow: Any) -> Any:
    """The task's result: its artifact named ``result`` (a meshant gateway's), else the
    one artifact's value, else all of them in order."""
    for a in artifacts:
        if a.name == "result":
            return _value(a.parts, narrow)
    values = [_value(a.parts, narrow) for a in artifacts]
    if len(values) == 1:
        return values[0]
    if values and all(isinstance(v, str) for v in values):
        return "".join(values)
    return values or None


__all__ = ["SAMPLING_KEY", "A2AWrap", "BadArguments", "Bridge", "MCPWrap", "WrapError",
           "payload_text", "sampled", "sampling_prompt", "tool_value"]
