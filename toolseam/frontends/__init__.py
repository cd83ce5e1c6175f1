"""The front ends: how a caller outside Python reaches a session — the command line (``cli``),
JSON lines on stdio (``stdio``), MCP (``mcp``) and inspect_ai's sandbox provider (``inspect``).
Each one speaks its protocol and hands every call to a ``toolseam.session`` object; none of them
knows which backend answers (docs/architecture.md)."""
