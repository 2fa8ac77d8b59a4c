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
  ``elicitation/create`` request; a host without elicitation is told the task was
  cancelled, and why. A question whose data carries ``sampling`` (a wrapped server's
  ``sampling/createMessage``) goes to the host's model the same way;
* resources: ``meshant://colony/status``, each colony memory key as
  ``meshant://memory/KEY`` and each task (its state and result) as
  ``meshant://tasks/ID`` (both also as templates); a memory key added or deleted
  changes the list, and a key's change updates its resource (to subscribers); prompts:
  none (listed empty, so a host that asks is not refused).

Every failure that a model can act on — an unknown tool, arguments the schema refuses
(SEP-1303), a colony that cannot take the task, the task's own failure (its exception
type named) — is a tool result with ``isError``; only a request the gateway must not
serve (a read-only token) is a protocol error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import quote, unquote

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from meshant._version import __version__
from meshant.errors import BadInput, Forbidden, MeshantError, TaskFailed
from meshant.gateways.colony import (
    CONTENT_KEY,
    Caller,
    ColonyLink,
    Ended,
    attach,
    check_payload,
    follow,
    jsonable,
    patiently,
    payload_text,
)
from meshant.gateways.http import CALLER_KEY
from meshant.gateways.wrap import SAMPLING_KEY

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


def _content(value: Any) -> list[types.ContentBlock] | None:
    """The MCP content blocks a ``{"$content": [...]}`` result carries, else None."""
    if not isinstance(value, dict) or set(value) != {CONTENT_KEY}:
        return None
    try:
        blocks = _BLOCKS.validate_python(value[CONTENT_KEY])
    except ValueError:
        return None  # not blocks after all: shown as the value it is
    return blocks or None


_BLOCKS: Any = None  # a TypeAdapter(list[ContentBlock]), made on first use


def _result(about: dict[str, Any], value: Any) -> types.CallToolResult:
    global _BLOCKS
    value = jsonable(value)
    if isinstance(value, dict) and CONTENT_KEY in value:
        if _BLOCKS is None:
            from pydantic import TypeAdapter

            _BLOCKS = TypeAdapter(list[types.ContentBlock])
        blocks = _content(value)
        if blocks is not None:
            return types.CallToolResult(content=blocks)
    schema = about.get("result")
    wrapped = not isinstance(value, dict) or bool(schema and schema.get("type") != "object")
    structured = {"result": value} if wrapped else value
    return types.CallToolResult(content=[types.TextContent(text=payload_text(value))],
                                structured_content=structured)


def _failed(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def failure_text(e: MeshantError) -> str:
    """A task's failure as its tool result says it: ``CODE: TYPE: MESSAGE`` (the
    handler's exception type, when it raised one)."""
    kind = e.remote_type if isinstance(e, TaskFailed) and e.remote_type else ""
    return f"{e.code}: " + (f"{kind}: " if kind else "") + e.message


# -- resources ----------------------------------------------------------------------------

STATUS_URI = "meshant://colony/status"
MEMORY = "meshant://memory/"
TASKS = "meshant://tasks/"
JSON_TYPE = "application/json"
PAGE = 200  # memory keys per resources/list page

TEMPLATES = [
    types.ResourceTemplate(name="task", uri_template=TASKS + "{task}", mime_type=JSON_TYPE,
                           description="A task of the colony: its state, history and, once "
                                       "it ended, its result or error (task.status)"),
    types.ResourceTemplate(name="memory", uri_template=MEMORY + "{key}", mime_type=JSON_TYPE,
                           description="A colony memory key's value (URL-encoded key)"),
]


FINAL = ("completed", "failed", "cancelled")
OUTCOME_WAIT = 5.0  # seconds a read waits for an ended task's outcome from the queen


async def _task_view(client: Any, task: str) -> dict[str, Any]:
    """A task as its resource shows it: task.status, and for an ended task its outcome
    (``result``, or ``error`` with its code, type and message) — read from an attachment
    when the status does not carry it (another client's task)."""
    st: dict[str, Any] = await patiently(client.task_status, task)
    final = st.get("final")
    if isinstance(final, dict) and ("result" in final or "error" in final):
        if "result" in final:
            st["result"] = final["result"]
        else:
            st["error"] = final["error"]
        return st
    if st.get("state") not in FINAL:
        return st
    att = await attach(client, task, 0)
    try:
        st["result"] = await asyncio.wait_for(asyncio.wrap_future(att), OUTCOME_WAIT)
    except MeshantError as e:
        st["error"] = {"code": e.code, "message": e.message,
                       **({"type": e.remote_type} if isinstance(e, TaskFailed) else {})}
    except TimeoutError:
        pass  # the outcome is not kept any more: the state says how it ended
    finally:
        if not att.done():
            client._detach(att)  # a read, not a follow
    return st


async def _memory(client: Any) -> dict[str, Any]:
    """The colony memory as ``client`` holds it, once it holds a snapshot (watching it
    turns its sync on without waiting for one; a read must wait)."""
    def read() -> dict[str, Any]:
        try:
            client.memory.wait_synced(OUTCOME_WAIT)
        except MeshantError:
            log.warning("no memory snapshot within %g s; reading what is here", OUTCOME_WAIT)
        items: dict[str, Any] = client.memory.items()
        return items

    return await asyncio.to_thread(read)


def _json_contents(uri: str, value: Any) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=uri, mime_type=JSON_TYPE, text=json.dumps(jsonable(value)))])


