"""``meshant a2a``: an A2A server in front of a colony, on the official ``a2a-sdk``.

A2A protocol 1.0 (the SDK's ``PROTOCOL_VERSION_CURRENT``), over the JSON-RPC binding
(with server-sent events for streaming; 0.3 clients through the SDK's adapter) and the
HTTP+JSON binding; the SDK's routes parse and frame every request and answer every
error; this module is its ``RequestHandler`` over the colony:

* the agent card lists the colony's capabilities as skills, live (with an ETag, a
  max-age and Last-Modified); each capability is also an agent of its own under
  ``/agents/CAPABILITY``;
* every request is checked whole before anything runs: a malformed one is an error and
  submits nothing;
* an A2A task is a meshant task (same id): sending a message submits one, getting it
  reads the queen's state and attaches for its artifacts, cancelling cancels it,
  subscribing attaches from the start; so any gateway, or this one restarted, serves
  any task;
* partial results become artifacts, progress becomes ``working`` status updates,
  ``ctx.ask`` becomes ``input-required`` and the client's next message on the task is
  the answer; a failure carries meshant's error code and the exception's type;
* what A2A has and the colony does not keep (context ids, message history, status
  times, push-notification configs, the listing ``ListTasks`` pages through) is this
  gateway's :class:`~meshant.gateways.a2a_tasks.TaskBook`, for the tasks it served;
  push notifications go only where :class:`~meshant.gateways.a2a_push.PushPolicy` says.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import (
    agent_card_to_dict,
    build_error_response,
)
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
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.proto_utils import to_stream_response
from a2a.utils.task import apply_history_length, validate_history_length
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
from meshant.gateways.a2a_push import Pusher, PushPolicy
from meshant.gateways.a2a_tasks import FINAL, Identity, Record, TaskBook
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
STATES = {"queued": TaskState.TASK_STATE_SUBMITTED, "delayed": TaskState.TASK_STATE_SUBMITTED,
          "assigned": TaskState.TASK_STATE_WORKING,
          "accepted": TaskState.TASK_STATE_WORKING,
          "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
          "completed": TaskState.TASK_STATE_COMPLETED, "failed": TaskState.TASK_STATE_FAILED,
          "cancelled": TaskState.TASK_STATE_CANCELED}
SNAPSHOT_WAIT = 5.0  # seconds to wait for an attachment's kept updates
REFRESH_MAX = 200  # unfinished tasks a listing asks the queen about
PUSH_FOLLOW_MAX = 1000  # running tasks followed for their push notifications at once
JSON_MODES = ["application/json", "text/plain"]
FILE_MODE = "application/octet-stream"  # a capability that takes files takes any bytes


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


def _is_file(part: Part) -> bool:
    return bool(part.HasField("raw") or part.HasField("url"))


def _file_value(part: Part) -> Any:
    """A file part inside a payload of several parts: its bytes (or URL) with what the
    client said of it."""
    out: dict[str, Any] = ({"raw": bytes(part.raw)} if part.HasField("raw")
                           else {"url": part.url})
    if part.media_type:
        out["mediaType"] = part.media_type
    if part.filename:
        out["filename"] = part.filename
    return out


def payload_of(msg: Message) -> Any:
    """A message's payload: its data part as JSON, else its text parts as one string; a
    message with files: one raw part alone is its bytes (carried to the capability as a
    blob), several parts a list of their values (text, JSON, or a file's
    ``{"raw"|"url", "mediaType", "filename"}``). A URL is passed on, never fetched."""
    files = False
    for i, part in enumerate(msg.parts):
        kind = part.WhichOneof("content")
        if kind is None:
            raise InvalidParamsError(f"part {i} of the message has no content (text, data, "
                                     "raw or url)")
        files = files or kind in ("raw", "url")
    if not files:
        for part in msg.parts:
            if part.HasField("data"):
                return _narrow(MessageToDict(part.data))
        texts = [part.text for part in msg.parts]
        return "\n".join(texts) if texts else None
    if len(msg.parts) == 1 and msg.parts[0].HasField("raw"):
        return bytes(msg.parts[0].raw)
    return [_file_value(p) if _is_file(p) else
            _narrow(MessageToDict(p.data)) if p.HasField("data") else p.text
            for p in msg.parts]


def _json_view(value: Any) -> Any:
    """A payload as its schema sees it: bytes as a string (JSON has no bytes)."""
    if isinstance(value, bytes | bytearray):
        return ""
    if isinstance(value, list):
        return [_json_view(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_view(v) for k, v in value.items()}
    return value


def takes_files(about: dict[str, Any]) -> bool:
    """Whether a capability takes file parts: it declares no payload schema, or one a
    string fits (a file travels as bytes; ``bytes`` and ``str`` hints both say string)."""
    return not about.get("payload") or check_payload("", about, "") is None


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether a value is JSON as it is (no bytes, no other types, string keys)."""
    if value is None or isinstance(value, str | bool | int | float):
        return True
    if depth > 32:
        return False
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def parts_of(value: Any) -> list[Part]:
    """A value as parts: a string as text, bytes as a file (raw), anything else as a
    data part."""
    if isinstance(value, str):
        return [Part(text=value)]
    if isinstance(value, bytes | bytearray):
        return [Part(raw=bytes(value), media_type=FILE_MODE)]
    try:
        # (A value that is JSON already skips jsonable's encode-and-decode round trip.)
        return [Part(data=ParseDict(value if _plain(value) else jsonable(value),
                                    struct_pb2.Value()))]
    except Exception:
        return [Part(text=payload_text(value))]


