"""An egress proxy listening on 127.0.0.1 for a test, and a raw request to it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from toolseam.egress import EgressProxy


@asynccontextmanager
async def running(proxy: EgressProxy) -> AsyncIterator[str]:
    """A TCP listener on 127.0.0.1 handing every connection to ``proxy.handle``."""
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
        # A client may have its whole answer a moment before the proxy's handler returns.
        for _ in range(100):
            if not proxy.active_connections:
                break
            await asyncio.sleep(0.02)
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def raw_request(proxy_url: str, request: bytes) -> bytes:
    """Send ``request`` to the proxy and read until it closes."""
    host, port = proxy_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data