class ColonyTools:
    """The MCP handlers over a colony (one per gateway process)."""

    def __init__(self, link: ColonyLink, *, wait: float | None = None) -> None:
        self.link = link
        self.wait = wait
        self.bus = InMemorySubscriptionBus()
        self._sessions: dict[int, Any] = {}  # handshake sessions, to tell of list changes
        # Handshake sessions' resources/subscribe: URI -> connection id -> session.
        self._subscribed: dict[str, dict[int, Any]] = {}
        self._keys: set[str] | None = None  # memory keys, once the memory is watched
        self._telling: set[asyncio.Task[None]] = set()  # notices under way (kept alive)
        self._listen = ListenHandler(self.bus)
        link.on_change(self._changed)

    def server(self) -> Server[Any]:
        tools = self

        class _Server(Server[Any]):
            def create_initialization_options(self, notification_options: Any = None,
                                              experimental_capabilities: Any = None,
                                              extensions: Any = None
                                              ) -> InitializationOptions:
                return super().create_initialization_options(
                    notification_options or NotificationOptions(tools_changed=True,
                                                                resources_changed=True),
                    experimental_capabilities, extensions)

        return _Server("meshant", version=__version__,
                       description="A meshant colony: each tool is a capability its "
                                   "foragers serve",
                       on_list_tools=tools.list_tools, on_call_tool=tools.call_tool,
                       on_list_resources=tools.list_resources,
                       on_list_resource_templates=tools.list_resource_templates,
                       on_read_resource=tools.read_resource,
                       on_subscribe_resource=tools.subscribe,
                       on_unsubscribe_resource=tools.unsubscribe,
                       on_list_prompts=tools.list_prompts, on_get_prompt=tools.get_prompt,
                       on_subscriptions_listen=tools.listen)

    async def _changed(self) -> None:
        await self.bus.publish(ToolsListChanged())
        for key, session in list(self._sessions.items()):
            try:
                await session.send_tool_list_changed()
            except Exception:
                self._sessions.pop(key, None)  # the connection is gone

    async def _tell(self, sessions: list[tuple[int, Any]], send: str, *args: Any) -> None:
        """Send a notification to handshake sessions, forgetting those that are gone."""
        for key, session in sessions:
            try:
                await getattr(session, send)(*args)
            except Exception:
                self._sessions.pop(key, None)  # the connection is gone
                for subs in self._subscribed.values():
                    subs.pop(key, None)

    async def _watch_memory(self) -> None:
        """From the first resources request on, a memory key added or deleted changes
        the resource list, and a key's change updates its resource: told on the bus
        (2026-07-28's subscriptions/listen) and to handshake sessions."""
        if self._keys is not None:
            return
        keys: set[str] = set()
        self._keys = keys  # (before any await: two first requests watch once)
        client = self.link.client()
        loop = asyncio.get_running_loop()

        def tell(key: str, deleted: bool) -> None:
            task = loop.create_task(self._memory_changed(key, deleted))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

        def changed(key: str, value: Any, deleted: bool) -> None:  # (the I/O thread)
            loop.call_soon_threadsafe(tell, key, deleted)

        # Watched before it is read: a change in between is told (once more), not lost.
        client.memory.on_change(changed)
        keys.update(await _memory(client))

    async def _memory_changed(self, key: str, deleted: bool) -> None:
        keys = self._keys if self._keys is not None else set()
        uri = MEMORY + quote(key, safe="")
        if deleted or key not in keys:
            (keys.discard if deleted else keys.add)(key)
            await self.bus.publish(ResourcesListChanged())
            await self._tell(list(self._sessions.items()), "send_resource_list_changed")
        await self.bus.publish(ResourceUpdated(uri=uri))
        await self._tell(list(self._subscribed.get(uri, {}).items()), "send_resource_updated",
                         uri)

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
            # A tool the colony does not serve (now: foragers come and go) is the call's
            # outcome, which the model reads and acts on, as MCPServer answers it.
            return _failed(f"unknown tool {name!r}: this colony's tools are "
                           f"{', '.join(self.link.catalog) or 'none yet'}")
        client = self.link.client(caller)
        if params.request_state:
            fut = await self._resume(client, name, params)
        else:
            payload = _payload(about, params.arguments)
            why = check_payload(name, about, payload)
            if why is not None:
                return _failed(why)  # an input validation error (SEP-1303)
            try:
                fut = client.submit(name, payload, wait=self.wait)
            except Forbidden as e:
                raise MCPError(types.INVALID_REQUEST, f"{e.code}: {e.message}") from None
            except MeshantError as e:
                return _failed(f"{e.code}: {e.message}")
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
            elif isinstance(response, types.CreateMessageResult):
                await asyncio.to_thread(client.answer, task, response.model_dump(
                    by_alias=True, mode="json", exclude_none=True), request=request)
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
                    return _failed(failure_text(e.error))
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
        """The task asks: elicit the answer from the host (or, for a sampling request,
        ask the host's model)."""
        v = e.value if isinstance(e.value, dict) else {}
        prompt = payload_text(v.get("prompt"))
        data = v.get("data")
        sampling = data.get(SAMPLING_KEY) if isinstance(data, dict) else None
        if isinstance(sampling, dict):
            return await self._sample(ctx, client, task_id, e, sampling)
        given = data.get("schema") if isinstance(data, dict) else None
        schema: dict[str, Any] = given if isinstance(given, dict) else ANSWER_SCHEMA
        caps = ctx.session.client_capabilities
        if caps is None or caps.elicitation is None:
            return self._unanswerable(client, task_id, prompt, "elicitation")
        elicit = types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=prompt, requested_schema=schema))
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self._input_required(task_id, e, elicit)
        result = await ctx.session.elicit_form(prompt, schema,
                                               related_request_id=ctx.request_id)
        if result.action != "accept":
            client.cancel(task_id, wait=False)  # (from the loop: not waiting)
            return None  # the cancel ends the task: its end comes through the stream
        await self._answer(client, task_id, _answer(result.content), e.request)
        return None

    async def _sample(self, ctx: ServerRequestContext[Any], client: Any, task_id: str,
                      e: Any, sampling: dict[str, Any]
                      ) -> types.InputRequiredResult | types.CallToolResult | None:
        """A question that is a sampling request: the host's model answers it."""
        from pydantic import ValidationError

        try:
            params = types.CreateMessageRequestParams.model_validate(sampling)
        except ValidationError as err:
            client.cancel(task_id, wait=False)  # (from the loop: not waiting)
            first = err.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            return _failed(f"task {task_id} was cancelled: its sampling request is malformed "
                           f"(at {where or 'the top'}: {first['msg']})")
        caps = ctx.session.client_capabilities
        if caps is None or caps.sampling is None:
            return self._unanswerable(client, task_id, payload_text(
                e.value.get("prompt")), "sampling")
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self._input_required(task_id, e, types.CreateMessageRequest(params=params))
        from mcp.shared.message import ServerMessageMetadata

        # The request as the task made it (send_request: create_message would rebuild
        # it field by field, and warns of 2026-07-28's deprecation on every revision).
        result = await ctx.session.send_request(
            types.CreateMessageRequest(params=params),
            types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        await self._answer(client, task_id, result.model_dump(
            by_alias=True, mode="json", exclude_none=True), e.request)
        return None

    @staticmethod
    def _input_required(task_id: str, e: Any, request: Any) -> types.InputRequiredResult:
        state = json.dumps({"task": task_id, "request": e.request, "after": e.seq})
        return types.InputRequiredResult(input_requests={e.request: request},
                                         request_state=state)

    @staticmethod
    def _unanswerable(client: Any, task_id: str, prompt: str,
                      feature: str) -> types.CallToolResult:
        """The host cannot answer the task's question: the task is cancelled (nobody
        could answer it through this call), and the host is told so."""
        client.cancel(task_id, wait=False)  # (from the loop: not waiting)
        what = "the host's model" if feature == "sampling" else "the user"
        return _failed(f"task {task_id} was cancelled: it asks {what} {prompt!r}, and this "
                       f"host does not support {feature}. Call the tool again from a host "
                       f"that does, or submit a new task with 'meshant submit' and reply "
                       f"with 'meshant answer'")

    @staticmethod
    async def _answer(client: Any, task_id: str, value: Any, request: str) -> None:
        try:
            await asyncio.to_thread(client.answer, task_id, value, request=request)
        except MeshantError as err:
            log.warning("cannot answer task %s: %s", task_id, err)

    # -- resources and prompts ------------------------------------------------------------

    async def list_resources(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        """The colony's status, then its memory keys (a page at a time, in key order)."""
        self._remember(ctx)
        await self._watch_memory()
        cursor = params.cursor if params is not None else None
        client = self.link.client(self._caller(ctx))
        keys = sorted(await _memory(client))
        if cursor:
            keys = [k for k in keys if k > cursor]
        page, rest = keys[:PAGE], keys[PAGE:]
        out = [] if cursor else [types.Resource(
            name="colony status", uri=STATUS_URI, mime_type=JSON_TYPE,
            description="The colony's foragers, capabilities, queues and counters")]
        out += [types.Resource(name=k, uri=MEMORY + quote(k, safe=""), mime_type=JSON_TYPE,
                               description=f"colony memory key {k!r}") for k in page]
        return types.ListResourcesResult(resources=out,
                                         next_cursor=page[-1] if rest else None)

    async def list_resource_templates(self, ctx: ServerRequestContext[Any],
                                      params: types.PaginatedRequestParams | None
                                      ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=TEMPLATES)

    async def read_resource(self, ctx: ServerRequestContext[Any],
                            params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        self._remember(ctx)
        await self._watch_memory()
        uri = str(params.uri)
        client = self.link.client(self._caller(ctx))
        if uri == STATUS_URI:
            return _json_contents(uri, await asyncio.to_thread(client.status))
        if uri.startswith(MEMORY) and len(uri) > len(MEMORY):
            key = unquote(uri[len(MEMORY):])
            items = await _memory(client)
            if key not in items:
                raise MCPError(types.INVALID_PARAMS, f"resource not found: {uri} (no colony "
                               f"memory key {key!r})")
            return _json_contents(uri, items[key])
        if uri.startswith(TASKS) and len(uri) > len(TASKS):
            task = unquote(uri[len(TASKS):])
            try:
                status = await _task_view(client, task)
            except Forbidden as e:
                raise MCPError(types.INVALID_REQUEST, f"{e.code}: {e.message}") from None
            except BadInput as e:
                raise MCPError(types.INVALID_PARAMS, f"resource not found: {uri} "
                               f"({e.message})") from None
            except MeshantError as e:
                raise MCPError(types.INTERNAL_ERROR, f"{e.code}: {e.message}") from None
            return _json_contents(uri, status)
        raise MCPError(types.INVALID_PARAMS, f"resource not found: {uri} (this gateway "
                       f"serves {STATUS_URI}, {MEMORY}KEY and {TASKS}ID)")

    async def listen(self, ctx: ServerRequestContext[Any],
                     params: types.SubscriptionsListenRequestParams
                     ) -> types.SubscriptionsListenResult:
        """2026-07-28's ``subscriptions/listen`` (the SDK's handler), the memory watched
        first when the stream wants resource events."""
        wants = params.notifications
        if wants.resources_list_changed or wants.resource_subscriptions:
            await self._watch_memory()
        return await self._listen(ctx, params)

    async def subscribe(self, ctx: ServerRequestContext[Any],
                        params: types.SubscribeRequestParams) -> types.EmptyResult:
        """Updates of a memory key's resource (the only ones that change in place)."""
        self._remember(ctx)
        uri = str(params.uri)
        if not uri.startswith(MEMORY) or len(uri) == len(MEMORY):
            raise MCPError(types.INVALID_PARAMS, f"cannot subscribe to {uri}: only colony "
                           f"memory keys ({MEMORY}KEY) send updates")
        conn = getattr(ctx.session, "_connection", None)
        subs = self._subscribed.setdefault(uri, {})
        if conn is not None and len(subs) < 10_000 and len(self._subscribed) < 10_000:
            subs[id(conn)] = ctx.session
        await self._watch_memory()
        return types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any],
                          params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        conn = getattr(ctx.session, "_connection", None)
        subs = self._subscribed.get(uri, {})
        subs.pop(id(conn), None)
        if not subs:
            self._subscribed.pop(uri, None)
        return types.EmptyResult()

    async def list_prompts(self, ctx: ServerRequestContext[Any],
                           params: types.PaginatedRequestParams | None
                           ) -> types.ListPromptsResult:
        """None: a colony's capabilities are tools. Listed (empty) so that a host which
        asks for prompts is answered rather than refused."""
        return types.ListPromptsResult(prompts=[])

    async def get_prompt(self, ctx: ServerRequestContext[Any],
                         params: types.GetPromptRequestParams) -> types.GetPromptResult:
        raise MCPError(types.INVALID_PARAMS, f"no prompt {params.name!r}: a colony has no "
                                             "prompts (its capabilities are tools)")


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
    """The streamable HTTP app at /mcp, its streams resumable (mcp_http.py); the shared
    Guard is put around it by the caller, which checks Host and Origin."""
    from meshant.gateways.mcp_http import http_app as app

    return app(tools.server(), path="/mcp", max_body=max_body)


__all__ = ["SPEC", "STATUS_URI", "ColonyTools", "failure_text", "http_app", "input_schema",
           "serve_stdio", "tool_of"]
