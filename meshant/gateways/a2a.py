"""``meshant a2a``: an A2A server in front of a colony, on the official ``a2a-sdk``.

A2A protocol 1.0 (the SDK's ``PROTOCOL_VERSION_CURRENT``), over the JSON-RPC binding
(with server-sent events for streaming; 0.3 clients through the SDK's adapter) and the
HTTP+JSON binding; the SDK's routes
parse, validate and frame every request and answer every error; this module is its
``RequestHandler`` over the colony:

* the agent card lists the colony's capabilities as skills, live; each capability is
  also an agent of its own under ``/agents/CAPABILITY``;
* an A2A task is a meshant task (same id): sending a message submits one, getting it
  reads the queen's state and attaches for its artifacts, cancelling cancels it,
  subscribing attaches from the start; so any gateway, or this one restarted, serves
  any task, and nothing here outlives a request;
* partial results become artifacts, progress becomes ``working`` status updates,
  ``ctx.ask`` becomes ``input-required`` and the client's next message on the task is
  the answer; a failure carries meshant's error code (``metadata.code``) and message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_CURRENT
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from meshant._version import __version__
from meshant.actors.attach import Attachment
from meshant.actors.client import Client
from meshant.actors.futures import TaskFuture, Update
from meshant.errors import BadInput, Forbidden, MeshantError, TooLarge
from meshant.gateways.colony import (
    Caller,
    ColonyLink,
    Ended,
    attach,
    check_payload,
    follow,
    jsonable,
    kept,
    patiently,
    payload_text,
)
from meshant.gateways.http import CALLER_KEY

log = logging.getLogger("meshant.gateways.a2a")

SPEC = f"A2A {PROTOCOL_VERSION_CURRENT}"
BINDINGS = ("JSONRPC", "HTTP+JSON")
STATES = {"queued": TaskState.TASK_STATE_SUBMITTED, "assigned": TaskState.TASK_STATE_WORKING,
          "accepted": TaskState.TASK_STATE_WORKING,
          "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
          "completed": TaskState.TASK_STATE_COMPLETED, "failed": TaskState.TASK_STATE_FAILED,
          "cancelled": TaskState.TASK_STATE_CANCELED}
FINAL = (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
         TaskState.TASK_STATE_CANCELED)
SNAPSHOT_WAIT = 5.0  # seconds to wait for an attachment's kept updates


# -- values ---------------------------------------------------------------------------------

def _narrow(v: Any) -> Any:
    """A protobuf Value holds every number as a double: whole ones back to int."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list):
        return [_narrow(x) for x in v]
    if isinstance(v, dict):
        return {k: _narrow(x) for k, x in v.items()}
    return v


def payload_of(msg: Message) -> Any:
    """A message's payload: its data part as JSON, else its text parts as one string."""
    for part in msg.parts:
        if part.HasField("data"):
            return _narrow(MessageToDict(part.data))
    texts = [part.text for part in msg.parts if part.HasField("text")]
    if texts:
        return "\n".join(texts)
    if any(part.HasField("raw") or part.HasField("url") for part in msg.parts):
        raise InvalidParamsError("file parts are not accepted: send the payload as a "
                                 "data part (JSON) or a text part")
    return None


def parts_of(value: Any) -> list[Part]:
    """A value as parts: a string as text, anything else as a data part."""
    if isinstance(value, str):
        return [Part(text=value)]
    if isinstance(value, bytes):
        return [Part(text=value.decode("utf-8", "replace"))]
    try:
        return [Part(data=ParseDict(jsonable(value), struct_pb2.Value()))]
    except Exception:
        return [Part(text=payload_text(value))]


def _agent_message(task_id: str, context_id: str, text: str, data: Any = None,
                   metadata: dict[str, Any] | None = None) -> Message:
    parts = [Part(text=text)]
    if data is not None:
        parts += parts_of(data)
    m = Message(message_id=str(uuid.uuid4()), task_id=task_id, context_id=context_id,
                role=Role.ROLE_AGENT, parts=parts)
    if metadata:
        m.metadata.update(jsonable(metadata))
    return m


