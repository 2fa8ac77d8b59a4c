"""``meshant mcp``: an MCP server in front of a colony, on the official ``mcp`` SDK's
low-level :class:`~mcp.server.lowlevel.Server`, over stdio or streamable HTTP.

Both eras the SDK serves are served: the handshake protocols (2024-11-05 to 2025-11-25)
and the per-request protocol 2026-07-28. Each capability is a tool:

* ``tools/list`` lists the colony's capabilities with their schemas, and a change of
  them is announced (``notifications/tools/list_changed``: to each handshake session,
  and to every ``subscriptions/listen`` stream on 2026-07-28);
* ``tools/call`` submits a task; its arguments object is the payload (a capability whose
  payload is not an object takes ``{"payload": ...}``); the result comes back as
  structured content and as text; progress and partial results become progress
  notifications; a cancelled call cancels the task;
* ``ctx.ask`` becomes an elicitation: on 2026-07-28 an ``InputRequiredResult`` whose
  ``requestState`` names the task and its cursor (so nothing is kept here: the retry
  answers the task and follows it on from there), on the handshake protocols an
  ``elicitation/create`` request; a host without elicitation gets a clear error, and
  the task is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from meshant._version import __version__
from meshant.errors import MeshantError
from meshant.gateways.colony import (
    Caller,
    ColonyLink,
    Ended,
    attach,
    check_payload,
    follow,
    jsonable,
    payload_text,
)
from meshant.gateways.http import CALLER_KEY

log = logging.getLogger("meshant.gateways.mcp")

SPEC = "MCP 2026-07-28 and 2025-11-25 (down to 2024-11-05)"
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string",
                                                              "description": "your answer"}},
                 "required": ["answer"]}


def input_schema(about: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema: the payload schema when it is an object's, else the
    payload wrapped as the ``payload`` argument."""
    schema = about.get("payload")
    if not schema:
        return {"type": "object"}
    if schema.get("type") == "object":
        return dict(schema)
    return {"type": "object", "properties": {"payload": schema}, "required": ["payload"]}


def output_schema(about: dict[str, Any]) -> dict[str, Any] | None:
    schema = about.get("result")
    if not schema:
        return None
    if schema.get("type") == "object":
        return dict(schema)
    return {"type": "object", "properties": {"result": schema}, "required": ["result"]}


def tool_of(capability: str, about: dict[str, Any]) -> types.Tool:
    return types.Tool(name=capability,
                      description=about.get("description") or f"the colony's {capability!r} "
                      "capability",
                      input_schema=input_schema(about), output_schema=output_schema(about))


def _payload(about: dict[str, Any], arguments: dict[str, Any] | None) -> Any:
    schema = about.get("payload")
    args = arguments or {}
    if schema and schema.get("type") != "object":
        return args.get("payload")
    return args


def _result(about: dict[str, Any], value: Any) -> types.CallToolResult:
    value = jsonable(value)
    schema = about.get("result")
    wrapped = not isinstance(value, dict) or bool(schema and schema.get("type") != "object")
    structured = {"result": value} if wrapped else value
    return types.CallToolResult(content=[types.TextContent(text=payload_text(value))],
                                structured_content=structured)


