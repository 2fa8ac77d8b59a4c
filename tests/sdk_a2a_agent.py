"""An A2A agent written with the official SDK's own server parts.

``python tests/sdk_a2a_agent.py`` serves the 'shout' agent (for ``meshant forager
--a2a`` tests) on a free loopback port and prints its URL as JSON.

``python tests/sdk_a2a_agent.py --echo [--port N]`` serves an echo agent instead, with
the SDK's JSON-RPC and HTTP+JSON routes, its card routes (ETag) and its in-memory task
store, at ``/agents/echo``: the anchor the A2A TCK scores ``meshant a2a`` against
(``python -m benchmarks.a2a_tck``), mounted at the same path shape as a meshant
capability's own agent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys

import uvicorn
from a2a.helpers.proto_helpers import get_message_text, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette


class Shouter(AgentExecutor):
    """Skill 'shout': streams the words upper-cased, then asks whether to add '!'."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        text = get_message_text(context.message) if context.message else ""
        task = context.current_task
        if task is None:
            await event_queue.enqueue_event(Task(
                id=context.task_id, context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)))
            await updater.start_work()
            for i, w in enumerate(text.split()):
                await updater.add_artifact([new_text_part(w.upper())], name=f"word-{i}")
            await updater.requires_input(new_text_message(
                "Add an exclamation mark? (yes/no)", task_id=context.task_id,
                context_id=context.context_id))
            return
        answer = text.strip().lower()
        await updater.add_artifact([new_text_part("!" if answer == "yes" else "")],
                                   name="end")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.cancel()


class Echo(AgentExecutor):
    """Skill 'echo': the message's parts back as the task's one artifact, completed."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        if context.current_task is None:
            await event_queue.enqueue_event(Task(
                id=context.task_id, context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)))
        parts = list(context.message.parts) if context.message else []
        await updater.add_artifact(parts, name="result")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.cancel()


def _listen(port: int) -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def shouter_app(url: str) -> Starlette:
    card = AgentCard(
        name="shouter", description="Shouts", version="1",
        supported_interfaces=[AgentInterface(url=url + "/", protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="shout", name="shout", description="Shout the words.",
                           tags=["test"])])
    handler = DefaultRequestHandler(Shouter(), InMemoryTaskStore(), card)
    return Starlette(routes=[*create_agent_card_routes(card),
                             *create_jsonrpc_routes(handler, "/")])


def echo_app(url: str, prefix: str = "/agents/echo") -> Starlette:
    base = url + prefix
    card = AgentCard(
        name="echo", description="Echoes the message's parts.", version="1",
        supported_interfaces=[
            AgentInterface(url=base + "/", protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=base + "/rest", protocol_binding="HTTP+JSON",
                           protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json", "text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Echo.", tags=["test"])])
    handler = DefaultRequestHandler(Echo(), InMemoryTaskStore(), card)
    return Starlette(routes=[
        *create_agent_card_routes(card, card_url=prefix + "/.well-known/agent-card.json"),
        *create_jsonrpc_routes(handler, prefix + "/"),
        *create_rest_routes(handler, path_prefix=prefix + "/rest")])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--echo", action="store_true", help="serve the echo agent (the TCK "
                    "anchor) at /agents/echo instead of the shouter")
    ap.add_argument("--port", type=int, default=0, help="loopback port (0: a free one)")
    args = ap.parse_args()
    sock, url = _listen(args.port)
    if args.echo:
        app = echo_app(url)
        print(json.dumps({"url": url + "/agents/echo"}), flush=True)
    else:
        app = shouter_app(url)
        print(json.dumps({"url": url}), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    sys.exit(main())
