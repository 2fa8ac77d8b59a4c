#!/usr/bin/env python3
"""An MCP server written with the mcp SDK's ``MCPServer`` (mcp 2.3; it was FastMCP
before), joined to a colony as a forager: each tool becomes a capability, and every
MCP host in front of the colony (``meshant mcp``) sees it. Needs ``meshant[mcp]``.

    meshant queen &
    meshant forager --mcp "python examples/mcp_server.py" &
    meshant submit word_count '{"text": "the quick brown fox"}'      # {"words": 4}
    meshant submit countdown '{"n": 3}' --stream                     # progress, then "liftoff"
    meshant mcp                          # what an MCP host runs: these tools, on stdio

Run alone, ``python examples/mcp_server.py`` is a plain MCP server on stdin/stdout (what
``--mcp`` starts). ``python examples/mcp_server.py --demo`` runs the whole chain in one
go and exits: a queen, this server as a forager (``meshant forager --mcp``), and an MCP
client calling its tools through ``meshant mcp`` (the client answers the question).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("word-tools")


@server.tool()
def word_count(text: str) -> dict[str, int]:
    """Count the words of a text."""
    return {"words": len(text.split())}


@server.tool()
async def countdown(n: int, ctx: Context) -> str:
    """Count down from n, reporting each step as progress."""
    for i in range(n, 0, -1):
        await ctx.report_progress(n - i + 1, n, f"{i}...")
        await asyncio.sleep(0.05)
    return "liftoff"


class Answer(BaseModel):
    ok: bool


@server.tool()
async def confirm(action: str, ctx: Context) -> str:
    """Ask the user to confirm an action (a question the colony carries as ctx.ask)."""
    got = await ctx.elicit(f"Really {action}?", Answer)
    return f"{action}: done" if got.action == "accept" and got.data.ok else f"{action}: skipped"


def demo() -> int:
    """A queen, this file as a forager, an MCP client through ``meshant mcp``."""
    import mcp_types as types
    from mcp import Client, StdioServerParameters

    from meshant import Queen
    from meshant.apps import _procs

    queen = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0").start()
    forager = _procs.spawn(["forager", "--queen", queen.endpoint, "--json", "--mcp",
                            f"{sys.executable} {Path(__file__).resolve()}"])
    try:
        _procs.read_json_line(forager, 60)  # its ready line: the tools are capabilities

        async def yes(context: Any, params: Any) -> types.ElicitResult:
            print(f"the colony asks: {params.message} -> yes")
            return types.ElicitResult(action="accept", content={"ok": True})

        async def progress(p: float, total: float | None, message: str | None) -> None:
            print(f"  progress {message}")

        async def calls() -> None:
            gateway = StdioServerParameters(command=sys.executable, args=[
                "-m", "meshant", "mcp", "--queen", queen.endpoint])
            async with Client(gateway, elicitation_callback=yes) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                print(f"tools through the colony: {', '.join(names)}")
                r = await client.call_tool("word_count", {"text": "the quick brown fox"})
                print(f"word_count: {r.structured_content}")
                r = await client.call_tool("countdown", {"n": 3}, progress_callback=progress)
                print(f"countdown: {r.content[0].text}")  # type: ignore[union-attr]
                r = await client.call_tool("confirm", {"action": "deploy"})
                print(f"confirm: {r.content[0].text}")  # type: ignore[union-attr]

        asyncio.run(asyncio.wait_for(calls(), 60))
        return 0
    finally:
        _procs.stop([forager])
        queen.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["--demo"]:
        sys.exit(demo())
    if sys.argv[1:]:
        print(f"usage: {sys.argv[0]} [--demo]  (no argument: serve MCP on stdio)",
              file=sys.stderr)
        sys.exit(2)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
