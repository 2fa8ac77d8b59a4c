"""An A2A agent written with the official SDK, for ``meshant forager --a2a`` tests:
``python tests/sdk_a2a_agent.py`` serves it on a free loopback port and prints its URL."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import uvicorn
from a2a.helpers.proto_helpers import get_message_text, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
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


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = AgentCard(
        name="shouter", description="Shouts", version="1",
        supported_interfaces=[AgentInterface(url=url + "/", protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="shout", name="shout", description="Shout the words.",
                           tags=["test"])])
    handler = DefaultRequestHandler(Shouter(), InMemoryTaskStore(), card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, "/")])
    print(json.dumps({"url": url}), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    sys.exit(main())
