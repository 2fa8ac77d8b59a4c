"""An MCP server written with the official SDK's ``MCPServer``: what ``meshant forager
--mcp`` wraps in the tests, and the reference the MCP conformance run measures meshant
against (benchmarks/mcp_conformance.py).

    python tests/sdk_mcp_server.py                       # the test tools, on stdio
    python tests/sdk_mcp_server.py --tools suite         # the conformance suite's tools
    python tests/sdk_mcp_server.py --tools echo --http 127.0.0.1:0

``--tools``: ``test`` (multiply, count, welcome, broken), ``echo`` (one tool returning
its arguments), ``suite`` (the tools the conformance suite's scenarios call, written the
way the SDK's own examples write them). ``--http [HOST:]PORT`` serves streamable HTTP at
``/mcp`` as the SDK sets it up by default, and prints ``{"url": ...}`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Audio, Image
from pydantic import BaseModel

# A 1x1 red PNG and a 10-sample silent WAV: the smallest valid media the suite accepts.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d7"
    "63f8cfc000000301010018dd8db00000000049454e44ae426082")


def _wav() -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(bytes(20))
    return buf.getvalue()


WAV = _wav()


def test_tools(server: MCPServer) -> None:
    """The tools tests/test_gateways.py wraps."""

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


def echo_tools(server: MCPServer) -> None:
    """One tool, as an echo-only colony serves one capability."""

    @server.tool()
    def echo(text: str = "") -> str:
        """Return the text as it came."""
        return text


def suite_tools(server: MCPServer) -> None:
    """The tools @modelcontextprotocol/conformance's server scenarios call."""

    @server.tool()
    def test_simple_text() -> str:
        """Returns simple text."""
        return "This is a simple text response for testing."

    @server.tool()
    def test_image_content() -> Image:
        """Returns an image."""
        return Image(data=PNG, format="png")

    @server.tool()
    def test_audio_content() -> Audio:
        """Returns audio."""
        return Audio(data=WAV, format="wav")

    @server.tool()
    def test_embedded_resource() -> types.EmbeddedResource:
        """Returns an embedded resource."""
        return types.EmbeddedResource(resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain",
            text="This is an embedded resource content."))

    @server.tool()
    def test_multiple_content_types() -> types.CallToolResult:
        """Returns text, an image and a resource."""
        return types.CallToolResult(content=[
            types.TextContent(text="Multiple content types test:"),
            Image(data=PNG, format="png").to_image_content(),
            types.EmbeddedResource(resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123})))])

    @server.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Logs three messages while it runs."""
        await ctx.info("Tool execution started")
        await asyncio.sleep(0.05)
        await ctx.info("Tool processing data")
        await asyncio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return "Tool with logging executed successfully"

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Reports progress 0, 50 and 100 of 100."""
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
            await asyncio.sleep(0.05)
        return "Tool with progress executed successfully"

    @server.tool()
    def test_error_handling() -> str:
        """Always fails."""
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool()
    async def test_reconnection(ctx: Context) -> str:
        """Closes the call's SSE stream, then answers (SEP-1699)."""
        await ctx.close_sse_stream()
        await asyncio.sleep(0.1)
        return "Reconnection test completed successfully."

    @server.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str:
        """Asks the client's model."""
        from mcp.shared.message import ServerMessageMetadata

        got = await ctx.session.send_request(  # (create_message warns of 2026-07-28)
            types.CreateMessageRequest(params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user",
                                                content=types.TextContent(text=prompt))],
                max_tokens=100)),
            types.CreateMessageResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        text = getattr(got.content, "text", None) or "No response"
        return f"LLM response: {text}"

    async def elicit(ctx: Context, message: str, schema: dict[str, Any]) -> str:
        got = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        return f"User response: action={got.action}, content={json.dumps(got.content or {})}"

    @server.tool()
    async def test_elicitation(message: str, ctx: Context) -> str:
        """Asks the user."""
        return await elicit(ctx, message, {
            "type": "object", "required": ["username", "email"], "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"}}})

    @server.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        """Asks with a default for every primitive type (SEP-1034)."""
        return await elicit(ctx, "Please review and update the form fields with defaults", {
            "type": "object", "required": [], "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {"type": "string", "description": "User status",
                           "enum": ["active", "inactive", "pending"], "default": "active"},
                "verified": {"type": "boolean", "description": "Verification status",
                             "default": True}}})

    @server.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        """Asks with the five enum forms (SEP-1330)."""
        titled = [{"const": f"value{i}", "title": t} for i, t in
                  ((1, "First Option"), (2, "Second Option"), (3, "Third Option"))]
        return await elicit(ctx, "Please select options from the enum fields", {
            "type": "object", "required": [], "properties": {
                "untitledSingle": {"type": "string", "description": "Select one option",
                                   "enum": ["option1", "option2", "option3"]},
                "titledSingle": {"type": "string", "description": "Select one option with "
                                 "titles", "oneOf": titled},
                "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                               "enum": ["opt1", "opt2", "opt3"],
                               "enumNames": ["Option One", "Option Two", "Option Three"]},
                "untitledMulti": {"type": "array", "description": "Select multiple options",
                                  "minItems": 1, "maxItems": 3,
                                  "items": {"type": "string",
                                            "enum": ["option1", "option2", "option3"]}},
                "titledMulti": {"type": "array", "description": "Select multiple options "
                                "with titles", "minItems": 1, "maxItems": 3,
                                "items": {"anyOf": titled}}}})

    @server.tool()
    def json_schema_2020_12_tool(name: str | None = None,
                                 address: dict[str, Any] | None = None) -> str:
        """Tool with JSON Schema 2020-12 features (SEP-1613)."""
        return f"JSON Schema 2020-12 tool called with: {json.dumps({'name': name})}"

    # The listing shows the schema as the suite gives it ($schema, $defs,
    # additionalProperties), which a signature cannot say.
    tool = server._tool_manager.get_tool("json_schema_2020_12_tool")
    assert tool is not None
    tool.parameters = {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
        "$defs": {"address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}}}},
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
        "additionalProperties": False}


TOOLS = {"test": test_tools, "echo": echo_tools, "suite": suite_tools}


def build(tools: str) -> MCPServer:
    server = MCPServer("sdk-test-server" if tools == "test" else f"sdk-{tools}-server")
    TOOLS[tools](server)
    return server


async def serve_http(server: MCPServer, host: str, port: int) -> None:
    """Streamable HTTP at /mcp as ``MCPServer.run("streamable-http")`` sets it up, on a
    socket bound here so that port 0 works and the URL can be announced."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    app = server.streamable_http_app(host=host)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def announce() -> None:
        while not uv.started:
            await asyncio.sleep(0.01)
        print(json.dumps({"url": f"http://{host}:{sock.getsockname()[1]}/mcp"}), flush=True)

    waiter = asyncio.get_running_loop().create_task(announce())
    try:
        await uv.serve(sockets=[sock])
    finally:
        waiter.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tools", choices=sorted(TOOLS), default="test")
    ap.add_argument("--http", metavar="[HOST:]PORT", help="serve streamable HTTP at /mcp")
    args = ap.parse_args()
    server = build(args.tools)
    if args.http is None:
        server.run("stdio")
        return
    host, _, port = args.http.rpartition(":")
    try:
        asyncio.run(serve_http(server, host or "127.0.0.1", int(port)))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
