"""The MCP front end: the server and its tools (``server``), the streamable HTTP transport with
bearer tokens (``http``), approvals as elicitations (``approvals``) and the sandboxes each
principal holds (``sandboxes``)."""
