"""The colony's edge: gateways that let A2A clients and MCP hosts use a colony
(``meshant a2a``, ``meshant mcp``), and foragers that bring existing MCP servers and A2A
agents into one (``meshant forager --mcp`` / ``--a2a``).

A gateway is a client of the colony and keeps no state of its own: an A2A task id is a
meshant task id, a stream is an attachment from a cursor, a question is ``ctx.ask``.
The SDKs (``meshant[a2a]``, ``meshant[mcp]``) are imported only by the module that
needs them, when its command runs.
"""