def _agent_message(message_id: str, task_id: str, context_id: str, text: str,
                   data: Any = None, metadata: dict[str, Any] | None = None) -> Message:
    parts = [Part(text=text)]
    if data is not None:
        parts += parts_of(data)
    m = Message(message_id=message_id, task_id=task_id, context_id=context_id,
                role=Role.ROLE_AGENT, parts=parts)
    if metadata:
        m.metadata.update(jsonable(metadata))
    return m


def _stamp(status: TaskStatus, wall: float) -> TaskStatus:
    # The fields set directly: Timestamp.FromNanoseconds checks its range in Python, on
    # every status of every reply.
    ns = int(wall * 1e9)
    status.timestamp.seconds, status.timestamp.nanos = divmod(ns, 1_000_000_000)
    return status


def failure_text(error: MeshantError) -> tuple[str, dict[str, Any]]:
    """A failed task's status text, ``CODE: TYPE: MESSAGE`` (the type: the handler's
    exception's, when the colony knows it), and its metadata."""
    code = getattr(error, "code", "error")
    kind = str(getattr(error, "remote_type", "") or "")
    meta: dict[str, Any] = {"code": code}
    if kind:
        meta["type"] = kind
    return f"{code}: {kind + ': ' if kind else ''}{error.message}", meta


def status_of(e: Update | Ended, task_id: str, context_id: str
              ) -> tuple[TaskState, Message | None, dict[str, Any]] | None:
    """The A2A status one meshant update or end stands for (None: it is not a status
    change: a partial result). Message ids are the update's own, so whoever turns the
    same update into a message makes the same one."""
    tid, cid = task_id, context_id
    if isinstance(e, Ended):
        if e.error is None:
            return TaskState.TASK_STATE_COMPLETED, None, {}
        text, end = failure_text(e.error)
        state = (TaskState.TASK_STATE_CANCELED if end["code"] == "cancelled"
                 else TaskState.TASK_STATE_FAILED)
        return state, _agent_message(f"{tid}.end", tid, cid, text, metadata=end), end
    meta: dict[str, Any] = {"seq": e.seq}
    if e.kind == "progress":
        if e.fraction is not None:
            meta["fraction"] = e.fraction
        msg = (_agent_message(f"{tid}.progress.{e.seq}", tid, cid, e.note, metadata=meta)
               if e.note is not None else None)
        return TaskState.TASK_STATE_WORKING, msg, meta
    if e.kind == "input-required":
        v = e.value if isinstance(e.value, dict) else {}
        meta["request"] = e.request
        msg = _agent_message(f"{e.request}.ask", tid, cid,
                             payload_text(v.get("prompt")), v.get("data"), meta)
        return TaskState.TASK_STATE_INPUT_REQUIRED, msg, meta
    if e.kind == "withdrawn":
        return TaskState.TASK_STATE_WORKING, None, meta
    return None


class TaskView:
    """What an A2A client sees of one meshant task, built from its updates."""

    def __init__(self, task_id: str, context_id: str, capability: str = "") -> None:
        self.task_id, self.context_id, self.capability = task_id, context_id, capability
        self.state = TaskState.TASK_STATE_SUBMITTED
        self.message: Message | None = None
        self.artifacts: list[Artifact] = []
        self.updated = time.time()  # wall time of the last status change seen
        self.seq = 0  # the last update folded in

    def task(self) -> Task:
        t = Task(id=self.task_id, context_id=self.context_id,
                 status=_stamp(TaskStatus(state=self.state), self.updated),
                 artifacts=self.artifacts)
        if self.message is not None:
            t.status.message.CopyFrom(self.message)
        if self.capability:
            # Set in place: Struct.update converts key by key in Python.
            t.metadata.fields["skill"].string_value = self.capability
        return t

    def _status(self, state: TaskState, message: Message | None,
                metadata: dict[str, Any]) -> TaskStatusUpdateEvent:
        self.state, self.message, self.updated = state, message, time.time()
        ev = TaskStatusUpdateEvent(task_id=self.task_id, context_id=self.context_id,
                                   status=_stamp(TaskStatus(state=state), self.updated))
        if message is not None:
            ev.status.message.CopyFrom(message)
        if metadata:
            ev.metadata.update(jsonable(metadata))
        return ev

    def _artifact(self, artifact_id: str, name: str, value: Any,
                  seq: int) -> TaskArtifactUpdateEvent:
        a = Artifact(artifact_id=artifact_id, name=name, parts=parts_of(value))
        a.metadata.fields["seq"].number_value = seq
        self.artifacts.append(a)
        return TaskArtifactUpdateEvent(task_id=self.task_id, context_id=self.context_id,
                                       artifact=a, last_chunk=name == "result")

    def event(self, e: Update | Ended) -> list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
        """The A2A events one meshant update stands for."""
        if isinstance(e, Update):
            self.seq = max(self.seq, e.seq)
        out: list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent] = []
        if isinstance(e, Ended) and e.error is None:
            out.append(self._artifact(f"{self.task_id}.result", "result", e.value, 0))
        elif isinstance(e, Update) and e.kind == "partial":
            return [self._artifact(f"{self.task_id}.partial.{e.seq}", "partial", e.value,
                                   e.seq)]
        st = status_of(e, self.task_id, self.context_id)
        if st is not None:
            out.append(self._status(*st))
        return out


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


