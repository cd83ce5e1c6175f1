"""PromQL over the HTTP API of a Prometheus server the test started on 127.0.0.1."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


def query(port: int, promql: str) -> list[dict[str, Any]]:
    """The instant vector ``promql`` selects now (raises OSError while it is not listening)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]