def _failed(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


class ColonyTools:
    """The MCP handlers over a colony (one per gateway process)."""

    def __init__(self, link: ColonyLink, *, wait: float | None = None) -> None:
        self.link = link
        self.wait = wait
        self.bus = InMemorySubscriptionBus()
        self._sessions: dict[int, Any] = {}  # handshake sessions, to tell of list changes
        link.on_change(self._changed)

    def server(self) -> Server[Any]:
        tools = self

        class _Server(Server[Any]):
            def create_initialization_options(self, notification_options: Any = None,
                                              experimental_capabilities: Any = None,
                                              extensions: Any = None
                                              ) -> InitializationOptions:
                return super().create_initialization_options(
                    notification_options or NotificationOptions(tools_changed=True),
                    experimental_capabilities, extensions)

        return _Server("meshant", version=__version__,
                       description="A meshant colony: each tool is a capability its "
                                   "foragers serve",
                       on_list_tools=tools.list_tools, on_call_tool=tools.call_tool,
                       on_subscriptions_listen=ListenHandler(tools.bus))

    async def _changed(self) -> None:
        await self.bus.publish(ToolsListChanged())
        for key, session in list(self._sessions.items()):
            try:
                await session.send_tool_list_changed()
            except Exception:
                self._sessions.pop(key, None)  # the connection is gone

    def _remember(self, ctx: ServerRequestContext[Any]) -> None:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            conn = getattr(ctx.session, "_connection", None)
            if conn is not None and len(self._sessions) < 10_000:
                self._sessions[id(conn)] = ctx.session

    @staticmethod
    def _caller(ctx: ServerRequestContext[Any]) -> Caller | None:
        scope = getattr(ctx.request, "scope", None)
        caller: Caller | None = scope.get(CALLER_KEY) if isinstance(scope, dict) else None
        return caller

    # -- tools/list -----------------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        self._remember(ctx)
        return types.ListToolsResult(tools=[tool_of(c, a) for c, a in
                                            self.link.catalog.items()])

    # -- tools/call -----------------------------------------------------------------------

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.InputRequiredResult:
        self._remember(ctx)
        caller = self._caller(ctx)
        if caller is not None and not caller.may_act:
            raise MCPError(types.INVALID_REQUEST, "forbidden: this caller's token is "
                                                  "read-only")
        name = params.name
        about = self.link.catalog.get(name)
        if about is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}: this colony's "
                           f"tools are {', '.join(self.link.catalog) or 'none yet'}")
        client = self.link.client(caller)
        if params.request_state:
            fut = await self._resume(client, name, params)
        else:
            payload = _payload(about, params.arguments)
            why = check_payload(name, about, payload)
            if why is not None:
                raise MCPError(types.INVALID_PARAMS, why)
            try:
                fut = client.submit(name, payload, wait=self.wait)
            except MeshantError as e:
                raise MCPError(types.INVALID_PARAMS, f"{e.code}: {e.message}") from None
        return await self._run(ctx, client, about, fut)

    async def _resume(self, client: Any, name: str, params: types.CallToolRequestParams) -> Any:
        """A retry after an InputRequiredResult: answer the task, follow it on."""
        try:
            state = json.loads(params.request_state or "")
            task, request, after = str(state["task"]), str(state["request"]), int(state["after"])
        except (ValueError, KeyError, TypeError):
            raise MCPError(types.INVALID_PARAMS, "requestState is not one this gateway "
                                                 "made") from None
        response = (params.input_responses or {}).get(request)
        try:
            att = await attach(client, task, after)
            if att.state != "input-required" and not att.done():
                pass  # answered meanwhile (another host): just follow it on
            elif isinstance(response, types.ElicitResult):
                if response.action != "accept":
                    client.cancel(task, wait=False)  # (from the loop: not waiting)
                else:
                    await asyncio.to_thread(client.answer, task, _answer(response.content),
                                            request=request)
            elif not att.done():
                client.cancel(task, wait=False)  # (from the loop: not waiting)
        except MeshantError as e:
            raise MCPError(types.INVALID_PARAMS, f"{e.code}: {e.message}") from None
        return att

    async def _run(self, ctx: ServerRequestContext[Any], client: Any, about: dict[str, Any],
                   fut: Any) -> types.CallToolResult | types.InputRequiredResult:
        session = ctx.session
        try:
            async for e in follow(fut, client, self.link):
                if isinstance(e, Ended):
                    if e.error is None:
                        return _result(about, e.value)
                    return _failed(f"{e.error.code}: {e.error.message}")
                if e.kind in ("progress", "partial"):
                    text = e.note if e.kind == "progress" else payload_text(e.value)
                    if e.kind == "progress" and e.fraction is not None:
                        text = f"{e.fraction:.0%}" + (f" {text}" if text else "")
                    await session.report_progress(float(e.seq), None, text)
                elif e.kind == "input-required":
                    asked = await self._ask(ctx, client, fut.task_id, e)
                    if asked is not None:
                        return asked
        except asyncio.CancelledError:
            # The host cancelled the call (or went away): the task goes too.
            client.cancel(fut.task_id, wait=False)  # (from the loop: not waiting)
            raise
        return _failed("the task's stream ended without a result")

    async def _ask(self, ctx: ServerRequestContext[Any], client: Any, task_id: str,
                   e: Any) -> types.InputRequiredResult | types.CallToolResult | None:
        """The task asks: elicit the answer from the host."""
        v = e.value if isinstance(e.value, dict) else {}
        prompt = payload_text(v.get("prompt"))
        data = v.get("data")
        given = data.get("schema") if isinstance(data, dict) else None
        schema: dict[str, Any] = given if isinstance(given, dict) else ANSWER_SCHEMA
        caps = ctx.session.client_capabilities
        if caps is None or caps.elicitation is None:
            client.cancel(task_id, wait=False)  # (from the loop: not waiting)
            return _failed(f"the task asks {prompt!r}, and this host does not support "
                           "elicitation: the task was cancelled (answer it from a host with "
                           "elicitation, or with 'meshant answer')")
        elicit = types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=prompt, requested_schema=schema))
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            state = json.dumps({"task": task_id, "request": e.request, "after": e.seq})
            return types.InputRequiredResult(input_requests={e.request: elicit},
                                             request_state=state)
        result = await ctx.session.elicit_form(prompt, schema,
                                               related_request_id=ctx.request_id)
        if result.action != "accept":
            client.cancel(task_id, wait=False)  # (from the loop: not waiting)
            return None  # the cancel ends the task: its end comes through the stream
        try:
            await asyncio.to_thread(client.answer, task_id, _answer(result.content),
                                    request=e.request)
        except MeshantError as err:
            log.warning("cannot answer task %s: %s", task_id, err)
        return None


def _answer(content: dict[str, Any] | None) -> Any:
    """The value ``ctx.ask`` returns: the form's ``answer`` field, or the whole form."""
    if content is not None and set(content) == {"answer"}:
        return content["answer"]
    return content


async def serve_stdio(tools: ColonyTools) -> None:
    from mcp.server.stdio import stdio_server

    server = tools.server()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(tools: ColonyTools, host: str, max_body: int) -> Any:
    """The streamable HTTP app at /mcp (the shared Guard is put around it by the
    caller; the SDK's own Host check is left to it)."""
    from mcp.server.transport_security import TransportSecuritySettings

    return tools.server().streamable_http_app(
        streamable_http_path="/mcp", host=host, max_request_body_size=max_body,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))


__all__ = ["SPEC", "ColonyTools", "http_app", "input_schema", "serve_stdio", "tool_of"]