# Per message type, the fields a check reads: (field, REQUIRED?, how it is kept, and
# whether the check goes into it). Read from the descriptors once: the SDK's own check
# (validate_proto_required_fields) reads every field's options of every nested message,
# a data part's whole JSON included, on every request (~0.1 ms a SendMessage).
_Plan = tuple[tuple[Any, bool, str, str | None], ...]
_PLANS: dict[str, _Plan] = {}


def _plan(desc: Any) -> _Plan:
    from google.api.field_behavior_pb2 import (  # type: ignore[import-untyped]
        FieldBehavior,
        field_behavior,
    )
    from google.protobuf.descriptor import FieldDescriptor

    plan = _PLANS.get(desc.full_name)
    if plan is not None:
        return plan
    _PLANS[desc.full_name] = ()  # a message type that holds itself: nothing more below
    steps = []
    for f in desc.fields:
        required = FieldBehavior.REQUIRED in f.GetOptions().Extensions[field_behavior]
        repeated = getattr(f, "is_repeated", None)  # protobuf >= 6.31; older: its label
        if repeated is None:
            repeated = getattr(f, "label", None) == FieldDescriptor.LABEL_REPEATED
        how = "repeated" if repeated else ("presence" if f.has_presence else "scalar")
        into = None
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type is not None:
            entry = f.message_type.GetOptions().map_entry
            inner = f.message_type.fields_by_name["value"].message_type if entry else \
                f.message_type
            if inner is not None and _plan(inner):
                into = "map" if entry else ("many" if repeated else "one")
        if required or into:
            steps.append((f, required, how, into))
    _PLANS[desc.full_name] = plan = tuple(steps)
    return plan


def _missing(msg: Any, prefix: str = "") -> list[dict[str, str]]:
    """The REQUIRED fields ``msg`` lacks, as the SDK names them (``message.parts``)."""
    out: list[dict[str, str]] = []
    plan = _PLANS.get(msg.DESCRIPTOR.full_name)
    for f, required, how, into in plan if plan is not None else _plan(msg.DESCRIPTOR):
        name = f.name
        if how == "presence" or into == "one":
            present = msg.HasField(name)
            if required and not present:
                out.append({"field": prefix + name, "message": "Field is required."})
            if into and present:
                out += _missing(getattr(msg, name), f"{prefix}{name}.")
            continue
        value = getattr(msg, name)
        if required and (not value if how == "repeated" else value == f.default_value):
            out.append({"field": prefix + name, "message": (
                "Field must contain at least one element." if how == "repeated"
                else "Field is required.")})
        if into == "many":
            for i, item in enumerate(value):
                out += _missing(item, f"{prefix}{name}[{i}].")
        elif into == "map":
            for k, item in value.items():
                out += _missing(item, f"{prefix}{name}[{k}].")
    return out


def _checked(params: Any, history: Any = None) -> None:
    """The request whole, before anything runs: its required fields (the spec's
    REQUIRED ones, the SDK's rule), a history length that is not negative."""
    errors = _missing(params)
    if errors:
        what = "; ".join(f"{x['field']}: {x['message']}" for x in errors)
        raise InvalidParamsError(f"invalid {type(params).__name__}: {what}",
                                 data={"errors": errors})
    if history is not None:
        validate_history_length(history)


# -- the handler ----------------------------------------------------------------------------