class TaskView:
    """What an A2A client sees of one meshant task, built from its updates."""

    def __init__(self, task_id: str, context_id: str, capability: str = "") -> None:
        self.task_id, self.context_id, self.capability = task_id, context_id, capability
        self.state = TaskState.TASK_STATE_SUBMITTED
        self.message: Message | None = None
        self.artifacts: list[Artifact] = []

    def task(self) -> Task:
        t = Task(id=self.task_id, context_id=self.context_id,
                 status=TaskStatus(state=self.state), artifacts=self.artifacts)
        if self.message is not None:
            t.status.message.CopyFrom(self.message)
        if self.capability:
            t.metadata.update({"skill": self.capability})
        return t

    def _status(self, state: TaskState, message: Message | None = None,
                metadata: dict[str, Any] | None = None) -> TaskStatusUpdateEvent:
        self.state, self.message = state, message
        ev = TaskStatusUpdateEvent(task_id=self.task_id, context_id=self.context_id,
                                   status=TaskStatus(state=state))
        if message is not None:
            ev.status.message.CopyFrom(message)
        if metadata:
            ev.metadata.update(jsonable(metadata))
        return ev

    def _artifact(self, artifact_id: str, name: str, value: Any,
                  seq: int) -> TaskArtifactUpdateEvent:
        a = Artifact(artifact_id=artifact_id, name=name, parts=parts_of(value))
        a.metadata.update({"seq": seq})
        self.artifacts.append(a)
        return TaskArtifactUpdateEvent(task_id=self.task_id, context_id=self.context_id,
                                       artifact=a, last_chunk=name == "result")

    def event(self, e: Update | Ended) -> list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
        """The A2A events one meshant update stands for."""
        tid, cid = self.task_id, self.context_id
        if isinstance(e, Ended):
            if e.error is None:
                return [self._artifact(f"{tid}.result", "result", e.value, 0),
                        self._status(TaskState.TASK_STATE_COMPLETED)]
            code = getattr(e.error, "code", "error")
            state = (TaskState.TASK_STATE_CANCELED if code == "cancelled"
                     else TaskState.TASK_STATE_FAILED)
            return [self._status(state, _agent_message(tid, cid, f"{code}: {e.error.message}",
                                                       metadata={"code": code}),
                                 {"code": code})]
        meta = {"seq": e.seq}
        if e.kind == "partial":
            return [self._artifact(f"{tid}.partial.{e.seq}", "partial", e.value, e.seq)]
        if e.kind == "progress":
            if e.fraction is not None:
                meta["fraction"] = e.fraction  # type: ignore[assignment]
            msg = (_agent_message(tid, cid, e.note, metadata=meta)
                   if e.note is not None else None)
            return [self._status(TaskState.TASK_STATE_WORKING, msg, meta)]
        if e.kind == "input-required":
            v = e.value if isinstance(e.value, dict) else {}
            prompt = v.get("prompt")
            meta["request"] = e.request  # type: ignore[assignment]
            msg = _agent_message(tid, cid, payload_text(prompt), v.get("data"), meta)
            return [self._status(TaskState.TASK_STATE_INPUT_REQUIRED, msg, meta)]
        if e.kind == "withdrawn":
            return [self._status(TaskState.TASK_STATE_WORKING, None, meta)]
        return []


# -- errors ---------------------------------------------------------------------------------

def a2a_error(e: MeshantError) -> A2AError:
    """The A2A error a colony's refusal stands for."""
    code = getattr(e, "code", "error")
    text = f"{code}: {e.message}"
    if code == "unknown-task":
        return TaskNotFoundError(text)
    if isinstance(e, Forbidden) or code in ("forbidden", "not-allowed"):
        return InvalidRequestError(text, data={"code": code})
    if isinstance(e, BadInput | TooLarge):
        return InvalidParamsError(text, data={"code": code})
    return InternalError(text, data={"code": code})


