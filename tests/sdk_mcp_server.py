"""An MCP server written with the official SDK, for ``meshant forager --mcp`` tests:
``python tests/sdk_mcp_server.py`` speaks MCP on stdio."""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("sdk-test-server")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Count to n, reporting progress."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"at {i + 1}")
    return f"counted to {n}"


class Name(BaseModel):
    name: str


@server.tool()
async def welcome(ctx: Context) -> str:
    """Ask for a name and welcome it."""
    got = await ctx.elicit("Who is there?", Name)
    if got.action != "accept":
        return "nobody"
    return f"welcome, {got.data.name}"


@server.tool()
def broken(x: int) -> int:
    """Always fails."""
    raise ValueError(f"broken on {x}")


if __name__ == "__main__":
    server.run("stdio")