class ColonyAgent(RequestHandler):
    """The A2A request handler of a colony (``capability``: of one capability's agent,
    taken from the path ``/agents/CAPABILITY``). ``push``: where push notifications may
    go (None or a policy without hosts: they are not offered)."""

    def __init__(self, link: ColonyLink, *, wait: float | None = None,
                 book: TaskBook | None = None, push: PushPolicy | None = None) -> None:
        self.link = link
        self.wait = wait
        self.book = book if book is not None else TaskBook()
        self.pusher = Pusher(push) if push is not None and push.enabled else None
        self._followers: dict[str, asyncio.Task[None]] = {}
        link.observers.append(self._observed)

    # -- who and what ---------------------------------------------------------------------

    @staticmethod
    def _caller(context: ServerCallContext, act: bool) -> Caller | None:
        caller: Caller | None = context.state.get("caller")
        if act and caller is not None and not caller.may_act:
            raise InvalidRequestError("forbidden: this caller's token is read-only")
        return caller

    @staticmethod
    def _identity(caller: Caller | None) -> Identity:
        return caller.identity if caller is not None else (None, None)

    def _visible(self, rec: Record | None, caller: Caller | None) -> Record | None:
        """The record if the caller may see its A2A side (its own, or an operator)."""
        if rec is None or (caller is not None and caller.operator):
            return rec
        return rec if rec.owner == self._identity(caller) else None

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

    def _payload(self, skill: str, msg: Message) -> Any:
        """The message's payload for ``skill``, checked against its schema."""
        about = self.link.catalog.get(skill, {})
        payload = payload_of(msg)
        files = [p for p in msg.parts if _is_file(p)] if isinstance(payload, bytes | list) \
            else []
        if files and not takes_files(about):
            kinds = ", ".join(sorted({p.media_type or FILE_MODE for p in files}))
            raise ContentTypeNotSupportedError(
                f"{skill!r} takes JSON payloads (its payload schema), not files ({kinds}): "
                "send the payload as a data part (JSON) or a text part")
        why = check_payload(skill, about, _json_view(payload) if files else payload)
        if why is not None:
            raise InvalidParamsError(why)
        return payload

    # -- what the book is told ------------------------------------------------------------

    def _observed(self, task_id: str, update: Update) -> None:
        """An update of a task submitted through this gateway (a client's I/O thread)."""
        rec = self.book.get(task_id)
        if rec is None or update.kind == "partial":
            return
        st = status_of(update, task_id, rec.context_id)
        if st is not None:
            state, message, _ = st
            keep = message if state == TaskState.TASK_STATE_INPUT_REQUIRED else None
            self.book.status(task_id, state, keep, time.time())

    def _ended(self, fut: Future[Any]) -> None:
        """A submitted task ended (a client's I/O thread, or at once if it had)."""
        assert isinstance(fut, TaskFuture)
        rec = self.book.get(fut.task_id)
        if rec is None or fut.cancelled():
            return
        err = fut.exception()
        end = Ended(value=None) if err is None else Ended(
            error=err if isinstance(err, MeshantError) else MeshantError(str(err)))
        st = status_of(end, fut.task_id, rec.context_id)
        assert st is not None
        self.book.status(fut.task_id, st[0], st[1], time.time())

    def _with_book(self, task: Task, caller: Caller | None, history: Any = None, *,
                   asked: bool = False) -> Task:
        """A task with what this gateway's book knows of it: its context, history, and
        (when the book saw the state it is in) when that state began. ``asked``: the
        history only if the request set a historyLength (a reply to the message just
        sent need not send it back: the spec leaves the default to the server)."""
        rec = self._visible(self.book.get(task.id), caller)
        if rec is not None:
            task.context_id = rec.context_id
            if not asked or (history is not None and history.HasField("history_length")):
                task.history.extend(rec.history)
            if rec.state == task.status.state:
                _stamp(task.status, rec.updated)
        return apply_history_length(task, history)

    # -- sending --------------------------------------------------------------------------

    async def _start(self, params: SendMessageRequest, context: ServerCallContext
                     ) -> tuple[TaskView, TaskFuture[Any], Client]:
        """Submit a new task, or answer the task the message continues. Returns the view,
        a future that follows the task, and the client it came through."""
        _checked(params, params.configuration)
        caller = self._caller(context, act=True)
        msg = params.message
        cfg = params.configuration
        push = (cfg.task_push_notification_config
                if cfg.HasField("task_push_notification_config") else None)
        if push is not None:
            self._check_push(push)
        if msg.task_id:
            view, fut, client = await self._continue(caller, msg)
        else:
            skill = self._skill(context, msg)
            payload = self._payload(skill, msg)
            client = self.link.client(caller)
            try:
                fut = client.submit(skill, payload, wait=self.wait)
            except MeshantError as e:
                raise a2a_error(e) from None
            context_id = msg.context_id or fut.task_id
            first = Message()
            first.CopyFrom(msg)
            first.task_id, first.context_id = fut.task_id, context_id
            self.book.open(fut.task_id, context_id, skill, self._identity(caller), first,
                           time.time())
            fut.add_done_callback(self._ended)  # (at once if it already ended)
            view = TaskView(fut.task_id, context_id, skill)
        if push is not None:
            await self._add_push(view.task_id, push, caller, client)
        return view, fut, client

    async def _continue(self, caller: Caller | None, msg: Message
                        ) -> tuple[TaskView, TaskFuture[Any], Client]:
        """The message answers its task's question: the handler's ``ctx.ask`` returns
        the message's payload."""
        task_id = msg.task_id
        client = self.link.client(caller)
        rec = self.book.get(task_id)
        try:
            st = await patiently(client.task_status, task_id)
        except MeshantError as e:
            raise a2a_error(e) from None
        context_id = rec.context_id if rec is not None else task_id
        if msg.context_id and msg.context_id != context_id:
            raise InvalidParamsError(f"contextId {msg.context_id!r} is not task {task_id}'s "
                                     f"(its context is {context_id!r}): send the task's "
                                     "own contextId, or none")
        state = STATES.get(st["state"], TaskState.TASK_STATE_WORKING)
        if state in FINAL:
            raise UnsupportedOperationError(
                f"task {task_id} is {st['state']}: a task that ended takes no more "
                "messages (send one without taskId to start a new task)")
        if state != TaskState.TASK_STATE_INPUT_REQUIRED:
            raise InvalidParamsError(f"task {task_id} is {st['state']}, not waiting for "
                                     "input: a message on an existing task answers its "
                                     "question")
        answer = payload_of(msg)
        try:
            att = await attach(client, task_id, 0)
            view = await self._snapshot(client, att, TaskView(
                task_id, context_id, st.get("capability", "")))
            await asyncio.to_thread(client.answer, task_id, answer)
        except MeshantError as e:
            raise a2a_error(e) from None
        said = Message()
        said.CopyFrom(msg)
        said.task_id, said.context_id = task_id, context_id
        self.book.said(task_id, said, time.time())
        view.state = TaskState.TASK_STATE_WORKING
        view.message = None
        view.updated = time.time()
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
        caller = self._caller(context, act=False)
        if not params.configuration.return_immediately:
            async for e in follow(fut, client, self.link, self._after(view, fut)):
                view.event(e)
                if view.state in FINAL or view.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                    break
        return self._with_book(view.task(), caller, params.configuration, asked=True)

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Any]:
        view, fut, client = await self._start(params, context)
        yield self._with_book(view.task(), self._caller(context, act=False),
                              params.configuration, asked=True)
        async for ev in self._events(view, fut, client, stop_on_input=True):
            yield ev

    @staticmethod
    def _after(view: TaskView, fut: TaskFuture[Any]) -> int | None:
        """Where following an attachment goes on from: after what its view folded in."""
        return view.seq if isinstance(fut, Attachment) else None

    async def _events(self, view: TaskView, fut: TaskFuture[Any], client: Client,
                      stop_on_input: bool) -> AsyncIterator[Any]:
        async for e in follow(fut, client, self.link, self._after(view, fut)):
            for ev in view.event(e):
                yield ev
            if view.state in FINAL or (stop_on_input and view.state
                                       == TaskState.TASK_STATE_INPUT_REQUIRED):
                return

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Any]:
        _checked(params)
        caller = self._caller(context, act=False)
        client = self.link.client(caller)
        try:
            att = await attach(client, params.id, 0)
        except MeshantError as e:
            raise a2a_error(e) from None
        view = await self._snapshot(client, att, self._view(params.id, caller))
        if view.state in FINAL:
            raise UnsupportedOperationError(
                f"task {params.id} is already {TaskState.Name(view.state)}: get it instead")
        yield self._with_book(view.task(), caller)
        async for ev in self._events(view, att, client, stop_on_input=False):
            yield ev

    def _view(self, task_id: str, caller: Caller | None, capability: str = "") -> TaskView:
        rec = self._visible(self.book.get(task_id), caller)
        return TaskView(task_id, rec.context_id if rec is not None else task_id,
                        capability or (rec.capability if rec is not None else ""))

    # -- tasks ----------------------------------------------------------------------------

    async def _read(self, task_id: str, caller: Caller | None) -> tuple[TaskView, dict[str,
                                                                                    Any]]:
        """A task as it is (state, kept updates, end) with the queen's view of it."""
        client = self.link.client(caller)
        try:
            st = await patiently(client.task_status, task_id)
            att = await attach(client, task_id, 0)
        except MeshantError as e:
            if getattr(e, "code", "") == "unknown-task":
                raise TaskNotFoundError(f"no task {task_id!r} in this colony") from None
            raise a2a_error(e) from None
        view = await self._snapshot(client, att, self._view(task_id, caller,
                                                            st.get("capability", "")))
        if not att.done():
            client._detach(att)  # a read, not a follow
        view.state = STATES.get(st["state"], view.state)
        history = st.get("history") or []
        if history and isinstance(st.get("age"), int | float):
            # The queen's clock says when the state last changed (relative to the
            # submission); the wall time is this gateway's.
            view.updated = time.time() - float(st["age"]) + float(history[-1][0])
        return view, st

    async def on_get_task(self, params: GetTaskRequest,
                          context: ServerCallContext) -> Task | None:
        _checked(params, params)
        caller = self._caller(context, act=False)
        view, _ = await self._read(params.id, caller)
        return self._with_book(view.task(), caller, params)

    async def on_cancel_task(self, params: CancelTaskRequest,
                             context: ServerCallContext) -> Task | None:
        _checked(params)
        caller = self._caller(context, act=True)
        client = self.link.client(caller)
        try:
            st = await patiently(client.task_status, params.id)
        except MeshantError as e:
            if getattr(e, "code", "") == "unknown-task":
                raise TaskNotFoundError(f"no task {params.id!r} in this colony") from None
            raise a2a_error(e) from None
        if STATES.get(st["state"]) in FINAL:
            raise TaskNotCancelableError(f"task {params.id} is already {st['state']}")
        try:
            att = await attach(client, params.id, 0)
            await asyncio.to_thread(client.cancel, params.id)  # (its verdict: forbidden...)
        except MeshantError as e:
            raise a2a_error(e) from None
        view = self._view(params.id, caller, st.get("capability", ""))
        try:
            async with asyncio.timeout(10):
                async for ev in follow(att, client, self.link, view.seq):
                    view.event(ev)
        except TimeoutError:  # a handler that ignores cancels: it is still running
            view.state = STATES.get(att.state, TaskState.TASK_STATE_WORKING)
        return self._with_book(view.task(), caller)

    async def on_list_tasks(self, params: ListTasksRequest,
                            context: ServerCallContext) -> ListTasksResponse:
        """The caller's tasks this gateway served (every caller's, for an operator),
        most recently updated first, a page at a time."""
        _checked(params, params)
        caller = self._caller(context, act=False)
        owner = None if caller is not None and caller.operator else self._identity(caller)
        await self._refresh(owner, caller)
        page, token, size, total = self.book.page(params, owner)
        tasks = []
        for rec in page:
            t = rec.task()
            if params.include_artifacts:
                try:
                    view, _ = await self._read(rec.task_id, caller)
                    t.artifacts.extend(view.artifacts)
                except A2AError:
                    pass  # gone from the colony meanwhile: listed without its artifacts
            tasks.append(apply_history_length(t, params))
        return ListTasksResponse(tasks=tasks, next_page_token=token, page_size=size,
                                 total_size=total)

    async def _refresh(self, owner: Identity | None, caller: Caller | None) -> None:
        """Bring the unfinished tasks a listing may show up to date from the queen (a
        running task sends its submitter nothing until it reports: its start is only in
        the queen's state), the most recently updated REFRESH_MAX of them."""
        live = [r for r in self.book.records()
                if r.state not in FINAL and (owner is None or r.owner == owner)]
        live.sort(key=lambda r: r.updated, reverse=True)
        client = self.link.client(caller)
        for rec in live[:REFRESH_MAX]:
            try:
                st = await asyncio.to_thread(client.task_status, rec.task_id)
            except MeshantError:
                continue  # gone, or the queen busy: listed as last seen
            state = STATES.get(st["state"], rec.state)
            if state != rec.state and state != TaskState.TASK_STATE_INPUT_REQUIRED:
                history = st.get("history") or []
                when = (time.time() - float(st.get("age", 0)) + float(history[-1][0])
                        if history else time.time())
                self.book.status(rec.task_id, state, None, when)

    # -- push notifications -------------------------------------------------------------------

    def _check_push(self, config: TaskPushNotificationConfig) -> None:
        if self.pusher is None:
            raise PushNotificationNotSupportedError(
                "this gateway sends no push notifications (started without --push-host)")
        why = self.pusher.policy.refuse(config.url)
        if why is not None:
            raise InvalidParamsError(why)

    async def _record_of(self, task_id: str, caller: Caller | None, *,
                         create: bool = False) -> Record | None:
        """The task's record, if the caller may see it; a task this gateway never served
        but the colony has: a new record when ``create``, else None. TaskNotFoundError if
        the colony does not know the task either (or the record is another caller's)."""
        rec = self.book.get(task_id)
        if rec is not None:
            if self._visible(rec, caller) is None:
                raise TaskNotFoundError(f"no task {task_id!r} of this caller's")
            return rec
        client = self.link.client(caller)
        try:
            st = await patiently(client.task_status, task_id)
        except MeshantError as e:
            if getattr(e, "code", "") == "unknown-task":
                raise TaskNotFoundError(f"no task {task_id!r} in this colony") from None
            raise a2a_error(e) from None
        if not create:
            return None
        rec = self.book.open(task_id, task_id, st.get("capability", ""),
                             self._identity(caller), None, time.time())
        if STATES.get(st["state"]) in FINAL:
            self.book.status(task_id, STATES[st["state"]], None, time.time())
        return rec

    async def _add_push(self, task_id: str, config: TaskPushNotificationConfig,
                        caller: Caller | None, client: Client) -> TaskPushNotificationConfig:
        self._check_push(config)
        rec = await self._record_of(task_id, caller, create=True)
        assert rec is not None
        stored = TaskPushNotificationConfig()
        stored.CopyFrom(config)
        stored.task_id = task_id
        stored.id = config.id or str(uuid.uuid4())
        if rec.state not in FINAL and task_id not in self._followers and \
                len(self._followers) >= PUSH_FOLLOW_MAX:
            raise InternalError(f"this gateway already sends the notifications of "
                                f"{PUSH_FOLLOW_MAX} running tasks, its limit: try again "
                                "when some have ended")
        rec.push[stored.id] = stored
        if rec.state not in FINAL and task_id not in self._followers:
            t = asyncio.get_running_loop().create_task(self._push_follow(rec, client))
            self._followers[task_id] = t
            t.add_done_callback(lambda _t: self._followers.pop(task_id, None))
        return stored

    async def _push_follow(self, rec: Record, client: Client) -> None:
        """Send each of a task's events, from its start, to its webhooks until it ends
        (or has none left)."""
        try:
            att = await attach(client, rec.task_id, 0)
        except MeshantError as e:
            log.warning("cannot follow task %s for its push notifications: %s",
                        rec.task_id, e)
            return
        view = TaskView(rec.task_id, rec.context_id, rec.capability)
        # What the task did before the attachment (its kept updates), then what follows.
        for u in await kept(client, att, SNAPSHOT_WAIT):
            if not await self._push(rec, view.event(u)):
                return
        async for update in follow(att, client, self.link, view.seq):
            if not await self._push(rec, view.event(update)) or view.state in FINAL:
                return

    async def _push(self, rec: Record, events: list[Any]) -> bool:
        """Send ``events`` to each of the task's webhooks in turn; False when it has none
        left (deleted meanwhile)."""
        assert self.pusher is not None
        for ev in events:
            if not rec.push:
                return False
            body = json.dumps(MessageToDict(to_stream_response(ev))).encode()
            for cfg in list(rec.push.values()):
                headers = {}
                if cfg.HasField("authentication") and cfg.authentication.scheme:
                    headers["Authorization"] = (f"{cfg.authentication.scheme} "
                                                f"{cfg.authentication.credentials}")
                if cfg.token:
                    headers["X-A2A-Notification-Token"] = cfg.token
                await self.pusher.send(cfg.url, body, headers)
        return True

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        _checked(params)
        caller = self._caller(context, act=True)
        self._check_push(params)
        return await self._add_push(params.task_id, params, caller, self.link.client(caller))

    async def on_get_task_push_notification_config(
            self, params: GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        _checked(params)
        if self.pusher is None:
            raise PushNotificationNotSupportedError()
        rec = await self._record_of(params.task_id, self._caller(context, act=False))
        cfg = rec.push.get(params.id) if rec is not None else None
        if cfg is None:
            raise TaskNotFoundError(f"no push notification config {params.id!r} on task "
                                    f"{params.task_id}")
        return cfg

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> ListTaskPushNotificationConfigsResponse:
        _checked(params)
        if self.pusher is None:
            raise PushNotificationNotSupportedError()
        rec = await self._record_of(params.task_id, self._caller(context, act=False))
        return ListTaskPushNotificationConfigsResponse(
            configs=list(rec.push.values()) if rec is not None else [])

    async def on_delete_task_push_notification_config(
            self, params: DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        _checked(params)
        if self.pusher is None:
            raise PushNotificationNotSupportedError()
        rec = await self._record_of(params.task_id, self._caller(context, act=True))
        if rec is not None:
            rec.push.pop(params.id, None)  # deleting what is not there: the same end

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        raise UnsupportedOperationError("no extended agent card")

    async def close(self) -> None:
        """Stop following tasks for their push notifications."""
        for t in list(self._followers.values()):
            t.cancel()
        if self.pusher is not None:
            await self.pusher.close()


# -- the cards and the app ------------------------------------------------------------------

def skill_of(capability: str, about: dict[str, Any]) -> AgentSkill:
    desc = about.get("description") or f"the colony's {capability!r} capability"
    if about.get("payload"):
        desc += " Payload schema: " + json.dumps(about["payload"], separators=(",", ":"))
    modes = [*JSON_MODES, FILE_MODE] if takes_files(about) else JSON_MODES
    return AgentSkill(id=capability, name=capability, description=desc, tags=["meshant"],
                      input_modes=modes, output_modes=[*JSON_MODES, FILE_MODE])


def card(link: ColonyLink, base_url: str, name: str | None = None,
         capability: str | None = None, push: bool = False) -> AgentCard:
    """The colony's agent card (or one capability's), as the catalog is now; ``name``:
    the colony's (default: as its queen says)."""
    name = name or link.colony
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
        capabilities=AgentCapabilities(streaming=True, push_notifications=push),
        default_input_modes=JSON_MODES, default_output_modes=[*JSON_MODES, FILE_MODE],
        skills=skills)


def card_response(request: Request, body: dict[str, Any], changed: float,
                  max_age: int) -> Response:
    """A card with its validators (a weak ETag of its content, Last-Modified: when the
    colony's capabilities last changed) and a max-age; 304 when the client's copy is
    current (If-None-Match first, else If-Modified-Since, as RFC 9110 says)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    etag = f'W/"{hashlib.sha256(text.encode()).hexdigest()[:32]}"'
    headers = {"ETag": etag, "Cache-Control": f"max-age={max_age}",
               "Last-Modified": email.utils.formatdate(int(changed), usegmt=True)}
    inm = request.headers.get("if-none-match")
    if inm is not None:
        tags = [t.strip().removeprefix("W/") for t in inm.split(",")]
        if "*" in tags or etag.removeprefix("W/") in tags:
            return Response(status_code=304, headers=headers)
    else:
        ims = request.headers.get("if-modified-since")
        try:
            since = email.utils.parsedate_to_datetime(ims).timestamp() if ims else None
        except (TypeError, ValueError):
            since = None  # a date it cannot read is no condition (RFC 9110 13.1.3)
        if since is not None and int(changed) <= since:
            return Response(status_code=304, headers=headers)
    return JSONResponse(body, headers=headers)


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


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


class _Endpoint:
    """One of the SDK's endpoints as this gateway serves it: for a capability the colony
    has (under ``/agents/CAP``), with a JSON body (the spec's Content-Type, answered
    ContentTypeNotSupportedError before the SDK reads the body), and for HTTP+JSON
    answering ``application/json`` (§11.1; the SDK labels it application/a2a+json)."""

    def __init__(self, inner: Any, link: ColonyLink, rest: bool) -> None:
        self.inner, self.link, self.rest = inner, link, rest

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        cap = scope.get("path_params", {}).get("cap")
        catalog = self.link.catalog
        if cap is not None and cap not in catalog:
            why = (f"no capability {cap!r} in this colony: its skills are "
                   f"{', '.join(catalog) or 'none yet'}")
            body: dict[str, Any] = (build_rest_error_payload(TaskNotFoundError(why))
                                    if self.rest else
                                    {"jsonrpc": "2.0", "id": None,
                                     "error": {"code": -32602, "message": why}})
            await JSONResponse(body, 404)(scope, receive, send)
            return
        ctype = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                      if k == b"content-type"), None)
        if scope.get("method") == "POST" and ctype is not None and not _is_json(ctype):
            err = ContentTypeNotSupportedError(
                f"the request body is {ctype.split(';')[0]}: send application/json")
            if self.rest:
                payload = build_rest_error_payload(err)
                payload["error"]["code"] = 415
                await JSONResponse(payload, 415)(scope, receive, send)
            else:
                await JSONResponse(build_error_response(None, err))(scope, receive, send)
            return
        if not self.rest:
            await self.inner(scope, receive, send)
            return

        async def labelled(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    (k, b"application/json") if k == b"content-type"
                    and v.startswith(b"application/a2a+json") else (k, v)
                    for k, v in message.get("headers", ())]}
            await send(message)

        await self.inner(scope, receive, labelled)


def app(link: ColonyLink, base_url: str, name: str | None = None,
        wait: float | None = None, push: PushPolicy | None = None,
        book: TaskBook | None = None) -> Starlette:
    """The gateway's ASGI app (to be wrapped in the HTTP policy's Guard). ``name``: the
    card's (default the colony's); ``push``: where push notifications may go."""
    handler = ColonyAgent(link, wait=wait, book=book, push=push)
    builder = _Context()
    pushes = handler.pusher is not None
    max_age = max(1, round(link.refresh))  # the card changes no faster than it is read

    async def root_card(request: Request) -> Response:
        return card_response(request, agent_card_to_dict(card(link, base_url, name,
                                                              push=pushes)),
                             link.catalog_changed, max_age)

    async def cap_card(request: Request) -> Response:
        cap = request.path_params["cap"]
        if cap not in link.catalog:
            return JSONResponse({"error": f"no capability {cap!r} in this colony"}, 404)
        return card_response(request, agent_card_to_dict(card(link, base_url, name, cap,
                                                              push=pushes)),
                             link.catalog_changed, max_age)

    routes: list[BaseRoute] = [
        Route(AGENT_CARD_WELL_KNOWN_PATH, root_card, methods=["GET"]),
        Route("/agents/{cap}" + AGENT_CARD_WELL_KNOWN_PATH, cap_card, methods=["GET"]),
    ]
    # The capabilities' own agents first: the root's HTTP+JSON routes end with a
    # catch-all (a tenant prefix) that would take their paths. A capability's JSON-RPC
    # endpoint answers with and without the trailing slash (clients join paths both ways).
    for rpc in create_jsonrpc_routes(handler, "/agents/{cap}/", context_builder=builder,
                                     enable_v0_3_compat=True):
        assert isinstance(rpc, Route)
        endpoint = _Endpoint(rpc.app, link, rest=False)
        routes += [Route("/agents/{cap}/", endpoint, methods=["POST"]),
                   Route("/agents/{cap}", endpoint, methods=["POST"])]
    for rest in create_rest_routes(handler, context_builder=builder,
                                   path_prefix="/agents/{cap}/rest"):
        if isinstance(rest, Route):
            routes.append(Route(rest.path, _Endpoint(rest.app, link, rest=True),
                                methods=list(rest.methods or ())))
    for rpc in create_jsonrpc_routes(handler, "/", context_builder=builder,
                                     enable_v0_3_compat=True):
        assert isinstance(rpc, Route)
        routes.append(Route(rpc.path, _Endpoint(rpc.app, link, rest=False), methods=["POST"]))
    for rest in create_rest_routes(handler, context_builder=builder, path_prefix="/rest"):
        if isinstance(rest, Route):
            routes.append(Route(rest.path, _Endpoint(rest.app, link, rest=True),
                                methods=list(rest.methods or ())))
        else:
            routes.append(rest)  # the tenant-prefixed mount

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await handler.close()

    return Starlette(routes=routes, lifespan=lifespan)


__all__ = ["BINDINGS", "SPEC", "ColonyAgent", "TaskView", "app", "card", "card_response",
           "failure_text", "parts_of", "payload_of", "status_of", "takes_files"]