# -- the handler ----------------------------------------------------------------------------

class ColonyAgent(RequestHandler):
    """The A2A request handler of a colony (``capability``: of one capability's agent,
    taken from the path ``/agents/CAPABILITY``)."""

    def __init__(self, link: ColonyLink, *, wait: float | None = None) -> None:
        self.link = link
        self.wait = wait

    # -- who and what ---------------------------------------------------------------------

    @staticmethod
    def _caller(context: ServerCallContext, act: bool) -> Caller | None:
        caller: Caller | None = context.state.get("caller")
        if act and caller is not None and not caller.may_act:
            raise InvalidRequestError("forbidden: this caller's token is read-only")
        return caller

    def _skill(self, context: ServerCallContext, msg: Message) -> str:
        catalog = self.link.catalog
        fixed = context.state.get("capability")
        skill = fixed
        if skill is None:
            meta = MessageToDict(msg.metadata) if msg.HasField("metadata") else {}
            skill = meta.get("skill")
        if not skill:
            if len(catalog) == 1:
                return next(iter(catalog))
            raise InvalidParamsError(
                "name the skill in the message's metadata.skill (or send to "
                f"/agents/SKILL); this colony's skills: {', '.join(catalog) or 'none yet'}")
        if not isinstance(skill, str) or skill not in catalog:
            raise InvalidParamsError(f"unknown skill {skill!r}: this colony's skills are "
                                     f"{', '.join(catalog) or 'none yet'}")
        return skill

    # -- sending --------------------------------------------------------------------------

    async def _start(self, params: SendMessageRequest, context: ServerCallContext
                     ) -> tuple[TaskView, TaskFuture[Any], Client]:
        """Submit a new task, or answer the task the message continues. Returns the view,
        a future that follows the task, and the client it came through."""
        caller = self._caller(context, act=True)
        client = self.link.client(caller)
        msg = params.message
        if msg.task_id:
            return await self._continue(client, msg, context)
        skill = self._skill(context, msg)
        payload = payload_of(msg)
        why = check_payload(skill, self.link.catalog.get(skill, {}), payload)
        if why is not None:
            raise InvalidParamsError(why)
        try:
            fut = client.submit(skill, payload, wait=self.wait)
        except MeshantError as e:
            raise a2a_error(e) from None
        return TaskView(fut.task_id, msg.context_id or fut.task_id, skill), fut, client

    async def _continue(self, client: Client, msg: Message, context: ServerCallContext
                        ) -> tuple[TaskView, TaskFuture[Any], Client]:
        """The message answers its task's question: the handler's ``ctx.ask`` returns
        the message's payload."""
        task_id = msg.task_id
        try:
            st = await patiently(client.task_status, task_id)
        except MeshantError as e:
            raise a2a_error(e) from None
        if st["state"] != "input-required":
            raise InvalidParamsError(f"task {task_id} is {st['state']}, not waiting for "
                                     "input: a message on an existing task answers its "
                                     "question")
        try:
            att = await attach(client, task_id, 0)
            view = await self._snapshot(client, att, TaskView(
                task_id, msg.context_id or task_id, st.get("capability", "")))
            await asyncio.to_thread(client.answer, task_id, payload_of(msg))
        except MeshantError as e:
            raise a2a_error(e) from None
        view.state = TaskState.TASK_STATE_WORKING
        view.message = None
        return view, att, client

    async def _snapshot(self, client: Client, att: Attachment, view: TaskView) -> TaskView:
        """Fold the updates an attachment was sent on attaching (up to its ``last``)
        into ``view``."""
        for u in await kept(client, att, SNAPSHOT_WAIT):
            view.event(u)
        view.state = STATES.get(att.state, view.state)
        if att.done():
            err = att.exception()
            view.event(Ended(value=att.result()) if err is None else Ended(
                error=err if isinstance(err, MeshantError) else MeshantError(str(err))))
        return view

    async def on_message_send(self, params: SendMessageRequest,
                              context: ServerCallContext) -> Task | Message:
        view, fut, client = await self._start(params, context)
        if params.configuration.return_immediately:
            return view.task()
        async for e in follow(fut, client, self.link):
            view.event(e)
            if view.state in FINAL or view.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                break
        return view.task()

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Any]:
        view, fut, client = await self._start(params, context)
        yield view.task()
        async for ev in self._events(view, fut, client, stop_on_input=True):
            yield ev

    async def _events(self, view: TaskView, fut: TaskFuture[Any], client: Client,
                      stop_on_input: bool) -> AsyncIterator[Any]:
        async for e in follow(fut, client, self.link):
            for ev in view.event(e):
                yield ev
            if view.state in FINAL or (stop_on_input and view.state
                                       == TaskState.TASK_STATE_INPUT_REQUIRED):
                return

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Any]:
        client = self.link.client(self._caller(context, act=False))
        try:
            att = await attach(client, params.id, 0)
        except MeshantError as e:
            raise a2a_error(e) from None
        view = await self._snapshot(client, att, TaskView(params.id, params.id))
        if view.state in FINAL:
            raise UnsupportedOperationError(
                f"task {params.id} is already {TaskState.Name(view.state)}: get it instead")
        yield view.task()
        async for ev in self._events(view, att, client, stop_on_input=False):
            yield ev

    # -- tasks ----------------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest,
                          context: ServerCallContext) -> Task | None:
        client = self.link.client(self._caller(context, act=False))
        try:
            st = await patiently(client.task_status, params.id)
            att = await attach(client, params.id, 0)
        except MeshantError as e:
            if getattr(e, "code", "") == "unknown-task":
                return None
            raise a2a_error(e) from None
        view = await self._snapshot(client, att, TaskView(params.id, params.id,
                                                          st.get("capability", "")))
        if not att.done():
            client._detach(att)  # a read, not a follow
        view.state = STATES.get(st["state"], view.state)
        return view.task()

    async def on_cancel_task(self, params: CancelTaskRequest,
                             context: ServerCallContext) -> Task | None:
        client = self.link.client(self._caller(context, act=True))
        try:
            st = await patiently(client.task_status, params.id)
        except MeshantError as e:
            if getattr(e, "code", "") == "unknown-task":
                return None
            raise a2a_error(e) from None
        if STATES.get(st["state"]) in FINAL:
            raise TaskNotCancelableError(f"task {params.id} is already {st['state']}")
        try:
            att = await attach(client, params.id, 0)
            await asyncio.to_thread(client.cancel, params.id)  # (its verdict: forbidden...)
        except MeshantError as e:
            raise a2a_error(e) from None
        view = TaskView(params.id, params.id, st.get("capability", ""))
        try:
            async with asyncio.timeout(10):
                async for ev in follow(att, client, self.link):
                    view.event(ev)
        except TimeoutError:  # a handler that ignores cancels: it is still running
            view.state = STATES.get(att.state, TaskState.TASK_STATE_WORKING)
        return view.task()

    async def on_list_tasks(self, params: ListTasksRequest,
                            context: ServerCallContext) -> ListTasksResponse:
        raise UnsupportedOperationError("listing tasks is not offered: the colony's tasks "
                                        "are many clients'; get a task by its id")

    # -- push notifications: not offered -----------------------------------------------------

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_get_task_push_notification_config(
            self, params: GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError()

    async def on_delete_task_push_notification_config(
            self, params: DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError()

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        raise UnsupportedOperationError("no extended agent card")


# -- the cards and the app ------------------------------------------------------------------

def skill_of(capability: str, about: dict[str, Any]) -> AgentSkill:
    desc = about.get("description") or f"the colony's {capability!r} capability"
    if about.get("payload"):
        desc += " Payload schema: " + json.dumps(about["payload"], separators=(",", ":"))
    return AgentSkill(id=capability, name=capability, description=desc, tags=["meshant"],
                      input_modes=["application/json", "text/plain"],
                      output_modes=["application/json", "text/plain"])


def card(link: ColonyLink, base_url: str, name: str,
         capability: str | None = None) -> AgentCard:
    """The colony's agent card (or one capability's), as the catalog is now."""
    base = base_url.rstrip("/") + (f"/agents/{capability}" if capability else "")
    skills = ([skill_of(capability, link.catalog.get(capability, {}))] if capability
              else [skill_of(c, a) for c, a in link.catalog.items()])
    desc = (link.catalog.get(capability or "", {}).get("description")
            if capability else None) or (
        f"meshant colony {name!r}: each skill is a capability its foragers serve; name it in "
        "the message's metadata.skill")
    return AgentCard(
        name=f"{name}/{capability}" if capability else name, description=desc,
        version=__version__,
        supported_interfaces=[
            AgentInterface(url=base + "/", protocol_binding="JSONRPC",
                           protocol_version=PROTOCOL_VERSION_CURRENT),
            AgentInterface(url=base + "/rest", protocol_binding="HTTP+JSON",
                           protocol_version=PROTOCOL_VERSION_CURRENT)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json", "text/plain"],
        skills=skills)


class _Context(DefaultServerCallContextBuilder):
    """The call context carries the caller (from the token) and the capability (from
    the path of a capability's own agent)."""

    def build(self, request: Request) -> ServerCallContext:
        ctx = super().build(request)
        ctx.state["caller"] = request.scope.get(CALLER_KEY)
        cap = request.path_params.get("cap")
        if cap is not None:
            ctx.state["capability"] = cap
        return ctx


def app(link: ColonyLink, base_url: str, name: str = "meshant",
        wait: float | None = None) -> Starlette:
    """The gateway's ASGI app (to be wrapped in the HTTP policy's Guard)."""
    handler = ColonyAgent(link, wait=wait)
    builder = _Context()

    async def root_card(request: Request) -> Response:
        return JSONResponse(agent_card_to_dict(card(link, base_url, name)))

    async def cap_card(request: Request) -> Response:
        cap = request.path_params["cap"]
        if cap not in link.catalog:
            return JSONResponse({"error": f"no capability {cap!r} in this colony"}, 404)
        return JSONResponse(agent_card_to_dict(card(link, base_url, name, cap)))

    class _Known:
        """A capability's own agent answers only for capabilities the colony has."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            cap = scope.get("path_params", {}).get("cap")
            if cap is not None and cap not in link.catalog:
                await JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32602, "message": f"no capability {cap!r} in this colony: its "
                    f"skills are {', '.join(link.catalog) or 'none yet'}"}}, 404)(
                        scope, receive, send)
                return
            await self.inner(scope, receive, send)

    routes: list[BaseRoute] = [
        Route(AGENT_CARD_WELL_KNOWN_PATH, root_card, methods=["GET"]),
        Route("/agents/{cap}" + AGENT_CARD_WELL_KNOWN_PATH, cap_card, methods=["GET"]),
    ]
    # The capabilities' own agents first: the root's HTTP+JSON routes end with a
    # catch-all (a tenant prefix) that would take their paths.
    for rpc in create_jsonrpc_routes(handler, "/agents/{cap}/", context_builder=builder,
                                     enable_v0_3_compat=True):
        assert isinstance(rpc, Route)
        routes.append(Route(rpc.path, _Known(rpc.app), methods=["POST"]))
    for rest in create_rest_routes(handler, context_builder=builder,
                                   path_prefix="/agents/{cap}/rest"):
        if isinstance(rest, Route):
            routes.append(Route(rest.path, _Known(rest.app), methods=list(rest.methods or ())))
    routes += [*create_jsonrpc_routes(handler, "/", context_builder=builder,
                                      enable_v0_3_compat=True),
               *create_rest_routes(handler, context_builder=builder, path_prefix="/rest")]
    return Starlette(routes=routes)


__all__ = ["BINDINGS", "SPEC", "ColonyAgent", "TaskView", "app", "card", "payload_of"]
